"""Preconditioner analysis of a `PQTransformer` (Ahn et al. 2023)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from iclprobe.errors import InputError, InputTypeError
from iclprobe.models.pq import PQTransformer

PRIORS = ("standard", "inverse-cov")


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


def ahn_optimum(cov: Tensor, n: int, prior: str = "standard") -> Tensor:
    """The optimal one-layer preconditioner for n context examples (Ahn et al., Thm. 1).

    ``prior="standard"`` (w ~ N(0, I)): Γ⁻¹ with Γ = ((n+1)/n) Σ + (tr Σ / n) I.
    ``prior="inverse-cov"`` (w ~ N(0, Σ⁻¹)): n/(n+d+1) Σ⁻¹.
    """
    if not isinstance(n, int) or n <= 0:
        raise InputError(f"n must be a positive integer, got {n!r}")
    if prior not in PRIORS:
        raise InputError(f"prior must be one of {PRIORS}, got {prior!r}")
    cov = cov.to(torch.float64)
    d = cov.shape[-1]
    if prior == "inverse-cov":
        return n / (n + d + 1) * torch.linalg.inv(cov)
    eye = torch.eye(d, dtype=torch.float64)
    gamma = (n + 1) / n * cov + torch.diagonal(cov).sum() / n * eye
    return torch.linalg.inv(gamma)


@dataclasses.dataclass
class PreconditionerAnalysis:
    """Per layer: distance of A_l to Σ⁻¹ (with the scale a_l) and to the identity."""

    dist_to_inv_cov: list[float]
    scale: list[float]  # a_l: A_l ≈ a_l Σ⁻¹
    dist_to_identity: list[float]
    identity_scale: list[float]
    dist_to_optimum: float | None  # one-layer models: distance to Ahn's optimum
    rel_error_to_optimum: float | None  # ‖A − A*‖ / ‖A*‖
    n_context: int | None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


def analyze_preconditioners(model: PQTransformer, cov: Tensor | None = None,
                            n_context: int | None = None,
                            prior: str | None = None) -> PreconditionerAnalysis:
    """Distances of every A_l to Σ⁻¹ and to I; for one layer, to Ahn et al.'s optimum.

    Σ, n and the prior default to the model's task (n = n_points − 1 context examples).
    """
    task = getattr(model, "task", None)
    if cov is None:
        cov = task.covariance if task is not None else None
        if cov is None:
            raise InputError("cov is required: the model's task has no fixed covariance")
    pre = preconditioners(model)
    d = model.cfg.n_dims
    inv = torch.linalg.inv(cov.to(torch.float64))
    dist_s, scale_s = distance(pre.A, inv)
    dist_i, scale_i = distance(pre.A, torch.eye(d, dtype=torch.float64))
    opt_dist = opt_rel = None
    if n_context is None and task is not None:
        n_context = task.n_points - 1
    if model.cfg.n_layers == 1 and n_context:
        w_prior = prior or (task.w_prior if task is not None else "standard")
        opt = ahn_optimum(cov, n_context, w_prior)
        a = pre.A[0].to(torch.float64)
        opt_dist = float(distance(a, opt)[0])
        opt_rel = float((a - opt).norm() / opt.norm())
    return PreconditionerAnalysis(dist_s.tolist(), scale_s.tolist(), dist_i.tolist(),
                                  scale_i.tolist(), opt_dist, opt_rel, n_context)
