"""In-context regression data: x samplers, covariances, w priors and label noise.

Names are imported on first use, so that the task's fields (`iclprobe.tasks.fields`, which
the CLI's flags come from) load without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from iclprobe._lazy import lazy_exports

_EXPORTS = {
    "RegressionBatch": "iclprobe.tasks.regression",
    "RegressionTask": "iclprobe.tasks.regression",
    "TaskFields": "iclprobe.tasks.fields",
    "as_generator": "iclprobe.tasks.regression",
    "ill_conditioned_eigenvalues": "iclprobe.tasks.covariance",
    "random_orthogonal": "iclprobe.tasks.covariance",
    "rotated_eigenvalues": "iclprobe.tasks.covariance",
}

__all__ = [
    "RegressionBatch",
    "RegressionTask",
    "TaskFields",
    "as_generator",
    "ill_conditioned_eigenvalues",
    "random_orthogonal",
    "rotated_eigenvalues",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from iclprobe.tasks.covariance import (
        ill_conditioned_eigenvalues,
        random_orthogonal,
        rotated_eigenvalues,
    )
    from iclprobe.tasks.fields import TaskFields
    from iclprobe.tasks.regression import RegressionBatch, RegressionTask, as_generator
