"""Hooked model families for in-context regression, their configs and checkpoints.

Families (`GPTRegressor`, `PQTransformer`, `LSTMRegressor`) subclass `Regressor` and are
registered in `iclprobe.models.registry`; `load`/`save` read and write checkpoints of any
of them (and import Garg/Fu run directories and Ahn et al.'s files); `size` measures what a
model of a config holds, on the meta device. A family of one's own builds on `ConfigMixin`,
`option` and the ``check_*`` validators (its config), `Regressor` and, for a token
sequence, `TokenLayoutMixin` (docs/architecture.md, "Recipe: add a model family").
Training lives in `iclprobe.training`, which builds on this package (nothing here imports
it).

Names are imported on first use, so that the configs and the registry (torch-free) load
without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from iclprobe._lazy import lazy_exports

_EXPORTS = {
    # what a family of one's own builds on (docs/architecture.md's family recipe)
    "ConfigMixin": "iclprobe.models.config",
    "TokenLayoutMixin": "iclprobe.models.layout",
    "option": "iclprobe._checks",
    "check_fields": "iclprobe._checks",
    "check_bool": "iclprobe._checks",
    "check_choice": "iclprobe._checks",
    "check_int": "iclprobe._checks",
    "check_real": "iclprobe._checks",
    "check_seed": "iclprobe._checks",
    "CheckpointError": "iclprobe.storage",
    "OutputExistsError": "iclprobe.storage",
    "GPTConfig": "iclprobe.models.config",
    "LSTMConfig": "iclprobe.models.config",
    "PQConfig": "iclprobe.models.config",
    "Regressor": "iclprobe.models.base",
    "HookedAdapter": "iclprobe.models.adapter",
    "GPTRegressor": "iclprobe.models.gpt",
    "LSTMRegressor": "iclprobe.models.lstm",
    "PQTransformer": "iclprobe.models.pq",
    "load": "iclprobe.models.checkpoint",
    "save": "iclprobe.models.files",
    "load_ahn": "iclprobe.models.ahn",
    "convert_garg_state": "iclprobe.models.garg",
    "load_garg_run": "iclprobe.models.garg",
    "register_family": "iclprobe.models.registry",
}

__all__ = [
    "CheckpointError",
    "ConfigMixin",
    "TokenLayoutMixin",
    "check_bool",
    "check_choice",
    "check_fields",
    "check_int",
    "check_real",
    "check_seed",
    "option",
    "GPTConfig",
    "GPTRegressor",
    "HookedAdapter",
    "LSTMConfig",
    "LSTMRegressor",
    "OutputExistsError",
    "PQConfig",
    "PQTransformer",
    "Regressor",
    "convert_garg_state",
    "load",
    "load_ahn",
    "load_garg_run",
    "register_family",
    "save",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from iclprobe._checks import (
        check_bool,
        check_choice,
        check_fields,
        check_int,
        check_real,
        check_seed,
        option,
    )
    from iclprobe.models.adapter import HookedAdapter
    from iclprobe.models.ahn import load_ahn
    from iclprobe.models.base import Regressor
    from iclprobe.models.checkpoint import load
    from iclprobe.models.config import ConfigMixin, GPTConfig, LSTMConfig, PQConfig
    from iclprobe.models.files import save
    from iclprobe.models.garg import convert_garg_state, load_garg_run
    from iclprobe.models.gpt import GPTRegressor
    from iclprobe.models.layout import TokenLayoutMixin
    from iclprobe.models.lstm import LSTMRegressor
    from iclprobe.models.pq import PQTransformer
    from iclprobe.models.registry import register_family
    from iclprobe.storage import CheckpointError, OutputExistsError
