"""Direct matrix iterations, one prefix at a time (batched over sequences).

The reference the eigenbasis recurrences of `iclprobe.algorithms.learners` are checked and
benchmarked against: each step is a batched matrix product, as a careful user would write
it without the per-eigenvalue shortcut.
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
