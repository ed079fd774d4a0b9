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
    """Per-prefix moments and the eigendecomposition of ``S_t``.

    Eigenvalues below a relative tolerance are set to exactly 0, and so are the matching
    coordinates of ``b_t`` (which lie in S_t's range), so that every learner reaches the
    min-norm limit on rank-deficient prefixes (t < d) instead of amplifying round-off.
    """

    gram: Float[Tensor, "batch pos n_dims n_dims"]  # S_t = Xᵀ X over the prefix
    xty: Float[Tensor, "batch pos n_dims"]  # b_t = Xᵀ y over the prefix
    counts: Float[Tensor, " pos"]  # t
    eigvals: Float[Tensor, "batch pos n_dims"]  # of S_t, ascending; 0 below the tolerance
    eigvecs: Float[Tensor, "batch pos n_dims n_dims"]  # columns
    xty_eig: Float[Tensor, "batch pos n_dims"]  # Vᵀ b_t (0 where the eigenvalue is 0)
    query_eig: Float[Tensor, "batch pos n_dims"]  # Vᵀ x_t, the query in the eigenbasis


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
    d = xs.shape[-1]
    rank_tol = eigvals[..., -1:].clamp(min=0.0) * (100 * d * torch.finfo(torch.float64).eps)
    nonzero = eigvals > rank_tol
    eigvals = torch.where(nonzero, eigvals, 0.0)
    xty_eig = torch.where(nonzero, torch.einsum("bpji,bpj->bpi", eigvecs, xty), 0.0)
    query_eig = torch.einsum("bpji,bpj->bpi", eigvecs, x)
    return PrefixStats(gram, xty, counts, eigvals, eigvecs, xty_eig, query_eig)


def safe_inverse(lam: Tensor) -> Tensor:
    """``1/λ`` where λ > 0, else 0 (the pseudo-inverse of a diagonal)."""
    return torch.where(lam > 0, 1.0 / torch.where(lam > 0, lam, 1.0), 0.0)


def from_eigenbasis(stats: PrefixStats, coef: Tensor) -> Tensor:
    """Weights ``V u`` from eigenbasis coefficients ``u [..., batch, pos, n_dims]``."""
    return torch.einsum("bpij,...bpj->...bpi", stats.eigvecs, coef)


def ols_weights(stats: PrefixStats) -> Float[Tensor, "batch pos n_dims"]:
    """Min-norm least squares ``S_t⁺ b_t`` at every prefix (0 at t = 0)."""
    return from_eigenbasis(stats, stats.xty_eig * safe_inverse(stats.eigvals))


def predict(weights: Tensor, xs: Tensor) -> Tensor:
    """``preds[..., b, t] = weights[..., b, t] · xs[b, t]`` for any leading axes."""
    return (weights * xs.to(weights.dtype)).sum(-1)


def ols_predictions(xs: Tensor, ys: Tensor) -> Float[Tensor, "batch pos"]:
    """Min-norm OLS prefix predictions in the dtype of ``xs``."""
    return predict(ols_weights(prefix_stats(xs, ys)), xs).to(xs.dtype)
