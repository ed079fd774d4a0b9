"""The answer's rule for one metric: what a layer runs, judged by the learners themselves.

`answer_metric` names, per layer and metric, the candidate the layer runs, or "cannot tell"
among several, or "none of them" (the rule: `_decide`; docs/protocols.md says why each
part is there); `alignment.views.answer` combines the metrics. A layer's similarity to a
candidate is that of the candidate *as a continuum* (`_mixes`), and is judged against the
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
from iclprobe.alignment.measuring.candidates import Candidate, TableSpec, columns_of
from iclprobe.alignment.measuring.similarities import Similarity, similarity
from iclprobe.alignment.metrics import METRIC_INFO, metric_info
from iclprobe.alignment.views.margins import probe_margins

RUNS, CANNOT_TELL, NONE = "runs", "cannot tell", "none of them"
DEAD = ("computes nothing", "matches no learner")
#: Similarities closer than this are equal. A model's layers are float32, so a layer that is
#: a learner's column matches it to ~1e-8, not to float64's 1e-16; two converged columns (CG
#: past d steps, OLS) are equal to round-off; and near convergence GD and heavy ball follow
#: each other to a few 1e-6, so a family's grid alone decided between them (at 1e-6 the
#: held-out slice named heavy ball for 6 GD oracle layers read exactly; none at 1e-5).
PRECISION = 1e-5
#: A mix fits a layer better than X alone where its gain's lower bound exceeds this (float
#: round-off only: the mix test is a paired bootstrap's, not a margin between learners).
MIX_FLOOR = 1e-8


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


def _sign(sim: Similarity) -> float:
    return 1.0 if sim.higher_is_better else -1.0


def _subset(it: Iterates, cols: Sequence[int]) -> Iterates:
    idx = torch.as_tensor(list(cols), dtype=torch.long)
    return Iterates(it.steps[idx], it.preds[idx],
                    it.weights[idx] if it.weights is not None else None, {}, it.name)


@dataclasses.dataclass
class _Evidence:
    """One metric's facts per candidate, in higher-is-better space."""

    best: dict[str, list[int]]  # matched column per layer
    table: dict[str, Tensor]  # [L, K] every column's similarity (sign applied)
    value: dict[str, Tensor]  # [L] best similarity (sign applied)
    boot: dict[str, Tensor]  # [L, R] best per replicate (sign applied)
    sign: float
    confidence: float


def _evidence(tables: Mapping[str, Similarity]) -> _Evidence:
    sims = list(tables.values())
    sign = _sign(sims[0])
    best, table, value, boot = {}, {}, {}, {}
    for key, sim in tables.items():
        if sim.boots is None:
            raise ValueError(f"the {sim.metric} table of {key} has no bootstrap replicates")
        scored = sign * sim.values
        best[key] = scored.argmax(1).tolist()
        table[key] = scored
        value[key] = scored.max(1).values
        boot[key] = (sign * sim.boots).max(1).values
    return _Evidence(best, table, value, boot, sign, sims[0].confidence)


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


def _resemblances(x: str, layers: Sequence[int], ev: _Evidence, cands: Mapping[str, Candidate],
                  metric: str, ys: Tensor, spec: TableSpec, values_of_layers: Tensor,
                  noisy: Sequence[Tensor] = ()) -> _Yardsticks:
    """What X's match at ``layers`` is judged against (higher-is-better space).

    Every rival's best imitation of X's matched column; the similarity of the runner-up's
    matched column to it; and the mixes (`_mixes`).
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
        imit[y] = {i: ev.sign * best[cols.index(ev.best[x][i])] for i in layers}
    runner: dict[int, float] = {}
    by_rival: dict[str, list[int]] = {}
    for i in layers:
        by_rival.setdefault(_ranked(ev, i)[1], []).append(i)
    for y, at in by_rival.items():
        ycols = sorted({ev.best[y][i] for i in at})
        table = similarity(values, _subset(cands[y].of(metric), ycols), ys, metric, n_boot=2,
                           check=False, **kw).values
        for i in at:
            runner[i] = ev.sign * float(table[cols.index(ev.best[x][i]),
                                              ycols.index(ev.best[y][i])])
    own: dict[int, Tensor] = {}
    own_value: dict[int, float] = {}
    rival_own: dict[str, dict[int, Tensor]] = {}
    mixed: dict[str, dict[int, bool]] = {}
    for i in layers:
        own_value[i], own[i], theirs, by_y = _mixes(x, i, ev, cands, metric, ys, spec,
                                                    values_of_layers)
        for y, flag in by_y.items():
            mixed.setdefault(y, {})[i] = flag
            rival_own.setdefault(y, {})[i] = theirs[y]
    margin = probe_margins(x, layers, ev.best, ev.sign, cands, metric, ys, spec,
                           values_of_layers, noisy)
    return _Yardsticks(imit, runner, own, own_value, rival_own, mixed, margin)


#: The weights w of the mixes ``(1 − w) a + w b`` tried (`_mixes`). A layer that runs X
#: off X's grid is fitted a little better by a small step toward some other learner
#: (w ≈ 0.1–0.25 on the known-answer models); a layer between two learners (the benchmark's
#: average of GD and Newton, w = 1/2) by a mix near the middle.
MIX_WEIGHTS = (0.35, 0.5, 0.65)
#: X's columns, after its match, that X's own mixes are made with (besides the match's
#: neighbours on its grid: the same rule's adjacent step counts, or the adjacent λ).
OWN_MIXES = 3


def _continuum(c: str, layer: int, ev: _Evidence, cands: Mapping[str, Candidate], metric: str,
               ys: Tensor, spec: TableSpec, values_of_layers: Tensor) -> tuple[float, Tensor]:
    """Candidate ``c`` as a continuum at ``layer``: its best value and best per replicate.

    A family is matched on a grid; a layer that runs it between grid points is closer to a
    mix of its nearest columns than to any one of them, so its similarity is taken over
    its matched column and the mixes ``(1 − w) m + w k`` with the match's grid neighbours,
    its next-best columns and each variant's best column k. Every candidate is read so
    (a denser family must not win by its grid alone: heavy ball's took GD layers between
    GD's step counts).
    """
    on_w = METRIC_INFO[metric].on == "weights"
    fam, best = cands[c].of(metric), ev.best[c][layer]
    nearest = list(dict.fromkeys([*cands[c].neighbors(best), *_next_best(c, layer, ev, OWN_MIXES),
                                  *_variant_bests(cands[c], ev.table[c][layer])]))
    nearest = [k for k in nearest if k != best]
    own, value = ev.boot[c][layer], float(ev.value[c][layer])
    if not nearest:
        return value, own
    mine = columns_of(fam, [best], on_w)[0]
    parts = columns_of(fam, nearest, on_w)
    values, boots = _mix_tables(mine, parts, layer, ev, metric, ys, spec, values_of_layers)
    return max(value, float(values.max())), torch.maximum(own, boots.flatten(0, 1).max(0).values)


def _mix_tables(mine: Tensor, parts: Tensor, layer: int, ev: _Evidence, metric: str,
                ys: Tensor, spec: TableSpec, values_of_layers: Tensor) -> tuple[Tensor, Tensor]:
    """The layer's similarity to each mix ``(1 − w) mine + w part``.

    Values ``[part, w]`` and replicates ``[part, w, boot]``, in higher-is-better space and
    corrected for the readout's noise as the tables are.
    """
    on_w = METRIC_INFO[metric].on == "weights"
    mixes = torch.stack([(1 - w) * mine + w * other for other in parts for w in MIX_WEIGHTS])
    it = Iterates(torch.zeros(len(mixes), dtype=torch.long),
                  mixes if not on_w else mixes.new_zeros(mixes.shape[:-1]),
                  mixes if on_w else None, {}, "mix")
    sim = similarity(values_of_layers[layer:layer + 1], it, ys, metric, n_boot=spec.n_boot,
                     confidence=ev.confidence, seed=spec.seed, check=False, **spec.kw(metric))
    assert sim.boots is not None
    rows = slice(layer, layer + 1)
    boots = ev.sign * spec.correct(metric, sim.boots, rows)[0]
    values = ev.sign * spec.correct(metric, sim.values, rows)[0]
    return values.view(len(parts), len(MIX_WEIGHTS)), boots.view(len(parts), len(MIX_WEIGHTS), -1)


def _mixes(x: str, layer: int, ev: _Evidence, cands: Mapping[str, Candidate], metric: str,
           ys: Tensor, spec: TableSpec, values_of_layers: Tensor
           ) -> tuple[float, Tensor, dict[str, Tensor], dict[str, bool]]:
    """X and every rival as continua (`_continuum`) at ``layer``, and the mixes of X and Y.

    Returns X's best value and replicates, each rival's replicates, and per rival whether
    a mix of X's and its matched columns fits the layer better than X does — a layer
    between X and Y (the known-answer benchmark's average of GD and Newton) is neither's;
    "better" is beyond the paired interval (every table shares the bootstrap's resamples).
    """
    on_w = METRIC_INFO[metric].on == "weights"
    kw: dict[str, Any] = {"ev": ev, "cands": cands, "metric": metric, "ys": ys, "spec": spec,
                          "values_of_layers": values_of_layers}
    own_value, own = _continuum(x, layer, **kw)
    rivals = [y for y in cands if y != x]
    rival_own = {y: _continuum(y, layer, **kw)[1] for y in rivals}
    mine = columns_of(cands[x].of(metric), [ev.best[x][layer]], on_w)[0]
    parts = torch.stack([columns_of(cands[y].of(metric), [ev.best[y][layer]], on_w)[0]
                         for y in rivals])
    _, boots = _mix_tables(mine, parts, layer, ev, metric, ys, spec, values_of_layers)
    low = torch.quantile(boots - own, (1 - ev.confidence) / 2, dim=-1)  # [rival, w]
    return own_value, own, rival_own, {y: bool((low[j] > MIX_FLOOR).any())
                                       for j, y in enumerate(rivals)}


def _variant_bests(cand: Candidate, values: Tensor) -> list[int]:
    """The best-matching column of each of the family's variants (``values``: one layer's)."""
    best: dict[int, int] = {}
    for k, v in enumerate(cand.variant):
        if v not in best or values[k] > values[best[v]]:
            best[v] = k
    return list(best.values())


def _next_best(x: str, layer: int, ev: _Evidence, k: int) -> list[int]:
    """X's ``k`` best columns at ``layer`` after its match (by its table's values)."""
    values = ev.table[x][layer]
    order = torch.argsort(values, descending=True).tolist()
    return [c for c in order if c != ev.best[x][layer]][:k]


def _ranked(ev: _Evidence, layer: int) -> list[str]:
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
    ev = _evidence(tables)
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


def _named(metric: str, ev: _Evidence, tables: Mapping[str, Similarity],
           cands: Mapping[str, Candidate], layer: int, x: str, kind: str = RUNS,
           **extra: Any) -> LayerAnswer:
    col = ev.best[x][layer]
    return LayerAnswer(kind, x, cands[x].columns[col], float(tables[x].values[layer, col]),
                       metric=metric, **extra)


def _decide(metric: str, ev: _Evidence, tables: Mapping[str, Similarity],
            cands: Mapping[str, Candidate], layer: int, x: str, sticks: _Yardsticks
            ) -> LayerAnswer:
    """The rule for one live, matched layer whose best candidate is ``x``.

    X's similarity is that of X as a continuum (its match and mixes with its next-best
    columns, `_mixes`). X is separated from Y when the layer is closer to X than to Y
    beyond the paired interval, widened through probes by the probes' own noise
    (`probe_margins`); it is closer to X's match than Y's best imitation of that
    match is (the learners' own resemblance: a layer farther from X's match than Y comes
    to it is not X's; the point estimate, the interval being the paired difference's job);
    and no mix of X's and Y's matched columns fits it better (a layer between X and Y is
    neither's). Runs X: separated from every other candidate. None of
    them: its optimistic bound falls short of the runner-up's matched column's similarity
    to X's match. Otherwise: cannot tell X from the candidates it is not separated from.
    """
    q = torch.tensor([(1 - ev.confidence) / 2, (1 + ev.confidence) / 2], dtype=torch.float64)
    own = sticks.own[layer]
    pessimistic, optimistic = torch.quantile(own, q).tolist()
    ranked = _ranked(ev, layer)
    unseparated = []
    for y in ranked[1:]:
        diff_low = float(torch.quantile(own - sticks.rival_own[y][layer], q[0]))
        diff_low -= sticks.margin.get(y, {}).get(layer, 0.0)
        close = sticks.own_value[layer] > sticks.imitation[y][layer] + PRECISION
        if not (diff_low > PRECISION and close and not sticks.mixed[y][layer]):
            unseparated.append(y)
    if not unseparated:
        return _named(metric, ev, tables, cands, layer, x)
    runner_up = sticks.runner_up[layer]
    extra = {"runner_up": ranked[1], "resemblance": ev.sign * runner_up}
    if optimistic + PRECISION < runner_up:
        return _named(metric, ev, tables, cands, layer, x, NONE, **extra)
    return _named(metric, ev, tables, cands, layer, x, CANNOT_TELL, others=unseparated,
                  **extra)
