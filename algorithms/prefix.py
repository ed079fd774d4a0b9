"""Per-prefix sufficient statistics by cumulative sums, and their eigendecompositions.

Prefix t holds the examples ``0..t-1``: ``S_t = Σ_{j<t} x_j x_jᵀ`` and
``b_t = Σ_{j<t} x_j y_j``. Axis legend: ``batch``, ``pos`` (t = 0..n-1), ``n_dims``.
Everything is computed in float64; results are cast back by the callers.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor


class PrefixStats(NamedTuple):
    """Per-prefix moments and the eigendecomposition of ``S_t``."""

    gram: Float[Tensor, "batch pos n_dims n_dims"]  # S_t = Xᵀ X over the prefix
    xty: Float[Tensor, "batch pos n_dims"]  # b_t = Xᵀ y over the prefix
    counts: Float[Tensor, " pos"]  # t
    eigvals: Float[Tensor, "batch pos n_dims"]  # of S_t, ascending, clamped at 0
    eigvecs: Float[Tensor, "batch pos n_dims n_dims"]  # columns
    rank_tol: Float[Tensor, "batch pos 1"]  # eigenvalues below this count as zero


def check_regression(xs: Tensor, ys: Tensor) -> None:
    """Validate ``xs [batch, pos, n_dims]`` and ``ys [batch, pos]``: shapes and finiteness."""
    if not isinstance(xs, Tensor) or not isinstance(ys, Tensor):
        raise TypeError(
            f"xs and ys must be torch tensors, got {type(xs).__name__}, {type(ys).__name__}"
        )
    if xs.ndim != 3:
        raise ValueError(f"xs must have shape [batch, pos, n_dims], got {tuple(xs.shape)}")
    if ys.shape != xs.shape[:2]:
        raise ValueError(f"ys must have shape {tuple(xs.shape[:2])}, got {tuple(ys.shape)}")
    if not bool(torch.isfinite(xs).all()) or not bool(torch.isfinite(ys).all()):
        raise ValueError("xs and ys must be finite (found NaN or Inf)")


def exclusive_cumsum(t: Tensor, dim: int = 1) -> Tensor:
    """``out[:, i] = Σ_{j<i} t[:, j]`` along ``dim``."""
    c = t.cumsum(dim)
    return torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c.narrow(dim, 0, c.shape[dim] - 1)],
                     dim)


def prefix_stats(xs: Tensor, ys: Tensor) -> PrefixStats:
    """Moments and eigendecompositions for every prefix of every sequence, in float64."""
    check_regression(xs, ys)
    x, y = xs.to(torch.float64), ys.to(torch.float64)
    gram = exclusive_cumsum(x[..., :, None] * x[..., None, :])
    xty = exclusive_cumsum(x * y[..., None])
    counts = torch.arange(xs.shape[1], dtype=torch.float64, device=xs.device)
    eigvals, eigvecs = torch.linalg.eigh(gram)
    eigvals = eigvals.clamp(min=0.0)
    d = xs.shape[-1]
    rank_tol = eigvals[..., -1:] * (10 * d * torch.finfo(torch.float64).eps) + 1e-300
    return PrefixStats(gram, xty, counts, eigvals, eigvecs, rank_tol)


def ols_weights(stats: PrefixStats) -> Float[Tensor, "batch pos n_dims"]:
    """Min-norm least squares ``S_t⁺ b_t`` at every prefix (0 at t = 0)."""
    v, lam = stats.eigvecs, stats.eigvals
    inv = torch.where(lam > stats.rank_tol, 1.0 / lam.clamp(min=1e-300), 0.0)
    coef = torch.einsum("bpji,bpj->bpi", v, stats.xty) * inv  # in the eigenbasis
    return torch.einsum("bpij,bpj->bpi", v, coef)


def predict(weights: Tensor, xs: Tensor) -> Tensor:
    """``preds[..., b, t] = weights[..., b, t] · xs[b, t]`` for any leading axes."""
    return (weights * xs.to(weights.dtype)).sum(-1)


def ols_predictions(xs: Tensor, ys: Tensor) -> Float[Tensor, "batch pos"]:
    """Min-norm OLS prefix predictions in the dtype of ``xs``."""
    return predict(ols_weights(prefix_stats(xs, ys)), xs).to(xs.dtype)
