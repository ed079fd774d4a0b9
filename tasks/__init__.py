"""In-context regression data: x samplers, covariances, w priors and label noise."""

from iclprobe.tasks.covariance import (
    ill_conditioned_eigenvalues,
    random_orthogonal,
    rotated_eigenvalues,
)
from iclprobe.tasks.regression import RegressionBatch, RegressionTask, as_generator

__all__ = [
    "RegressionBatch",
    "RegressionTask",
    "as_generator",
    "ill_conditioned_eigenvalues",
    "random_orthogonal",
    "rotated_eigenvalues",
]
