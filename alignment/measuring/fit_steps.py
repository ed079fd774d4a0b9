"""Step sizes fitted continuously: each layer's match moved along its family's continuum.

A family's grid and its fine step sizes (`refine`) are 2^(1/4) apart. GD at 1.5/λ_max on a
spread spectrum (κ 1000) sits between GD's 1.41 and 1.68, whose columns reached it at
0.982–0.985 by the error cosine while heavy ball's denser grid came to 0.9995 (a held-out
GD oracle on designed data, named heavy ball); 2^(1/8) apart still left 0.995. So, where the
layers are read exactly, every candidate whose family lies on continua of one step size
each (`Family.continuum`: GD's and preconditioned GD's rules and fixed steps, Newton's α,
heavy ball's step size at each β, ridge's λ, online GD's relaxation) has each layer's match
moved along its continuum at the matched step, between the matched variant's neighbours
(``r − 1 … r + 1``), by successive parabolic interpolation with golden-section steps where
the parabola has no maximum inside (`_Search`), until it promises less than
`VALUE_TOLERANCE` more, the points around the best are `TOLERANCE` apart, or `MAX_EVALS`.
The metric is the error cosine where computed (`fit_metric`). The variant found joins the
family where it is closer to the layer than the match was, as the fine step sizes do. A
step count makes up for a step size, so the searches climb along that valley: to the step
counts either side of the match's, then beside the best searched one (`_climbs`; the
contenders within `CLIMB_WITHIN` of the layer's best, at most `MAX_CLIMB` step counts). A
family's other continua (heavy ball's other β, GD's other rules) whose best column comes
within `CONTINUUM_WITHIN` of the match are searched too, from that column. Rivals are
searched the same way, so that a rival's imitation of a match is as flexible as the match.
A search is bracketed by the neighbouring ranks the family holds at that step: its fine
step sizes where they were run, else the coarse grid's two ranks away. Through probes fitted
to the column a layer holds (`held`) the matches are fitted too, and since a probe's reading
is blind to a scale, at every step count whose best grid column comes within `PROBE_WITHIN`
of the match (at most `AROUND`); through probes fitted to y no match is fitted, for the
reason the fine step sizes are not run there (`measure_candidates`). Through probes either
way the rivals' imitations of the matches are fitted (`imitators`). A rank a family's fits
share at several layers is tried at the others (`shared_rank`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence, Set

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.algorithms.families import Family, FamilyContext
from iclprobe.alignment.measuring.candidate import Candidate, Fine
from iclprobe.alignment.measuring.refine import as_fine, continuum_groups, continuum_starts
from iclprobe.alignment.measuring.shared_rank import shared_rank_fits
from iclprobe.alignment.measuring.similarities import first_best, similarity_values
from iclprobe.alignment.metrics import METRIC_INFO, metric_info
from iclprobe.tasks import RegressionBatch

#: a search ends when the points around its best are this close (ranks 2^(1/4) apart: a
#: step size within about 0.05%), or after `MAX_EVALS`
TOLERANCE = 3e-3
MAX_EVALS = 8
#: ... or when the parabola promises less than this above the best (the rule reads 1e-5; at
#: 1e-7, 9% faster, the spd's answer named heavy ball at two GD layers it could not tell)
VALUE_TOLERANCE = 1e-9
_GOLDEN = (3.0 - math.sqrt(5.0)) / 2.0  # 0.382: golden section's step into the wider side
#: the metric the step sizes are fitted by where it is computed (the answer's lead metric)
FIT_METRIC = "error_cosine"
#: searched step counts at most, with ``within`` (`fitted`'s): the match's and the nearest
AROUND = 6
#: through probes (a scale is free: a step count makes up for a step size) the step counts
#: whose best grid column comes this near the match's are searched too (a GD oracle's step 3
#: at 0.6/λ_max: steps 2-8 within 8·10⁻⁴ of its best, step 7; only step 3's reaches it)
PROBE_WITHIN = 1e-3
#: step counts per (candidate, layer) the climb along step size and count searches at most
MAX_CLIMB = 8
#: ... by the candidates within this of the layer's best column of any (the contenders)
CLIMB_WITHIN = 1e-3
#: a family's other continua within this of its match are searched too (`continuum_starts`)
CONTINUUM_WITHIN = 5e-3


def fit_metric(metrics: Iterable[str]) -> str | None:
    """The metric to fit by among ``metrics``: `FIT_METRIC`, else the first on predictions."""
    metrics = list(metrics)
    if FIT_METRIC in metrics:
        return FIT_METRIC
    return next((m for m in metrics if METRIC_INFO[m].on == "preds"), None)


@dataclasses.dataclass
class _Search:
    """One (candidate, layer)'s search: maximise its similarity over ranks in [low, high].

    Successive parabolic interpolation through the best point and its neighbours, with
    golden-section steps where the parabola does not point inside (Brent's safeguard).
    ``values``: rank -> similarity of the points evaluated (the match's to begin with).
    """

    step: int  # the matched step (a closed form's one column: its own)
    low: float
    high: float
    values: dict[float, float]
    start: float = 0.0  # the match's value
    evals: int = 0
    _next: tuple[float | None] | None = None  # `ask`'s answer, until `told` adds a point

    def __post_init__(self) -> None:
        self.start = max(self.values.values())

    @property
    def best(self) -> tuple[float, float]:
        """(rank, value) of the best point evaluated (the first of equals)."""
        return max(self.values.items(), key=lambda kv: kv[1])

    def ask(self) -> float | None:
        """The next rank to evaluate, or None: done (asked twice a round, done or not)."""
        self._next = self._next or (self._ask(),)
        return self._next[0]

    def _ask(self) -> float | None:
        for end in (self.low, self.high):
            if end not in self.values:
                return end
        if self.evals >= MAX_EVALS:
            return None
        b, fb = self.best
        a = max((x for x in self.values if x < b), default=None)
        c = min((x for x in self.values if x > b), default=None)
        gaps = [(b - a if a is not None else 0.0, -1.0), (c - b if c is not None else 0.0, 1.0)]
        width, way = max(gaps)
        if width < TOLERANCE:
            return None
        # the parabola through the best and the two points nearest it (either side or both)
        near = sorted(sorted(self.values, key=lambda x: (abs(x - b), x))[:3])
        top = _vertex(*[v for x in near for v in (x, self.values[x])]) \
            if len(near) == 3 else None
        if top is not None and (a if a is not None else b) <= top[0] <= \
                (c if c is not None else b):
            x, peak = top
            if peak - fb < VALUE_TOLERANCE:
                return None  # the parabola promises nothing the rule could read
            if abs(x - b) < TOLERANCE / 2:  # the vertex is the best: look beside it
                x = b + way * TOLERANCE / 2
            if x not in self.values:
                return x
        if a is None or c is None:  # the best at an end, and no peak inside: it is the peak
            return b + way * TOLERANCE / 2  # unless the function rises right beside it
        return b + way * _GOLDEN * width

    def told(self, rank: float, value: float) -> None:
        self.values[rank] = value
        self.evals += 1
        self._next = None


def _vertex(*points: float) -> tuple[float, float] | None:
    """The parabola through three points (a < b < c): its vertex and its value there.

    ``points``: a, f(a), b, f(b), c, f(c). None where it has no maximum (not concave, or a
    point is not finite).
    """
    a, fa, b, fb, c, fc = points
    if not all(math.isfinite(v) for v in (fa, fb, fc)):
        return None
    # f(x) = fb + s (x - b) + k (x - b)²: the slopes either side give s and k
    left, right = (fb - fa) / (b - a), (fc - fb) / (c - b)
    k = (right - left) / (c - a)
    if not k < 0:
        return None
    s = left + k * (b - a)  # the slope at b: f(a) = fb − s (b − a) + k (b − a)²
    return b - s / (2 * k), fb - s * s / (4 * k)


def _searches(places: Mapping[str, Sequence[tuple[float, int]]],
              scored: Mapping[str, Tensor], ctx: FamilyContext,
              skip: Set[tuple[str, int]] = frozenset(), around: bool = False,
              within: float | None = None, also_at: Sequence[int] | None = None
              ) -> dict[tuple[str, int, int], _Search]:
    """The searches per (candidate with a continuum, layer), from the layer's match.

    The ranks either side of the match's (within its continuum) bound it; where their
    columns at the matched step are in the family, their values start it too. ``around``:
    also one at each step count next to the match's on the family's steps, from that
    step's best column; ``within``: at each step count whose best column comes within that
    of the match instead (`_starts`); ``also_at``: per layer, one more step count.
    ``skip``: (candidate, layer) pairs not searched.
    Keyed by (candidate, layer, step).
    """
    out = {}
    for key, where in places.items():
        if key not in algorithms.LEARNERS or key not in scored:
            continue
        family = algorithms.learner_info(key).fitted_family
        if family.continuum is None:
            continue
        at = {place: i for i, place in enumerate(where)}
        starts = _starts(scored[key], where,
                         family.steps if around or within or also_at else None, within,
                         also_at)
        groups = continuum_groups(key, ctx, where)
        others = continuum_starts(scored[key], groups, CONTINUUM_WITHIN) if groups else None
        for layer, cols in enumerate(starts):
            if (key, layer) in skip:
                continue
            for i, col in enumerate(cols + (others[layer] if others else [])):
                search = _search_from(family, ctx, where, at, scored[key][layer], col)
                if search is not None and (i < len(cols) or
                                           (key, layer, search.step) not in out):
                    out[(key, layer, search.step)] = search
    return out


def _search_from(family: Family, ctx: FamilyContext, where: Sequence[tuple[float, int]],
                 at: Mapping[tuple[float, int], int], scored: Tensor, col: int
                 ) -> _Search | None:
    """The search along ``col``'s continuum at its step, bracketed by its neighbours.

    ``scored``: the layer's values of the family's columns; ``at``: (rank, step) -> column.
    None where there is nothing to search: a fitted column already, the zero predictor (no
    step size), or a continuum of one point.
    """
    rank, step = where[col]
    if rank != int(rank) or (family.steps is not None and step == 0):
        return None
    first, last = family.span(ctx, int(rank))
    if first == last:
        return None
    # between the neighbours the family holds at this step: the fine ones where they were
    # run, else the coarse grid's, two ranks away
    low, high = (max(rank - 1, first), min(rank + 1, last))
    if (low, step) not in at:
        low = max(rank - 2, first)
    if (high, step) not in at:
        high = min(rank + 2, last)
    known = {r: float(scored[at[(r, step)]]) for r in (low, rank, high) if (r, step) in at}
    return _Search(step, low, high, known)


def _climbs(searches: Mapping[tuple[str, int, int], _Search],
            places: Mapping[str, Sequence[tuple[float, int]]], scored: Mapping[str, Tensor],
            ctx: FamilyContext, lead: Sequence[float]) -> dict[tuple[str, int, int], _Search]:
    """The step counts next to each (candidate, layer)'s best searched one, where unsearched.

    A step count makes up for a step size (k steps at η reach about what k' steps reach at
    η k/k'), so a layer's best column can sit a few step counts from its own, at another
    step size, along that valley. The family's step counts next to the best searched one
    are searched too where they were not (a lone match's on both sides; through probes the
    step counts within `PROBE_WITHIN` need not be adjacent), each from its best column
    there, until the best has both neighbours searched or `MAX_CLIMB` step counts are.
    Only candidates within `CLIMB_WITHIN` of the layer's best grid column of any candidate
    (``lead``, `_leads`) climb: a farther one is no contender there, as match nor as rival.
    """
    by: dict[tuple[str, int], dict[int, float]] = {}
    for (key, layer, step), search in searches.items():
        by.setdefault((key, layer), {})[step] = search.best[1]
    out: dict[tuple[str, int, int], _Search] = {}
    for (key, layer), values in by.items():
        family = algorithms.learner_info(key).fitted_family
        steps = family.steps
        if not isinstance(steps, tuple) or len(values) >= MAX_CLIMB or \
                max(values.values()) < lead[layer] - CLIMB_WITHIN:
            continue
        top = max(values, key=lambda s: (values[s], -s))
        if top not in steps:
            continue
        where = places[key]
        at = {place: i for i, place in enumerate(where)}
        for i in (steps.index(top) - 1, steps.index(top) + 1):
            if not 0 <= i < len(steps) or steps[i] in values:
                continue
            # from the family's best grid column at that step count
            cols = [c for (rank, s), c in at.items() if s == steps[i] and rank == int(rank)]
            if not cols:
                continue
            col = cols[int(first_best(scored[key][layer, cols]))]
            found = _search_from(family, ctx, where, at, scored[key][layer], col)
            if found is not None:
                out[(key, layer, steps[i])] = found
    return out


def _leads(scored: Mapping[str, Tensor]) -> list[float]:
    """Per layer, its best column of any candidate (``scored``: higher is better)."""
    return torch.stack([t.max(1).values for t in scored.values()]).max(0).values.tolist()


def _starts(scored: Tensor, where: Sequence[tuple[float, int]], steps: object,
            within: float | None = None, also_at: Sequence[int] | None = None
            ) -> list[list[int]]:
    """Per layer, the columns the searches start from: the match, and its neighbours' steps.

    Where ``steps`` is a tuple of step counts, the best column at each step count next to
    the match's follows the match. ``within``: instead, the best column at every step
    count whose best grid column comes within that of the match (at most `AROUND`, the
    nearest to the match's step first). ``also_at``: per layer, one more step count whose
    best column starts a search.
    """
    matches = first_best(scored).tolist()
    if not isinstance(steps, tuple):
        return [[c] for c in matches]
    lists: dict[int, list[int]] = {}
    for col, (rank, step) in enumerate(where):
        if rank == int(rank):
            lists.setdefault(step, []).append(col)
    cols_at = {s: torch.tensor(c) for s, c in lists.items()}
    order = list(cols_at)
    if within is not None and order:  # each step count's best value, per layer
        group = torch.full((scored.shape[1],), len(order))
        for i, s in enumerate(order):
            group[cols_at[s]] = i
        tops = torch.full((scored.shape[0], len(order) + 1), -torch.inf, dtype=scored.dtype)
        tops.scatter_reduce_(1, group.expand(scored.shape[0], -1), scored, "amax")
    out = []
    for layer, match in enumerate(matches):
        step = where[match][1]
        if within is None:
            at = steps.index(step) if step in steps else None
            near = [] if at is None else [s for s in steps[max(at - 1, 0):at + 2] if s != step]
        else:
            top = float(scored[layer, match])
            near = sorted((s for s, v in zip(order, tops[layer].tolist())
                           if s != step and v >= top - within),
                          key=lambda s: (abs(s - step), s))[:AROUND - 1]
        if also_at is not None and also_at[layer] != step and also_at[layer] not in near:
            near.append(also_at[layer])
        out.append([match] + [int(cols_at[s][first_best(scored[layer, cols_at[s]])])
                              for s in near if s in cols_at])
    return out


def fitted(places: Mapping[str, Sequence[tuple[float, int]]], metric: str,
           scored: Mapping[str, Tensor],
           values: Tensor, ys: Tensor, kw: Mapping[str, object], batch: RegressionBatch,
           stats: algorithms.PrefixStats, window: tuple[int, int],
           run: Callable[[Mapping[str, Fine]], Mapping[str, Candidate]],
           skip: Set[tuple[str, int]] = frozenset(), around: bool = False,
           within: float | None = None, also_at: Sequence[int] | None = None,
           correct: Callable[[Tensor], Tensor] | None = None) -> dict[str, Fine]:
    """Per candidate, the fitted variants that beat the layers' matches, to join the family.

    ``places``: candidate -> its family's columns' places (`Candidate.places`, grid and
    fine); ``scored``: candidate -> the family's values by ``metric`` (`fit_metric`),
    ``[layer, column]``, higher is better; ``values``: the layers as compared (or other
    rows: the benchmark fits to the true columns); ``kw``: the metric's window and pooling;
    ``run(asks)``: the asked variants alone, as candidates (predictions only); ``skip``:
    (candidate, layer) pairs not fitted (`imitators`); ``around``: search the step counts
    next to the match's too (`_searches`); ``within``: every step count whose best column
    comes within that of the match's; ``also_at``: per row of ``values``, one more step
    count searched (`imitators`: the imitated column's own); ``correct``: applied to the
    evaluated values ``[row, column]`` where ``scored`` is corrected for the probes' noise
    (`TableSpec.correct`), so that the searches compare like with like.
    """
    ctx = FamilyContext(stats, batch.cov, window)
    searches = _searches(places, scored, ctx, skip, around, within, also_at)
    lead = _leads(scored)
    while True:
        # a (candidate, layer) whose searches are done climbs to its next step count
        busy = {where[:2] for where, search in searches.items() if search.ask() is not None}
        searches.update(_climbs({where: search for where, search in searches.items()
                                 if where[:2] not in busy}, places, scored, ctx, lead))
        wanted = {where: x for where, search in searches.items()
                  if (x := search.ask()) is not None}
        if not wanted:
            break
        asks: dict[str, dict[float, set[int]]] = {}
        for (key, _, step), rank in wanted.items():
            asks.setdefault(key, {}).setdefault(rank, set()).add(step)
        got = _evaluate(asks, metric, values, ys, kw, run, correct)
        for (key, layer, step), rank in wanted.items():
            searches[key, layer, step].told(
                rank, got[key].get(layer, rank, step) if key in got else -math.inf)
    out: dict[str, dict[float, set[int]]] = {}
    for (key, layer, _), search in searches.items():
        rank, value = search.best
        if value > float(scored[key][layer].max()) and rank != int(rank):  # beats the match
            out.setdefault(key, {}).setdefault(rank, set()).add(search.step)
    for key, by in shared_rank_fits(searches, places, scored, lambda asks: _evaluate(
            asks, metric, values, ys, kw, run, correct)).items():  # a rank the layers share
        for rank, steps in by.items():
            out.setdefault(key, {}).setdefault(rank, set()).update(steps)
    return {key: as_fine(by) for key, by in out.items()}


class _Values:
    """One family's evaluated columns against every layer, signed higher-is-better."""

    def __init__(self, table: Tensor, places: list[tuple[float, int]]) -> None:
        self.table = table
        self.at = {(rank, step): i for i, (rank, step) in enumerate(places)}

    def get(self, layer: int, rank: float, step: int) -> float:
        """The similarity of ``layer`` to the column at (``rank``, ``step``); -inf: it diverged."""
        col = self.at.get((rank, step))
        value = -math.inf if col is None else float(self.table[layer, col])
        return value if math.isfinite(value) else -math.inf


def _evaluate(asks: Mapping[str, Mapping[float, set[int]]], metric: str, values: Tensor,
              ys: Tensor, kw: Mapping[str, object],
              run: Callable[[Mapping[str, Fine]], Mapping[str, Candidate]],
              correct: Callable[[Tensor], Tensor] | None = None) -> dict[str, _Values]:
    """Every asked (rank, step) of every family against every layer (``correct``-ed)."""
    cands = run({key: as_fine(by) for key, by in asks.items()})
    sign = 1.0 if metric_info(metric).higher_is_better else -1.0
    fix = correct or (lambda table: table)
    return {key: _Values(sign * fix(similarity_values(
        values, cand.preds, ys, metric, **kw)), cand.places)  # type: ignore[arg-type]
        for key, cand in cands.items()}
