"""What a learner's fitted family may depend on: the evaluation data and window.

`algorithms.families` builds each learner's variants from a `FamilyContext` (its step
size rules read the data's curvature; ridge's λ grid reads Σ's spread).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

from iclprobe.algorithms.prefix import PrefixStats

__all__ = ["FamilyContext"]


_Value = TypeVar("_Value")
#: Σ's eigenvalues spread by at most this share of the largest: Σ is a multiple of I (a
#: rotated s·I is off by ~1e-15 of its scale; a Σ given in float32, by ~1e-7; a learner
#: that differs from GD by that little differs by less than any answer resolves)
ISOTROPIC_TOL = 1e-6


def _once(method: Callable[[Any], _Value]) -> Callable[[Any], _Value]:
    """A method of no arguments computed once per context (the context is frozen)."""
    key = "_once_" + method.__name__

    @functools.wraps(method)
    def get(self: Any) -> _Value:
        if key not in self.__dict__:
            self.__dict__[key] = method(self)  # past the frozen __setattr__: a cache
        return self.__dict__[key]

    return get


@dataclasses.dataclass(frozen=True)
class FamilyContext:
    """What a family's variants may depend on: the evaluation data and window.

    ``stats``: ``prefix_stats`` of the evaluation batch (its moments are of the scaled data,
    ``xs / stats.x_scale``). ``cov``: the population covariance, ``[d, d]`` or
    ``[batch, d, d]``. ``window``: the positions ``(t_min, t_max)`` aligned.
    """

    stats: PrefixStats
    cov: Tensor
    window: tuple[int, int]

    @property
    def rows(self) -> slice:
        """The prefixes of the window with at least one example (t >= 1)."""
        return slice(max(self.window[0], 1), self.window[1] + 1)

    @_once
    def inside(self) -> Tensor:
        """``[pos]``: 1 inside the window (t >= 1), 0 elsewhere (float64)."""
        mask = torch.zeros(self.stats.counts.numel(), dtype=torch.float64)
        mask[self.rows] = 1.0
        return mask

    @_once
    def top_mean(self) -> float:
        """The largest λ_max(S_t/t) over the window, in the data's units (the mean loss's Hessian)."""
        t = self.stats.counts[self.rows].clamp(min=1)
        top = self.stats.eigvals[:, self.rows, -1] / t
        return _positive(top) * self.stats.x_scale**2

    @_once
    def top_sum(self) -> float:
        """The largest λ_max(S_t) over the window, in the data's units (the summed loss's Hessian)."""
        return _positive(self.stats.eigvals[:, self.rows, -1]) * self.stats.x_scale**2

    @_once
    def spread(self) -> float:
        """Σ's largest eigenvalue over its mean eigenvalue, the largest over the batch (>= 1)."""
        eig = torch.linalg.eigvalsh(self.cov.to(torch.float64))  # basis-free: values only
        ratio = eig[..., -1] / eig.mean(-1).clamp(min=torch.finfo(torch.float64).tiny)
        return max(float(ratio.max()), 1.0)

    @_once
    def isotropic(self) -> bool:
        """Whether Σ is a multiple of I in every sequence, to round-off (`ISOTROPIC_TOL`).

        Judged on Σ's eigenvalues (basis-free): spread by at most `ISOTROPIC_TOL` of the
        largest. A rotated Σ = s·I (a designed isotropic distribution at another scale)
        carries round-off of ~1e-16 off its diagonal, which an entrywise test against
        s·I with no absolute tolerance takes for structure.
        """
        eig = torch.linalg.eigvalsh(self.cov.to(torch.float64))
        spread = eig[..., -1] - eig[..., 0]
        return bool((spread <= ISOTROPIC_TOL * eig[..., -1].abs()).all())

    @_once
    def mean_eigenvalue(self) -> float:
        """The mean eigenvalue of S_t/t over the window's prefixes, in the data's units."""
        t = self.stats.counts[self.rows].clamp(min=1)
        mean = self.stats.eigvals[:, self.rows].mean(-1) / t
        return float(mean.mean()) * self.stats.x_scale**2 if mean.numel() else 1.0


def _positive(values: Tensor) -> float:
    top = float(values.max()) if values.numel() else 1.0
    return top if top > 0 else 1.0
