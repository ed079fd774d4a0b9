"""CG and heavy-ball momentum as recurrences in each prefix's eigenbasis.

In ``S_t = V Λ Vᵀ`` a step updates the coefficients ``u = Vᵀ w`` elementwise: O(d) per
prefix, in place on ``[batch, pos, n_dims]`` tensors. The prediction ``uᵀ Vᵀ x_t`` is taken
at each wanted step count, the weights ``V u`` only when asked. (GD and Newton–Schulz
have closed forms: `iclprobe.algorithms.learners`.) Axis legend: ``step``, ``batch``,
``pos`` (prefix t), ``n_dims``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
from torch import Tensor

from iclprobe.algorithms.base import Iterates, check_steps, register
from iclprobe.algorithms.learners import (
    GD_LOG_GRID,
    LrSpec,
    _above_bound,
    _gd_bound,
    _lr,
    _scale,
    _stats,
)
from iclprobe.algorithms.numerics import finish, fixed_number, out_dtype
from iclprobe.algorithms.prefix import PrefixStats, by_blocks, from_eigenbasis
from iclprobe.errors import InputError

State = TypeVar("State")
CgState = tuple[Tensor, Tensor, Tensor, Tensor]  # u, residual r, direction p, ‖r‖²


def _run_recurrence(stats: PrefixStats, k_steps: Tensor, state: State,
                    advance: Callable[[State], State], coef_of: Callable[[State], Tensor],
                    want_weights: bool) -> tuple[Tensor, Tensor | None]:
    """Advance ``state`` step by step; record predictions at the requested step counts.

    ``advance`` may update the state in place, and ``coef_of`` may return a reused buffer:
    what is recorded is computed before the next step.
    """
    wanted, q = k_steps.tolist(), stats.query_eig
    work = torch.empty_like(q)
    preds = q.new_empty(len(wanted), *q.shape[:2])  # [step, batch, pos]
    coefs = q.new_empty(len(wanted), *q.shape) if want_weights else None
    for k in range(max(wanted) + 1):
        slots = [i for i, want in enumerate(wanted) if want == k]
        if slots:
            coef = coef_of(state)
            pred = torch.mul(coef, q, out=work).sum(-1)
            for i in slots:
                preds[i] = pred
                if coefs is not None:
                    coefs[i] = coef
        if k < max(wanted):
            state = advance(state)
    return preds, (from_eigenbasis(stats, coefs) if coefs is not None else None)


@register("momentum", label="heavy-ball momentum", steps=GD_LOG_GRID, step_scale="log2",
          align_hyper={"lr": "max", "beta": 0.9}, compare_with=())
def momentum(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None, lr: LrSpec = 0.1,
             beta: float = 0.9, normalize: bool = True, weights: bool = True,
             stats: PrefixStats | None = None) -> Iterates:
    """Heavy ball ``w_{k+1} = w_k − η ∇R(w_k) + β (w_k − w_{k−1})`` from w_0 = w_{−1} = 0.

    Stable iff ``η c λ < 2 (1 + β)`` for every eigenvalue λ of every prefix.
    """
    k_steps = check_steps(steps)
    if not (isinstance(beta, (int, float)) and 0 <= beta < 1):
        raise InputError(f"beta must be a number in [0, 1), got {beta!r}")
    stats = _stats(xs, ys, stats)
    c = _scale(stats, normalize)

    def run(block: PrefixStats) -> tuple[Tensor, Tensor | None]:
        rate, lam, b = _lr(lr, block, c), block.eigvals, block.xty_eig

        def advance(state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
            u, prev = state
            return u - rate * c * (lam * u - b) + beta * (u - prev), u

        zero = torch.zeros_like(b)
        return _run_recurrence(block, k_steps, (zero, zero), advance, lambda s: s[0], weights)

    def unstable() -> str | None:
        checked = [] if lr == "max" else [(lr, float(_lr(lr, stats, c)))]
        return _above_bound("lr", checked, _gd_bound(stats, c, 2.0 * (1 + beta)), stats, 2,
                            "2(1+β)/max(c·λ_max)")

    preds, w = by_blocks(stats, run)
    return finish("momentum", k_steps, preds, w,
                  {"lr": lr, "beta": beta, "normalize": normalize}, out_dtype(xs),
                  (stats.x_scale, stats.y_scale), unstable, ys=ys if fixed_number(lr) else None)


def _cg_block(stats: PrefixStats, k_steps: Tensor, want_weights: bool
              ) -> tuple[Tensor, Tensor | None]:
    """CG's predictions (and weights) on one block of sequences, in the eigenbasis."""
    lam, b = stats.eigvals, stats.xty_eig
    floor = 1e-28 * b.pow(2).sum(-1, keepdim=True)  # residual norms below this: converged
    lam_p, work = torch.empty_like(b), torch.empty_like(b)

    def sum_sq(v: Tensor, w: Tensor) -> Tensor:  # (v ⊙ w).sum, through the work buffer
        return torch.mul(v, w, out=work).sum(-1, keepdim=True)

    # In place, with the same roundings as the plain expressions (CG amplifies any change of
    # rounding on ill-conditioned prefixes): u + step p, r − (step λ) p, r + β p.
    def advance(state: CgState) -> CgState:
        u, r, p, rr = state
        curv = sum_sq(torch.mul(lam, p, out=lam_p), p)  # (λ p) p
        live = (rr > floor) & (curv > 0)
        step = torch.where(live, rr / torch.where(live, curv, 1.0), 0.0)
        u.add_(torch.mul(p, step, out=work))
        r.sub_(torch.mul(lam, step, out=work).mul_(p))
        rr_new = sum_sq(r, r)
        beta = torch.where(live, rr_new / torch.where(live, rr, 1.0), 0.0)
        return u, r, p.mul_(beta).add_(r), rr_new

    start: CgState = (torch.zeros_like(b), b.clone(), b.clone(), b.pow(2).sum(-1, keepdim=True))
    return _run_recurrence(stats, k_steps, start, advance, lambda s: s[0], want_weights)


@register("cg", label="CG", steps="cg", align=True, order=4, compare_with=())
def cg(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
       weights: bool = True,
       stats: PrefixStats | None = None) -> Iterates:
    """Conjugate gradient on the normal equations ``S w = Xᵀy`` from 0 (exact in ≤ d steps)."""
    k_steps = check_steps(steps)
    stats = _stats(xs, ys, stats)
    preds, w = by_blocks(stats, lambda block: _cg_block(block, k_steps, weights))
    return finish("cg", k_steps, preds, w, {}, out_dtype(xs), (stats.x_scale, stats.y_scale))


