"""Preconditioned GD with one preconditioner per step: what a PQ transformer's layers run.

A linear-attention PQ layer with Eq. 8 sparsity and B = 0 updates the query's induced
weight by ``w <- w − A_l ∇R(w)``, ``∇R(w) = c_t (S_t w − b_t)`` (c_t = 1/t, the mean loss).
Step k of `pgd_schedule` applies ``A_1 … A_k`` in order, so layer l of such a model equals
step l exactly. Axis legend: ``step``, ``batch``, ``pos`` (prefix t), ``n_dims``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from iclprobe._checks import check_bool
from iclprobe._finite import all_finite
from iclprobe.algorithms.base import Iterates, check_steps, register
from iclprobe.algorithms.numerics import finish, out_dtype
from iclprobe.algorithms.prefix import (
    check_real,
    check_regression,
    exclusive_cumsum,
    safe_inverse,
)
from iclprobe.errors import InputError


def _check_preconds(preconds: Tensor | None, n_dims: int, batch: int) -> Tensor:
    """``[K, d, d]`` or ``[K, batch, d, d]`` finite preconditioners, as float64."""
    preconds = check_real("preconds", preconds, "[steps, d, d] or [steps, batch, d, d]")
    ok = (preconds.ndim == 3 and preconds.shape[1:] == (n_dims, n_dims)) or (
        preconds.ndim == 4 and preconds.shape[1:] == (batch, n_dims, n_dims))
    if not ok or preconds.shape[0] == 0:
        raise InputError(f"preconds must have shape [steps, {n_dims}, {n_dims}] or [steps, "
                         f"{batch}, {n_dims}, {n_dims}], got {tuple(preconds.shape)}")
    if not all_finite(preconds):
        raise InputError("preconds must be finite (found NaN or Inf)")
    return preconds.to(torch.float64)


@register("pgd_schedule", label="GD with a preconditioner per step", steps="layers",
          compare_with=(), candidate=False)
def pgd_schedule(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
                 preconds: Tensor | None = None, normalize: bool = True,
                 weights: bool = True) -> Iterates:
    """GD from w = 0 whose k-th step is preconditioned by ``preconds[k-1]``.

    Args:
        steps: step counts in 0..K (K = ``len(preconds)``).
        preconds: ``[K, d, d]`` (one per step) or ``[K, batch, d, d]``; not necessarily
            symmetric (a trained PQ layer's A_l is not).
        normalize: gradient of the mean (True, as a PQ layer computes) or summed loss.
    """
    check_regression(xs, ys)
    b, n, d = xs.shape
    mats = _check_preconds(preconds, d, b)
    k_steps = check_steps(steps)
    if int(k_steps.max()) > mats.shape[0]:
        raise InputError(f"steps go up to {int(k_steps.max())}, but only {mats.shape[0]} "
                         "preconditioners were given")
    x, y = xs.detach().to(torch.float64), ys.detach().to(torch.float64)
    gram = exclusive_cumsum(x[..., :, None] * x[..., None, :])  # [batch, pos, d, d]
    xty = exclusive_cumsum(x * y[..., None])  # [batch, pos, d]
    counts = torch.arange(n, dtype=torch.float64, device=xs.device)
    mean = check_bool("pgd_schedule", "normalize", normalize)
    c = (safe_inverse(counts) if mean else torch.ones_like(counts))[None, :, None]
    w = torch.zeros(b, n, d, dtype=torch.float64, device=xs.device)
    saved = {0: w}
    for k in range(int(k_steps.max())):
        grad = c * ((gram @ w[..., None])[..., 0] - xty)
        a = mats[k] if mats.ndim == 3 else mats[k][:, None]  # [d, d] or [batch, 1, d, d]
        w = w - (a @ grad[..., None])[..., 0]
        saved[k + 1] = w
    stacked = torch.stack([saved[k] for k in k_steps.tolist()])  # [step, batch, pos, d]
    preds = (stacked * x).sum(-1)
    grew = not (all_finite(preds) and all_finite(stacked))

    def unstable() -> str | None:  # float64 overflow: the steps, not the dtype, are the cause
        return ("the preconditioned steps make the iterates grow without bound on these "
                "data (some I − c_t A_k S_t has an eigenvalue beyond 1 in modulus)") if grew \
            else None

    return finish("pgd_schedule", k_steps, preds, stacked if weights else None,
                  {"normalize": normalize, "preconds": mats.tolist()}, out_dtype(xs),
                  unstable=unstable)
