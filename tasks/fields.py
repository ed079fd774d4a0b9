"""The fields of a `RegressionTask`, torch-free: the one home of their names and help.

`RegressionTask` (which imports torch) subclasses `TaskFields` and validates them; the
``iclprobe train`` flags are generated from `TaskFields` (`iclprobe.cli_flags`), so that
``iclprobe --help`` needs no torch and the flags cannot drift from the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iclprobe._checks import option

COVARIANCES = ("isotropic", "rotated", "ill-conditioned")
W_PRIORS = ("standard", "inverse-cov", "rotated")
EIGENBASES = ("sequence", "batch")
QUERIES = ("context", "low-variance")


@dataclass(frozen=True, eq=False)
class TaskFields:
    """What describes an in-context regression task (see `RegressionTask` for each)."""

    n_dims: int = option(help="covariate dimension d")
    n_points: int = option(help="examples per sequence")
    cov: Any = option("isotropic", "isotropic | rotated | ill-conditioned")  # or a [d, d] Tensor
    w_prior: str = option("standard", "standard (w ~ N(0, I)) | inverse-cov (w ~ N(0, Σ⁻¹)) | "
                          "rotated (w ~ N(0, Σ_w), Σ_w with a rotation of its own, unrelated "
                          "to Σ)")
    noise_std: float = option(0.0, "label noise standard deviation")
    seed: int = option(0, "seed of the rotated covariance")
    condition_number: float = option(100.0, "κ of the ill-conditioned covariance")
    eigenbasis: str = option("sequence", "ill-conditioned eigenbasis per sequence | batch")
    eigenvalues: tuple[float, ...] | None = option(
        None, "Σ's eigenvalues for cov=rotated (default: 1 1 1/4 1/16 1, repeated to n_dims)")
    active_dims: int | None = option(
        None, "Garg's truncation: only the first k coordinates are non-zero (default: all "
        "n_dims)")
    query: str = option("context", "the last example's x: context (x ~ N(0, Σ), as every "
                        "other) | low-variance (x ~ N(0, s Σ⁻¹), s = tr Σ / tr Σ⁻¹: along Σ's "
                        "low-variance directions, at the same mean energy)")
