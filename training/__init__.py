"""Training: the loop behind ``iclprobe train``, its recipe and its run directory.

The loop resumes exactly and runs under torchrun (DDP); `TrainConfig` is the recipe; the
run directory holds the lock, the metrics log and the latest checkpoint.

``train(model, task, TrainConfig(...), out=...)`` trains a model of any registered family.

Names are imported on first use, so that `TrainConfig` (torch-free: the CLI builds its
flags from it) loads without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from iclprobe._lazy import lazy_exports

_EXPORTS = {
    "TrainConfig": "iclprobe.training.config",
    "RunBusyError": "iclprobe.training.run_dir",
    "read_train_config": "iclprobe.training.run_dir",
    "TrainingDiverged": "iclprobe.training.loop",
    "TrainingInterrupted": "iclprobe.training.loop",
    "TrainResult": "iclprobe.training.loop",
    "train": "iclprobe.training.loop",
}

__all__ = [
    "RunBusyError",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "read_train_config",
    "train",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from iclprobe.training.config import TrainConfig
    from iclprobe.training.loop import TrainingDiverged, TrainingInterrupted, TrainResult, train
    from iclprobe.training.run_dir import RunBusyError, read_train_config
