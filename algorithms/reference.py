"""Direct iterations, as a careful user would write them without the shortcuts.

The references the fast learners are checked and benchmarked against: GD and Newton–Schulz
one prefix at a time (batched over sequences), each step a batched matrix product instead
of the per-eigenvalue recurrence; online GD example by example instead of its pass maps.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gd_direct(xs: Tensor, ys: Tensor, steps: list[int], lr: float,
              normalize: bool = True) -> Tensor:
    """GD predictions ``[K, batch, pos]`` by iterating ``w <- w − η c (S w − b)``."""
    b, n, d = xs.shape
    out = torch.zeros(len(steps), b, n, dtype=xs.dtype)
    order = {k: i for i, k in enumerate(steps)}
    for t in range(1, n):
        x, y = xs[:, :t], ys[:, :t]
        gram, xty = x.transpose(1, 2) @ x, (x.transpose(1, 2) @ y[..., None])[..., 0]
        c = 1.0 / t if normalize else 1.0
        w = torch.zeros(b, d, dtype=xs.dtype)
        for k in range(max(steps) + 1):
            if k in order:
                out[order[k], :, t] = (w * xs[:, t]).sum(-1)
            w = w - lr * c * ((gram @ w[..., None])[..., 0] - xty)
    return out


def newton_direct(xs: Tensor, ys: Tensor, steps: list[int], alpha: str = "frobenius") -> Tensor:
    """Newton–Schulz predictions ``[K, batch, pos]`` by iterating ``M <- M (2I − S M)``."""
    b, n, d = xs.shape
    out = torch.zeros(len(steps), b, n, dtype=xs.dtype)
    order = {k: i for i, k in enumerate(steps)}
    eye = torch.eye(d, dtype=xs.dtype)
    for t in range(1, n):
        x, y = xs[:, :t], ys[:, :t]
        gram, xty = x.transpose(1, 2) @ x, (x.transpose(1, 2) @ y[..., None])[..., 0]
        sst = gram @ gram.transpose(1, 2)
        norm = torch.linalg.matrix_norm(sst, ord="fro" if alpha == "frobenius" else 2)
        m = gram.transpose(1, 2) / norm[:, None, None]
        for k in range(max(steps) + 1):
            if k in order:
                out[order[k], :, t] = ((m @ xty[..., None])[..., 0] * xs[:, t]).sum(-1)
            m = m @ (2 * eye - gram @ m)
    return out


def online_gd_direct(xs: Tensor, ys: Tensor, passes: list[int], lr: float | str = "normalized",
                     init: Tensor | None = None) -> Tensor:
    """Online GD weights ``[K, batch, pos, n_dims]`` by updating every prefix example by example.

    Each pass runs ``w <- w − η_j x_j (x_jᵀ w − y_j)`` for j = 0..t−1 on prefix t's weights
    (``η_j = 1/‖x_j‖²`` for "normalized"); ``init`` (default 0) is each prefix's start.
    """
    b, n, d = xs.shape
    w = torch.zeros(b, n, d, dtype=xs.dtype) if init is None else init.clone()
    w[:, 0] = 0.0
    saved = {0: w.clone()}
    for k in range(1, max(passes) + 1):
        for j in range(n - 1):  # example j updates every prefix t > j
            xj = xs[:, j]
            norm = xj.pow(2).sum(-1)
            eta = torch.where(norm > 0, 1.0 / norm, 0.0) if lr == "normalized" else \
                torch.full((b,), float(lr), dtype=xs.dtype)
            resid = (w[:, j + 1 :] * xj[:, None]).sum(-1) - ys[:, j, None]  # [batch, t > j]
            w[:, j + 1 :] -= (eta[:, None] * resid)[..., None] * xj[:, None]
        saved[k] = w.clone()
    return torch.stack([saved[k] for k in passes])
