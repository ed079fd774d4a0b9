"""Preconditioner analysis of a `PQTransformer` (Ahn et al. 2023)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from iclprobe._checks import check_choice, check_int
from iclprobe._checks import check_real as check_number
from iclprobe._finite import all_finite
from iclprobe.algorithms.prefix import check_real
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models.pq import PQTransformer
from iclprobe.tasks.covariance import check_covariance

PRIORS = ("standard", "inverse-cov", "rotated")


@dataclasses.dataclass
class Preconditioners:
    """A_l and B_l per layer: heads summed (``[layer, d, d]``) and per head."""

    A: Tensor  # [layer, d, d]
    B: Tensor  # [layer, d, d]
    A_heads: Tensor  # [layer, head, d, d]
    B_heads: Tensor  # [layer, head, d, d]


def preconditioners(model: PQTransformer) -> Preconditioners:
    """Read A_l (= −Q[:d, :d]) and B_l (= P[:d, :d]) out of every layer."""
    if not callable(getattr(model, "matrices", None)):
        raise InputTypeError(f"model must have PQ matrices (a PQTransformer), got "
                        f"{type(model).__name__}")
    if getattr(model.cfg, "n_state", 0):
        raise InputError(f"preconditioners: a PQ model with n_state={model.cfg.n_state} state "
                         "channels does not compute w <- w - A ∇R(w) on (x, y); A and B are "
                         "defined for n_state = 0 only")
    p, q = (m.detach() for m in model.matrices())
    d = model.cfg.n_dims
    a_heads, b_heads = -q[..., :d, :d], p[..., :d, :d]
    return Preconditioners(a_heads.sum(1), b_heads.sum(1), a_heads, b_heads)


def _matrices(who: str, name: str, value: Any) -> Tensor:
    """``value`` in float64 if it is a finite real tensor of square matrices ``[..., d, d]``."""
    check_real(f"{who}: {name}", value, "[..., d, d]")
    if value.ndim < 2 or value.shape[-1] != value.shape[-2] or value.shape[-1] == 0:
        raise InputError(f"{who}: {name} must be square matrices [..., d, d] with d >= 1, got "
                         f"shape {tuple(value.shape)}")
    if not all_finite(value):
        raise InputError(f"{who}: {name} must be finite, found NaN or Inf")
    return value.to(torch.float64)


def _nonzero(who: str, name: str, sq_norm: Tensor, why: str) -> None:
    """Refuse a matrix of ``name`` whose squared norm (per batch index) is 0."""
    zero = (sq_norm == 0).nonzero()
    if len(zero):
        at = f"[{', '.join(map(str, zero[0].tolist()))}]" if sq_norm.ndim else ""
        raise InputError(f"{who}: {name}{at} is 0 (or so small that its squared norm "
                         f"underflows): {why}")


def distance(a: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """``min_α ‖A − αM‖_F / ‖A‖_F`` and the minimizing α = ⟨A, M⟩ / ⟨M, M⟩ (broadcasting).

    ``a`` (A) and ``m`` (M) are finite ``[..., d, d]`` tensors. α divides by ⟨M, M⟩, so an
    M of 0 is refused; an A of 0 is 0 · M exactly, at distance 0 with α = 0 (a model's B_l
    that is 0 by construction, Ahn et al.'s sparse layers).
    """
    a, m = _matrices("distance", "a", a), _matrices("distance", "m", m)
    try:
        torch.broadcast_shapes(a.shape, m.shape)
    except RuntimeError:
        ok = False
    else:
        ok = a.shape[-1] == m.shape[-1]
    if not ok:
        raise InputError(f"A and M must be square matrices of one size, got "
                         f"{tuple(a.shape)} and {tuple(m.shape)}")
    _nonzero("distance", "m", m.square().sum((-1, -2)), "the scale α = ⟨A, M⟩ / ⟨M, M⟩ is "
             "undefined for M = 0")
    alpha = (a * m).sum((-1, -2)) / (m * m).sum((-1, -2))
    resid = a - alpha[..., None, None] * m
    norm = a.norm(dim=(-1, -2))  # A = 0 is 0 · M exactly: distance 0 (a B_l of 0, say)
    dist = resid.norm(dim=(-1, -2)) / torch.where(norm > 0, norm, 1.0)
    if not (all_finite(dist) and all_finite(alpha)):
        raise InputError("distance: a and m overflow float64 (⟨A, M⟩ or ‖A − αM‖ is "
                         "infinite); rescale them")
    return dist, alpha


def _covariance(who: str, name: str, value: Any, d: int | None = None, of: str = "") -> Tensor:
    """A finite symmetric positive-definite ``[d, d]`` tensor, in float64 (a copy).

    ``d``: the size required (``of`` says whose it is), else any d >= 1.
    """
    check_real(f"{who}: {name}", value, "[d, d]")
    size = value.shape[-1] if d is None and value.ndim else d
    if value.ndim != 2 or value.shape != (size, size) or not size:
        expected = "a square [d, d] matrix with d >= 1" if d is None else f"[{d}, {d}]{of}"
        raise InputError(f"{who}: {name} must be {expected}, got shape {tuple(value.shape)}")
    return check_covariance(value, size, f"{who}: {name}", condition=False)


def ahn_optimum(cov: Tensor, n: int, prior: str = "standard", *, w_cov: Tensor | None = None,
                noise_std: float = 0.0) -> Tensor:
    """The optimal one-layer preconditioner for n context examples (Ahn et al., Thm. 1).

    One linear layer with B = 0 predicts ``ŷ = x_qᵀ A (1/n) Xᵀ y``. For x ~ N(0, Σ),
    w ~ N(0, Σ_w) and label noise of variance σ², the expected loss is quadratic in A and
    its minimizer is (derivation in docs/ahn-reviewers.md)::

        A* = ( ((n+1)/n) Σ + ((tr(Σ Σ_w) + σ²)/n) Σ_w⁻¹ )⁻¹

    ``prior="standard"`` (Σ_w = I, σ = 0): Γ⁻¹ with Γ = ((n+1)/n) Σ + (tr Σ / n) I, Ahn et
    al.'s Theorem 1. ``prior="inverse-cov"`` (Σ_w = Σ⁻¹): n/(n+d+1) Σ⁻¹. ``w_cov`` gives Σ_w
    itself (any prior, e.g. a task's ``w_covariance``; required for ``"rotated"``).

    ``cov`` and ``w_cov`` must be finite symmetric positive-definite ``[d, d]`` tensors.
    """
    who = "ahn_optimum"
    check_int(who, "n", n)
    check_choice(who, "prior", prior, PRIORS)
    check_number(who, "noise_std", noise_std, 0.0)
    cov = _covariance(who, "cov", cov)
    d = cov.shape[-1]
    if w_cov is None:
        if prior == "rotated":
            raise InputError("prior 'rotated' needs w_cov, the prior's covariance Σ_w (a "
                             "task's w_covariance)")
        w_cov = torch.eye(d, dtype=torch.float64) if prior == "standard" else torch.linalg.inv(cov)
    else:
        check_real(f"{who}: w_cov", w_cov, "[d, d]")
        if w_cov.shape != cov.shape:
            raise InputError(f"w_cov must have Σ's shape {tuple(cov.shape)}, got "
                             f"{tuple(w_cov.shape)}")
        w_cov = _covariance(who, "w_cov", w_cov, d)
    trace = torch.trace(cov @ w_cov) + noise_std**2
    gamma = (n + 1) / n * cov + trace / n * torch.linalg.inv(w_cov)
    out = torch.linalg.inv((gamma + gamma.T) / 2)
    if not all_finite(out):
        raise InputError(f"{who}: the optimum overflows float64 for cov and w_cov of these "
                         f"magnitudes (largest |cov| entry {cov.abs().max():.3g}); rescale them")
    return (out + out.T) / 2


@dataclasses.dataclass
class Definiteness:
    """Is each A_l positive definite (xᵀ A x > 0 for all x ≠ 0)? Its symmetric part says."""

    eigenvalues: Tensor  # [layer, d]: of (A_l + A_lᵀ)/2, ascending
    smallest: Tensor  # [layer]: the smallest; > 0 iff A_l is positive definite
    skew_ratio: Tensor  # [layer]: ‖(A_l − A_lᵀ)/2‖_F / ‖A_l‖_F (0: symmetric)


def definiteness(a: Tensor) -> Definiteness:
    """The symmetric part's spectrum and the skew part's share of ``a [..., d, d]``.

    ``a`` must be finite; the skew share of a zero matrix is 0 (it is symmetric).
    """
    a = _matrices("definiteness", "a", a)
    sym, skew = (a + a.transpose(-1, -2)) / 2, (a - a.transpose(-1, -2)) / 2
    eig = torch.linalg.eigvalsh(sym)
    norm = a.norm(dim=(-1, -2))
    skew_ratio = skew.norm(dim=(-1, -2)) / torch.where(norm > 0, norm, 1.0)
    return Definiteness(eig, eig[..., 0], skew_ratio)


@dataclasses.dataclass
class PreconditionerAnalysis:
    """Per layer: distance of A_l to Σ⁻¹ (with the scale a_l) and to the identity.

    And whether A_l is positive definite: the eigenvalues of its symmetric part (ascending),
    the smallest, and ‖skew part‖_F / ‖A_l‖_F (`definiteness`).
    """

    dist_to_inv_cov: list[float]
    scale: list[float]  # a_l: A_l ≈ a_l Σ⁻¹
    dist_to_identity: list[float]
    identity_scale: list[float]
    dist_to_optimum: float | None  # one-layer models: distance to Ahn's optimum
    rel_error_to_optimum: float | None  # ‖A − A*‖ / ‖A*‖
    n_context: int | None
    sym_eigenvalues: list[list[float]] = dataclasses.field(default_factory=list)
    min_sym_eigenvalue: list[float] = dataclasses.field(default_factory=list)
    skew_ratio: list[float] = dataclasses.field(default_factory=list)

    @property
    def positive_definite(self) -> list[bool]:
        """Per layer: the symmetric part's smallest eigenvalue is above 0."""
        return [v > 0 for v in self.min_sym_eigenvalue]

    def summary(self, name: str) -> str:
        """One line: each A_l's smallest symmetric-part eigenvalue and the largest skew share."""
        mins = ", ".join(f"{v:.3g}" for v in self.min_sym_eigenvalue)
        bad = [str(i + 1) for i, ok in enumerate(self.positive_definite) if not ok]
        verdict = "positive definite" if not bad else "not PD at layer " + ", ".join(bad)
        return (f"{name}: λ_min(sym A_l) {mins}; max ‖skew‖/‖A‖ "
                f"{max(self.skew_ratio, default=0.0):.3f}: {verdict}")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


def analyze_preconditioners(model: PQTransformer, cov: Tensor | None = None,
                            n_context: int | None = None,
                            prior: str | None = None, *, w_cov: Tensor | None = None
                            ) -> PreconditionerAnalysis:
    """Distances of every A_l to Σ⁻¹ and to I; for one layer, to the optimum `ahn_optimum`.

    Σ, n, the prior (its Σ_w) and the label noise default to the model's task (n =
    n_points − 1 context examples). ``w_cov`` gives Σ_w itself (as `ahn_optimum`'s); a
    ``prior`` named without it has its own Σ_w (I, or ``cov``⁻¹), and ``"rotated"``, whose
    rotation is a task's, the task's where that is its prior (else it needs ``w_cov``). Also
    each A_l's definiteness (`definiteness`).
    """
    who = "analyze_preconditioners"
    pre = preconditioners(model)  # a PQ model's A_l, else the error that says it needs one
    task = getattr(model, "task", None)
    if cov is None:
        cov = task.covariance if task is not None else None
        if cov is None:
            raise InputError("cov is required: the model's task has no fixed covariance")
    d = model.cfg.n_dims
    cov = _covariance(who, "cov", cov, d, f" (the model's n_dims is {d})")
    if n_context is not None:
        check_int(who, "n_context", n_context)
    elif task is not None:
        n_context = task.n_points - 1
    if prior is not None:
        check_choice(who, "prior", prior, PRIORS)
    if w_cov is not None:  # checked where no optimum reads it too, as prior is
        check_real(f"{who}: w_cov", w_cov, "[d, d]")
        w_cov = _covariance(who, "w_cov", w_cov, d, f" (the model's n_dims is {d})")
    _check_layers(who, pre.A)
    dist_s, scale_s = distance(pre.A, torch.linalg.inv(cov))
    dist_i, scale_i = distance(pre.A, torch.eye(d, dtype=torch.float64))
    opt_dist = opt_rel = None
    if model.cfg.n_layers == 1 and n_context is not None:
        if n_context == 0:  # from the task: an explicit n_context is positive
            raise InputError(f"{who}: the model's task has n_points=1, no context example "
                             "before the query; the one-layer optimum needs n_context >= 1: "
                             "pass n_context")
        w_prior = prior or (task.w_prior if task is not None else "standard")
        if w_cov is None and task is not None and (prior is None or prior == task.w_prior
                                                   == "rotated"):
            w_cov = task.w_covariance  # the task's own prior, or its rotation
        if w_cov is None and w_prior == "rotated":
            raise InputError(f"{who}: prior 'rotated' needs w_cov, the prior's covariance Σ_w "
                             f"(a task's w_covariance): the model's task "
                             f"{'has none' if task is None else 'has prior ' + repr(task.w_prior)}")
        noise = float(task.noise_std) if task is not None else 0.0
        opt = ahn_optimum(cov, n_context, w_prior, w_cov=w_cov, noise_std=noise)
        a = pre.A[0].to(torch.float64)
        opt_dist = float(distance(a, opt)[0])
        opt_rel = float((a - opt).norm() / opt.norm())
    pd = definiteness(pre.A)
    return PreconditionerAnalysis(dist_s.tolist(), scale_s.tolist(), dist_i.tolist(),
                                  scale_i.tolist(), opt_dist, opt_rel, n_context,
                                  pd.eigenvalues.tolist(), pd.smallest.tolist(),
                                  pd.skew_ratio.tolist())


def _check_layers(who: str, a: Tensor) -> None:
    """Refuse a model whose A_l (``a [layer, d, d]``) is 0 or not finite at some layer.

    `distance` reads A = 0 as 0 · M (distance 0: a B_l of 0 by construction); the analysis
    would print that as "A_l ∝ Σ⁻¹", so it refuses such a layer instead.
    """
    sq = a.to(torch.float64).square().sum((-1, -2)).tolist()
    bad = [(layer + 1, v) for layer, v in enumerate(sq) if not (math.isfinite(v) and v > 0)]
    if bad:
        raise InputError(f"{who}: the model's A_l is 0 or not finite at layer(s) "
                         f"{[layer for layer, _ in bad]} (‖A_l‖_F² = "
                         f"{[v for _, v in bad]}): an A_l of 0 is 0 · M for every M, so "
                         "its distances to Σ⁻¹ and to I (0, by `distance`'s convention) "
                         "would call it proportional to both")
