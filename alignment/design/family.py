"""The family of evaluation distributions the designed evaluation chooses from.

Each `Distribution` is a `RegressionTask` of the model's dimension d: Σ's spectrum (κ and
the shape of its decay), the number of examples, label noise, and where the query is
drawn (see `iclprobe.alignment.design`). The prior of w is not a factor: it is the model's
own task's (w ~ N(0, Σ⁻¹) for the distribution's Σ where the own prior is "inverse-cov").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from iclprobe._checks import check_choice, check_int, check_real, check_seed, check_type
from iclprobe.errors import InputError, InputTypeError
from iclprobe.tasks import RegressionTask
from iclprobe.tasks.covariance import MAX_CONDITION, ill_conditioned_eigenvalues
from iclprobe.tasks.fields import QUERIES, W_PRIORS

#: The factors of the family, in the order the search takes them.
FACTORS = ("spectrum", "examples", "noise", "query")
#: How Σ's eigenvalues decay from 1 to 1/κ: geometric (κ^(−i/(d−1))) or linear. Both spread
#: them over d levels. A split spectrum (half 1, half 1/κ) was tried and dropped: with two
#: levels a learner's filter is judged at two points, and on the benchmark at κ 1000 GD's
#: family imitated the average of GD and Newton through probes (4 false attributions).
SHAPES = ("geometric", "linear")
#: The range of Σ's largest eigenvalue (after the scale) in which float32 data stay finite
#: and nonzero; condition numbers up to the tasks' `MAX_CONDITION`
TOP_RANGE = (1e-30, 1e30)


def spectrum(n_dims: int, condition_number: float, shape: str, top: float = 1.0
             ) -> tuple[float, ...]:
    """Σ's eigenvalues, largest first: ``top``, down to ``top / condition_number``."""
    check_int("spectrum", "n_dims", n_dims)
    check_choice("spectrum", "shape", shape, SHAPES)
    check_real("spectrum", "condition_number", condition_number, 1, MAX_CONDITION)
    check_real("spectrum", "top", top, 0, low_open=True)
    d = n_dims
    if shape == "geometric":
        raw = [condition_number ** (-i / (d - 1)) if d > 1 else 1.0 for i in range(d)]
    else:
        raw = [1.0 - (1.0 - 1.0 / condition_number) * i / (d - 1) if d > 1 else 1.0
               for i in range(d)]
    return tuple(top * v for v in raw)


@dataclasses.dataclass(frozen=True)
class Distribution:
    """One evaluation distribution of the family (see the module docstring)."""

    condition_number: float
    shape: str
    n_points: int
    noise_std: float
    query: str
    top: float = 1.0  # Σ's largest eigenvalue before `scale`: the model's own
    #: x and y multiplied by it (Σ by its square, the label noise by it): chosen by
    #: `design_evaluation` so that the data's curvature is the own task's (`matched_scale`)
    scale: float = 1.0
    #: the prior of w, the model's own task's (not a factor of the family): "inverse-cov"
    #: is w ~ N(0, Σ⁻¹) for this distribution's Σ
    w_prior: str = "standard"
    #: where ``w_prior`` is "rotated": the own task's seed, which fixes its Σ_w
    w_seed: int | None = None

    def __post_init__(self) -> None:
        owner = "Distribution"
        check_real(owner, "condition_number", self.condition_number, 1, MAX_CONDITION)
        check_choice(owner, "shape", self.shape, SHAPES)
        check_int(owner, "n_points", self.n_points, 2)
        check_real(owner, "noise_std", self.noise_std, 0)
        check_choice(owner, "query", self.query, QUERIES)
        check_real(owner, "top", self.top, 0, low_open=True)
        check_real(owner, "scale", self.scale, 0, low_open=True)
        check_choice(owner, "w_prior", self.w_prior, W_PRIORS)
        if (self.w_seed is not None) != (self.w_prior == "rotated"):
            raise InputError(f"Distribution: w_seed (the own task's seed, which fixes Σ_w) "
                             f"is given with w_prior='rotated' and only then, got "
                             f"w_seed={self.w_seed!r} with w_prior={self.w_prior!r}")
        if self.w_seed is not None:
            check_seed(owner, "w_seed", self.w_seed)
        low, high = TOP_RANGE  # the sampled data are float32
        log_variance = math.log(self.top) + 2 * math.log(self.scale)  # no overflow
        if not math.log(low) <= log_variance <= math.log(high):
            raise InputError(f"Distribution: Σ's largest eigenvalue top × scale² = "
                             f"{self.top!r} × {self.scale!r}² lies outside [{low:g}, "
                             f"{high:g}]: the data (float32) would overflow or vanish")

    def task(self, n_dims: int, seed: int) -> RegressionTask:
        """The `RegressionTask` that samples it (``seed``: the rotation of its Σ).

        With the same generator, its sequences at ``scale`` s are s times those at scale 1.
        Its w has the own task's prior (``w_prior``); a "rotated" prior's Σ_w is fixed by
        the own task's seed (``w_seed``), which then fixes Σ's rotation too, not ``seed``.
        """
        noise = self.noise_std * self.scale
        seed = seed if self.w_seed is None else self.w_seed
        if self.condition_number == 1 and self.top == 1 and self.scale == 1:
            return RegressionTask(n_dims=n_dims, n_points=self.n_points, noise_std=noise,
                                  query=self.query, w_prior=self.w_prior, seed=seed)
        eig = spectrum(n_dims, self.condition_number, self.shape, self.top * self.scale**2)
        return RegressionTask(n_dims=n_dims, n_points=self.n_points, cov="rotated",
                              eigenvalues=eig, noise_std=noise, query=self.query,
                              w_prior=self.w_prior, seed=seed,
                              condition_number=self.condition_number)  # its record: κ

    @property
    def text(self) -> str:
        """"κ 1000 (geometric, λ_max 1), n 21, noise 0, queries as the context, x and y × 1.57"."""
        sigma = "isotropic Σ" if self.condition_number == 1 else \
            f"κ {self.condition_number:g} ({self.shape}, λ_max {self.top:.3g})"
        query = "queries along Σ's low-variance directions" if self.query == "low-variance" \
            else "queries as the context"
        scaled = "" if f"{self.scale:.3g}" == "1" else f", x and y × {self.scale:.3g}"
        prior = {"standard": "", "inverse-cov": ", w ~ N(0, Σ⁻¹)",
                 "rotated": ", w ~ N(0, Σ_w) as on its own task"}[self.w_prior]
        return f"{sigma}, n {self.n_points}, noise {self.noise_std:g}, {query}{prior}{scaled}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DesignFamily:
    """The distributions `design_evaluation` chooses from (see the module docstring).

    ``examples``: n as multiples m of d (n = round(m·d) + 1), besides the model's own n and
    below it (empty: the own n alone). ``n_sequences``: the sequences each candidate
    distribution is judged on.
    """

    condition_numbers: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0)
    shapes: tuple[str, ...] = SHAPES
    examples: tuple[float, ...] = (1.0, 1.5, 2.0)
    noise: tuple[float, ...] = (0.0, 0.5)
    queries: tuple[str, ...] = ("context", "low-variance")
    n_sequences: int = 64

    def __post_init__(self) -> None:
        owner = "DesignFamily"
        for name in ("condition_numbers", "shapes", "examples", "noise", "queries"):
            values = getattr(self, name)
            if not isinstance(values, (tuple, list)):
                raise InputTypeError(f"{owner}.{name} must be a tuple of values, got "
                                     f"{values!r}")
            if not values and name != "examples":  # examples: may be () (the own n alone)
                raise InputError(f"{owner}.{name} must not be empty")
        for k in self.condition_numbers:
            check_real(owner, "condition_numbers", k, 1, MAX_CONDITION)
        for shape in self.shapes:
            check_choice(owner, "shapes", shape, SHAPES)
        for m in self.examples:  # multiples of d
            check_real(owner, "examples", m, 0, low_open=True)
        for sd in self.noise:
            check_real(owner, "noise", sd, 0)
        for query in self.queries:
            check_choice(owner, "queries", query, QUERIES)
        check_int(owner, "n_sequences", self.n_sequences, 8)

    def spectra(self) -> list[tuple[float, str]]:
        """(κ, shape) pairs: κ = 1 once (isotropic), every shape for the others."""
        out = [(1.0, SHAPES[0])] if 1 in self.condition_numbers else []
        return out + [(float(k), s) for k in self.condition_numbers if k != 1
                      for s in self.shapes]

    def n_options(self, n_dims: int, own: int, fixed: bool, least: int = 2) -> list[int]:
        """The numbers of examples: the model's own, and m·d + 1 below it (>= ``least``)."""
        if fixed:
            return [own]
        more = sorted({round(m * n_dims) + 1 for m in self.examples} - {own})
        return [own, *[n for n in more if max(2, least) <= n < own]]

    def options(self, factor: str, current: Distribution, n_dims: int, own_n: int,
                fixed_n: bool, least_n: int = 2) -> list[Distribution]:
        """``current`` with ``factor`` (one of `FACTORS`) set to each of its values.

        ``least_n``: the fewest examples a designed sequence may have (one past the first
        position aligned, where the model is aligned from a given position on).
        """
        if factor == "spectrum":
            return [dataclasses.replace(current, condition_number=k, shape=s,
                                        query=self.query_on(k, current.query))
                    for k, s in self.spectra()]
        if factor == "examples":
            return [dataclasses.replace(current, n_points=n)
                    for n in self.n_options(n_dims, own_n, fixed_n, least_n)]
        if factor == "noise":
            return [dataclasses.replace(current, noise_std=float(s)) for s in self.noise]
        if factor == "query":
            queries = dict.fromkeys(self.query_on(current.condition_number, q)
                                    for q in self.queries)
            return [dataclasses.replace(current, query=q) for q in queries]
        raise InputError(f"factor must be one of {FACTORS}, got {factor!r}")

    def query_on(self, condition_number: float, query: str) -> str:
        """``query`` where Σ has ``condition_number``: no low-variance queries on isotropic Σ.

        There the low-variance directions are every direction: such a query is drawn as the
        context is, and would only move the alignment to the last position (fewer
        predictions, the same data); the family's other query (or "context") instead.
        """
        if condition_number != 1 or query != "low-variance":
            return query
        return next((q for q in self.queries if q != "low-variance"), "context")


def nearest_distribution(task: RegressionTask, family: DesignFamily) -> Distribution:
    """The family's member nearest the model's own task (where the search starts)."""
    check_type("nearest_distribution", "task", task, RegressionTask, "a RegressionTask")
    check_type("nearest_distribution", "family", family, DesignFamily, "a DesignFamily")
    kappa, shape, top = 1.0, SHAPES[0], 1.0
    if task.cov == "ill-conditioned":
        kappa = float(task.condition_number)
        top = float(ill_conditioned_eigenvalues(task.n_dims, kappa).max())
    elif isinstance(task.cov, Tensor) or task.cov == "rotated":
        cov = task.covariance
        assert cov is not None  # a fixed Σ
        eig = torch.linalg.eigvalsh(cov.double())
        kappa, top = float(eig.max() / eig.min()), float(eig.max())
    spectra = family.spectra()
    kappa, shape = min(spectra, key=lambda ks: (abs(math.log(ks[0]) - math.log(kappa)),
                                                ks[1] != shape))
    noise = min(family.noise, key=lambda s: abs(s - float(task.noise_std)))
    query = family.query_on(kappa, task.query if task.query in family.queries
                            else family.queries[0])
    return Distribution(kappa, shape, task.n_points, float(noise), query, top,
                        w_prior=task.w_prior,
                        w_seed=task.seed if task.w_prior == "rotated" else None)
