"""Covariance constructions for the covariates x (Ahn et al. 2023, Fu et al. 2024).

Axis legend: ``batch`` sequences, ``n_dims`` (d) covariate dimension.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from iclprobe._checks import is_number
from iclprobe._finite import all_finite
from iclprobe.errors import InputError, InputTypeError

#: Σ's eigenvalues of Ahn et al.'s rotated setting at d = 5 (D = diag(1, 1, 1/2, 1/4, 1)).
AHN_ROTATED_EIGENVALUES = (1.0, 1.0, 0.25, 0.0625, 1.0)
#: Largest condition number of a task's Σ. Sampled batches are float32, whose rounding
#: (relative 6e-8 per entry) shifts Σ's smallest eigenvalues by ~4% at κ = 1e6 and makes
#: Σ indefinite (Cholesky fails) near κ = 1e7 and beyond.
MAX_CONDITION = 1e6


def random_orthogonal(
    n_dims: int, generator: torch.Generator, batch: tuple[int, ...] = ()
) -> Tensor:
    """Draw Haar-distributed orthogonal matrices ``[*batch, d, d]`` (QR with sign fix)."""
    gauss = torch.randn(*batch, n_dims, n_dims, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gauss)
    # Multiplying each column by sign(r_ii) makes the distribution exactly Haar.
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return q * signs.unsqueeze(-2)


def rotated_eigenvalues(n_dims: int, eigenvalues: tuple[float, ...] | None = None) -> Tensor:
    """Eigenvalues of Ahn et al.'s rotated Σ: given ones, or their d = 5 pattern repeated."""
    if eigenvalues is None:
        pattern = AHN_ROTATED_EIGENVALUES
        eigenvalues = tuple(pattern[i % len(pattern)] for i in range(n_dims))
    if len(eigenvalues) != n_dims:
        raise InputError(
            f"eigenvalues has {len(eigenvalues)} entries, expected n_dims={n_dims}"
        )
    return torch.tensor(check_eigenvalues(eigenvalues), dtype=torch.float64)


def check_eigenvalues(eigenvalues: Any) -> tuple[float, ...]:
    """Finite positive numbers whose ratio (the condition number) is at most 1e6."""
    values = tuple(eigenvalues) if isinstance(eigenvalues, (tuple, list)) else None
    if not values or not all(is_number(e) for e in values):
        raise InputTypeError(f"eigenvalues must be a non-empty sequence of numbers, got "
                        f"{eigenvalues!r}")
    if not all(math.isfinite(e) and e > 0 for e in values):
        raise InputError(f"eigenvalues must be finite and positive, got {list(values)}")
    _check_condition(max(values) / min(values), "eigenvalues")
    return tuple(float(e) for e in values)


def _check_condition(kappa: float, name: str) -> None:
    if not kappa <= MAX_CONDITION:
        raise InputError(f"{name}: condition number {kappa:.3g} is above {MAX_CONDITION:g}, "
                         "beyond which a sampled float32 Σ is no longer positive definite")


def ill_conditioned_eigenvalues(n_dims: int, condition_number: float) -> Tensor:
    """Fu et al.'s spectrum: the first ⌊d/2⌋ eigenvalues are κ times the rest; trace = d."""
    n_large = n_dims // 2
    eig = torch.ones(n_dims, dtype=torch.float64)
    eig[:n_large] = condition_number
    return eig * (n_dims / eig.sum())


def check_covariance(cov: Tensor, n_dims: int, name: str = "cov", batch: int | None = None,
                     condition: bool = True) -> Tensor:
    """Validate a symmetric positive-definite ``[d, d]`` matrix; return a float64 copy.

    A copy (never the caller's tensor): a task keeps Σ, and the caller's later changes to
    theirs must not reach it. ``batch``: ``[batch, d, d]`` (one Σ per sequence) is allowed
    too. ``condition``: also refuse a condition number above `MAX_CONDITION` (a Σ that only
    draws queries, already rounded to float32, need not).
    """
    if not isinstance(cov, Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor or a known name, got {type(cov).__name__}")
    shapes = [(n_dims, n_dims)] + ([(batch, n_dims, n_dims)] if batch is not None else [])
    if tuple(cov.shape) not in shapes:
        raise InputError(f"{name} has shape {tuple(cov.shape)}, expected "
                         f"{' or '.join(map(str, shapes))}")
    if cov.is_complex():
        raise InputTypeError(f"{name} must be real, got {cov.dtype}")
    cov = cov.detach().to(torch.float64, copy=True)
    if not all_finite(cov):
        raise InputError(f"{name} contains NaN or Inf")
    if not torch.allclose(cov, cov.mT, rtol=1e-6, atol=1e-8):  # Cholesky reads one triangle
        raise InputError(f"{name} must be symmetric, max |Σ - Σᵀ| = {(cov - cov.mT).abs().max():.3g}")
    eig = torch.linalg.eigvalsh(cov)
    smallest = eig.min().item()
    if smallest <= 0:
        raise InputError(f"{name} must be positive definite, smallest eigenvalue = {smallest:.3g}")
    if condition:
        _check_condition((eig[..., -1] / eig[..., 0]).max().item(), name)
    return cov


def symmetric_sqrt_pair(cov: Tensor) -> tuple[Tensor, Tensor]:
    """Σ^{1/2} and Σ^{-1/2}, the symmetric (principal) square roots of an SPD ``[d, d]`` Σ.

    Both are unique, so data drawn as ``x = Σ^{1/2} z`` are a function of the draws ``z``
    and of Σ alone: no eigenvector's sign, nor the basis LAPACK picks inside a repeated
    eigenvalue's eigenspace, reaches them (a factor ``V D^{1/2}`` would carry both). They
    are computed as ``V g(Λ) Vᵀ``, a product that does not depend on the basis chosen in
    exact arithmetic; in floating point another basis moves it by round-off (about 1e-15
    relative): float64 samples can differ in their last digits; float32 ones (the tasks'
    default) round that away unless a value lies within it of a rounding boundary.
    """
    sym = (cov + cov.transpose(-1, -2)) / 2
    diag = torch.diagonal(sym, dim1=-2, dim2=-1)
    if torch.equal(sym, torch.diag_embed(diag)):  # exact for a diagonal Σ (isotropic: I)
        return torch.diag_embed(diag.sqrt()), torch.diag_embed(diag.rsqrt())
    eig, vecs = torch.linalg.eigh(sym)
    eig = eig.clamp(min=torch.finfo(sym.dtype).tiny)

    def apply(values: Tensor) -> Tensor:
        out = (vecs * values.unsqueeze(-2)) @ vecs.transpose(-1, -2)
        return (out + out.transpose(-1, -2)) / 2

    return apply(eig.sqrt()), apply(eig.rsqrt())
