"""The model-family registry: name → config class and model class (torch-free).

One registry serves checkpoint loading (``config.json`` names the family), training and
``iclprobe train --family``, hooks, probes and alignment. The model class is imported
lazily (``"module:Class"``) so that the CLI can read a family's config fields for its flags
without importing torch. A family registers itself once::

    register_family("mine", MyConfig, "mypackage.models:MyRegressor",
                    "my recurrent regressor")

``MyRegressor`` subclasses `iclprobe.models.base.Regressor`; ``MyConfig`` is a frozen
dataclass with ``n_dims``, ``n_layers``, ``seed``, ``to_dict`` and ``from_dict`` (checked by
``register_family``). What a model holds is measured on the model itself
(`iclprobe.models.size`): a family writes no formula of its size. A family of models that
are built, not trained (``trainable=False``: the known-answer oracles) is refused by
``iclprobe train``, and its config fields get no flags.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

from iclprobe.errors import InputError, InputTypeError
from iclprobe.models.config import GPTConfig, LSTMConfig, OracleConfig, PQConfig
from iclprobe.plugins import claim, registrant

#: What ``register_family`` checks of a config class: fields, then methods.
CONFIG_FIELDS = ("n_dims", "n_layers", "seed")
CONFIG_METHODS = {
    "to_dict": "config.json is written from it (models.config.ConfigMixin has it)",
    "from_dict": "checkpoints are loaded with it (models.config.ConfigMixin has it)",
}


@dataclasses.dataclass(frozen=True)
class Family:
    """A registered model family."""

    name: str
    config: Any  # a frozen dataclass class with to_dict/from_dict
    model: str | type  # "module:Class", imported on first use, or the class itself
    summary: str
    runs: tuple[str, ...] = ()  # learner runs its models add to align (claimed_learners)
    trainable: bool = True  # False: built, not trained (iclprobe train refuses it)
    registrant: str = ""  # who registered it (`iclprobe.plugins.registrant`), for messages

    def model_class(self) -> Any:
        """The model class, imported and checked (`check_model_class`) on first use."""
        if not isinstance(self.model, str):
            return self.model
        if self.model not in _IMPORTED:
            module, _, cls = self.model.partition(":")
            try:
                found = getattr(importlib.import_module(module), cls)
            except (ImportError, AttributeError) as err:
                raise InputError(f"model family {self.name!r}: cannot import its model class "
                                 f"{self.model!r} ({err})") from err
            check_model_class(self.name, found)
            _IMPORTED[self.model] = found
        return _IMPORTED[self.model]


FAMILIES: dict[str, Family] = {}
_IMPORTED: dict[str, type] = {}  # "module:Class" -> the class, checked


def register_family(name: str, config: Any, model: str | type, summary: str,
                    runs: tuple[str, ...] = (), trainable: bool = True,
                    replace: bool = False) -> Family:
    """Register a model family under ``name``.

    What the family must provide is checked here: the config class's fields
    (`CONFIG_FIELDS`) and methods (`CONFIG_METHODS`); a model class given as a class is
    checked now, one given as ``"module:Class"`` when first imported (`check_model_class`).
    The model class learns its registry name (its ``family`` attribute).

    Args:
        name: the family's name (``config.json``'s ``family``, ``--family``).
        config: the frozen config dataclass (a class).
        model: the model class, or ``"module:Class"`` to import it on first use.
        summary: one line for ``iclprobe train --help``.
        runs: the names of the learner runs its models add to an alignment (the keys of
            their ``claimed_learners``), so that ``AlignConfig(algorithms=...)`` accepts them.
        trainable: False for models that are built, not trained: ``iclprobe train``
            refuses the family and its config's fields get no flags.
        replace: replace the family registered as ``name`` (without it, a name taken is
            refused, naming who registered it); every command then says what replaced what.

    Raises:
        InputError, InputTypeError: naming what is missing or malformed, or the registrant
            of a name taken.
    """
    if not isinstance(name, str) or not name:
        raise InputError(f"name must be a non-empty string, got {name!r}")
    _check_config_class(name, config)
    if isinstance(model, str):
        module, sep, cls = model.partition(":")
        if not (module and sep and cls.isidentifier()):
            raise InputError(f"model family {name!r}: model must be a class or "
                             f"'module:Class', got {model!r}")
        _IMPORTED.pop(model, None)
    else:
        check_model_class(name, model)
    if not isinstance(summary, str):
        raise InputTypeError(f"model family {name!r}: summary must be a string, got {summary!r}")
    runs = (runs,) if isinstance(runs, str) else tuple(runs)
    if not all(isinstance(r, str) and r for r in runs):
        raise InputTypeError(f"model family {name!r}: runs must be names (strings), got {runs!r}")
    if not isinstance(trainable, bool):
        raise InputTypeError(f"model family {name!r}: trainable must be a bool, got {trainable!r}")
    by = registrant(sys._getframe(1).f_globals.get("__name__", "?"))
    taken = FAMILIES.get(name)
    claim("model family", name, taken.registrant if taken else None, by, replace)
    family = Family(name, config, model, summary, runs, trainable, by)
    FAMILIES[name] = family
    return family


def _check_config_class(name: str, config: Any) -> None:
    """Refuse a config class without what checkpoints, training and the CLI use."""
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise InputTypeError(f"model family {name!r}: config must be a dataclass class, "
                        f"got {config!r}")
    if not config.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise InputTypeError(f"model family {name!r}: {config.__name__} must be a frozen "
                        "dataclass (@dataclasses.dataclass(frozen=True))")
    fields = {f.name for f in dataclasses.fields(config)}
    missing = [f for f in CONFIG_FIELDS if f not in fields]
    if missing:
        raise InputTypeError(f"model family {name!r}: {config.__name__} has no field(s) {missing} "
                        f"(every config has {list(CONFIG_FIELDS)})")
    absent = [m for m in CONFIG_METHODS if not callable(getattr(config, m, None))]
    if absent:
        raise InputTypeError(f"model family {name!r}: {config.__name__} lacks method(s) {absent}: "
                        + "; ".join(f"{m}: {CONFIG_METHODS[m]}" for m in absent))


def check_model_class(name: str, cls: Any) -> None:
    """Refuse a model class that is not a complete `Regressor`; give it its ``family``.

    A subclass of ``iclprobe.models.base.Regressor`` checks itself
    (`Regressor.check_family_class`: every abstract method implemented, well-formed class
    attributes); anything else is refused here. The registry never imports the base class:
    the base class imports the registry (a model saves under its family's name).
    """
    check = getattr(cls, "check_family_class", None) if isinstance(cls, type) else None
    if check is None:
        raise InputTypeError(f"model family {name!r}: the model must be a subclass of "
                        f"iclprobe.models.base.Regressor, got {cls!r}")
    check(name)


def get_family(name: str) -> Family:
    """The family registered as ``name`` (the error lists them)."""
    if name not in FAMILIES:
        raise InputError(f"unknown model family {name!r}; registered: {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_of(model: Any) -> str:
    """The registry name of ``model``'s family.

    Its class's ``family`` attribute, or, for a class registered as ``"module:Class"`` and
    imported directly rather than through the registry, the family registered with its path.
    """
    cls = type(model)
    name = cls.__dict__.get("family", "")  # its own, not a registered parent's
    if name not in FAMILIES:
        path = f"{cls.__module__}:{cls.__qualname__}"
        name = next((f.name for f in FAMILIES.values() if f.model in (path, cls)),
                    getattr(cls, "family", ""))
    if name not in FAMILIES or not isinstance(model, FAMILIES[name].model_class()):
        raise InputTypeError(f"model must be a registered iclprobe model family, got "
                        f"{cls.__name__} (registered: {sorted(FAMILIES)})")
    return name


register_family("gpt", GPTConfig, "iclprobe.models.gpt:GPTRegressor",
                "GPT-2 regressor (Garg et al.), softmax or linear attention")
register_family("pq", PQConfig, "iclprobe.models.pq:PQTransformer",
                "PQ linear transformer (Ahn et al., von Oswald et al.)",
                runs=("pgd_own", "pgd_inv_cov"))
register_family("lstm", LSTMConfig, "iclprobe.models.lstm:LSTMRegressor",
                "LSTM regressor: the recurrent baseline on the same tokens")
register_family("oracle", OracleConfig, "iclprobe.constructions.oracle:LearnerOracle",
                "known-answer oracle: a registered learner's iterates as layers, behind a "
                "rotation (iclprobe.constructions.oracle)", trainable=False)
