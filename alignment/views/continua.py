"""Candidates as continua, and the mixes of two: what a layer's match is taken over.

A family is matched on a grid of columns; a layer that runs it between grid points is
closer to a mix of its nearest columns than to any one of them, and a layer between two
learners is closer to a mix of theirs than to either. `mixes` computes both for one layer
and the best-matching candidate X, in one table of the layer against every mix
(`alignment.views.answer_rule` judges with them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from iclprobe.algorithms.base import Iterates
from iclprobe.alignment.measuring.bootstrap import lower_end
from iclprobe.alignment.measuring.candidate import columns_of
from iclprobe.alignment.measuring.candidates import Candidate, TableSpec
from iclprobe.alignment.measuring.mixing import mix_replicates, mix_scores
from iclprobe.alignment.measuring.similarities import (
    Similarity,
    first_best,
    similarity,
    similarity_values,
)
from iclprobe.alignment.metrics import METRIC_INFO

#: Similarities closer than this are equal. A model's layers are float32, so a layer that is
#: a learner's column matches it to ~1e-8, not to float64's 1e-16; two converged columns (CG
#: past d steps, OLS) are equal to round-off; and near convergence GD and heavy ball follow
#: each other to a few 1e-6, so a family's grid alone decided between them (at 1e-6 the
#: held-out slice named heavy ball for 6 GD oracle layers read exactly; none at 1e-5).
PRECISION = 1e-5
#: The same resolution holds for the mixes on the layers' predictions: a mix of X's and Y's
#: matches fits a layer better than X alone where its gain's lower bound exceeds
#: `PRECISION`. A layer that runs X off X's grid (a GD construction's fixed step between
#: GD's grid points) is fitted better, by a few 1e-6, by a small step toward some rival,
#: which at a float floor read as a layer between the two ("cannot tell GD from Newton" at
#: the known-answer benchmark's construction layers); a layer between two learners (the
#: benchmark's average of GD's and Newton's predictions) gains 5e-5 to 1.5e-3. On induced
#: weights, which may object to an answer but not give one (`answer.combine`), the float
#: floor stays: at `PRECISION` the weight cosine named heavy ball for GD oracles' first
#: layers (GD's and heavy ball's first iterates point the same way to 1e-5) and blocked
#: answers the prediction metrics gave.
WEIGHT_MIX_FLOOR = 1e-8


def sign_of(sim: Similarity) -> float:
    """+1 where the metric's higher is better, else −1 (tables are compared sign-applied)."""
    return 1.0 if sim.higher_is_better else -1.0


@dataclasses.dataclass
class Evidence:
    """One metric's facts per candidate, in higher-is-better space."""

    best: dict[str, list[int]]  # matched column per layer
    table: dict[str, Tensor]  # [L, K] every column's similarity (sign applied)
    value: dict[str, Tensor]  # [L] best similarity (sign applied)
    boot: dict[str, Tensor]  # [L, R] best per replicate (sign applied)
    sign: float
    confidence: float
    n_sequences: int  # resampled by the replicates


def evidence(tables: Mapping[str, Similarity]) -> Evidence:
    """Every candidate's table read once: matched columns, best values and replicates."""
    sims = list(tables.values())
    sign = sign_of(sims[0])
    best, table, value, boot = {}, {}, {}, {}
    for key, sim in tables.items():
        if sim.boots is None:
            raise ValueError(f"the {sim.metric} table of {key} has no bootstrap replicates")
        scored = sign * sim.values
        best[key] = first_best(scored).tolist()
        table[key] = scored
        value[key] = scored.max(1).values
        boot[key] = (sign * sim.boots).max(1).values
    return Evidence(best, table, value, boot, sign, sims[0].confidence, sims[0].n_sequences)


#: The weights w of the mixes ``(1 − w) a + w b`` tried (`mixes`). A layer that runs X
#: off X's grid is fitted a little better by a small step toward some other learner
#: (w ≈ 0.1–0.25 on the known-answer models); a layer between two learners (the benchmark's
#: average of GD and Newton, w = 1/2) by a mix near the middle.
MIX_WEIGHTS = (0.35, 0.5, 0.65)
#: X's columns, after its match, that X's own mixes are made with (besides the match's
#: neighbours on its grid: the same rule's adjacent step counts, or the adjacent λ).
OWN_MIXES = 3


def _continuum_parts(c: str, layer: int, ev: Evidence, cands: Mapping[str, Candidate],
                     metric: str) -> tuple[Tensor, Tensor] | None:
    """Candidate ``c`` as a continuum at ``layer``: its matched column and those it mixes with.

    A family is matched on a grid; a layer that runs it between grid points is closer to a
    mix of its nearest columns than to any one of them, so its similarity is taken over
    its matched column and the mixes ``(1 − w) m + w k`` with the match's grid neighbours,
    its next-best columns and each variant's best column k (`mixed_with`). Every candidate
    is read so (a denser family must not win by its grid alone: heavy ball's took GD layers
    between GD's step counts). None: no column to mix with.
    """
    best = ev.best[c][layer]
    return _parts(cands[c], best, mixed_with(cands[c], ev.table[c][layer], best), metric)


def mixed_with(cand: Candidate, values: Tensor, best: int) -> list[int]:
    """The columns a family's match is mixed with, given one row of its table (``values``).

    The match's grid neighbours, its `OWN_MIXES` next-best columns and each variant's best
    column, the match itself left out.
    """
    order = torch.argsort(values, descending=True).tolist()
    next_best = [k for k in order if k != best][:OWN_MIXES]
    nearest = dict.fromkeys([*cand.neighbors(best), *next_best,
                             *_variant_bests(cand, values)])
    return [k for k in nearest if k != best]


def _parts(cand: Candidate, best: int, nearest: Sequence[int], metric: str
           ) -> tuple[Tensor, Tensor] | None:
    """The match's column and the columns it is mixed with (None: none to mix with)."""
    on_w = METRIC_INFO[metric].on == "weights"
    if not nearest:
        return None
    fam = cand.of(metric)
    return columns_of(fam, [best], on_w)[0], columns_of(fam, nearest, on_w)


def _mix_iterates(groups: Sequence[tuple[Tensor, Tensor]], on_w: bool) -> Iterates:
    """Every mix ``(1 − w) mine + w part`` of every group, as one learner's columns.

    Ordered group by group, part by part, the weight fastest.
    """
    w = torch.tensor(MIX_WEIGHTS, dtype=groups[0][0].dtype)
    w = w.view(1, -1, *[1] * groups[0][0].ndim)  # [1, weight, ...]
    mixes = torch.cat([((1 - w) * mine + w * parts[:, None]).flatten(0, 1)
                       for mine, parts in groups])  # [part × weight, ...], weight fastest
    return Iterates(torch.zeros(len(mixes), dtype=torch.long),
                    mixes if not on_w else mixes.new_zeros(mixes.shape[:-1]),
                    mixes if on_w else None, {}, "mix")


def families_reach(values: Tensor, cands: Mapping[str, Candidate], ys: Tensor, metric: str,
                   tables: Mapping[str, Tensor] | None = None, **kw: Any
                   ) -> dict[str, list[float]]:
    """How near each family as a continuum comes to each row of ``values`` (the metric's units).

    Per candidate, the best of its columns and of the mixes of its best column with that
    column's grid neighbours (the adjacent step counts and step sizes): a family between
    its grid points, for columns that are not a model's layers (a learner's own iterates,
    as the known-answer benchmark's separability reads them). The answer's rule mixes a
    match with more columns besides (`mixed_with`); they are left out here, a table of
    every row against each family's few neighbours costing a fraction of one against
    `mixed_with`'s dozens. ``kw``: `similarity`'s window keywords. One table per candidate
    (``tables``: those already computed, ``[row, column]`` in higher-is-better space, by
    candidate), then one per row of every candidate's mixes.
    """
    info = METRIC_INFO[metric]
    on_w, sign = info.on == "weights", 1.0 if info.higher_is_better else -1.0
    reach: dict[str, Tensor] = {}
    groups: dict[str, list[tuple[Tensor, Tensor] | None]] = {}
    for key, cand in cands.items():
        table = tables[key] if tables is not None and key in tables else \
            sign * similarity_values(values, cand.of(metric), ys, metric, **kw)
        reach[key] = table.max(1).values
        groups[key] = [_parts(cand, col, cand.neighbors(col), metric)
                       for col in first_best(table).tolist()]
    for row in range(values.shape[0]):
        mixed = [(key, g) for key, gs in groups.items() if (g := gs[row]) is not None]
        if not mixed:
            continue
        pairs = [g for _, g in mixed]
        scores = mix_scores(values[row], pairs, MIX_WEIGHTS, ys, metric, **kw)
        sims = sign * (scores.mean(-1) if scores is not None else similarity_values(
            values[row:row + 1], _mix_iterates(pairs, on_w), ys, metric, **kw)[0])
        at = 0
        for key, group in mixed:
            k = len(group[1]) * len(MIX_WEIGHTS)
            reach[key][row] = torch.maximum(reach[key][row], sims[at:at + k].max())
            at += k
    return {key: (sign * r).tolist() for key, r in reach.items()}


def _mix_tables(groups: Sequence[tuple[Tensor, Tensor]], layer: int, ev: Evidence,
                metric: str, ys: Tensor, spec: TableSpec, values_of_layers: Tensor
                ) -> list[tuple[Tensor, Tensor]]:
    """The layer's similarity to each mix ``(1 − w) mine + w part``, for every group.

    Per group ``(mine, parts)``: values ``[part, w]`` and replicates ``[part, w, boot]``, in
    higher-is-better space and corrected for the readout's noise as the tables are. Every
    mix is scored from the columns' products (`measuring.mixing`: the built-in metrics over
    positions) or, for other metrics, is one column of one table; either way with the
    tables' resamples.
    """
    scores = mix_scores(values_of_layers[layer], groups, MIX_WEIGHTS, ys, metric,
                        **spec.kw(metric))
    if scores is not None:  # from the columns' products (`mixing`)
        value, boot = (t[None] for t in mix_replicates(scores, spec.n_boot, spec.seed))
    else:  # every mix a column
        it = _mix_iterates(groups, METRIC_INFO[metric].on == "weights")
        sim = similarity(values_of_layers[layer:layer + 1], it, ys, metric, n_boot=spec.n_boot,
                         confidence=ev.confidence, seed=spec.seed, check=False,
                         **spec.kw(metric))
        assert sim.boots is not None
        value, boot = sim.values, sim.boots
    rows = slice(layer, layer + 1)
    boots = ev.sign * spec.correct(metric, boot, rows)[0]
    values = ev.sign * spec.correct(metric, value, rows)[0]
    out, at, n_w = [], 0, len(MIX_WEIGHTS)
    for _, parts in groups:
        k = len(parts) * n_w
        out.append((values[at:at + k].view(len(parts), n_w),
                    boots[at:at + k].view(len(parts), n_w, -1)))
        at += k
    return out


def mixes(x: str, layer: int, ev: Evidence, cands: Mapping[str, Candidate], metric: str,
           ys: Tensor, spec: TableSpec, values_of_layers: Tensor
           ) -> tuple[float, Tensor, dict[str, Tensor], dict[str, bool]]:
    """X and every rival as continua (`_continuum_parts`) at ``layer``, and X's mixes with Y.

    Returns X's best value and replicates, each rival's replicates, and per rival whether
    a mix of X's and its matched columns fits the layer better than X does — a layer
    between X and Y (the known-answer benchmark's average of GD and Newton) is neither's;
    "better" is the paired interval's lower end past `PRECISION` on predictions,
    `WEIGHT_MIX_FLOOR` on induced weights (every table shares the bootstrap's resamples).
    All of it is one table of the layer against every mix.
    """
    on_w = METRIC_INFO[metric].on == "weights"
    rivals = [y for y in cands if y != x]
    continua = {c: _continuum_parts(c, layer, ev, cands, metric) for c in [x, *rivals]}
    mine = columns_of(cands[x].of(metric), [ev.best[x][layer]], on_w)[0]
    parts = torch.stack([columns_of(cands[y].of(metric), [ev.best[y][layer]], on_w)[0]
                         for y in rivals])
    groups = [g for g in continua.values() if g is not None]
    tables = _mix_tables([*groups, (mine, parts)], layer, ev, metric, ys, spec,
                         values_of_layers)
    best: dict[str, tuple[float, Tensor]] = {}
    at = 0
    for c, g in continua.items():
        value, own = float(ev.value[c][layer]), ev.boot[c][layer]
        if g is not None:
            values, boots = tables[at]
            at += 1
            value = max(value, float(values.max()))
            own = torch.maximum(own, boots.flatten(0, 1).max(0).values)
        best[c] = (value, own)
    own_value, own = best[x]
    boots = tables[-1][1]
    low = lower_end(boots - own, ev.confidence, ev.n_sequences)  # [rival, w]
    floor = WEIGHT_MIX_FLOOR if on_w else PRECISION
    return own_value, own, {y: best[y][1] for y in rivals}, \
        {y: bool((low[j] > floor).any()) for j, y in enumerate(rivals)}


def _variant_bests(cand: Candidate, values: Tensor) -> list[int]:
    """The best-matching column of each of the family's variants (``values``: one layer's).

    The first column reaching its variant's best, variants in column order.
    """
    variant, order = cand.variant_index
    n = int(variant.max()) + 1
    top = torch.full((n,), -torch.inf, dtype=values.dtype).scatter_reduce(
        0, variant, values, "amax")
    at_top = values == top[variant]
    first = torch.full((n,), len(variant)).scatter_reduce(
        0, variant[at_top], torch.arange(len(variant))[at_top], "amin").tolist()
    return [first[v] for v in order if first[v] < len(variant)]  # variants in column order
