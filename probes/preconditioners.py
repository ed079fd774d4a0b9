"""Preconditioner analysis of a `PQTransformer` (Ahn et al. 2023)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from iclprobe.errors import InputError, InputTypeError
from iclprobe.models.pq import PQTransformer

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


def distance(a: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """``min_α ‖A − αM‖_F / ‖A‖_F`` and the minimizing α = ⟨A, M⟩ / ⟨M, M⟩ (broadcasting)."""
    a, m = a.to(torch.float64), m.to(torch.float64)
    if a.shape[-2:] != m.shape[-2:] or a.shape[-1] != a.shape[-2]:
        raise InputError(f"A and M must be square matrices of one size, got "
                         f"{tuple(a.shape)} and {tuple(m.shape)}")
    alpha = (a * m).sum((-1, -2)) / (m * m).sum((-1, -2))
    resid = a - alpha[..., None, None] * m
    norm = a.norm(dim=(-1, -2))
    return resid.norm(dim=(-1, -2)) / torch.where(norm > 0, norm, 1.0), alpha


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
    """
    if not isinstance(n, int) or n <= 0:
        raise InputError(f"n must be a positive integer, got {n!r}")
    if prior not in PRIORS:
        raise InputError(f"prior must be one of {PRIORS}, got {prior!r}")
    if not (isinstance(noise_std, (int, float)) and noise_std >= 0):
        raise InputError(f"noise_std must be a number >= 0, got {noise_std!r}")
    cov = cov.to(torch.float64)
    d = cov.shape[-1]
    if w_cov is None:
        if prior == "rotated":
            raise InputError("prior 'rotated' needs w_cov, the prior's covariance Σ_w (a "
                             "task's w_covariance)")
        w_cov = torch.eye(d, dtype=torch.float64) if prior == "standard" else torch.linalg.inv(cov)
    w_cov = w_cov.to(torch.float64)
    if w_cov.shape != cov.shape:
        raise InputError(f"w_cov must have Σ's shape {tuple(cov.shape)}, got {tuple(w_cov.shape)}")
    trace = torch.trace(cov @ w_cov) + noise_std**2
    gamma = (n + 1) / n * cov + trace / n * torch.linalg.inv(w_cov)
    out = torch.linalg.inv((gamma + gamma.T) / 2)
    return (out + out.T) / 2


@dataclasses.dataclass
class Definiteness:
    """Is each A_l positive definite (xᵀ A x > 0 for all x ≠ 0)? Its symmetric part says."""

    eigenvalues: Tensor  # [layer, d]: of (A_l + A_lᵀ)/2, ascending
    smallest: Tensor  # [layer]: the smallest; > 0 iff A_l is positive definite
    skew_ratio: Tensor  # [layer]: ‖(A_l − A_lᵀ)/2‖_F / ‖A_l‖_F (0: symmetric)


def definiteness(a: Tensor) -> Definiteness:
    """The symmetric part's spectrum and the skew part's share of ``a [..., d, d]``."""
    a = a.to(torch.float64)
    sym, skew = (a + a.transpose(-1, -2)) / 2, (a - a.transpose(-1, -2)) / 2
    eig = torch.linalg.eigvalsh(sym)
    norm = a.norm(dim=(-1, -2))
    return Definiteness(eig, eig[..., 0], skew.norm(dim=(-1, -2)) / torch.where(norm > 0, norm, 1.0))


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
                            prior: str | None = None) -> PreconditionerAnalysis:
    """Distances of every A_l to Σ⁻¹ and to I; for one layer, to the optimum `ahn_optimum`.

    Σ, n, the prior (its Σ_w) and the label noise default to the model's task (n =
    n_points − 1 context examples). Also each A_l's definiteness (`definiteness`).
    """
    pre = preconditioners(model)  # a PQ model's A_l, else the error that says it needs one
    task = getattr(model, "task", None)
    if cov is None:
        cov = task.covariance if task is not None else None
        if cov is None:
            raise InputError("cov is required: the model's task has no fixed covariance")
    d = model.cfg.n_dims
    inv = torch.linalg.inv(cov.to(torch.float64))
    dist_s, scale_s = distance(pre.A, inv)
    dist_i, scale_i = distance(pre.A, torch.eye(d, dtype=torch.float64))
    opt_dist = opt_rel = None
    if n_context is None and task is not None:
        n_context = task.n_points - 1
    if model.cfg.n_layers == 1 and n_context:
        w_prior = prior or (task.w_prior if task is not None else "standard")
        w_cov = task.w_covariance if task is not None and prior is None else None
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
