"""Hooked transformers for in-context regression, their configs and checkpoints."""

from iclprobe.models.ahn import load_ahn
from iclprobe.models.checkpoint import CheckpointError, load, save
from iclprobe.models.config import GPTConfig, LSTMConfig, PQConfig
from iclprobe.models.garg import convert_garg_state, load_garg_run
from iclprobe.models.gpt import GPTRegressor
from iclprobe.models.io import OutputExistsError
from iclprobe.models.lstm import LSTMRegressor
from iclprobe.models.pq import PQTransformer
from iclprobe.models.train_config import TrainConfig
from iclprobe.models.training import (
    RunBusyError,
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    read_train_config,
    train,
)

__all__ = [
    "CheckpointError",
    "GPTConfig",
    "GPTRegressor",
    "LSTMConfig",
    "LSTMRegressor",
    "OutputExistsError",
    "PQConfig",
    "PQTransformer",
    "RunBusyError",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "convert_garg_state",
    "load",
    "load_ahn",
    "load_garg_run",
    "read_train_config",
    "save",
    "train",
]
