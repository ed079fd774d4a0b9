"""The model-family registry: name → config class and model class (torch-free).

One registry serves checkpoint loading (``config.json`` names the family), training and
``iclprobe train --family``, hooks, probes and alignment. The model class is imported
lazily (``"module:Class"``) so that the CLI can read a family's config fields for its flags
without importing torch. A family registers itself once::

    register_family("mine", MyConfig, "mypackage.models:MyRegressor",
                    "my recurrent regressor")

``MyRegressor`` subclasses `iclprobe.models.base.Regressor`; ``MyConfig`` is a frozen
dataclass with ``n_dims``, ``n_layers``, ``to_dict`` and ``from_dict``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from iclprobe.models.config import GPTConfig, LSTMConfig, PQConfig


@dataclasses.dataclass(frozen=True)
class Family:
    """A registered model family."""

    name: str
    config: Any  # a frozen dataclass class with to_dict/from_dict
    model: str | type  # "module:Class", imported on first use, or the class itself
    summary: str
    runs: tuple[str, ...] = ()  # learner runs its models add to align (claimed_learners)

    def model_class(self) -> Any:
        """The model class (imported on first use)."""
        if isinstance(self.model, str):
            module, _, cls = self.model.partition(":")
            return getattr(importlib.import_module(module), cls)
        return self.model


FAMILIES: dict[str, Family] = {}


def register_family(name: str, config: Any, model: str | type, summary: str,
                    runs: tuple[str, ...] = ()) -> Family:
    """Register a model family under ``name`` (re-registering a name replaces it).

    ``runs``: the names of the learner runs its models add to an alignment (the keys of
    their ``claimed_learners``), so that ``AlignConfig(algorithms=...)`` accepts them.
    """
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"config must be a dataclass, got {config!r}")
    family = Family(name, config, model, summary, tuple(runs))
    FAMILIES[name] = family
    if not isinstance(model, str):
        setattr(model, "family", name)  # noqa: B010 - the class learns its registry name
    return family


def get_family(name: str) -> Family:
    """The family registered as ``name`` (the error lists them)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; registered: {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_of(model: Any) -> str:
    """The registry name of ``model``'s family (its class's ``family`` attribute)."""
    name = getattr(type(model), "family", "")
    if name not in FAMILIES or not isinstance(model, FAMILIES[name].model_class()):
        raise TypeError(f"model must be a registered iclprobe model family, got "
                        f"{type(model).__name__} (registered: {sorted(FAMILIES)})")
    return name


register_family("gpt", GPTConfig, "iclprobe.models.gpt:GPTRegressor",
                "GPT-2 regressor (Garg et al.), softmax or linear attention")
register_family("pq", PQConfig, "iclprobe.models.pq:PQTransformer",
                "PQ linear transformer (Ahn et al., von Oswald et al.)",
                runs=("pgd_own", "pgd_inv_cov"))
register_family("lstm", LSTMConfig, "iclprobe.models.lstm:LSTMRegressor",
                "LSTM regressor: the recurrent baseline on the same tokens")
