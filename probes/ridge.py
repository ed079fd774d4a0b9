"""Closed-form ridge, batched over layers, with generalized cross-validation.

For centered features X (N × D) and targets y, one eigendecomposition of XᵀX = V diag(s) Vᵀ
per layer gives every α at once: w(α) = V diag(1/(s + α)) Vᵀ Xᵀy, and in z = Vᵀ Xᵀy
RSS(α) = ‖y‖² − Σ z² (2/(s + α) − s/(s + α)²), df(α) = Σ s/(s + α),
GCV(α) = (RSS/N) / (1 − df/N)².  Axis legend: ``layer``, ``row`` (N), ``feature`` (D).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

DEFAULT_ALPHAS = torch.logspace(-6, 4, 21, dtype=torch.float64)


class RidgeFit(NamedTuple):
    """Per layer: coefficients, intercept, the chosen α and its GCV score."""

    coef: Tensor  # [layer, feature]
    intercept: Tensor  # [layer]
    alpha: Tensor  # [layer]
    gcv: Tensor  # [layer]


def _moments(x: Tensor, y: Tensor, fit_intercept: bool
             ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Means and centered Gram matrices of ``x [layer, row, feature]``, ``y [layer, row]``.

    Computed one layer at a time in float64, without materializing centered copies
    (``XᵀX − N μ μᵀ``), so memory stays at one layer's float64 features.
    """
    n_rows = x.shape[1]
    out: list[list[Tensor]] = [[], [], [], [], []]
    for layer in range(x.shape[0]):
        xl, yl = x[layer].to(torch.float64), y[layer].to(torch.float64)
        mx = xl.mean(0) if fit_intercept else xl.new_zeros(xl.shape[1])
        my = yl.mean() if fit_intercept else yl.new_zeros(())
        gram = xl.T @ xl - n_rows * torch.outer(mx, mx)
        xty = xl.T @ yl - n_rows * mx * my
        for i, v in enumerate((mx, my, gram, xty, (yl - my).pow(2).sum())):
            out[i].append(v)
    mx, my, gram, xty, yy = (torch.stack(v) for v in out)
    return mx, my, gram, xty, yy


def ridge_gcv(x: Tensor, y: Tensor, alphas: Tensor | float | None = None,
              fit_intercept: bool = True) -> RidgeFit:
    """Ridge per layer on ``x [layer, row, feature]``, ``y [row]`` or ``[layer, row]``.

    ``alphas``: one α for all layers, or a grid from which GCV picks per layer (default
    1e-6 … 1e4). Computed in float64.
    """
    y = y.expand(x.shape[0], -1) if y.ndim == 1 else y
    if y.shape != x.shape[:2]:
        raise ValueError(f"y must have shape [row] or {tuple(x.shape[:2])}, got {tuple(y.shape)}")
    n_rows = x.shape[1]
    grid = DEFAULT_ALPHAS if alphas is None else torch.as_tensor(alphas, dtype=torch.float64)
    grid = grid.reshape(-1)
    if not bool((grid >= 0).all()) or grid.numel() == 0:
        raise ValueError(f"alpha must be >= 0, got {grid.tolist()}")
    mx, my, gram, xty, yy = _moments(x, y, fit_intercept)
    s, v = torch.linalg.eigh(gram)
    s = s.clamp(min=0.0)
    z = (v.transpose(1, 2) @ xty[..., None])[..., 0]  # [layer, feature]
    den = s[:, None, :] + grid[None, :, None]  # [layer, alpha, feature]
    inv = torch.where(den > 0, 1.0 / torch.where(den > 0, den, 1.0), 0.0)
    rss = yy[:, None] - (z[:, None] ** 2 * (2 * inv - s[:, None] * inv**2)).sum(-1)
    df = (s[:, None] * inv).sum(-1) + (1.0 if fit_intercept else 0.0)
    gcv = (rss.clamp(min=0) / n_rows) / (1 - df / n_rows).clamp(min=1e-12) ** 2
    best = gcv.argmin(1)  # [layer]
    chosen_inv = inv[torch.arange(x.shape[0]), best]  # [layer, feature]
    coef = (v @ (z * chosen_inv)[..., None])[..., 0]
    intercept = my - (mx * coef).sum(-1)
    return RidgeFit(coef, intercept, grid[best], gcv[torch.arange(x.shape[0]), best])
