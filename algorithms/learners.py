"""Learners in closed form in each prefix's eigenbasis: GD, preconditioned GD, Newton, OLS.

One eigendecomposition ``S_t = V Λ Vᵀ`` per prefix makes every learner elementwise on the
coefficients ``u = Vᵀ w`` with ``Λ`` diagonal. GD's k steps and Newton–Schulz's have closed
forms ``u = (β/λ)(1 − decay)``, so a step count costs one exponential and one dot product
per prefix, whatever k (CG and momentum are recurrences: `iclprobe.algorithms.recurrences`).
The direct matrix iterations in `iclprobe.algorithms.reference` are the check. Learners
computed on the same data can share one decomposition: pass ``stats=prefix_stats(xs, ys)``
to each.

Losses: with ``normalize=True`` the gradient is that of the mean loss,
``(1/t)(S_t w − b_t)`` (Ahn et al.); with ``normalize=False`` that of the sum,
``S_t w − b_t`` (Fu et al.'s code).

Hard data: everything runs in float64 (float16/bfloat16 input too; results are cast back,
and refused when they do not fit the input's dtype). Extreme scales are divided out by
powers of two (`PrefixStats`), with the hyperparameters mapped to match: ``lr -> lr s_x²``,
``alpha -> alpha s_x⁴``, ``lam -> lam / s_x²``. A fixed lr or alpha whose iterates overflow
raises a ValueError naming the largest stable value for the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from iclprobe._checks import check_bool
from iclprobe.algorithms import families
from iclprobe.algorithms.base import Iterates, check_steps, register
from iclprobe.algorithms.numerics import (
    check_positive,
    collect,
    finish,
    fixed_number,
    log2,
    out_dtype,
    rescale,
    scaled_number,
)
from iclprobe.algorithms.prefix import (
    PrefixStats,
    check_regression,
    given_stats,
    prefix_stats,
    safe_inverse,
)
from iclprobe.algorithms.spectral import one_by_one, power_decays, spectral_iterates
from iclprobe.errors import InputError

LrSpec = float | str | Tensor
GD_LOG_GRID = tuple(2**i for i in range(13))  # 2^0 … 2^12, Fu et al.'s grid
#: Newton–Schulz initial scalings: name -> (numerator, norm of S Sᵀ).
NEWTON_ALPHAS = {"frobenius": (1.0, "fro"), "2/frobenius": (2.0, "fro"),
                 "spectral": (1.0, "spectral"), "2/spectral": (2.0, "spectral")}


def _scale(stats: PrefixStats, normalize: bool, name: str = "gd") -> Tensor:
    """The gradient's scale c_t per prefix, ``[pos, 1]``: 1/t (mean loss) or 1 (sum)."""
    if not check_bool(name, "normalize", normalize):
        return torch.ones_like(stats.counts)[:, None]
    return safe_inverse(stats.counts)[:, None]


def _lr(lr: LrSpec, stats: PrefixStats, c: Tensor, name: str = "lr") -> Tensor | float:
    """The step size on the scaled data.

    A number (times s_x²), or "max": 1 / λ_max of the per-prefix Hessian c_t S_t (0 where
    S_t = 0).
    """
    if isinstance(lr, Tensor):  # one η_t per prefix, [pos] -> [pos, 1]
        return _per_prefix(lr, stats.counts.numel(), name, 2)[:, None] * stats.x_scale**2
    if lr == "max":
        return safe_inverse(c * stats.eigvals[..., -1:])
    if isinstance(lr, str):
        raise InputError(f"{name} must be a number > 0 or 'max' (gd also takes 'tuned'), got "
                         f"{lr!r}")
    return rescale(check_positive(lr, name), stats.x_scale, 2)


def _above_bound(name: str, rates: list[tuple[Any, float]], bound: float, stats: PrefixStats,
                 power: int, formula: str) -> str | None:
    """The divergence message when a rate (given, on the scaled data) reaches ``bound``.

    ``rates``: (the value as the user gave it, the value on the scaled data) pairs.
    """
    for given, rate in rates:
        if rate >= bound:
            largest = scaled_number(bound, -power * log2(stats.x_scale))
            return (f"{name}={given!r} diverges on these data (the iterates grow without "
                    f"bound): the largest stable {name} here is {formula} = {largest}")
    return None


def _gd_bound(stats: PrefixStats, c: Tensor, factor: float = 2.0) -> float:
    """``factor / max(c_t λ_max)`` over every prefix and sequence, on the scaled data."""
    top = (c * stats.eigvals[..., -1:]).max().item()
    return factor / top if top > 0 else math.inf


def gd_coefficients(stats: PrefixStats, c: Tensor, lr: Tensor | float, k: int) -> Tensor:
    """Closed form of k GD steps from 0: ``u_k = (β/λ)(1 − (1 − η c λ)^k)``."""
    lam = stats.eigvals
    decay = (1.0 - lr * c * lam) ** k
    return torch.where(lam > 0, stats.xty_eig * safe_inverse(lam) * (1.0 - decay), 0.0)


def _tune_gd(tune: PrefixStats, ys: Tensor, c: Tensor, steps: Tensor,
             grid: Iterable[float] | None) -> list[float]:
    """Per step count, the learning rate of ``grid`` with the least error on ``tune``.

    The rates are returned in the units of the data (not of ``tune``'s scaled copy).
    """
    lam_max = (c * tune.eigvals[..., -1:])[:, 1:].median().item()
    if not lam_max > 0:  # NaN: one position; 0: every x is 0 there
        raise InputError(f"tune_on's data give no curvature to tune the rate on (median "
                         f"λ_max {lam_max}): they need >= 2 positions and nonzero xs")
    factors = torch.as_tensor(list(grid) if grid is not None else
                              torch.logspace(-3, 0.5, 36).tolist(), dtype=torch.float64)
    if factors.ndim != 1 or factors.numel() == 0:
        raise InputError(f"grid must hold at least one learning-rate multiplier, got "
                         f"{list(grid) if grid is not None else grid!r}")
    if not bool((factors > 0).all()):
        raise InputError(f"grid must hold positive learning-rate multipliers, got "
                         f"{[float(f) for f in factors if not f > 0]} among them")
    candidates = factors / max(lam_max, 1e-300)
    target = ys.to(torch.float64) / tune.y_scale
    chosen = []
    for k in steps.tolist():
        errors = []
        for lr in candidates.tolist():
            preds = (gd_coefficients(tune, c, lr, k) * tune.query_eig).sum(-1)
            err = (preds - target)[:, 1:].pow(2).mean()
            errors.append(err.item() if torch.isfinite(err) else float("inf"))
        best = candidates[int(torch.tensor(errors).argmin())].item()
        chosen.append(rescale(best, tune.x_scale, -2))
    return chosen


def gd_core(xs: Tensor, ys: Tensor, steps: Iterable[int] | None, lr: LrSpec, normalize: bool,
            weights: bool, stats: PrefixStats | None, tune_on: tuple[Tensor, Tensor] | None,
            grid: Iterable[float] | None, name: str = "gd", dtype: torch.dtype | None = None,
            map_weights: Callable[[Tensor], Tensor] | None = None,
            lr_factor: float = 1.0, lr_scale: float = 1.0) -> Iterates:
    """`gd`, also as the inner solver of `pgd` (which names itself and maps the weights).

    ``lr_factor``: pgd's shortcut for a preconditioner ``a·I`` and a number or "max" lr:
    steps ``η a ∇R``, with lr, its checks and messages still in pgd's units.
    """
    k_steps = check_steps(steps)
    stats = given_stats(xs, ys, stats, name)
    c = _scale(stats, normalize, name)
    hyper: dict[str, Any] = {"lr": lr.tolist() if isinstance(lr, Tensor) else lr,
                             "normalize": normalize}
    lr_scale = check_positive(lr_scale, "lr_scale")
    if lr_scale != 1.0:
        hyper["lr_scale"] = lr_scale
    if isinstance(lr, str) and lr == "tuned":
        if lr_scale != 1.0:
            raise InputError(f"lr_scale={lr_scale} applies to a number or 'max', not to "
                             "lr='tuned'")
        if tune_on is None:
            half = xs.shape[0] // 2
            if half == 0:
                raise InputError("lr='tuned' needs tune_on=(xs, ys) or a batch of >= 2")
            tune_on = (xs[half:], ys[half:])
        if not (isinstance(tune_on, (tuple, list)) and len(tune_on) == 2):
            raise InputError(f"tune_on must be a pair (xs, ys), got {tune_on!r:.80}")
        check_regression(*tune_on)
        tune = prefix_stats(*tune_on)
        rates = _tune_gd(tune, tune_on[1], _scale(tune, normalize), k_steps, grid)
        hyper["lr"] = rates
        scaled_rates = [rescale(r, stats.x_scale, 2) for r in rates]
        checked: list[tuple[Any, float]] = list(zip(rates, scaled_rates))

        def decays(block: PrefixStats) -> Iterable[Tensor]:
            return one_by_one((1.0 - r * c * block.eigvals) ** k
                              for r, k in zip(scaled_rates, k_steps.tolist()))
    else:
        per_prefix = isinstance(lr, Tensor)
        is_max = not per_prefix and lr == "max"
        checked = [] if is_max or per_prefix else [(lr, float(_lr(lr, stats, c)) * lr_scale)]
        factor = (1.0 if is_max else lr_factor) * lr_scale  # "max": that of M ∇R already

        def decays(block: PrefixStats) -> Iterable[Tensor]:
            x = _lr(lr, block, c) * factor * c * block.eigvals  # η c λ
            return power_decays(x, [float(k) for k in k_steps.tolist()])
    preds, w = spectral_iterates(stats, decays, weights)

    def unstable() -> str | None:
        return _above_bound("lr", checked, _gd_bound(stats, c) / lr_factor, stats, 2,
                            "2/max(c·λ_max)")

    return finish(name, k_steps, preds, w, hyper, dtype or out_dtype(xs),
                  (stats.x_scale, stats.y_scale), unstable, map_weights,
                  ys=ys if fixed_number(lr) else None)


@register("gd", label="GD", steps=GD_LOG_GRID, step_scale="log2",
          align_hyper={"lr": "max", "normalize": True}, align=True, order=1, compare_with=(),
          family=families.GD)
def gd(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None, lr: LrSpec = 0.1,
       normalize: bool = True, weights: bool = True,
       stats: PrefixStats | None = None,
       tune_on: tuple[Tensor, Tensor] | None = None,
       grid: Iterable[float] | None = None, lr_scale: float = 1.0) -> Iterates:
    """Gradient descent from w = 0 (closed form per eigenvalue).

    Args:
        lr: a number; "max" (1/λ_max of each prefix's Hessian); a tensor ``[pos]`` of one
            step size per prefix (0: no step there); or "tuned": per step count,
            the best of ``grid`` (multipliers of 1/median λ_max) on ``tune_on = (xs, ys)``,
            or, without it, on the second half of the given batch. The values land in
            ``hyper["lr"]``. A number at or above 2/max(c·λ_max), the stability bound of
            these data, makes the iterates grow; if they overflow, a ValueError names it.
        normalize: gradient of the mean (True) or summed (False) squared loss.
        lr_scale: multiplies the step size of a number or "max" (``lr="max",
            lr_scale=0.5``: 0.5/λ_max of each prefix), e.g. a known-answer model that runs a
            protocol's rule at another scale.
    """
    return gd_core(xs, ys, steps, lr, normalize, weights, stats, tune_on, grid,
               lr_scale=lr_scale)


def _named_alpha(alpha: str, lam: Tensor) -> Tensor:
    """Newton's α per prefix for one of `NEWTON_ALPHAS`, from the eigenvalues ``lam`` of S."""
    numerator, norm = NEWTON_ALPHAS[alpha]
    sq = lam.pow(2)  # the eigenvalues of S Sᵀ
    size = sq.pow(2).sum(-1, keepdim=True).sqrt() if norm == "fro" else sq[..., -1:]
    return numerator * safe_inverse(size)


@register("newton", label="Newton", steps=range(25), align_hyper={"alpha": "frobenius"},
          align=True, order=0, compare_with=("gd", "online_gd"), family=families.NEWTON)
def newton(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
           alpha: float | str | Tensor = "frobenius", weights: bool = True,
           stats: PrefixStats | None = None, alpha_scale: float = 1.0) -> Iterates:
    """Newton–Schulz iteration for S⁺: ``M_0 = α Sᵀ``, ``M_{k+1} = M_k (2I − S M_k)``.

    ``w_k = M_k Xᵀy`` (step k ↔ M_k). In S's eigenbasis ``m_{k+1} = m_k (2 − λ m_k)`` and
    ``1 − λ m_{k+1} = (1 − λ m_k)²``: ``λ m_k = 1 − (1 − α λ²)^(2^k)``, computed in closed
    form like GD's (one exponential per step count). It converges iff ``0 < α λ_max² < 2``.
    ``alpha``: "frobenius" = 1/‖SSᵀ‖_F (the default, and what Fu et al.'s evaluation code
    uses), "2/frobenius" = 2/‖SSᵀ‖_F (their first commit's), "spectral" = 1/‖SSᵀ‖₂, a
    number, or a tensor ``[pos]`` of one α_t per prefix t (e.g. a/t², what a
    linear-attention Newton network computes; ``hyper["alpha"]`` then holds the list; 0 at a
    prefix: no step there); ``alpha_scale`` multiplies any of them (``alpha="frobenius",
    alpha_scale=0.5``: 0.5/‖SSᵀ‖_F). The paper's own
    α = 2/‖SSᵀ‖₂ ("2/spectral") lies exactly on the divergence boundary: in the top
    eigendirection ``1 − λ m_k`` goes −1, 1, 1, … and never converges (in floating point,
    round-off ε grows as 2^k ε and lets it escape after ~30-50 steps). 2/‖SSᵀ‖_F converges
    whenever S has rank ≥ 2 (‖SSᵀ‖_F > λ_max²) and sits on the boundary at rank 1.
    A number above the boundary whose iterates overflow raises a ValueError.
    """
    k_steps = check_steps(steps)
    stats = given_stats(xs, ys, stats, "newton")
    alpha_scale = check_positive(alpha_scale, "alpha_scale")
    if isinstance(alpha, str) and alpha not in NEWTON_ALPHAS:
        raise InputError(f"alpha must be one of {sorted(NEWTON_ALPHAS)}, a number > 0 or a "
                         f"tensor [pos] of numbers > 0, got {alpha!r}")
    per_prefix = _per_prefix_alpha(alpha, xs.shape[1], stats.x_scale) \
        if isinstance(alpha, Tensor) else None
    a = None if isinstance(alpha, (str, Tensor)) else rescale(check_positive(alpha, "alpha"),
                                                             stats.x_scale, 4)

    def unstable() -> str | None:
        if per_prefix is not None:
            worst = (alpha_scale * per_prefix[None, :] * stats.eigvals[..., -1] ** 2
                     ).max(0).values
            if bool((worst >= 2).any()):
                t = int(worst.argmax())
                return (f"alpha[{t}] diverges on these data (the iterates grow without "
                        f"bound): α_t must stay below 2/max(λ_max²) of prefix t")
            return None
        top = stats.eigvals[..., -1].max().item()
        bound = 2.0 / top**2 if top > 0 else math.inf
        checked = [(alpha, a * alpha_scale)] if a is not None else []
        return _above_bound("alpha", checked, bound, stats, 4, "2/max(λ_max²)")

    exponents = [2.0 ** min(k, 1000) for k in k_steps.tolist()]  # past 2^1000: converged

    def decays(block: PrefixStats) -> Iterable[Tensor]:
        lam = block.eigvals
        if per_prefix is not None:
            scale: Tensor | float = per_prefix[None, :, None]
        else:
            scale = a if a is not None else _named_alpha(str(alpha), lam)
        return power_decays(alpha_scale * scale * lam * lam, exponents)

    preds, w = spectral_iterates(stats, decays, weights)
    recorded: dict[str, Any] = {"alpha": alpha.tolist() if isinstance(alpha, Tensor) else alpha,
                                **({"alpha_scale": alpha_scale} if alpha_scale != 1.0 else {})}
    return finish("newton", k_steps, preds, w, recorded, out_dtype(xs),
                  (stats.x_scale, stats.y_scale), unstable, ys=ys if a is not None else None)


def _per_prefix(value: Tensor, n_points: int, name: str, power: int,
                all_zero: bool = False) -> Tensor:
    """A hyperparameter given per prefix t, ``[pos]``, checked, as float64.

    Prefixes with value 0 take no step (their iterates stay at the start): a model valid
    only at some positions is matched there alone. ``all_zero``: 0 at every prefix is
    allowed (GD++'s γ: no covariate map).
    """
    if value.shape != (n_points,) or value.is_complex() or value.dtype == torch.bool:
        raise InputError(f"{name} as a tensor must be real with shape ({n_points},), one value "
                         f"per prefix, got {value.dtype} of shape {tuple(value.shape)}")
    v = value.detach().to(torch.float64)
    if not bool((torch.isfinite(v) & (v >= 0)).all()) or not (all_zero or bool((v > 0).any())):
        raise InputError(f"{name} must be finite and >= 0 at every prefix"
                         f"{'' if all_zero else ' (> 0 somewhere)'}, got {v.tolist()}")
    return v


def _per_prefix_alpha(alpha: Tensor, n_points: int, x_scale: float) -> Tensor:
    """Newton's α_t as a float64 ``[pos]`` tensor on the scaled data (α scales as x⁻⁴)."""
    return _per_prefix(alpha, n_points, "alpha", 4) * x_scale**4


@register("ols", label="OLS", align=True, order=5, compare_with=(), family=families.OLS)
def ols(xs: Tensor, ys: Tensor, weights: bool = True,
        stats: PrefixStats | None = None) -> Iterates:
    """Min-norm least squares ``S_t⁺ Xᵀy`` at every prefix (also for t < d)."""
    stats = given_stats(xs, ys, stats, "ols")
    preds, w = collect(stats, [stats.xty_eig * safe_inverse(stats.eigvals)], weights)
    return finish("ols", torch.zeros(1, dtype=torch.int64), preds, w, {}, out_dtype(xs),
                  (stats.x_scale, stats.y_scale))


@register("ridge", label="ridge", align_hyper={"lam": 1.0}, order=6, compare_with=(),
          family=families.RIDGE)
def ridge(xs: Tensor, ys: Tensor, lam: float = 1.0, weights: bool = True,
          stats: PrefixStats | None = None) -> Iterates:
    """Ridge ``(S_t + λ I)⁻¹ Xᵀy``: minimizes ‖y − Xw‖² + λ‖w‖² (scikit-learn's alpha)."""
    lam = check_positive(lam, "lam")
    stats = given_stats(xs, ys, stats, "ridge")
    den = stats.eigvals + rescale(lam, stats.x_scale, -2)  # 0 only if λ underflowed and S_t = 0
    coef = torch.where(den > 0, stats.xty_eig / torch.where(den > 0, den, 1.0), 0.0)
    preds, w = collect(stats, [coef], weights)
    return finish("ridge", torch.zeros(1, dtype=torch.int64), preds, w, {"lam": lam},
                  out_dtype(xs), (stats.x_scale, stats.y_scale))
