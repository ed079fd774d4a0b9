"""Newton–Schulz, CG and heavy-ball momentum as recurrences in each prefix's eigenbasis.

In ``S_t = V Λ Vᵀ`` a step updates the coefficients ``u = Vᵀ w`` (Newton's ``m`` with
``u = m ⊙ Vᵀb``) elementwise: O(d) per prefix, in place on ``[batch, pos, n_dims]``
tensors. The prediction ``uᵀ Vᵀ x_t`` is taken at each wanted step count, the weights
``V u`` only when asked. The direct matrix iterations in `iclprobe.algorithms.reference`
are the check. Axis legend: ``step``, ``batch``, ``pos`` (prefix t), ``n_dims``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
from torch import Tensor

from iclprobe.algorithms.base import (
    Iterates,
    check_positive,
    check_steps,
    finish,
    out_dtype,
    register,
    rescale,
)
from iclprobe.algorithms.learners import (
    GD_LOG_GRID,
    NEWTON_ALPHAS,
    LrSpec,
    _above_bound,
    _gd_bound,
    _lr,
    _scale,
    _stats,
)
from iclprobe.algorithms.prefix import PrefixStats, from_eigenbasis, safe_inverse

State = TypeVar("State")


def _run_recurrence(stats: PrefixStats, k_steps: Tensor, state: State,
                    advance: Callable[[State], State], coef_of: Callable[[State], Tensor],
                    want_weights: bool) -> tuple[Tensor, Tensor | None]:
    """Advance ``state`` step by step; record predictions at the requested step counts.

    ``advance`` may update the state in place, and ``coef_of`` may return a reused buffer:
    what is recorded is computed before the next step.
    """
    wanted, work = k_steps.tolist(), torch.empty_like(stats.query_eig)
    preds = work.new_empty(len(wanted), *work.shape[:2])  # [step, batch, pos]
    coefs = work.new_empty(len(wanted), *work.shape) if want_weights else None
    for k in range(max(wanted) + 1):
        slots = [i for i, want in enumerate(wanted) if want == k]
        if slots:
            coef = coef_of(state)
            pred = torch.mul(coef, stats.query_eig, out=work).sum(-1)
            for i in slots:
                preds[i] = pred
                if coefs is not None:
                    coefs[i] = coef
        if k < max(wanted):
            state = advance(state)
    return preds, (from_eigenbasis(stats, coefs) if coefs is not None else None)


@register("momentum", label="heavy-ball momentum", steps=GD_LOG_GRID, step_scale="log2",
          align_hyper={"lr": "max", "beta": 0.9})
def momentum(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None, lr: LrSpec = 0.1,
             beta: float = 0.9, normalize: bool = True, weights: bool = True,
             stats: PrefixStats | None = None) -> Iterates:
    """Heavy ball ``w_{k+1} = w_k − η ∇R(w_k) + β (w_k − w_{k−1})`` from w_0 = w_{−1} = 0.

    Stable iff ``η c λ < 2 (1 + β)`` for every eigenvalue λ of every prefix.
    """
    k_steps = check_steps(steps)
    if not (isinstance(beta, (int, float)) and 0 <= beta < 1):
        raise ValueError(f"beta must be a number in [0, 1), got {beta!r}")
    stats = _stats(xs, ys, stats)
    c = _scale(stats, normalize)
    rate = _lr(lr, stats, c)
    lam, b = stats.eigvals, stats.xty_eig

    def advance(state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        u, prev = state
        return u - rate * c * (lam * u - b) + beta * (u - prev), u

    def unstable() -> str | None:
        checked = [] if lr == "max" else [(lr, float(rate))]
        return _above_bound("lr", checked, _gd_bound(stats, c, 2.0 * (1 + beta)), stats, 2,
                            "2(1+β)/max(c·λ_max)")

    zero = torch.zeros_like(b)
    preds, w = _run_recurrence(stats, k_steps, (zero, zero), advance, lambda s: s[0], weights)
    return finish("momentum", k_steps, preds, w,
                  {"lr": lr, "beta": beta, "normalize": normalize}, out_dtype(xs),
                  (stats.x_scale, stats.y_scale), unstable)


@register("newton", label="Newton", steps=range(25), align_hyper={"alpha": "frobenius"},
          align=True, order=0)
def newton(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
           alpha: float | str = "frobenius", weights: bool = True,
           stats: PrefixStats | None = None) -> Iterates:
    """Newton–Schulz iteration for S⁺: ``M_0 = α Sᵀ``, ``M_{k+1} = M_k (2I − S M_k)``.

    ``w_k = M_k Xᵀy`` (step k ↔ M_k). In S's eigenbasis ``m_{k+1} = m_k (2 − λ m_k)`` and
    ``1 − λ m_{k+1} = (1 − λ m_k)²``, so it converges iff ``0 < α λ_max² < 2``.
    ``alpha``: "frobenius" = 1/‖SSᵀ‖_F (the default), "2/frobenius" = 2/‖SSᵀ‖_F (what Fu
    et al.'s evaluation code uses), "spectral" = 1/‖SSᵀ‖₂, or a number. The paper's own
    α = 2/‖SSᵀ‖₂ ("2/spectral") lies exactly on the divergence boundary: in the top
    eigendirection ``1 − λ m_k`` goes −1, 1, 1, … and never converges (in floating point,
    round-off ε grows as 2^k ε and lets it escape after ~30-50 steps). 2/‖SSᵀ‖_F converges
    whenever S has rank ≥ 2 (‖SSᵀ‖_F > λ_max²) and sits on the boundary at rank 1.
    A number above the boundary whose iterates overflow raises a ValueError.
    """
    k_steps = check_steps(steps)
    stats = _stats(xs, ys, stats)
    lam = stats.eigvals
    if alpha in NEWTON_ALPHAS:
        numerator, norm = NEWTON_ALPHAS[alpha]
        sq = lam.pow(2)  # the eigenvalues of S Sᵀ
        size = sq.pow(2).sum(-1, keepdim=True).sqrt() if norm == "fro" else sq[..., -1:]
        a: Tensor | float = numerator * safe_inverse(size)
    elif isinstance(alpha, str):
        raise ValueError(f"alpha must be one of {sorted(NEWTON_ALPHAS)} or a number > 0, "
                         f"got {alpha!r}")
    else:
        a = rescale(check_positive(alpha, "alpha"), stats.x_scale, 4)

    def unstable() -> str | None:
        top = lam[..., -1].max().item()
        bound = 2.0 / top**2 if top > 0 else math.inf
        checked = [(alpha, a)] if isinstance(a, float) else []
        return _above_bound("alpha", checked, bound, stats, 4, "2/max(λ_max²)")

    work, coef = torch.empty_like(lam), torch.empty_like(lam)

    def advance(m: Tensor) -> Tensor:  # m (2 − λ m), in place
        return m.mul_(torch.mul(lam, m, out=work).neg_().add_(2.0))

    preds, w = _run_recurrence(stats, k_steps, a * lam, advance,
                               lambda m: torch.mul(m, stats.xty_eig, out=coef), weights)
    return finish("newton", k_steps, preds, w, {"alpha": alpha}, out_dtype(xs),
                  (stats.x_scale, stats.y_scale), unstable)


@register("cg", label="CG", steps="cg", align=True, order=4)
def cg(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
       weights: bool = True,
       stats: PrefixStats | None = None) -> Iterates:
    """Conjugate gradient on the normal equations ``S w = Xᵀy`` from 0 (exact in ≤ d steps)."""
    k_steps = check_steps(steps)
    stats = _stats(xs, ys, stats)
    lam, b = stats.eigvals, stats.xty_eig
    floor = 1e-28 * b.pow(2).sum(-1, keepdim=True)  # residual norms below this: converged
    lam_p, work = torch.empty_like(b), torch.empty_like(b)

    def advance(state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:  # in place
        u, r, p, rr = state
        curv = torch.mul(lam, p, out=lam_p).mul(p).sum(-1, keepdim=True)
        live = (rr > floor) & (curv > 0)
        step = torch.where(live, rr / torch.where(live, curv, 1.0), 0.0)
        u.addcmul_(step, p)
        r.addcmul_(step, lam_p, value=-1.0)
        rr_new = torch.mul(r, r, out=work).sum(-1, keepdim=True)
        p.mul_(torch.where(live, rr_new / torch.where(live, rr, 1.0), 0.0)).add_(r)
        return u, r, p, rr_new

    start = (torch.zeros_like(b), b.clone(), b.clone(), b.pow(2).sum(-1, keepdim=True))
    preds, w = _run_recurrence(stats, k_steps, start, advance, lambda s: s[0], weights)
    return finish("cg", k_steps, preds, w, {}, out_dtype(xs), (stats.x_scale, stats.y_scale))


