"""CG, heavy-ball momentum and GD++ elementwise in each prefix's eigenbasis.

In ``S_t = V Λ Vᵀ`` a step updates the coefficients ``u = Vᵀ w`` elementwise: O(d) per
prefix, in place on ``[batch, pos, n_dims]`` tensors. The prediction ``uᵀ Vᵀ x_t`` is taken
at each wanted step count, the weights ``V u`` only when asked. Heavy ball has a closed
form (powers of a 2×2 matrix per eigenvalue, by repeated squaring); CG and GD++ are
recurrences. (GD and Newton–Schulz have closed forms: `iclprobe.algorithms.learners`.)
Axis legend: ``step``, ``batch``, ``pos`` (prefix t), ``n_dims``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
from torch import Tensor

from iclprobe.algorithms import families
from iclprobe.algorithms.base import Iterates, check_steps, register
from iclprobe.algorithms.learners import (
    GD_LOG_GRID,
    LrSpec,
    _above_bound,
    _gd_bound,
    _lr,
    _per_prefix,
    _scale,
)
from iclprobe.algorithms.numerics import (
    check_positive,
    finish,
    fixed_number,
    log2,
    out_dtype,
    rescale,
    scaled_number,
)
from iclprobe.algorithms.prefix import (
    PrefixStats,
    by_blocks,
    from_eigenbasis,
    given_stats,
    safe_inverse,
)
from iclprobe.algorithms.spectral import one_by_one, spectral_iterates
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


def heavy_ball_decays(rate: Tensor, beta: float, steps: list[int]) -> list[Tensor]:
    """Per step count k, ``r_k`` with ``u_k = (b/λ)(1 − r_k)``: heavy ball's closed form.

    With ``a = η c λ`` (``rate``, any shape) the error ``e_k = u_k − b/λ`` obeys
    ``e_{k+1} = (1 + β − a) e_k − β e_{k−1}`` from ``e_0 = e_{−1} = −b/λ``, so
    ``r_k = [M^k (1, 1)ᵀ]_0`` with ``M = [[1 + β − a, −β], [1, 0]]``. From one wanted step
    count to the next: one step of the recurrence where they are 1 apart, else the gap by
    squared powers of M (O(log gap) elementwise 2×2 products, powers only as far as the
    largest gap needs).
    """
    tau = (1.0 + beta) - rate
    wanted = sorted(set(steps))
    gaps = [k - at for at, k in zip([0, *wanted[:-1]], wanted)]
    powers = _matrix_powers(tau, beta, max(gaps, default=0)) if any(g > 1 for g in gaps) else []
    v0, v1 = torch.ones_like(rate), torch.ones_like(rate)
    out: dict[int, Tensor] = {}
    for k, gap in zip(wanted, gaps):
        if gap == 1:  # one step of the recurrence
            v0, v1 = torch.mul(tau, v0).sub_(v1, alpha=beta), v0
            gap = 0
        j = 0
        while gap:  # M^gap, a power of two at a time
            if gap & 1:
                p0, p1, p2, p3 = powers[j]
                v0, v1 = torch.addcmul(p0 * v0, p1, v1), torch.addcmul(p2 * v0, p3, v1)
            gap, j = gap >> 1, j + 1
        out[k] = v0
    # fresh tensors (the caller may work in place): each v0 above is one; a step count
    # asked for again gets a copy
    seen: set[int] = set()
    fresh = []
    for k in steps:
        fresh.append(out[k].clone() if k in seen or k == 0 else out[k])
        seen.add(k)
    return fresh


def _matrix_powers(tau: Tensor, beta: float, top: int) -> list[tuple[Tensor, ...]]:
    """``M^(2^j)`` for ``2^j <= top``, each as its entries ``(m00, m01, m10, m11)``."""
    powers: list[tuple[Tensor, ...]] = [
        (tau, torch.full_like(tau, -beta), torch.ones_like(tau), torch.zeros_like(tau))]
    while 2 ** len(powers) <= top:
        p0, p1, p2, p3 = powers[-1]
        cross, trace = p1 * p2, p0 + p3  # [[a, b], [c, d]]² = [[a² + bc, b(a+d)], [c(a+d), d² + bc]]
        powers.append((torch.addcmul(cross, p0, p0), p1 * trace, p2 * trace,
                       torch.addcmul(cross, p3, p3)))
    return powers


@register("momentum", label="heavy-ball momentum", steps=GD_LOG_GRID, step_scale="log2",
          align_hyper={"lr": "max", "beta": 0.9}, order=7, compare_with=(),
          family=families.MOMENTUM)
def momentum(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None, lr: LrSpec = 0.1,
             beta: float = 0.9, normalize: bool = True, weights: bool = True,
             stats: PrefixStats | None = None, lr_scale: float = 1.0) -> Iterates:
    """Heavy ball ``w_{k+1} = w_k − η ∇R(w_k) + β (w_k − w_{k−1})`` from w_0 = w_{−1} = 0.

    ``lr``: a number, "max" (1/λ_max of each prefix's Hessian) or a tensor ``[pos]`` of one
    step size per prefix; ``lr_scale`` multiplies it. Stable iff ``η c λ < 2 (1 + β)`` for
    every eigenvalue λ of every prefix. In closed form per eigenvalue
    (`heavy_ball_decays`).
    """
    k_steps = check_steps(steps)
    if not (isinstance(beta, (int, float)) and 0 <= beta < 1):
        raise InputError(f"beta must be a number in [0, 1), got {beta!r}")
    lr_scale = check_positive(lr_scale, "lr_scale")
    stats = given_stats(xs, ys, stats, "momentum")
    c = _scale(stats, normalize, "momentum")

    def decays(block: PrefixStats) -> Iterable[Tensor]:
        rate = _lr(lr, block, c) * lr_scale * c * block.eigvals
        return one_by_one(heavy_ball_decays(rate, float(beta), k_steps.tolist()))

    def unstable() -> str | None:
        if isinstance(lr, Tensor) or lr == "max":
            return None  # per prefix: "max" is stable below 2(1 + β), a tensor is the user's
        checked = [(lr, float(_lr(lr, stats, c)) * lr_scale)]
        return _above_bound("lr", checked, _gd_bound(stats, c, 2.0 * (1 + beta)), stats, 2,
                            "2(1+β)/max(c·λ_max)")

    preds, w = spectral_iterates(stats, decays, weights)
    return finish("momentum", k_steps, preds, w,
                  {"lr": lr.tolist() if isinstance(lr, Tensor) else lr, "beta": beta,
                   "normalize": normalize, **({"lr_scale": lr_scale} if lr_scale != 1.0 else {})},
                  out_dtype(xs),
                  (stats.x_scale, stats.y_scale), unstable, ys=ys if fixed_number(lr) else None)


def _cg_block(stats: PrefixStats, k_steps: Tensor, want_weights: bool
              ) -> tuple[Tensor, Tensor | None]:
    """CG's predictions (and weights) on one block of sequences, in the eigenbasis.

    CG's residuals are orthogonal in exact arithmetic; in floating point they lose it on
    ill-conditioned prefixes, and the plain recurrence then drifts from CG's iterates (by
    5·10⁻³ of the predictions' scale at step d − 1 on κ 1000 data, 2·10⁻² at step d, where
    CG has ended at OLS). So each new residual is orthogonalized twice against the earlier
    ones (full reorthogonalization, as in Lanczos): the iterates are exact CG's to
    round-off. From the step S_t's rank on (CG's end in exact arithmetic) the iterate is
    OLS's min-norm solution itself: a step past d is step d's (not run again: each step
    reorthogonalizes against every earlier one).
    """
    lam, b = stats.eigvals, stats.xty_eig
    k_steps = k_steps.clamp(max=lam.shape[-1])
    floor = 1e-28 * b.pow(2).sum(-1, keepdim=True)  # residual norms below this: converged
    lam_p, work = torch.empty_like(b), torch.empty_like(b)
    ols, rank = b * safe_inverse(lam), (lam > 0).sum(-1, keepdim=True)
    basis = b.new_empty(max(int(k_steps.max()), 1), *b.shape)  # the residuals, normalized
    taken = [0]  # steps taken: basis[:taken] are filled

    def sum_sq(v: Tensor, w: Tensor) -> Tensor:  # (v ⊙ w).sum, through the work buffer
        return torch.mul(v, w, out=work).sum(-1, keepdim=True)

    def advance(state: CgState) -> CgState:  # in place: u + step p, r − (step λ) p, r + β p
        u, r, p, rr = state
        curv = sum_sq(torch.mul(lam, p, out=lam_p), p)  # (λ p) p
        live = (rr > floor) & (curv > 0)
        step = torch.where(live, rr / torch.where(live, curv, 1.0), 0.0)
        torch.mul(r, torch.where(rr > 0, rr.rsqrt(), 0.0), out=basis[taken[0]])
        taken[0] += 1
        u.add_(torch.mul(p, step, out=work))
        r.sub_(torch.mul(lam, step, out=work).mul_(p))
        for _ in range(2):  # Gram–Schmidt twice is enough (Kahan, Parlett)
            for q in basis[:taken[0]]:
                r.sub_(torch.mul(q, sum_sq(q, r), out=lam_p))
        rr_new = sum_sq(r, r)
        beta = torch.where(live, rr_new / torch.where(live, rr, 1.0), 0.0)
        torch.where(rank <= taken[0], ols, u, out=u)  # CG has ended: OLS's solution
        return u, r, p.mul_(beta).add_(r), rr_new

    start: CgState = (torch.zeros_like(b), b.clone(), b.clone(), b.pow(2).sum(-1, keepdim=True))
    return _run_recurrence(stats, k_steps, start, advance, lambda s: s[0], want_weights)


@register("cg", label="CG", steps="cg", align=True, order=4, compare_with=(), family=families.CG)
def cg(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
       weights: bool = True,
       stats: PrefixStats | None = None) -> Iterates:
    """Conjugate gradient on the normal equations ``S w = Xᵀy`` from 0 (exact in ≤ d steps)."""
    k_steps = check_steps(steps)
    stats = given_stats(xs, ys, stats, "cg")
    preds, w = by_blocks(stats, lambda block: _cg_block(block, k_steps, weights))
    return finish("cg", k_steps, preds, w, {}, out_dtype(xs), (stats.x_scale, stats.y_scale))




GdppState = tuple[Tensor, Tensor, Tensor]  # u, h (the residual moment), c (the covariate map)
#: `align`'s tables run GD++ at η = 1/λ_max(S_t/t) per prefix (GD's "max") and γ this
#: multiple of it: its family's smallest γ multiple, away from γ → 0, where GD++ is GD
GDPP_GAMMA_SCALE = families.GDPP_GAMMAS[0]


@register("gd_plus_plus", label="GD++", steps=range(1, 9),
          align_hyper={"lr": "max", "gamma": "max", "gamma_scale": GDPP_GAMMA_SCALE},
          order=8, compare_with=(), family=families.GD_PLUS_PLUS)
def gd_plus_plus(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
                 lr: float | Tensor | str = 0.1, gamma: float | Tensor | str = 0.01,
                 weights: bool = True, stats: PrefixStats | None = None,
                 lr_scale: float = 1.0, gamma_scale: float = 1.0) -> Iterates:
    """GD++ (von Oswald et al.): a GD step, then the covariates map ``x <- (I − γ S/t) x``.

    Each step, with the current covariates, takes a GD step on the mean loss; then every
    covariate, the query's included, maps by ``I − γ S/t`` with S from the current context
    covariates. The PQ construction A = ηI, B = (γ/η) I computes exactly this.

    With C_k the accumulated map (x^(k) = C_k x) and h_k = C_k-free residual moment
    (h_0 = Xᵀy), ``g_k = C_k h_k / t``, ``h_{k+1} = h_k − η S C_kᵀ g_k``,
    ``C_{k+1} = (I − γ C_k S C_kᵀ / t) C_k``, and the predictor in the original coordinates
    is ``w_k = Σ_{m<k} η C_mᵀ g_m``. C_0 = I makes every C_k a polynomial in S, so in S's
    eigenbasis all of it is elementwise: ``c ← (1 − γ λ c²/t) c``, ``u ← u + η c² h/t``,
    ``h ← h (1 − η λ c²/t)``.

    ``lr`` and ``gamma``: numbers, tensors ``[pos]`` of one value per prefix (a prefix
    whose η is 0 takes no step: a model valid only at some positions is matched there), or
    "max": 1/λ_max(S_t/t) of each prefix, GD's "max" on the mean loss (relative to the data,
    so stable on data of any scale), times ``lr_scale`` and ``gamma_scale``. `align`'s
    tables run η "max" and γ `GDPP_GAMMA_SCALE` × "max"; a fixed number (0.1, the default)
    is in the data's units, and diverges on data whose curvature is past 2/η.
    """
    k_steps = check_steps(steps)
    stats = given_stats(xs, ys, stats, "gd_plus_plus")
    sx = stats.x_scale
    eta = _gdpp_rate(lr, stats, "lr", check_positive(lr_scale, "lr_scale"))  # scaled data
    gam = _gdpp_rate(gamma, stats, "gamma", check_positive(gamma_scale, "gamma_scale"))

    def run(block: PrefixStats) -> tuple[Tensor, Tensor | None]:
        lam, inv_t = block.eigvals, safe_inverse(block.counts)[:, None]  # [pos, 1]
        rule = safe_inverse(lam[..., -1:] * inv_t)  # 1/λ_max(S_t/t) [block, pos, 1]
        eta_b = rule * eta[1] if isinstance(eta, tuple) else eta
        gam_b = rule * gam[1] if isinstance(gam, tuple) else gam

        def advance(state: GdppState) -> GdppState:  # in place: the state is this run's
            u, h, c = state
            c2 = torch.mul(c, c).mul_(inv_t)
            u.add_(torch.mul(c2, h).mul_(eta_b))
            lam_c2 = c2.mul_(lam)
            h.mul_(torch.mul(lam_c2, eta_b).neg_().add_(1.0))
            c.mul_(lam_c2.mul_(gam_b).neg_().add_(1.0))
            return u, h, c

        start = (torch.zeros_like(lam), block.xty_eig.clone(), torch.ones_like(lam))
        return _run_recurrence(block, k_steps, start, advance, lambda s: s[0], weights)

    preds, w = by_blocks(stats, run)
    hyper = {name: v.tolist() if isinstance(v, Tensor) else v
             for name, v in (("lr", lr), ("gamma", gamma))}
    hyper.update({k: v for k, v in (("lr_scale", lr_scale), ("gamma_scale", gamma_scale))
                  if v != 1.0})
    return finish("gd_plus_plus", k_steps, preds, w, hyper, out_dtype(xs), (sx, stats.y_scale),
                  lambda: _gdpp_unstable(lr, gamma, lr_scale, gamma_scale, stats),
                  ys=ys if fixed_number(lr) or isinstance(lr, str) else None)


def _gdpp_unstable(lr: float | Tensor | str, gamma: float | Tensor | str, lr_scale: float,
                   gamma_scale: float, stats: PrefixStats) -> str | None:
    """Why GD++'s iterates grow, in the user's terms (None: per-prefix rates, the user's)."""
    if isinstance(lr, Tensor):
        return None  # per prefix: the user's (a model read at some positions only)

    def given(name: str, value: float | Tensor | str, scale: float) -> str:
        shown = "(one per prefix)" if isinstance(value, Tensor) else repr(value)
        return f"{name}={shown}" + (f" × {name}_scale={scale!r}" if scale != 1.0 else "")

    rates = f"{given('lr', lr, lr_scale)}, {given('gamma', gamma, gamma_scale)}"
    if isinstance(lr, str):
        return (f"{rates} make the iterates diverge on these data: lower them (GD's step "
                "alone is stable for lr_scale < 2; γ's map shrinks the covariates for "
                "gamma_scale < 1)")
    top = (safe_inverse(stats.counts) * stats.eigvals[..., -1]).max().item()
    bound = scaled_number(2.0 / top, -2 * log2(stats.x_scale)) if top > 0 else "inf"
    return (f"{rates} make the iterates diverge on these data: lower them (the GD step "
            f"alone is stable for lr{' × lr_scale' if lr_scale != 1.0 else ''} < "
            f"2/max(λ_max(S_t)/t) = {bound})")


def _gdpp_rate(value: float | Tensor | str, stats: PrefixStats, name: str, scale: float
               ) -> Tensor | float | tuple[str, float]:
    """GD++'s η or γ on the scaled data, times ``scale``.

    A number > 0 (γ >= 0); ``[pos]`` -> ``[pos, 1]``; "max" -> ``("max", scale)``, the
    rule 1/λ_max(S_t/t) applied per block of sequences (`gd_plus_plus`).
    """
    gamma = name == "gamma"
    if isinstance(value, str):
        if value != "max":
            raise InputError(f"{name} must be a number, a tensor [pos] or 'max', got {value!r}")
        return ("max", scale)
    if isinstance(value, Tensor):
        v = _per_prefix(value, stats.counts.numel(), name, 2, all_zero=gamma)
        return v[:, None] * stats.x_scale**2 * scale if bool(v.any()) else 0.0  # γ 0: GD
    return rescale(check_positive(value, name, allow_zero=gamma), stats.x_scale, 2) * scale
