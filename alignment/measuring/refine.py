"""Step sizes between the grid's, run where the layers match: each family refined locally.

A candidate's family is a grid of variants (step sizes √2 apart, ...) × steps. A layer that
runs its algorithm at a step size between two of the grid's sits between that family's
columns, and another learner's family may imitate it as well as its own grid does (a GD
construction's fixed step read "cannot tell GD from Newton"). Running every step size
twice as densely costs each family's time again; a layer, though, only needs the step
sizes next to the one it matches. So `align` runs the grid, finds each layer's best
column in every candidate's family (by every metric), and then runs the family's fine
variants (`Family.fine`) on either side of that column's variant, at its step and the
steps next to it. They are appended to the family, each variant indexed by its rank, so
that a fine variant is a grid neighbour of the variants around it (`Candidate.neighbors`,
the mixes the answer reads), and every candidate with a fine grid gets the same refinement.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.algorithms.families import FamilyContext
from iclprobe.alignment.measuring.candidate import VARIANT_HYPER, Candidate, Fine
from iclprobe.alignment.measuring.similarities import Similarity, column_labels, first_best
from iclprobe.tasks import RegressionBatch


def grid_of(key: str, batch: RegressionBatch, stats: algorithms.PrefixStats,
            window: tuple[int, int]) -> list[tuple[str, bool]] | None:
    """Candidate ``key``'s variants (label, on the coarse grid) in rank order; None: no fine grid."""
    if key not in algorithms.LEARNERS:
        return None  # a model's claim: one run of its own
    family = algorithms.learner_info(key).fitted_family
    if family.fine is None:
        return None
    return [(label, on) for (label, _), on in family.grid(FamilyContext(stats, batch.cov, window))]


def fine_asks(cand: Candidate, on_grid: Sequence[bool], steps: Sequence[int] | None,
              matched: Iterable[int]) -> dict[float, tuple[int, ...]]:
    """The fine variants next to the matched columns' variants, and the steps to run each at.

    ``on_grid``: per rank, whether the variant is on the coarse grid; ``steps``: the
    family's step counts (None: not a tuple, run at the matched step alone); ``matched``:
    columns of ``cand``. A fine variant is next to a grid variant where only fine ones lie
    between them; it runs at the matched step and the family's steps on either side of it.
    """
    asks: dict[float, set[int]] = {}
    for col in sorted(set(matched)):
        place, step = cand.places[col]
        rank = int(place)  # the grid's and fine variants' ranks (before any step size is fitted)
        around = {step}
        if steps is not None and step in steps:
            at = steps.index(step)
            around.update(steps[max(at - 1, 0):at + 2])
        for way in (-1, 1):
            r = rank + way
            while 0 <= r < len(on_grid) and not on_grid[r]:
                asks.setdefault(r, set()).update(around)
                r += way
    return as_fine(asks)


def as_fine(by: Mapping[float, Iterable[int]]) -> dict[float, tuple[int, ...]]:
    """Variants to run, by rank, each at its step counts sorted (a family's `Fine` asks)."""
    return {rank: tuple(sorted(steps)) for rank, steps in by.items()}


def continuum_groups(key: str, ctx: FamilyContext, places: Sequence[tuple[float, int]]
                     ) -> list[int] | None:
    """Per column of candidate ``key`` (its ``places``), which of its family's continua it is on.

    None where the family has fewer than two continua (or is a model's claim). A family
    of several (GD's rule, fixed and summed-loss steps; Newton's three α; heavy ball's
    β) is matched on each: see `best_columns`.
    """
    if key not in algorithms.LEARNERS:
        return None
    continuum = algorithms.learner_info(key).fitted_family.continuum
    if continuum is None:
        return None
    names = [name for name, _ in continuum.points(ctx)]
    index = {name: i for i, name in enumerate(dict.fromkeys(names))}
    if len(index) < 2:
        return None
    return [index[names[math.floor(rank)]] for rank, _ in places]


def best_columns(scored: Tensor, groups: Sequence[int] | None = None) -> set[int]:
    """Each row's best column of ``scored [layer, column]`` (higher is better), and each group's.

    ``groups``: per column, its continuum (`continuum_groups`). A layer that runs heavy ball
    at β 0.5 between two of the grid's step sizes an octave apart can sit nearer the grid
    of β 0.75 than of its own β, and refined around β 0.75's match alone it was matched
    there (0.999 by the error cosine, its own column 1: a held-out heavy-ball oracle read
    exactly), so every continuum's best column is refined and fitted, not the family's
    best alone.
    """
    out = set(first_best(scored).tolist())
    for best in _group_bests(scored, groups) if groups is not None else []:
        out.update(best.tolist())
    return out


def _group_bests(scored: Tensor, groups: Sequence[int]) -> list[Tensor]:
    """Per group of columns (in order), each row's best column of the group (`first_best`)."""
    at = torch.tensor(list(groups))
    out = []
    for group in sorted(set(groups)):
        cols = (at == group).nonzero().flatten()
        out.append(cols[first_best(scored[:, cols])])
    return out


def continuum_starts(scored: Tensor, groups: Sequence[int], within: float) -> list[list[int]]:
    """Per layer, each continuum's best column where it comes within ``within`` of the layer's best.

    ``scored [layer, column]``: higher is better; ``groups``: `continuum_groups`. The
    continua a layer's step-size fit starts from besides its match (`fit_steps`): the fine
    step size nearest a layer's own (2^(1/4) apart) can leave its continuum's best column
    3·10⁻³ below the layer and 2·10⁻³ below another continuum's fitted imitation (heavy
    ball at β 0.5 and 1.5/λ_max, step 4, on ill-conditioned data: 0.9966 at 1.41/λ_max
    against β 0.75's fit, 0.9984).
    """
    per_group = [(best, scored.gather(1, best[:, None])[:, 0])
                 for best in _group_bests(scored, groups)]
    top = scored.max(1).values
    return [[int(best[layer]) for best, value in per_group if value[layer] >= top[layer] - within]
            for layer in range(scored.shape[0])]


def matched_columns(tables: Mapping[str, Mapping[str, Similarity]], key: str,
                    groups: Sequence[int] | None = None) -> set[int]:
    """Every layer's best column of candidate ``key`` by every metric's table (`best_columns`)."""
    out: set[int] = set()
    for by in tables.values():
        if key in by:
            sign = 1.0 if by[key].higher_is_better else -1.0
            out.update(best_columns(sign * by[key].values, groups))
    return out


def rank_labels(key: str, batch: RegressionBatch, stats: algorithms.PrefixStats,
                window: tuple[int, int], ranks: Iterable[float]) -> dict[float, str]:
    """Candidate ``key``'s variants' labels by rank, the grid's and ``ranks`` between them."""
    family = algorithms.learner_info(key).fitted_family
    ctx = FamilyContext(stats, batch.cov, window)
    out: dict[float, str] = {r: label for r, ((label, _), _) in enumerate(family.grid(ctx))}
    for r in ranks:
        if r not in out:
            out[r] = family.variant_at(ctx, r)[0]
    return out


def merged(cand: Candidate, more: Candidate, labels: Mapping[float, str]) -> Candidate:
    """``cand`` with ``more``'s columns (fine or fitted variants) after its own, in their places.

    The columns are appended, not reordered (no copy of the grid's in another order): a
    column's variant index is its variant's place among the family's ranks, so that a fine
    variant sits between the grid variants around it (`Candidate.neighbors`), and each
    variant's columns stay together in step order. ``labels``: every variant's label by
    rank (the columns' ``variant`` hyperparameter).
    """
    places = cand.places + more.places
    ranks = sorted({r for r, _ in places})
    at = {r: i for i, r in enumerate(ranks)}

    def join(a: algorithms.Iterates | None, b: algorithms.Iterates | None
             ) -> algorithms.Iterates | None:
        if a is None or b is None:
            return None
        hyper = {k: v for k, v in a.hyper.items()
                 if not (isinstance(v, list) and len(v) == a.steps.numel())}
        for name in VARIANT_HYPER:
            hyper.pop(name, None)  # recorded per column in "variant"
        hyper["variant"] = [labels[r] for r, _ in places]
        w = None if a.weights is None or b.weights is None else \
            torch.cat([a.weights, b.weights])
        return dataclasses.replace(a, steps=torch.cat([a.steps, b.steps]),
                                   preds=torch.cat([a.preds, b.preds]), weights=w,
                                   hyper=hyper)

    preds = join(cand.preds, more.preds)
    assert preds is not None
    return dataclasses.replace(cand, preds=preds, weights=join(cand.weights, more.weights),
                               columns=cand.columns + more.columns,
                               variant=[at[r] for r, _ in places], closed=False,
                               places=places)


def merged_table(table: Similarity, more: Similarity, family: Candidate) -> Similarity:
    """A family's table and its fine columns' (``more``), as one table of ``family``'s columns.

    ``family``: the merged candidate (`merged`). A table's columns are computed one by one
    from the same bootstrap resamples, so this is the table of the merged family.
    """
    def cat(a: Tensor, b: Tensor, dim: int) -> Tensor:
        return torch.cat([a, b], dim)

    return dataclasses.replace(
        table, steps=table.steps + more.steps, values=cat(table.values, more.values, 1),
        lower=cat(table.lower, more.lower, 1), upper=cat(table.upper, more.upper, 1),
        zero=cat(table.zero, more.zero, 0),
        boots=None if table.boots is None or more.boots is None else
        cat(table.boots, more.boots, 1),
        labels=column_labels(family.of(table.metric)))


def refined(members: Mapping[str, Candidate],
            matched: Callable[[str, Sequence[int] | None], set[int]],
            batch: RegressionBatch, stats: algorithms.PrefixStats, window: tuple[int, int],
            run: Callable[[Mapping[str, Fine]], Mapping[str, Candidate]]
            ) -> Mapping[str, Candidate]:
    """The fine variants next to each candidate's matched columns, run alone.

    ``matched(key, groups)``: the columns of candidate ``key`` some layer matches, on each
    of its continua where ``groups`` is given (`best_columns`); ``run(fine)``: the
    candidates' fine variants alone, as candidates (`build_candidates` with ``fine``).
    Returns them per candidate that has any (`merged` joins them to the family).
    """
    asks = {}
    ctx = FamilyContext(stats, batch.cov, window)
    for key, cand in members.items():
        grid = grid_of(key, batch, stats, window)
        if grid is None:
            continue
        steps = algorithms.learner_info(key).fitted_family.steps
        ask = fine_asks(cand, [on for _, on in grid],
                        steps if isinstance(steps, tuple) else None,
                        matched(key, continuum_groups(key, ctx, cand.places)))
        if ask:
            asks[key] = ask
    return run(asks) if asks else {}


def joined(members: Mapping[str, Candidate], *runs: Mapping[str, Candidate],
           batch: RegressionBatch, stats: algorithms.PrefixStats, window: tuple[int, int]
           ) -> dict[str, tuple[Candidate, Candidate]]:
    """Per candidate in ``runs``: its family with their columns after its own, and those alone.

    ``runs``: variants of the families run alone (fine, then fitted). Each family is merged
    once (a merge copies its columns), however many runs add to it.
    """
    keys = [k for k in members if any(k in more for more in runs)]
    out = {}
    for key in keys:
        parts = [more[key] for more in runs if key in more]
        ranks = [r for part in parts for r, _ in part.places]
        labels = rank_labels(key, batch, stats, window, ranks)
        extra = parts[0]
        for part in parts[1:]:
            extra = merged(extra, part, labels)
        out[key] = (merged(members[key], extra, labels), extra)
    return out
