"""Hooked transformers for in-context regression, their configs and checkpoints."""

from iclprobe.models.checkpoint import CheckpointError, load, save
from iclprobe.models.config import GPTConfig
from iclprobe.models.garg import convert_garg_state, load_garg_run
from iclprobe.models.gpt import GPTRegressor

__all__ = [
    "CheckpointError",
    "GPTConfig",
    "GPTRegressor",
    "convert_garg_state",
    "load",
    "load_garg_run",
    "save",
]
