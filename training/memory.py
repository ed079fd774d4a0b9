"""What training holds in memory, checked before the model is built.

Four float32 copies of the weights (weights, gradients, Adam's two moments), the activations
one step saves for backward and the step's data (float64 draws). The weights and the
activations are measured on the model itself, built on the meta device
(`iclprobe.models.size`), after a cheap bound over its depth.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from iclprobe.models.size import check_model_fits, count_activations
from iclprobe.tasks import RegressionTask
from iclprobe.training.config import TrainConfig


def check_training_fits(model_cls: Any, model_cfg: Any, task: RegressionTask,
                        train_cfg: TrainConfig, available: int | None = None) -> None:
    """Refuse, before building it, a model that cannot be trained in the memory available.

    Raises:
        ValueError: ``training: a model with N parameters (sizes) needs at least … GiB of
            memory, but … GiB are available``.
    """
    batch, n = train_cfg.batch_size, task.n_points

    def activations(model: nn.Module) -> int:
        return count_activations(model, batch, n, last_only=train_cfg.loss == "last")

    data = 2 * batch * n * (task.n_dims + 1) * 2  # xs and ys drawn in float64
    check_model_fits(model_cls, model_cfg, "training", copies=4, activations=activations,
                     extra_floats=data, available=available)
