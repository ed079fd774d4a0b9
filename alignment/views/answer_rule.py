"""The answer's rule for one metric: what a layer runs, judged by the learners themselves.

`answer_metric` names, per layer and metric, the candidate the layer runs, or "cannot tell"
among several, or "none of them" (the rule: `_decide`; docs/protocols.md says why each
part is there); `alignment.views.answer` combines the metrics. A layer's similarity to a
candidate is that of the candidate *as a continuum* (`continua.mixes`), and is judged against the
candidates' own resemblance (`_resemblances`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from iclprobe.algorithms.base import Iterates
from iclprobe.alignment import comparison as C
from iclprobe.alignment.measuring.bootstrap import interval, lower_end
from iclprobe.alignment.measuring.candidate import columns_of
from iclprobe.alignment.measuring.candidates import Candidate, TableSpec
from iclprobe.alignment.measuring.similarities import Similarity, similarity_values
from iclprobe.alignment.metrics import METRIC_INFO, metric_info
from iclprobe.alignment.views.continua import PRECISION, Evidence, evidence, mixes
from iclprobe.alignment.views.margins import probe_margins

RUNS, CANNOT_TELL, NONE = "runs", "cannot tell", "none of them"
DEAD = ("computes nothing", "matches no learner")


@dataclasses.dataclass
class LayerAnswer:
    """What one layer runs, by one metric or by the metrics combined.

    ``kind``: "runs", "cannot tell", "none of them", "computes nothing" or "matches no
    learner". ``learner``: the candidate named (runs), the best-matching one (cannot tell),
    the nearest (none of them). ``column``: its matched hyperparameters and step.
    ``value``: its similarity (``metric``'s). ``others``: the candidates it cannot be told
    from. ``runner_up`` and ``resemblance``: the second-best candidate and how similar its
    matched column is to the learner's (what "none of them" is judged against).
    """

    kind: str
    learner: str | None = None
    column: str | None = None
    value: float | None = None
    others: list[str] = dataclasses.field(default_factory=list)
    runner_up: str | None = None
    resemblance: float | None = None
    metric: str | None = None
    source: str = ""  # the metrics that said it (combined answers)
    #: the candidates of ``others`` that a mix of ``learner``'s and theirs fits better than
    #: ``learner`` alone (the layer lies between them; one metric's answers only)
    between: list[str] = dataclasses.field(default_factory=list)

    @property
    def short(self) -> str:
        """The answer in a table cell: "gd (1/λmax, step 5)", "≈ gd, cg", "none (≈ gd)"."""
        if self.kind == CANNOT_TELL:
            names = [n for n in [self.learner, *self.others] if n is not None]
            more = f" +{len(names) - 3}" if len(names) > 3 else ""
            return "≈ " + ", ".join(names[:3]) + more
        if self.kind == NONE:
            return f"none (nearest {self.learner})"
        return self.text

    @property
    def key(self) -> str:
        """What rows of a table collapse on: the kind and the learner, not the step."""
        return f"{self.kind} {self.learner} {' '.join(self.others)}"

    @property
    def text(self) -> str:
        """The answer in words."""
        if self.kind == RUNS:
            return f"{self.learner} ({self.column})" if self.column else str(self.learner)
        if self.kind == CANNOT_TELL:
            return f"cannot tell {self.learner} from {', '.join(self.others)}"
        if self.kind == NONE:
            return f"none of them (nearest {self.learner})"
        return self.kind

    def detail(self) -> str:
        """The answer with its numbers ("none of them: nearest gd, error cosine 0.951 ...")."""
        if self.kind != NONE or self.metric is None:
            return self.text
        label = metric_info(self.metric).label
        p = places_apart([(self.value, self.resemblance)])
        return (f"none of them: nearest {self.learner} ({self.column}) at {label} "
                f"{self.value:.{p}f}, while {self.runner_up}'s matched column is at "
                f"{self.resemblance:.{p}f} to it")


def places_apart(pairs: Sequence[tuple[float | None, float | None]]) -> int:
    """Decimal places (3 to 6) at which each pair's two numbers print differently.

    A layer's similarity to its nearest candidate and the runner-up's resemblance to that
    candidate can both round to 1.000; printed so, "none of them" would read as a tie.
    """
    for places in range(3, 7):
        if all(a is None or b is None or f"{a:.{places}f}" != f"{b:.{places}f}"
               for a, b in pairs):
            return places
    return 6


def _subset(it: Iterates, cols: Sequence[int]) -> Iterates:
    idx = torch.as_tensor(list(cols), dtype=torch.long)
    return Iterates(it.steps[idx], it.preds[idx],
                    it.weights[idx] if it.weights is not None else None, {}, it.name)


@dataclasses.dataclass
class _Yardsticks:
    """What a layer's similarity to X is judged against, per layer (higher is better)."""

    imitation: dict[str, dict[int, float]]  # rival -> layer -> its best imitation of X's match
    runner_up: dict[int, float]  # the runner-up's matched column's similarity to X's match
    own: dict[int, Tensor]  # X as a continuum: its best per bootstrap replicate [boot]
    own_value: dict[int, float]  # ... and its best
    rival_own: dict[str, dict[int, Tensor]]  # every rival as a continuum, per replicate
    mixed: dict[str, dict[int, bool]]  # rival -> layer -> a mix of X and it fits better
    #: rival -> layer -> how far the probes' own noise moves the layer's X − rival
    #: difference (`probe_margins`; empty for an exact readout)
    margin: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)
    #: layer -> how far the probes' noise correction may leave its similarities from the
    #: layer's own (`TableSpec.slack`; 0 for an exact readout)
    slack: dict[int, float] = dataclasses.field(default_factory=dict)


def _resemblances(x: str, layers: Sequence[int], ev: Evidence, cands: Mapping[str, Candidate],
                  metric: str, ys: Tensor, spec: TableSpec, values_of_layers: Tensor,
                  noisy: Sequence[Tensor] = ()) -> _Yardsticks:
    """What X's match at ``layers`` is judged against (higher-is-better space).

    Every rival's best imitation of X's matched column; the similarity of the runner-up's
    matched column to it; and the mixes (`continua.mixes`).
    """
    on_w = METRIC_INFO[metric].on == "weights"
    cols = sorted({ev.best[x][i] for i in layers})
    values = columns_of(cands[x].of(metric), cols, on_w)
    kw = spec.kw(metric)
    imit: dict[str, dict[int, float]] = {}
    for y, cand in cands.items():
        if y == x:
            continue
        best, _ = C.imitation(values, cand.of(metric), ys, metric, **kw)
        if cand.imitators is not None and not on_w:  # its columns fitted to the matches
            fitted, _ = C.imitation(values, cand.imitators, ys, metric, **kw)
            best = [ev.sign * max(ev.sign * a, ev.sign * b) for a, b in zip(best, fitted)]
        imit[y] = {i: ev.sign * best[cols.index(ev.best[x][i])] for i in layers}
    runner: dict[int, float] = {}
    by_rival: dict[str, list[int]] = {}
    for i in layers:
        by_rival.setdefault(_ranked(ev, i)[1], []).append(i)
    for y, at in by_rival.items():
        ycols = sorted({ev.best[y][i] for i in at})
        table = similarity_values(values, _subset(cands[y].of(metric), ycols), ys, metric,
                                  **kw)
        for i in at:
            runner[i] = ev.sign * float(table[cols.index(ev.best[x][i]),
                                              ycols.index(ev.best[y][i])])
    own: dict[int, Tensor] = {}
    own_value: dict[int, float] = {}
    rival_own: dict[str, dict[int, Tensor]] = {}
    mixed: dict[str, dict[int, bool]] = {}
    for i in layers:
        own_value[i], own[i], theirs, by_y = mixes(x, i, ev, cands, metric, ys, spec,
                                                    values_of_layers)
        for y, flag in by_y.items():
            mixed.setdefault(y, {})[i] = flag
            rival_own.setdefault(y, {})[i] = theirs[y]
    margin = probe_margins(x, layers, ev.best, ev.sign, cands, metric, ys, spec,
                           values_of_layers, noisy)
    slack = {i: abs(spec.slack(metric, i)) for i in layers}
    return _Yardsticks(imit, runner, own, own_value, rival_own, mixed, margin, slack)


def _ranked(ev: Evidence, layer: int) -> list[str]:
    """The candidates by their best similarity at ``layer``, best first (ties: table order)."""
    keys = list(ev.value)
    return sorted(keys, key=lambda k: (-float(ev.value[k][layer]), keys.index(k)))


def answer_metric(metric: str, tables: Mapping[str, Similarity],
                  cands: Mapping[str, Candidate], values: Tensor, ys: Tensor, spec: TableSpec,
                  live: Sequence[bool], matched: Sequence[bool], noisy: Sequence[Tensor] = ()
                  ) -> list[LayerAnswer]:
    """The answer per layer by one metric (see the module docstring).

    ``tables``: candidate -> its family's table by ``metric``; ``values``: the layers as
    the tables compared them (predictions or induced weights); ``ys``: the sequences the
    tables were computed on; ``matched``: some candidate beats the zero predictor there;
    ``noisy``: the layers read with the probes' noise sample added and subtracted (empty:
    an exact readout).
    """
    ev = evidence(tables)
    out: list[LayerAnswer | None] = []
    tops: dict[str, list[int]] = {}
    for layer, alive in enumerate(live):
        if not alive:
            out.append(LayerAnswer(DEAD[0], metric=metric))
        elif not matched[layer]:
            out.append(LayerAnswer(DEAD[1], metric=metric))
        else:
            out.append(None)
            tops.setdefault(_ranked(ev, layer)[0], []).append(layer)
    if len(ev.value) == 1:  # one candidate: nothing to tell it from
        return [a or _named(metric, ev, tables, cands, i, list(ev.value)[0])
                for i, a in enumerate(out)]
    for x, layers in tops.items():
        sticks = _resemblances(x, layers, ev, cands, metric, ys, spec, values, noisy)
        for layer in layers:
            out[layer] = _decide(metric, ev, tables, cands, layer, x, sticks)
    return [a for a in out if a is not None]


def _named(metric: str, ev: Evidence, tables: Mapping[str, Similarity],
           cands: Mapping[str, Candidate], layer: int, x: str, kind: str = RUNS,
           **extra: Any) -> LayerAnswer:
    col = ev.best[x][layer]
    return LayerAnswer(kind, x, cands[x].columns[col], float(tables[x].values[layer, col]),
                       metric=metric, **extra)


#: A metric's best possible value by its geometry (higher-is-better space: a distance's 0)
PERFECT = {"cosine": 1.0, "squared": 0.0}


def _at_most_perfect(metric: str, value: float) -> float:
    """``value`` no better than a perfect match (probes' noise correction can overshoot it).

    Read exactly a similarity cannot beat a perfect match, so a rival that imitates X's
    match to within `PRECISION` leaves no layer "close" to X. Through probes the
    noise-ceiling correction (`TableSpec.correct`) is one sample of the noise and can carry
    a layer's similarity past 1 (a cosine) or 0 (a distance); capped, a rival that
    imitates X's match that well is unseparated through probes too (the known-answer
    benchmark: GD and heavy ball's early iterates, equal up to the readout's scale).
    """
    perfect = PERFECT.get(metric_info(metric).geometry or "")
    return value if perfect is None else min(value, perfect)


def _decide(metric: str, ev: Evidence, tables: Mapping[str, Similarity],
            cands: Mapping[str, Candidate], layer: int, x: str, sticks: _Yardsticks
            ) -> LayerAnswer:
    """The rule for one live, matched layer whose best candidate is ``x``.

    X's similarity is that of X as a continuum (its match and mixes with its next-best
    columns, `continua.mixes`). X is separated from Y when the layer is closer to X than to Y
    beyond the paired interval, widened through probes by the probes' own noise
    (`probe_margins`); it is closer to X's match than Y's best imitation of that
    match is (the learners' own resemblance: a layer farther from X's match than Y comes
    to it is not X's; the point estimate, never beyond a perfect match, the interval
    being the paired difference's job; through probes less the noise correction's own
    uncertainty, its slack, and against Y's imitation with its step size fitted to X's
    match, `measuring.imitators`); and no mix of X's and Y's matched columns fits it
    better (a layer between X and Y is neither's). Runs X: separated from every other
    candidate. None of them: its optimistic bound falls short of the runner-up's matched
    column's similarity to X's match by more than the probes' noise correction could
    leave it (its slack). Otherwise: cannot tell X from the candidates it is not separated
    from. The slack counts against naming and against "none of them" alike: what the
    correction cannot settle is "cannot tell".
    """
    own = sticks.own[layer]
    pessimistic, optimistic = (float(end) for end in interval(own, ev.confidence,
                                                               ev.n_sequences))
    ranked = _ranked(ev, layer)
    level = _at_most_perfect(metric, sticks.own_value[layer])
    slack = sticks.slack.get(layer, 0.0)  # through probes: the correction's own uncertainty
    unseparated, between = [], []
    for y in ranked[1:]:
        diff_low = float(lower_end(own - sticks.rival_own[y][layer], ev.confidence,
                                   ev.n_sequences))
        diff_low -= sticks.margin.get(y, {}).get(layer, 0.0)
        close = level - slack > sticks.imitation[y][layer] + PRECISION
        if not (diff_low > PRECISION and close and not sticks.mixed[y][layer]):
            unseparated.append(y)
            if sticks.mixed[y][layer]:
                between.append(y)
    if not unseparated:
        return _named(metric, ev, tables, cands, layer, x)
    runner_up = sticks.runner_up[layer]
    extra = {"runner_up": ranked[1], "resemblance": ev.sign * runner_up}
    if optimistic + slack + PRECISION < runner_up:
        return _named(metric, ev, tables, cands, layer, x, NONE, **extra)
    return _named(metric, ev, tables, cands, layer, x, CANNOT_TELL, others=unseparated,
                  between=between, **extra)
