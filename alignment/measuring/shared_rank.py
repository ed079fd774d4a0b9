"""A family's step size shared by a model's layers, tried at the layers its searches missed.

A fitted search is bracketed by the family's columns next to a layer's match
(`fit_steps`). On a spread spectrum a learner's iterate can peak sharply in its step size
between two grid points, under a spurious optimum elsewhere: a Newton oracle at
1.3/‖SSᵀ‖ on data of κ 1000 (the known-answer benchmark's fresh slice, on its designed
data) has its step-1 layer's grid columns at α 1 and 1.41 below the one at 0.35, so the
search at step 1 ended at 0.37 and the layer read "none of them", while the same family was
fitted to 1.3 at every other layer. So where a family's fitted ranks agree at `MIN_LAYERS`
or more layers (within `AGREE`), its columns at that rank are evaluated at the other
layers' matched step counts and those next to them, and join the family where they beat
the layer's best. Every candidate is treated alike, rivals included.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor

from iclprobe import algorithms

#: fitted ranks this close count as one step size (the searches stop at 3e-3 ranks)
AGREE = 0.02
#: layers whose fits must agree before the rank is tried at the others
MIN_LAYERS = 3


def shared_rank_fits(searches: Mapping[tuple[str, int, int], Any],
                     places: Mapping[str, Sequence[tuple[float, int]]],
                     scored: Mapping[str, Tensor],
                     evaluate: Callable[[dict[str, dict[float, set[int]]]], Mapping[str, Any]]
                     ) -> dict[str, dict[float, set[int]]]:
    """Per candidate, the (rank, steps) at the shared rank that beat a layer's best.

    ``searches``: `fit_steps`'s, done (``.best`` is (rank, value)); ``scored``: the family's
    values per layer and column, higher is better; ``evaluate(asks)``: the asked columns'
    values (``.get(layer, rank, step)``).
    """
    best: dict[tuple[str, int], tuple[float, float, int]] = {}  # (key, layer) -> rank, value, step
    for (key, layer, step), search in searches.items():
        rank, value = search.best
        if value > best.get((key, layer), (0.0, -float("inf"), 0))[1]:
            best[key, layer] = (rank, value, step)
    asks: dict[str, dict[float, set[int]]] = {}
    wanted: dict[str, tuple[float, dict[int, set[int]]]] = {}  # key -> rank, layer -> steps
    for key in places:
        if key not in algorithms.LEARNERS or key not in scored:
            continue  # a model's claim (no continuum of its own)
        steps = algorithms.learner_info(key).fitted_family.steps
        fits = sorted(r for (k, layer), (r, v, _) in best.items() if k == key and r != int(r)
                      and v > float(scored[key][layer].max()))
        group = _largest_group(fits)
        if len(group) < MIN_LAYERS or not isinstance(steps, tuple):
            continue
        shared = statistics.median(group)  # between two ranks of one continuum, as each fit
        for layer in range(scored[key].shape[0]):
            found = best.get((key, layer))
            if found is not None and abs(found[0] - shared) <= AGREE:
                continue
            step = found[2] if found is not None else \
                places[key][int(scored[key][layer].argmax())][1]
            at = steps.index(step) if step in steps else None
            near = set() if at is None else {s for s in steps[max(at - 1, 0):at + 2] if s}
            if near:
                wanted.setdefault(key, (shared, {}))[1][layer] = near
                asks.setdefault(key, {}).setdefault(shared, set()).update(near)
    if not asks:
        return {}
    got = evaluate(asks)
    out: dict[str, dict[float, set[int]]] = {}
    for key, (shared, layers) in wanted.items():
        for layer, near in layers.items():
            top = max(float(scored[key][layer].max()), best.get((key, layer), (0, -1e300, 0))[1])
            for step in near:
                if key in got and got[key].get(layer, shared, step) > top:
                    out.setdefault(key, {}).setdefault(shared, set()).add(step)
    return out


def _largest_group(ranks: Sequence[float]) -> list[float]:
    """The most sorted ``ranks`` within `AGREE` of each other and between the same two integers.

    A fit lies between two ranks of one continuum, so their median does too: a rank
    between two continua would be refused when run.
    """
    best: list[float] = []
    start = 0
    for end, rank in enumerate(ranks):
        while rank - ranks[start] > AGREE or math.floor(ranks[start]) != math.floor(rank):
            start += 1
        if end + 1 - start > len(best):
            best = list(ranks[start:end + 1])
    return best
