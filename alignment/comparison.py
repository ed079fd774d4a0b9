"""Which learner does a layer resemble more — and can the metric tell them apart at all?

Per layer and metric (Fu et al.'s table): each learner's best similarity with a bootstrap
interval (the best step is re-picked in every bootstrap replicate, so the interval covers
the selection too), and paired differences such as Newton − GD, whose replicates share
the resampled sequences.

Calibration reads a verdict against the learners' own resemblance: for a layer matched to
Newton step k, how similar is the best GD step to Newton step k itself? If GD imitates
Newton step k better than the layer does, the metric cannot attribute the layer to
Newton, however significant the difference. Verdict per layer:

- ``prefers A``: A is closer than B beyond the interval of A − B (A − B above 0 for a
  similarity, below 0 for a distance such as spd or ilwd), and the layer is closer to its
  A step than any B step is (the layer's bound beats B's best imitation of that step);
- ``leans A``: A is closer beyond the interval, but B imitates the matched A step at
  least as well as the layer does — closer to A, not attributable to A;
- ``indistinguishable``: the interval of A − B contains 0;
- ``computes nothing``: the layer is not live — its normalized error is not below the
  zero predictor's beyond its interval (`iclprobe.alignment.measuring.liveness`, the one rule every
  view, protocol, readout and position uses);
- ``matches no learner``: the layer is live, but none of the learners run matches it
  better than the zero predictor does — a verdict on the learners chosen, not on the layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from iclprobe.algorithms.base import Iterates
from iclprobe.alignment.measuring.bootstrap import interval
from iclprobe.alignment.measuring.similarities import Similarity, first_best, similarity_values
from iclprobe.alignment.metrics import metric_info, on_weights
from iclprobe.errors import InputError


@dataclasses.dataclass
class Interval:
    """Per layer: a value with its bootstrap interval."""

    value: list[float]
    lower: list[float]
    upper: list[float]


@dataclasses.dataclass
class LearnerScore:
    """A learner's best similarity per layer (over its steps), with a bootstrap interval."""

    run: str
    metric: str
    best_step: list[int]
    best_label: list[str]
    score: Interval


@dataclasses.dataclass
class Calibration:
    """How well each learner imitates the other's matched step, per layer.

    ``a_by_b[l]``: the best similarity of any B step with A's step matched at layer l
    (``b_step_for_a[l]`` is that B step); ``b_by_a`` the other way round.
    """

    a: str
    b: str
    metric: str
    a_by_b: list[float]
    b_step_for_a: list[str]
    b_by_a: list[float]
    a_step_for_b: list[str]


@dataclasses.dataclass
class PairVerdict:
    """A − B per layer, the calibration, the verdict per layer and a sentence."""

    a: str
    b: str
    metric: str
    difference: Interval
    calibration: Calibration
    verdicts: list[str]
    sentence: str


@dataclasses.dataclass
class LearnerComparison:
    """Every learner's best similarity and the paired verdicts, for one metric."""

    metric: str
    scores: dict[str, LearnerScore]
    pairs: list[PairVerdict]
    live: list[bool]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


def _quantiles(boot: Tensor, sim: Similarity) -> tuple[list[float], list[float]]:
    lower, upper = interval(boot, sim.confidence, sim.n_sequences)
    return lower.tolist(), upper.tolist()


def best_boot(sim: Similarity) -> Tensor:
    """Per layer and replicate, the best value over steps (higher is better), ``[L, R]``."""
    if sim.boots is None:
        raise InputError(f"the {sim.metric} table of {sim.learner} has no bootstrap replicates")
    sign = 1.0 if sim.higher_is_better else -1.0
    return sign * (sign * sim.boots).max(dim=1).values


def learner_score(sim: Similarity, match_columns: Sequence[int]) -> LearnerScore:
    """The best similarity per layer with an interval that re-picks the step per replicate."""
    lower, upper = _quantiles(best_boot(sim), sim)
    rows = torch.arange(sim.values.shape[0])
    cols = torch.tensor(list(match_columns))
    return LearnerScore(sim.learner, sim.metric, [sim.steps[c] for c in cols.tolist()],
                        [sim.column_label(c) for c in cols.tolist()],
                        Interval(sim.values[rows, cols].tolist(), lower, upper))


def difference(sim_a: Similarity, sim_b: Similarity) -> Interval:
    """Best of A − best of B per layer, paired replicate by replicate."""
    if sim_a.boots is None or sim_b.boots is None:
        missing = [s.learner for s in (sim_a, sim_b) if s.boots is None]
        raise InputError(f"difference needs the bootstrap replicates of both tables; "
                         f"{missing} kept none")
    shapes = [(sim_a.learner, sim_a.n_sequences, sim_a.boots.shape[-1]),
              (sim_b.learner, sim_b.n_sequences, sim_b.boots.shape[-1])]
    if shapes[0][1:] != shapes[1][1:]:
        raise InputError("difference pairs tables replicate by replicate: they must come from "
                         "the same sequences and bootstrap, got (learner, sequences, "
                         f"replicates) {shapes[0]} and {shapes[1]}")
    sign = 1.0 if sim_a.higher_is_better else -1.0
    best_a = sign * (sign * sim_a.values).max(1).values
    best_b = sign * (sign * sim_b.values).max(1).values
    lower, upper = _quantiles(best_boot(sim_a) - best_boot(sim_b), sim_a)
    return Interval((best_a - best_b).tolist(), lower, upper)


def imitation(values: Tensor, other: Iterates, ys: Tensor, metric: str, **kw: Any
              ) -> tuple[list[float], list[int]]:
    """How well ``other``'s best column imitates each of ``values`` (rows read as layers).

    The learners' resemblance, computed once for every use: calibration (a learner's
    matched steps against the other learner) and the separation views. Returns the best
    similarity per row and the column that reaches it.
    """
    table = similarity_values(values, other, ys, metric, **kw)
    sign = 1.0 if metric_info(metric).higher_is_better else -1.0
    best = first_best(sign * table)
    return table.gather(1, best[:, None])[:, 0].tolist(), best.tolist()


def calibrate(it_a: Iterates, it_b: Iterates, ys: Tensor, sim_a: Similarity,
              sim_b: Similarity, cols_a: Sequence[int], cols_b: Sequence[int]) -> Calibration:
    """The learners' resemblance at each layer's matched steps, on the same data and view.

    ``it_a``, ``it_b`` and ``ys`` are on the sequences the tables were computed on (for a
    weight metric: with weights). Only the matched columns are compared with every column
    of the other learner (A's matched columns read as layers against every B column, every
    A column against B's matched columns): the full [K_a, K_b] table is not needed, which
    matters for the fitted view's hundreds of columns.
    """
    values = it_a.weights if on_weights(sim_a.metric) else it_a.preds
    if values is None:
        raise InputError(f"calibration by {sim_a.metric} needs {it_a.name}'s weights")
    sign = 1.0 if sim_a.higher_is_better else -1.0
    kw: dict[str, Any] = {"t_min": sim_a.t_min, "t_max": sim_a.t_max, "over": sim_a.over}
    ua, ub = sorted(set(cols_a)), sorted(set(cols_b))
    a_value, a_col = imitation(values[torch.tensor(ua)], it_b, ys, sim_a.metric, **kw)
    b_sub = Iterates(it_b.steps[ub], it_b.preds[ub],
                     it_b.weights[ub] if it_b.weights is not None else None, {}, it_b.name)
    b_cols = sign * similarity_values(values, b_sub, ys, sim_a.metric,
                                      **kw)  # [K_a, |ub|]: every A column as a layer
    b_best = [b_cols[:, ub.index(c)] for c in cols_b]
    return Calibration(
        sim_a.learner, sim_b.learner, sim_a.metric,
        [a_value[ua.index(c)] for c in cols_a],
        [sim_b.column_label(a_col[ua.index(c)]) for c in cols_a],
        [float(sign * col.max()) for col in b_best],
        [sim_a.column_label(int(first_best(col))) for col in b_best])


def verdicts(score_a: LearnerScore, score_b: LearnerScore, diff: Interval, cal: Calibration,
             live: Sequence[bool], higher_is_better: bool = True,
             matched: Sequence[bool] | None = None) -> list[str]:
    """The verdict per layer (see the module docstring), in the metric's direction.

    ``live``: the layer computes something (`liveness.live_layers`: its error is below the
    zero predictor's beyond the interval); a layer that is not gets "computes nothing".
    ``matched``: some learner run matches the layer better than the zero predictor does
    (None: every live layer); a live layer that no run matches gets "matches no learner".
    ``higher_is_better``: the metric's direction: for a distance (spd, ilwd) A is closer
    where A − B is below 0.
    """
    sign = 1.0 if higher_is_better else -1.0
    out = []
    for layer, alive in enumerate(live):
        if not alive:
            out.append("computes nothing")
        elif matched is not None and not matched[layer]:
            out.append("matches no learner")
        elif diff.lower[layer] > 0 or diff.upper[layer] < 0:
            # A − B beyond 0 on A's side: above 0 where higher is better, below where lower is
            a_wins = diff.lower[layer] > 0 if higher_is_better else diff.upper[layer] < 0
            own, rival = (score_a, cal.a_by_b) if a_wins else (score_b, cal.b_by_a)
            bound = own.score.lower[layer] if higher_is_better else own.score.upper[layer]
            strength = "prefers" if sign * bound > sign * rival[layer] else "leans"
            out.append(f"{strength} {own.run}")
        else:
            out.append("indistinguishable")
    return out


def layer_ranges(layers: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> "0–2, 5"."""
    spans: list[list[int]] = []
    for layer in layers:
        if spans and layer == spans[-1][1] + 1:
            spans[-1][1] = layer
        else:
            spans.append([layer, layer])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)


def sentence(labels: Sequence[str], a: str, b: str, metric: str | None) -> str:
    """The verdicts in words, grouped by kind, as strong as the intervals allow.

    ``metric`` None: the verdict of the metrics combined (`combined`).
    """
    order = [f"prefers {a}", f"prefers {b}", f"leans {a}", f"leans {b}", "indistinguishable",
             "matches no learner", "computes nothing"]
    words = {f"prefers {a}": f"prefers {a}", f"prefers {b}": f"prefers {b}",
             f"leans {a}": f"closer to {a} but within the learners' own resemblance",
             f"leans {b}": f"closer to {b} but within the learners' own resemblance",
             "indistinguishable": f"{a} and {b} indistinguishable",
             "matches no learner": "computes, but no learner run matches it better than the "
                                   "zero predictor does",
             "computes nothing": "computes nothing (error not below the zero predictor's)"}
    parts = []
    for kind in order:
        layers = [i for i, v in enumerate(labels) if v == kind]
        if layers:
            noun = "layer" if len(layers) == 1 else "layers"
            parts.append(f"{words[kind]} at {noun} {layer_ranges(layers)}")
    head = f"{a} vs {b} by {metric_info(metric).label}" if metric is not None else \
        f"{a} vs {b}, the verdict (step sizes fitted, metrics combined)"
    return head + ": " + "; ".join(parts) + "."


def combined(pairs: Sequence[PairVerdict]) -> tuple[list[str], list[str]]:
    """One verdict per layer from several metrics' verdicts on the same pair, and its source.

    ``prefers X`` where some metric prefers X and none prefers or leans to the other;
    ``leans X`` where the metrics lean to X only; ``indistinguishable`` where no metric
    separates the learners, and where they point to different learners; the liveness
    labels where every metric has one. The source names the metrics that said it.
    """
    if not pairs:
        return [], []
    out, source = [], []
    for layer in range(len(pairs[0].verdicts)):
        said = {p.metric: p.verdicts[layer] for p in pairs}
        sides = {v.split(" ", 1)[1] for v in said.values()
                 if v.startswith(("prefers ", "leans "))}
        dead = [v for v in said.values() if v in ("computes nothing", "matches no learner")]
        if len(dead) == len(said):
            out.append(dead[0])
            source.append("")
        elif len(sides) == 1:
            side = sides.pop()
            strength = "prefers" if f"prefers {side}" in said.values() else "leans"
            out.append(f"{strength} {side}")
            source.append(", ".join(metric_info(m).label for m, v in said.items()
                                    if v == f"{strength} {side}"))
        else:
            out.append("indistinguishable")
            source.append("the metrics disagree" if sides else "")
    return out, source
