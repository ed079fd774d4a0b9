"""Each learner's fitted family: the hyperparameter variants × step counts it is matched over.

A protocol runs a learner at one rule (GD at 1/λ_max, Newton at α = 1/‖SSᵀ‖_F). A model
that runs the same algorithm at another step size then sits between that learner's
columns and can sit nearer another learner's, so `align`'s answer ("this layer runs X")
gives every candidate learner the same flexibility: each is matched over a *family* of
variants (step sizes, λ, β, ...) × step counts, and the candidates' best matches are
compared. A learner's family is part of its registration (``register(..., family=...)``);
a learner registered without one is matched at its ``align_hyper`` and step grid alone.

The built-in families (m: a multiple of the rule or of the stability bound):

- ``gd``: per-prefix ``m/λ_max(S_t/t)``, fixed ``η = m/max λ_max(S_t/t)`` on the mean loss
  and ``η = m/max λ_max(S_t)`` on the summed loss (maxima over the window), m ∈ `GD_SCALES`
  (octaves to 1/2, then √2 apart to the bound 2);
  steps 0…16, then 2^(1/3) apart to 4096 (`GD_STEPS`).
- ``newton`` (Newton–Schulz): ``α = m/‖SSᵀ‖_F`` per prefix, m ∈ `NEWTON_SCALES`; fixed
  ``α_t = (m/max λ_max(S_t/t)²)/t²`` and fixed ``α = m/max λ_max(S_t)²``, m ∈
  `NEWTON_FIXED`; steps 0…`NEWTON_MAX_STEP` (a Newton step doubles the effective step, so
  its multiples are √2 apart, and it has converged on any κ ≤ 10⁶ data by step 32).
- ``pgd`` (GD preconditioned by Σ⁻¹): GD's per-prefix rule (on the preconditioned
  Hessian) at `GD_SCALES`, GD's steps. Where Σ ∝ I it is GD itself, and not a candidate
  of its own.
- ``momentum`` (heavy ball): β ∈ `MOMENTUM_BETAS` × per-prefix ``m/λ_max(S_t/t)``, m ∈
  `MOMENTUM_SCALES` (stable below 2(1 + β)); steps 0…1024 on GD's grid.
- ``ridge``: λ = s · 2^(j/2), j = −12…12 + ⌈2 log₂ r⌉, s the mean eigenvalue of S_t/t over
  the window and r Σ's largest eigenvalue over its mean (1 on isotropic data: the grid then
  ends at 64 s; on a spread spectrum it reaches as far above the largest eigenvalue as it
  reaches above the mean on isotropic data) (λ on the summed loss, scikit-learn's alpha);
  one column each.
- ``online_gd``: relaxed Kaczmarz ``η_j = m/‖x_j‖²``, m ∈ `ONLINE_SCALES`; passes
  `ONLINE_STEPS`.
- ``gd_plus_plus``: ``η = m/max λ_max(S_t/t)``, ``γ = g/max λ_max(S_t/t)``, m ∈
  `GDPP_SCALES`, g ∈ `GDPP_GAMMAS`, both 0 outside the window; steps 0…8.
- ``cg``: steps 0…d + 1; ``ols``: its one column.

The grids of ``gd``, ``pgd``, ``newton`` and ``momentum`` have fine variants besides
(``Family.fine``; `GD_FINE`, `NEWTON_SCALES_FINE`, `NEWTON_FIXED_FINE`, `MOMENTUM_FINE`): the
step sizes between the grid's, which `align` runs only next to a variant some layer
matches, at the matched step and the steps next to it (`iclprobe.alignment.measuring.refine`).
Those of ``gd``, ``pgd``, ``newton``, ``momentum`` (at each β), ``ridge`` and ``online_gd``
also lie on continua of one step size each (``Family.continuum``): any rank between two
variants of one continuum is a variant too, at the geometric interpolation of their
multipliers, and `align` fits each match's step size along it
(`iclprobe.alignment.measuring.fit_steps`). GD++'s two step sizes and CG have none.

Fixed steps act inside the evaluation window only (0 elsewhere: a model valid only at its
trained length is matched there).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

from iclprobe.algorithms.family_context import FamilyContext
from iclprobe.errors import InputError, InputTypeError

# 2 / λ_max is on the boundary. Octaves below 1/2, where a step count makes up for the
# step size (k steps at η ≈ k/2 at 2η while ηλ is small), √2 apart above, where it does
# not: on spread spectra (κ 1000) an octave grid left GD at 1.3/λ_max between 1 and 1.5,
# and heavy ball's denser effective rates imitated its layer better than GD's grid did
# (named heavy ball, read exactly, on the fresh slice's designed data). Up to the bound 2
# itself, where a prefix's top direction neither decays nor grows: a PQ construction at 0.9
# of its stable step (1.8) on κ 100 data sat past a grid ending at 1.41, where the top
# direction's factor (1 − m)^k swings with m, and read "cannot tell GD from Newton" at every
# layer (the known-answer benchmark's main slice: GD named at 149 of 174 separable layers
# read exactly, 130 of 170 before). 1.68 as well named two more layers there but let GD's
# family imitate the GD/Newton average's last layer through probes on a κ 1000 design
# (a false attribution on the fresh slice's designed data).
GD_SCALES = (0.125, 0.25, 0.5, 0.71, 1.0, 1.41, 2.0)
# every step up to 16, then 2^(1/3) apart to 4096: a layer between two step counts of the
# same rule is then nearer its match than other learners' imitations of that match are
# (with steps √2 apart, GD at 1/λ_max for 21 steps was nearer heavy ball's imitation)
GD_STEPS = tuple(sorted(set(range(17)) | {round(2 ** (j / 3)) for j in range(13, 37)}))
# Newton's step count doubles its effective step (α λ² → 2^k α λ²): multiples an octave
# apart are nearly redundant, so Newton's are √2 apart within [1/2, 2] (2/‖SSᵀ‖_F still
# converges at rank >= 2), and its fixed steps' likewise below the bound
NEWTON_SCALES = (0.5, 0.71, 1.0, 1.41, 2.0)
NEWTON_FIXED = (0.35, 0.5, 0.71, 1.0, 1.41)
NEWTON_MAX_STEP = 32
NEWTON_STEPS = tuple(range(NEWTON_MAX_STEP + 1))
MOMENTUM_BETAS = (0.5, 0.75, 0.9)
MOMENTUM_SCALES = (0.25, 0.5, 1.0, 2.0)
MOMENTUM_STEPS = tuple(s for s in GD_STEPS if s <= 1024)  # heavy ball converges faster
# The step sizes between the grid's (2^(1/4) from their neighbours where the grid is √2
# apart), run only next to a variant some layer matches (`Family.fine`): a layer that runs
# a step size between two of the grid's sits nearer its own family then, not nearer
# another learner's imitation of it. Measured on the known-answer benchmark's main slice
# with every one of them run: GD named at 168 of 176 separable layers read exactly (152 of
# 170 on the grid alone), no false attribution; a GD construction's fixed step at 0.3, 0.6
# and 0.9 of its bound, between GD's grid points, had read "cannot tell GD from Newton".
GD_FINE = (0.125, 0.25, 0.35, 0.5, 0.59, 0.71, 0.84, 1.0, 1.19, 1.41, 1.68, 2.0)
NEWTON_SCALES_FINE = (0.5, 0.59, 0.71, 0.84, 1.0, 1.19, 1.41, 1.68, 2.0)
NEWTON_FIXED_FINE = (0.35, 0.42, 0.5, 0.59, 0.71, 0.84, 1.0, 1.19, 1.41)
MOMENTUM_FINE = (0.25, 0.35, 0.5, 0.71, 1.0, 1.41, 2.0)
RIDGE_EXPONENTS = tuple(range(-12, 13))  # λ = s · 2^(j/2), on isotropic data
ONLINE_SCALES = (0.25, 0.5, 1.0, 1.5)
ONLINE_STEPS = (0, 1, 2, 3, 4, 6, 8, 11, 16)
GDPP_SCALES = (0.25, 0.5, 1.0)
# GD++ at γ → 0 is GD: its γ stay well away from 0 (≥ 1/4 of the top curvature), so that
# it is a hypothesis of its own, not GD at finer step sizes than GD's own grid (measured:
# at γ = 0.1/λ_max it took GD construction layers on ill-conditioned data)
GDPP_GAMMAS = (0.25, 0.5)
GDPP_STEPS = tuple(range(9))

Variant = tuple[str, dict[str, Any]]  # (label, hyperparameters)


class NotACandidate(InputError):
    """Raised by a family's variants where the learner is no candidate of its own here.

    E.g. GD preconditioned by Σ⁻¹ on data whose Σ is a multiple of I is GD itself. The
    message says why; `align` notes it.
    """


@dataclasses.dataclass(frozen=True)
class Continuum:
    """A family's variants as points on one-parameter continua, so that any step size between them runs.

    ``points(ctx)``: per rank of `Family.grid`, the continuum it lies on (GD's per-prefix
    rule, its fixed step, ...) and its multiplier there; ``at(ctx, name, m)``: the variant
    on continuum ``name`` at multiplier ``m`` (any m > 0). Between two variants of the same
    continuum at adjacent ranks r and r + 1, rank r + f is the variant at the multipliers'
    geometric interpolation ``m_r^(1-f) · m_(r+1)^f`` (`Family.variant_at`): the step sizes
    `align` fits continuously (`iclprobe.alignment.measuring.fit_steps`).
    """

    points: Callable[[FamilyContext], list[tuple[str, float]]]
    at: Callable[[FamilyContext, str, float], Variant]


@dataclasses.dataclass(frozen=True)
class Family:
    """A learner's fitted family: ``variants(ctx)`` × ``steps``.

    ``steps``: step counts, a rule resolved per model (``"cg"``: 0…d+1; ``"layers"``:
    0…L), or None for a closed form (one column per variant).
    """

    variants: Callable[[FamilyContext], list[Variant]]
    steps: tuple[int, ...] | str | None = None
    #: the variants between the grid's as well: ``variants(ctx)`` and more, in one order
    #: (the grid's variants by their labels). `align` runs the grid, then the ones next to
    #: a variant some layer matches, at the matched steps and their neighbours.
    fine: Callable[[FamilyContext], list[Variant]] | None = None
    #: the variants as points on continua of one step size each (None: a grid alone)
    continuum: Continuum | None = None

    def __post_init__(self) -> None:
        for name in ("variants", "fine"):
            fn = getattr(self, name)
            if not callable(fn) and (name == "variants" or fn is not None):
                raise InputTypeError(f"Family.{name} must be a function of a FamilyContext, "
                                     f"got {fn!r}")
        if self.continuum is not None and not isinstance(self.continuum, Continuum):
            raise InputTypeError(f"Family.continuum must be a families.Continuum or None, got "
                                 f"{self.continuum!r}")

    def grid(self, ctx: FamilyContext) -> list[tuple[Variant, bool]]:
        """Every variant, fine ones included, each with whether it is on the coarse grid.

        A variant's place in this list is its rank (`Candidate.places`).
        """
        coarse = self.variants(ctx)
        if self.fine is None:
            return [(v, True) for v in coarse]
        labels = [label for label, _ in coarse]
        fine = self.fine(ctx)
        fine_labels = [label for label, _ in fine]
        missing = set(labels) - set(fine_labels)
        if missing:
            raise InputError(f"Family.fine must hold every variant of Family.variants; "
                             f"missing {sorted(missing)}")
        if len(set(fine_labels)) < len(fine_labels) or \
                [label for label in fine_labels if label in set(labels)] != labels:
            raise InputError("Family.fine's labels must be distinct, with Family.variants' "
                             "in their own order")
        return [(v, v[0] in labels) for v in fine]

    def span(self, ctx: FamilyContext, rank: int) -> tuple[int, int]:
        """The ranks of `grid` on the continuum that rank ``rank`` lies on: ``(first, last)``.

        ``(rank, rank)`` for a family without a continuum.
        """
        if self.continuum is None:
            return rank, rank
        return _line(self.continuum.points(ctx), rank)

    def shown(self, ctx: FamilyContext, rank: float, label: str) -> str:
        """``label``, the variant at ``rank``, marked where that is an end of its continuum.

        A layer matched there may run a step size beyond the family's range, not the one
        shown (at some layers a Newton–Schulz construction whose a lies below Newton's
        fixed-α line): "a 0.0333 at its range's low end".
        """
        if self.continuum is None or rank != int(rank):
            return label
        points = self.continuum.points(ctx)
        first, last = _line(points, int(rank))
        line = [m for _, m in points[first:last + 1]]
        m = line[int(rank) - first]
        if min(line) == max(line):
            return label
        return label + (" at its range's low end" if m == min(line) else
                        " at its range's high end" if m == max(line) else "")

    def holds(self, ctx: FamilyContext, rank: float) -> bool:
        """Whether ``rank`` is a variant of this family on ``ctx``'s data (`variant_at`'s).

        A family's ranks depend on the data (ridge's grid reaches further on a spread
        spectrum), so a rank matched on one task may be none on another.
        """
        low = math.floor(rank)
        if rank == low and 0 <= low < len(self.grid(ctx)):
            return True
        points = self.continuum.points(ctx) if self.continuum is not None else []
        return 0 <= low < len(points) - 1 and points[low][0] == points[low + 1][0]

    def variant_at(self, ctx: FamilyContext, rank: float) -> Variant:
        """The variant at ``rank`` of `grid`; between two ranks, on their continuum (`Continuum`)."""
        low = math.floor(rank)
        if rank == low:
            grid = self.grid(ctx)
            if 0 <= low < len(grid):
                return grid[low][0]
        points = self.continuum.points(ctx) if self.continuum is not None else []
        if self.continuum is None or not 0 <= low < len(points) - 1:
            raise InputError(f"rank {rank!r} is not a variant of this family (ranks 0…"
                             f"{max(len(points), len(self.grid(ctx))) - 1}"
                             f"{'' if self.continuum else ', integers'})")
        (name, a), (other, b) = points[low], points[low + 1]
        if name != other:
            raise InputError(f"rank {rank!r} lies between two continua ({name!r}, {other!r})")
        f = rank - low
        return self.continuum.at(ctx, name, a ** (1 - f) * b ** f)


def _line(points: list[tuple[str, float]], rank: int) -> tuple[int, int]:
    """The ranks ``(first, last)`` of the run of ``points`` on rank ``rank``'s continuum."""
    names = [name for name, _ in points]
    first, last = rank, rank
    while first > 0 and names[first - 1] == names[rank]:
        first -= 1
    while last + 1 < len(names) and names[last + 1] == names[rank]:
        last += 1
    return first, last


def single(hyper: dict[str, Any], steps: tuple[int, ...] | str | None) -> Family:
    """The family of a learner registered without one: its ``align_hyper`` at its steps."""
    return Family(lambda ctx: [("", dict(hyper))], steps)


GD_KINDS = ("rule", "fixed", "sum")  # per-prefix m/λ_max, fixed on the mean, on the summed loss


def _gd_one(ctx: FamilyContext, kind: str, m: float) -> Variant:
    if kind == "rule":
        return f"{m:.3g}/λmax", {"lr": "max", "normalize": True, "lr_scale": m}
    if kind == "fixed":
        top = ctx.top_mean()
        return f"η {m / top:.3g}", {"lr": ctx.inside() * (m / top), "normalize": True}
    top_sum = ctx.top_sum()
    return f"η {m / top_sum:.3g} (sum)", {"lr": ctx.inside() * (m / top_sum), "normalize": False}


def _gd_variants(ctx: FamilyContext, scales: tuple[float, ...] | None = None) -> list[Variant]:
    scales = GD_SCALES if scales is None else scales
    return [_gd_one(ctx, kind, m) for kind in GD_KINDS for m in scales]


NEWTON_KINDS = ("rule", "fixed", "constant")  # α = m/‖SSᵀ‖_F, fixed per t, constant


def _newton_one(ctx: FamilyContext, kind: str, m: float) -> Variant:
    if kind == "rule":
        return f"{m:.3g}/‖SSᵀ‖", {"alpha": "frobenius", "alpha_scale": m}
    if kind == "fixed":
        t, top = ctx.stats.counts.clamp(min=1), ctx.top_mean()
        return f"a {m / top**2:.3g}", {"alpha": ctx.inside() * (m / top**2) / t**2}
    top_sum = ctx.top_sum()
    return f"α {m / top_sum**2:.3g}", {"alpha": ctx.inside() * (m / top_sum**2)}


def _newton_scales(fine: bool) -> tuple[tuple[float, ...], ...]:
    return (NEWTON_SCALES_FINE, NEWTON_FIXED_FINE, NEWTON_FIXED_FINE) if fine else \
        (NEWTON_SCALES, NEWTON_FIXED, NEWTON_FIXED)


def _newton_variants(ctx: FamilyContext, fine: bool = False) -> list[Variant]:
    return [_newton_one(ctx, kind, m)
            for kind, scales in zip(NEWTON_KINDS, _newton_scales(fine)) for m in scales]


def _pgd_variants(ctx: FamilyContext, scales: tuple[float, ...] | None = None) -> list[Variant]:
    scales = GD_SCALES if scales is None else scales
    if ctx.isotropic():
        raise NotACandidate("pgd: Σ is a multiple of I in these data, so GD preconditioned by "
                            "Σ⁻¹ is GD (one candidate, gd)")
    return [(f"{m:.3g}/λmax", {"precond": "inverse_cov", "lr": "max", "normalize": True,
                               "lr_scale": m}) for m in scales]


def _momentum_one(beta: float, m: float) -> Variant:
    return f"β {beta:g}, {m:.3g}/λmax", {"lr": "max", "beta": beta, "lr_scale": m}


def _momentum_variants(ctx: FamilyContext, fine: bool = False) -> list[Variant]:
    scales = MOMENTUM_FINE if fine else MOMENTUM_SCALES
    return [_momentum_one(beta, m) for beta in MOMENTUM_BETAS for m in scales]


def ridge_exponents(spread: float) -> tuple[int, ...]:
    """The ridge grid's j (λ = s · 2^(j/2)) for a Σ whose largest eigenvalue is ``spread`` × its mean.

    Rounded to 1e-9 before the ceiling, so that a spread of exactly 2^(k/2) adds k.
    """
    extra = max(math.ceil(round(2 * math.log2(spread), 9)), 0)
    return tuple(range(RIDGE_EXPONENTS[0], RIDGE_EXPONENTS[-1] + extra + 1))


def _ridge_one(ctx: FamilyContext, m: float) -> Variant:
    lam = ctx.mean_eigenvalue() * m
    return f"λ {lam:.3g}", {"lam": lam}


def _ridge_variants(ctx: FamilyContext) -> list[Variant]:
    return [_ridge_one(ctx, 2 ** (j / 2)) for j in ridge_exponents(ctx.spread())]


def _online_one(m: float) -> Variant:
    return f"{m:.3g}/‖x‖²", {"lr": "normalized", "lr_scale": m}


def _online_variants(ctx: FamilyContext) -> list[Variant]:
    return [_online_one(m) for m in ONLINE_SCALES]


def _gdpp_variants(ctx: FamilyContext) -> list[Variant]:
    top, inside = ctx.top_mean(), ctx.inside()
    return [(f"η {m / top:.3g}, γ {g / top:.3g}",
             {"lr": inside * (m / top), "gamma": inside * (g / top)})
            for m in GDPP_SCALES for g in GDPP_GAMMAS]


# The families' continua, per rank of `Family.grid` (the fine grid where there is one)
GD_CONTINUUM = Continuum(lambda ctx: [(kind, m) for kind in GD_KINDS for m in GD_FINE],
                         _gd_one)
NEWTON_CONTINUUM = Continuum(
    lambda ctx: [(kind, m) for kind, scales in zip(NEWTON_KINDS, _newton_scales(True))
                 for m in scales], _newton_one)
PGD_CONTINUUM = Continuum(lambda ctx: [("rule", m) for m in GD_FINE],
                          lambda ctx, name, m: _pgd_variants(ctx, (m,))[0])
MOMENTUM_CONTINUUM = Continuum(
    lambda ctx: [(f"β {beta:g}", m) for beta in MOMENTUM_BETAS for m in MOMENTUM_FINE],
    lambda ctx, name, m: _momentum_one(float(name.split()[1]), m))
RIDGE_CONTINUUM = Continuum(
    lambda ctx: [("λ", 2 ** (j / 2)) for j in ridge_exponents(ctx.spread())],
    lambda ctx, name, m: _ridge_one(ctx, m))
ONLINE_CONTINUUM = Continuum(lambda ctx: [("rule", m) for m in ONLINE_SCALES],
                             lambda ctx, name, m: _online_one(m))

# the fine grids read the module's constants when run (as the grids do)
GD = Family(_gd_variants, GD_STEPS, lambda ctx: _gd_variants(ctx, GD_FINE), GD_CONTINUUM)
NEWTON = Family(_newton_variants, NEWTON_STEPS, functools.partial(_newton_variants, fine=True),
                NEWTON_CONTINUUM)
PGD = Family(_pgd_variants, GD_STEPS, lambda ctx: _pgd_variants(ctx, GD_FINE), PGD_CONTINUUM)
MOMENTUM = Family(_momentum_variants, MOMENTUM_STEPS,
                  functools.partial(_momentum_variants, fine=True), MOMENTUM_CONTINUUM)
RIDGE = Family(_ridge_variants, None, continuum=RIDGE_CONTINUUM)
ONLINE_GD = Family(_online_variants, ONLINE_STEPS, continuum=ONLINE_CONTINUUM)
GD_PLUS_PLUS = Family(_gdpp_variants, GDPP_STEPS)
CG = Family(lambda ctx: [("", {})], "cg")
OLS = Family(lambda ctx: [("", {})], None)
