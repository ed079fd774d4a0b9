"""Training: the loop behind ``iclprobe train``, its recipe and its run directory.

The loop resumes exactly and runs under torchrun (DDP); `TrainConfig` is the recipe; the
run directory holds the lock, the metrics log and the latest checkpoint.

``train(model, task, TrainConfig(...), out=...)`` trains a model of any registered family.
"""

from iclprobe.training.config import TrainConfig
from iclprobe.training.loop import TrainingDiverged, TrainingInterrupted, TrainResult, train
from iclprobe.training.run_dir import RunBusyError, read_train_config

__all__ = [
    "RunBusyError",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "read_train_config",
    "train",
]
