"""What a layer runs: one answer over every candidate learner, "none of them" included.

Each candidate (`alignment.measuring.candidates`) is matched over its fitted family; per layer and
metric its best similarity has a bootstrap interval that re-picks the column in every
replicate. With X the best-matching candidate and every other candidate Y:

- **X is separated from Y** when X is closer than Y beyond the interval of the paired
  difference, and the layer is closer to X's matched column than any column of Y comes to
  that column (the layer's pessimistic bound beats Y's best imitation of X's match): the
  learners' own resemblance is the yardstick, as in the Newton-vs-GD verdict;
- the layer **runs X** (with X's matched hyperparameters and step) when X is separated
  from every other candidate;
- it is **none of them** when it is farther from X's matched column, even at its
  optimistic bound, than the runner-up's matched column is: the candidates resemble each
  other more than the best of them resembles the layer. It is printed with the nearest
  candidate and both similarities;
- otherwise **cannot tell X from Y, …**, naming the candidates X is not separated from.

Layers that are not live (`alignment.liveness`) "compute nothing"; a live layer no
candidate matches better than the zero predictor "matches no learner". The metrics
combine (`combine`): a learner is named where some metric names it and none points
elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from iclprobe.alignment import comparison as C
from iclprobe.alignment.measuring.candidates import Candidate, Candidates, TableSpec
from iclprobe.alignment.measuring.similarities import Similarity, first_best
from iclprobe.alignment.metrics import METRIC_INFO, metric_info
from iclprobe.alignment.views.answer_rule import (
    CANNOT_TELL,
    DEAD,
    NONE,
    PRECISION,
    RUNS,
    LayerAnswer,
    answer_metric,
    places_apart,
)
from iclprobe.alignment.views.continua import evidence, sign_of

if TYPE_CHECKING:
    from iclprobe.alignment.evaluation import Evaluation

__all__ = ["CANNOT_TELL", "DEAD", "NONE", "PRECISION", "RUNS", "Answer", "LayerAnswer",
           "answer", "answer_view", "combine", "matched_by", "matched_layers"]


@dataclasses.dataclass
class Answer:
    """The answer per layer over the candidates, per metric and combined."""

    candidates: list[str]
    learner_labels: dict[str, str]  # candidate -> what it is
    metrics: list[str]  # the metrics combined (the verdict metrics computed)
    layers: list[LayerAnswer]  # combined
    by_metric: dict[str, list[LayerAnswer]]
    scores: dict[str, dict[str, C.LearnerScore]]  # metric -> candidate -> best per layer
    sequences: dict[str, int]  # metric -> the sequences its tables were computed on
    notes: list[str] = dataclasses.field(default_factory=list)  # candidates left out, why
    #: candidate -> per layer, its matched column's place in its family (variant, step), by
    #: the error cosine where computed: the same columns on other data (`alignment.design`);
    #: a variant between two integers is a step size fitted between two of the family's
    #: (`Family.variant_at`, `measuring.fit_steps`)
    places: dict[str, list[tuple[float, int]]] = dataclasses.field(default_factory=dict)
    #: whether the families' fine step sizes next to the layers' matches joined them (the
    #: layers read exactly; through probes the grids alone: `measuring.refine`)
    fine: bool = False

    @property
    def texts(self) -> list[str]:
        """Per layer, the combined answer in words."""
        return [a.text for a in self.layers]

    @property
    def labels(self) -> list[str]:
        """Per layer, the answer without its step ("gd", "≈ gd, cg", "none (nearest gd)")."""
        return [str(a.learner) if a.kind == RUNS else a.short for a in self.layers]

    def sentence(self, live: Sequence[bool], evaluations: Sequence[str] | None = None) -> str:
        """The answer over the live layers in words, one clause per run of equal answers.

        "None of them" layers form one clause, with their nearest candidates and the range
        of their similarity to them beside the runners-up's. ``evaluations``: per layer,
        the evaluation a "none of them" answer's numbers come from (an answer over two
        evaluations): its clauses then keep each evaluation's numbers apart and name it.
        """
        runs: list[tuple[tuple[str, str], list[int]]] = []
        for layer, a in enumerate(self.layers):
            if not live[layer]:
                continue
            text = NONE if a.kind == NONE else str(a.learner) if a.kind == RUNS else a.text
            key = (text, evaluations[layer] if evaluations and a.kind == NONE else "")
            if runs and runs[-1][0] == key and runs[-1][1][-1] == layer - 1:
                runs[-1][1].append(layer)
            else:
                runs.append((key, [layer]))
        clauses = [f"{self._clause(text, layers, on)} at {_where(layers)}"
                   for (text, on), layers in runs]
        head = (f"what the layers run, among {', '.join(self.candidates)} (each over its "
                f"fitted family; {', '.join(metric_info(m).label for m in self.metrics)})")
        return head + ": " + ("; ".join(clauses) if clauses else "no live layer") + "."

    def _clause(self, text: str, layers: list[int], on: str = "") -> str:
        """A run of layers' answer: the learner with its columns, or the nearest candidates.

        ``on``: the evaluation a "none of them" run's numbers come from, named ("" none).
        """
        said = [self.layers[i] for i in layers]
        if said[0].kind == RUNS:
            cols = [a.column for a in said]
            return f"{text} ({cols[0] if len(set(cols)) == 1 else f'{cols[0]} … {cols[-1]}'})"
        if said[0].kind != NONE:
            return text
        nearest: dict[str, list[int]] = {}
        for i, a in zip(layers, said):
            nearest.setdefault(str(a.learner), []).append(i)
        label = metric_info(said[0].metric).label if said[0].metric else "similarity"
        where = ", ".join(f"{k} at {_where(v, short=True)}" for k, v in nearest.items())
        places = places_apart([(a.value, a.resemblance) for a in said])
        return (f"none of them ({f'on the {on}: ' if on else ''}nearest {where}; {label} "
                f"{_span([a.value for a in said], places)} to it, while the runner-up's match "
                f"is at {_span([a.resemblance for a in said], places)} to it)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


def combine(by_metric: Mapping[str, list[LayerAnswer]]) -> list[LayerAnswer]:
    """One answer per layer from several metrics' answers.

    The metrics on the layers' own predictions lead (error cosine, spd: no fit of induced
    weights stands between the layer and the metric): a learner is named ("runs X") where
    the first of them names X, every other one names X or cannot tell X from others without
    finding the layer between X and another candidate (a mix of their columns fitting it
    better: `LayerAnswer.between`), and no metric on induced weights names another learner;
    "none of them" where every prediction metric says so. Otherwise "cannot tell" among
    every candidate a prediction metric named, could not separate, or found nearest, and
    every candidate a weight metric names. On the known-answer benchmark, letting a weight
    metric name a learner alone, or block one by "none of them", cost through probes false
    attributions (a weight metric naming heavy ball in a layer between GD and Newton) and a
    sixth of the named layers (noisy induced weights read as "none").

    Where a prediction metric is live, a weight metric's own "cannot tell" list widens
    neither answer: it cannot block a name, and it does not lengthen a "cannot tell" (its
    runner-up and list are heard only where no one else gives a second name). Its paired
    intervals run over the few weight sequences, where a difference carried by a few of
    them has a lower end of 0: a CG oracle's layer past d steps (OLS's iterate exactly) was
    read "cannot tell cg from ols, newton, momentum, gd" because the weight cosine could not
    separate the last three, whose best iterates the error cosine and spd put 10⁻³ below
    it; it now reads "cannot tell cg from ols".
    """
    per_layer = list(zip(*by_metric.values()))
    return [_combine_layer(list(by_metric), list(said)) for said in per_layer]


def _involved(a: LayerAnswer) -> list[str]:
    return [n for n in [a.learner, *a.others] if n is not None]


def _between(a: LayerAnswer, x: str | None) -> bool:
    """``a`` found the layer between ``x`` and another candidate (a mix of theirs fits it)."""
    return bool(a.between) and (a.learner == x or x in a.between)


def _combine_layer(metrics: list[str], said: list[LayerAnswer]) -> LayerAnswer:
    live = [(m, a) for m, a in zip(metrics, said) if a.kind not in DEAD]
    if not live:
        return dataclasses.replace(said[0], metric=None, source="")
    labels = {m: metric_info(m).label for m in metrics}
    on_preds = [(m, a) for m, a in live if METRIC_INFO[m].on == "preds"] or live
    lead = on_preds[0][1]
    if lead.kind == RUNS:
        x = lead.learner
        agree = all(a.kind in (RUNS, CANNOT_TELL) and x in _involved(a)
                    and not _between(a, x) for _, a in on_preds)
        blocked = any(a.kind == RUNS and a.learner != x for _, a in live)
        if agree and not blocked:
            return dataclasses.replace(lead, source=", ".join(
                labels[m] for m, a in live if a.kind == RUNS and a.learner == x))
    if all(a.kind == NONE for _, a in on_preds):
        return dataclasses.replace(lead, source=", ".join(labels[m] for m, _ in on_preds))
    involved: list[str] = []
    leading = {m for m, _ in on_preds}
    for m, a in live:  # a weight metric's own "cannot tell" list does not widen it
        names = _involved(a) if m in leading else [a.learner] if a.kind == RUNS else []
        involved += [n for n in names if n is not None and n not in involved]
    for _, a in on_preds + live:  # so that "cannot tell X from" names someone
        for n in [a.runner_up, *_involved(a)]:
            if len(involved) < 2 and n is not None and n not in involved:
                involved.append(n)
    first = lead.learner if lead.learner is not None else involved[0]
    heard = {a.learner for m, a in live if m in leading or a.kind == RUNS}
    why = "the metrics disagree" if len(heard) > 1 else ""
    return LayerAnswer(CANNOT_TELL, first, lead.column, lead.value,
                       [n for n in involved if n != first], lead.runner_up, lead.resemblance,
                       None, why)


def matched_layers(tables: Mapping[str, Similarity], tol: float) -> list[bool]:
    """Per layer: some candidate's best column beats the zero predictor beyond its interval."""
    out = None
    for sim in tables.values():
        sign = sign_of(sim)
        best = first_best(sign * sim.values)
        rows = torch.arange(sim.values.shape[0])
        bound = (sim.lower if sim.higher_is_better else sim.upper)[rows, best]
        above = sign * bound > sign * sim.zero[best] + tol
        out = above if out is None else out | above
    return [bool(v) for v in out] if out is not None else []


def answer(tables: Mapping[str, Mapping[str, Similarity]], cands: Mapping[str, Candidate],
           layer_values: Mapping[str, Tensor | None], ys: Tensor, spec: TableSpec,
           live: Sequence[bool], tie_tol: float, notes: Sequence[str] = (),
           noisy: Sequence[Mapping[str, Tensor | None]] = ()) -> Answer:
    """The answer over ``cands`` from their tables (``metric -> candidate -> table``).

    ``layer_values``: the layers as the tables compared them, ``{"preds": [L+1, B, n],
    "weights": [L+1, B', n, d] or None}``. ``noisy``: the same read with a sample of the
    probes' noise added and subtracted (`Candidates.noisy`; empty for an exact readout).

    The verdict metrics among those computed are combined (`combine`); liveness comes from
    ``live``, matching from the error cosine's tables where computed (else the first
    metric's).
    """
    verdict = [m for m in tables if metric_info(m).verdict] or list(tables)
    ref = tables.get("error_cosine") or tables[verdict[0]]
    matched = matched_layers(ref, tie_tol)
    sequences = {m: next(iter(by.values())).n_sequences for m, by in tables.items()}
    by_metric = {}
    for m in verdict:
        values = layer_values[METRIC_INFO[m].on]
        assert values is not None
        shifted = [v for nz in noisy if (v := nz[METRIC_INFO[m].on]) is not None]
        by_metric[m] = answer_metric(m, tables[m], cands, values, ys[:sequences[m]], spec, live,
                                     matched, shifted if len(shifted) == len(noisy) else ())
    scores = {}
    for metric, by in tables.items():
        best = evidence(by).best
        scores[metric] = {k: C.learner_score(sim, best[k]) for k, sim in by.items()}
    ref_best = evidence(ref).best
    places = {k: [c.places[col] for col in ref_best[k]] for k, c in cands.items() if c.places}
    return Answer(list(cands), {k: c.label for k, c in cands.items()}, verdict,
                  combine(by_metric), by_metric, scores, sequences, list(notes), places)


def answer_view(ev: Evaluation, live: Sequence[bool], cands: Candidates) -> Answer:
    """`align`'s stage: the answer per layer over the measured candidates (`answer`)."""
    return dataclasses.replace(
        answer(cands.tables, cands.members, cands.layers, ev.ys, cands.spec, live,
               ev.protocol.tie_tol, cands.notes, cands.noisy), fine=cands.fine)


def matched_by(result: Answer) -> list[bool]:
    """Per layer: some candidate beats the zero predictor there (not "matches no learner")."""
    return [a.kind != DEAD[1] for a in result.layers]


def _where(layers: Sequence[int], short: bool = False) -> str:
    """"layer 3", "layers 3–5" (or "3", "3–5")."""
    span = str(layers[0]) if len(layers) == 1 else f"{layers[0]}–{layers[-1]}"
    return span if short else f"layer{'s' if len(layers) > 1 else ''} {span}"


def _span(values: Sequence[float | None], places: int = 3) -> str:
    """The range of some numbers, to ``places`` places ("0.839–0.945")."""
    got = [v for v in values if v is not None]
    if not got:
        return "—"
    lo, hi = f"{min(got):.{places}f}", f"{max(got):.{places}f}"
    return lo if lo == hi else f"{lo}–{hi}"
