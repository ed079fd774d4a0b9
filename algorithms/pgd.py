"""Preconditioned GD: GD on ``x' = M^{1/2} x``, mapped back (Ahn et al.'s w <- w − η M ∇R).

Axis legend: ``step``, ``batch``, ``pos``, ``n_dims``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from iclprobe._finite import all_finite
from iclprobe.algorithms import families
from iclprobe.algorithms.base import Iterates, register
from iclprobe.algorithms.learners import GD_LOG_GRID, LrSpec, gd_core
from iclprobe.algorithms.numerics import out_dtype
from iclprobe.algorithms.prefix import PrefixStats, check_real, check_regression, prefix_stats
from iclprobe.errors import InputError

#: the last preconditioner checked and its square root: `align` runs pGD at many step sizes
#: with one preconditioner, and its checks and decomposition were a quarter of each run
_ROOTS: list[tuple[Tensor, Tensor]] = []


def _matrix_sqrt(precond: Tensor, n_dims: int, batch: int) -> Tensor:
    """The symmetric square root of an SPD ``[d, d]`` or ``[batch, d, d]`` matrix."""
    check_real("precond", precond, "[d, d] or [batch, d, d]")
    if precond.shape not in ((n_dims, n_dims), (batch, n_dims, n_dims)):
        raise InputError(f"precond must have shape ({n_dims}, {n_dims}) or ({batch}, {n_dims}, "
                         f"{n_dims}), got {tuple(precond.shape)}")
    m = precond.to(torch.float64)
    for held, root in _ROOTS:
        if _same(held, m):
            return root
    if not all_finite(m):
        raise InputError("precond must be finite (found NaN or Inf)")
    if not torch.allclose(m, m.transpose(-1, -2), rtol=1e-6, atol=1e-10):
        raise InputError("precond must be symmetric")
    lam, v = torch.linalg.eigh(m)
    if not bool((lam > 0).all()):
        raise InputError(f"precond must be positive definite, smallest eigenvalue "
                         f"{lam.min().item():.3g}")
    root = (v * lam.sqrt().unsqueeze(-2)) @ v.transpose(-1, -2)
    _ROOTS[:] = [(m.clone(), root)]
    return root


#: the last preconditioned data and their prefix statistics: `align` runs pGD at many step
#: sizes on one batch (its family, and the step sizes fitted to each layer), and the
#: decomposition of every prefix is most of each run's time
_LAST: list[tuple[Tensor, Tensor, PrefixStats]] = []


def _moved_stats(moved: Tensor, ys: Tensor) -> PrefixStats:
    """``prefix_stats(moved, ys)``, the last call's where both are equal to its (compared exactly).

    The same numbers as computing them again: the statistics are a function of the data.
    """
    for x, y, stats in _LAST:
        if _same(x, moved) and _same(y, ys):
            return stats
    stats = prefix_stats(moved, ys)
    _LAST[:] = [(moved.clone(), ys.clone(), stats)]
    return stats


def _same(held: Tensor, new: Tensor) -> bool:
    """Whether ``new`` is ``held`` number for number, on its device and in its dtype.

    ``torch.equal`` alone raises on tensors of two devices (a CPU call's cache met by a
    CUDA call) and holds 1.0 in float32 equal to 1.0 in float64.
    """
    return (held.device == new.device and held.dtype == new.dtype
            and held.shape == new.shape and torch.equal(held, new))


def _identity_multiple(m: Tensor) -> float | None:
    """The number a where every matrix of ``m`` equals ``a·I`` exactly, else None."""
    if m.numel() == 0:
        return None
    a = m.reshape(-1)[0]
    eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
    return float(a) if torch.equal(m, (a * eye).expand_as(m)) else None


@register("pgd", label="GD preconditioned by Σ⁻¹", steps=GD_LOG_GRID, step_scale="log2",
          align_hyper={"precond": "inverse_cov", "lr": "max", "normalize": True}, align=True,
          order=3, compare_with=(), family=families.PGD)
def pgd(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
        precond: Tensor | None = None, lr: LrSpec = 1.0, normalize: bool = True,
        weights: bool = True, stats: PrefixStats | None = None,
        lr_scale: float = 1.0) -> Iterates:
    """Preconditioned GD ``w <- w − η M ∇R(w)`` from 0 (e.g. M = Σ⁻¹ or Ahn's Γ⁻¹).

    Runs GD on ``x' = M^{1/2} x``, where it is plain GD, and maps back ``w = M^{1/2} v``.
    The stability bound on lr is that of GD on ``x'`` (the preconditioned Hessian).

    Args:
        lr_scale: multiplies a number or "max" lr (``lr="max", lr_scale=0.5``: 0.5/λ_max
            of each prefix's preconditioned Hessian).
        stats: ``prefix_stats(xs, ys)`` to share with other learners. Used when M = a·I
            exactly (Σ⁻¹ of isotropic data) and lr is a number or "max": pgd is then GD
            with step η·a and needs no decomposition of its own; otherwise ignored.
    """
    if precond is None:
        raise InputError("pgd needs precond, a symmetric positive-definite [d, d] matrix")
    check_regression(xs, ys)
    root = _matrix_sqrt(precond, xs.shape[-1], xs.shape[0])
    x64 = xs.to(torch.float64)
    a = _identity_multiple(precond.to(torch.float64)) \
        if not (isinstance(lr, str) and lr == "tuned") else None
    if a is not None:
        it = gd_core(x64, ys.to(torch.float64), steps, lr, normalize, weights, stats, None,
                     None, name="pgd", dtype=out_dtype(xs), lr_factor=a, lr_scale=lr_scale)
    else:
        moved = torch.einsum("bnd,de->bne" if root.ndim == 2 else "bnd,bde->bne", x64, root)
        eq = "kbnd,ed->kbne" if root.ndim == 2 else "kbnd,bed->kbne"
        y64 = ys.to(torch.float64)
        it = gd_core(moved, y64, steps, lr, normalize, weights, _moved_stats(moved, y64), None,
                     None, name="pgd", dtype=out_dtype(xs),
                     map_weights=lambda v: torch.einsum(eq, v, root), lr_scale=lr_scale)
    # a copy of the tensor, not a nested list: per-sequence preconditioners ([batch, d, d])
    # took longer to list than the run itself
    it.hyper["precond"] = precond.detach().clone()
    return it
