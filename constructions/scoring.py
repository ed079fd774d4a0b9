"""Counting a known-answer cell: what `align` said of each live layer, against the truth.

Views and what they count over the live layers (layers that compute nothing are not
counted):

- ``answer`` (the per-layer answer over every candidate, `AlignResult.answer`; judged):
  ``true`` (it names the truth; where the truth's iterate has converged to OLS's within
  the interval, also OLS, or "cannot tell" among learners that all reach the iterate
  within the rule's resolution: a converged iterate is any converged learner's),
  ``false`` (it names another learner: a false attribution), ``cannot tell`` and
  ``none``; and the **separable** layers — those where the truth's own family reaches its
  iterate better than every other candidate's family does, by more than the width of the
  layer's interval and more than the rule's `PRECISION` (its resolution), under some
  verdict metric; where the iterate has converged under every metric, those where the
  candidates split into those alike to it and those beyond the resolution under every
  metric, some beyond (`separable_at`: the converged ones can be told from the rest) —
  with the true answers among them. A family reaches an iterate as
  the answer's rule lets it reach a layer: over its columns and their mixes
  (`continua.families_reach`; a rival's grid alone would count as separable a GD iterate
  that heavy ball, between two of its step counts, imitates to 2e-6), and with its fine
  step sizes next to its match where the answer read the layers exactly (as `align` runs
  them there). For a model that
  runs no candidate (truth None) naming any learner is false, and "cannot tell" or "none
  of them" is right. ``answer METRIC``: each metric's
  own answer, counted the same way.
- For GD and Newton truths, the Newton-vs-GD views as before: ``protocol METRIC`` (the
  protocol's learner table), ``fitted METRIC`` (step sizes fitted), ``verdict`` (the
  fitted view's verdict metrics combined), ``verdict, default metrics`` and ``spectral
  order``: ``true`` (prefers the truth), ``false`` (prefers the other), ``none``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.alignment.comparison import PairVerdict, combined
from iclprobe.alignment.config import DEFAULT_METRICS
from iclprobe.alignment.measuring import fit_steps, refine
from iclprobe.alignment.measuring.candidates import Candidate, Fine, TableSpec, build_candidates
from iclprobe.alignment.measuring.kept import kept
from iclprobe.alignment.measuring.reading import reread
from iclprobe.alignment.measuring.similarities import similarity_values
from iclprobe.alignment.metrics import METRIC_INFO, metric_info
from iclprobe.alignment.pipeline import AlignResult
from iclprobe.alignment.views.answer import CANNOT_TELL, DEAD, RUNS, LayerAnswer
from iclprobe.alignment.views.answer_rule import PRECISION
from iclprobe.alignment.views.continua import families_reach
from iclprobe.tasks import RegressionBatch

#: The verdict of `align`'s default metrics (error and weight cosine) alone: what a user
#: who does not ask for spd gets.
DEFAULT_VIEW = "verdict, default metrics"
ANSWER = "answer"
VIEWS = ("protocol", "fitted", "spectral", "verdict", DEFAULT_VIEW, ANSWER)
JUDGED = ANSWER  # the view the targets are held to: the answer align reports first
#: per layer, whether the truth is separable as a probe reads the layer (`truth_reach` with
#: the probes' rows; `Reach.separable`: beyond the probe cell's interval and the rule's
#: resolution): a probe reads a column up to a scale and a part linear in x_t, and some
#: rivals reproduce a truth's iterate exactly up to those (heavy ball's step 2 is GD's at
#: 2η/(2 + β), times (2 + β)²/4; every first step is ``η Xᵀy``)
THROUGH_PROBES = "separable through probes"
SEPARABLE, NOT_SEPARABLE = "separable", "not separable"
TruthColumns = Callable[..., algorithms.Iterates]


def score(res: AlignResult, truth: str | None, batch: RegressionBatch,
          truth_columns: TruthColumns, probe_rows: tuple[int, int] | None = None,
          named: Sequence[int] | None = None
          ) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    """Every view's counts and per-layer labels for one aligned cell.

    ``probe_rows``: the positions the layers' probes were fitted on, where they were (the
    rows `align` re-reads the candidates on): where the answer misses the truth at a live
    layer (of ``named``, where given: the layers the exact readout names it at), the labels
    then also say, per layer, whether the truth is separable as a probe reads it
    (`THROUGH_PROBES`; on every layer, as the answer's families reach the layers together).
    """
    counts: dict[str, dict[str, int]] = {}
    verdicts: dict[str, list[str]] = {}
    if truth in ("gd", "newton"):
        _pair_views(res, truth, counts, verdicts)
    if res.answer is not None:
        reach = truth_reach(res, truth, batch, truth_columns) if truth else {}
        for view, said in [(ANSWER, res.answer.layers), *(
                (f"{ANSWER} {m}", by) for m, by in res.answer.by_metric.items())]:
            metrics = list(res.answer.by_metric) if view == ANSWER else [view.split(" ")[1]]
            counts[view] = answer_counts(said, truth, {m: reach[m] for m in metrics
                                                       if m in reach})
            verdicts[view] = [a.text for a in said]
        said = res.answer.layers
        asked = range(len(said)) if named is None else [i for i in named if i < len(said)]
        if truth and probe_rows is not None and any(  # only where probes miss the truth
                said[i].kind not in DEAD and not names_truth(said[i].text, truth) for i in asked):
            through = truth_reach(res, truth, batch, truth_columns, probe_rows)
            verdicts[THROUGH_PROBES] = [
                SEPARABLE if any(r.separable(i) for r in through.values()) else NOT_SEPARABLE
                for i in range(len(res.answer.layers))]
    return counts, verdicts


def _pair_views(res: AlignResult, truth: str, counts: dict[str, dict[str, int]],
                verdicts: dict[str, list[str]]) -> None:
    """The Newton-vs-GD views: protocol and fitted per metric, verdicts, spectral."""
    other = "newton" if truth == "gd" else "gd"
    views = {f"protocol {metric}": next(p for p in table.pairs if {p.a, p.b} == {"newton", "gd"})
             for metric, table in res.comparisons.items()
             if any({p.a, p.b} == {"newton", "gd"} for p in table.pairs)}
    views.update({f"fitted {metric}": pair for metric, pair in res.fitted.items()})
    for view, pair in views.items():
        live = [i for i, v in enumerate(pair.verdicts) if v not in DEAD]
        said = [pair.verdicts[i] for i in live]
        counts[view] = {"true": said.count(f"prefers {truth}"),
                        "false": said.count(f"prefers {other}"),
                        "none": sum(not v.startswith("prefers") for v in said)}
        if view.startswith("fitted"):
            sep = [i for i in live if separable(pair, truth, i)]
            counts[view]["separable"] = len(sep)
            counts[view]["true_separable"] = sum(
                pair.verdicts[i] == f"prefers {truth}" for i in sep)
        verdicts[view] = list(pair.verdicts)
    if res.fitted:
        default = [p for m, p in res.fitted.items() if m in DEFAULT_METRICS]
        for view, said_by in (("verdict", res.verdict),
                              (DEFAULT_VIEW, combined(default)[0] if default else [])):
            counts[view] = _verdict_counts(said_by, list(res.fitted.values()), truth)
            verdicts[view] = list(said_by)
    if res.spectral is not None:
        said = [r for r in res.spectral.reading if r != "computes nothing"]
        counts["spectral order"] = {"true": said.count(f"{truth}-like"),
                                    "false": said.count(f"{other}-like"),
                                    "none": sum(not r.endswith("-like") for r in said)}
        verdicts["spectral order"] = list(res.spectral.reading)


def _verdict_counts(said_by: list[str], pairs: list[PairVerdict], truth: str) -> dict[str, int]:
    """A combined verdict's counts over the live layers, and at the separable ones."""
    other = "newton" if truth == "gd" else "gd"
    live = [i for i, v in enumerate(said_by) if v not in DEAD]
    sep = [i for i in live if any(separable(p, truth, i) for p in pairs)]
    said = [said_by[i] for i in live]
    return {"true": said.count(f"prefers {truth}"), "false": said.count(f"prefers {other}"),
            "none": sum(not v.startswith("prefers") for v in said), "separable": len(sep),
            "true_separable": sum(said_by[i] == f"prefers {truth}" for i in sep)}


def separable(pair: PairVerdict, truth: str, layer: int) -> bool:
    """Whether the learners alone can tell the true learner's iterate from the other's.

    The other learner's best match (over its whole fitted family) to the true learner's
    matched column falls short of a perfect match by more than the width of the
    Newton − GD interval.
    """
    cal, diff = pair.calibration, pair.difference
    rival = cal.a_by_b[layer] if truth == pair.a else cal.b_by_a[layer]
    gap = 1.0 - rival if metric_info(pair.metric).higher_is_better else rival
    return gap > diff.upper[layer] - diff.lower[layer]


@dataclasses.dataclass
class Reach:
    """Per layer, by one metric: how far the truth's own family stands out.

    ``gaps[k][l]``: the truth's family's best imitation of layer l's true column minus
    candidate k's family's best (higher-is-better space); ``width[l]``: the width of the
    layer's interval for the truth.
    """

    gaps: dict[str, list[float]]
    width: list[float]

    def resolution(self, layer: int) -> float:
        """What the answer cannot tell apart: the layer's interval, and `PRECISION`."""
        return max(self.width[layer], PRECISION)

    def separable(self, layer: int) -> bool:
        """The truth's family reaches its iterate better than every rival, beyond noise.

        Beyond the layer's interval, and beyond `PRECISION`, under which the answer's rule
        holds two similarities equal (its `resolution`).
        """
        beyond = [g[layer] > self.resolution(layer) for g in self.gaps.values()]
        return bool(beyond) and all(beyond)

    def converged(self, layer: int) -> bool:
        """OLS reaches the true iterate as well as the truth's family, within noise."""
        return "ols" in self.gaps and self.gaps["ols"][layer] <= self.width[layer]

    def alike(self, layer: int) -> set[str]:
        """The candidates whose family reaches the true iterate within the resolution."""
        return {k for k, g in self.gaps.items() if g[layer] <= self.resolution(layer)}


def separable_at(reach: Mapping[str, Reach], layer: int) -> bool:
    """Whether the answer's rule can say, right, what the layer runs (by some metric's reach).

    The truth stands out under some metric (`Reach.separable`); or its iterate has converged
    to OLS's under every metric, where OLS and every learner converged with it are as right
    as the truth: then the layer is separable where the candidates split cleanly into those
    alike to the iterate under every metric and those beyond the resolution under every
    metric, some of them beyond, so that "cannot tell" among the converged ones tells
    something and no metric leaves a candidate between the two.
    """
    rs = list(reach.values())
    if any(r.separable(layer) for r in rs):
        return True
    if not rs or not all(r.converged(layer) for r in rs):
        return False
    alike = set.intersection(*(r.alike(layer) for r in rs))
    beyond = set.intersection(*(set(r.gaps) - r.alike(layer) for r in rs))
    return bool(beyond) and alike | beyond == set(rs[0].gaps)


def truth_reach(res: AlignResult, truth: str | None, batch: RegressionBatch,
                truth_columns: TruthColumns, probe_rows: tuple[int, int] | None = None
                ) -> dict[str, Reach]:
    """`Reach` per verdict metric of the answer: the candidates' families on the true columns.

    Computed from the learners alone (raw, as an exact readout sees them; given
    ``probe_rows``, the true columns and the families both read as probes fitted on those
    positions read a layer, `reading.reread`), on the batch
    the model was aligned on; the width comes from the layer's interval in ``res``. The
    families are those the answer read (``res.answer.fine``): with their fine step sizes
    next to each family's match to the true column and their step sizes fitted where the
    layers were read exactly or through probes fitted to held columns (through probes the
    searches also try the step counts near the match's, as `align`'s do), their grids
    alone through probes fitted to y (`measuring.refine`).
    """
    assert res.answer is not None and truth is not None
    if truth not in res.answer.candidates:
        return {}
    spec = TableSpec(tuple(res.window), res.protocol["weight_t_min"],  # type: ignore[arg-type]
                     "sequences" if res.positions == "last" else "positions", 2, 0.95, 0)
    n_w = max((n for m, n in res.answer.sequences.items() if METRIC_INFO[m].on == "weights"),
              default=0)
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    cands, _ = build_candidates(res.answer.candidates, batch, stats, spec.window, res.n_layers,
                                slice(0, n_w) if n_w else None, {}, probe_rows)
    metrics = list(res.answer.metrics)
    values = _true_values(truth_columns, batch, metrics, n_w, probe_rows)
    reaches = kept(  # the same for every readout of the same reading
        ("reach", tuple(cands), tuple((m, tuple(sorted(spec.kw(m).items()))) for m in metrics),
         spec.window, res.n_layers, n_w, probe_rows),  # the families depend on these too
        (batch.xs, batch.ys, batch.cov, *values.values()),
        lambda: _reaches(values, cands, batch, stats, spec, res.n_layers, n_w, probe_rows)
    )[res.answer.fine]
    out = {}
    for metric in metrics:
        sign = 1.0 if metric_info(metric).higher_is_better else -1.0
        reach = {k: [sign * v for v in r] for k, r in reaches[metric].items()}
        own = reach.pop(truth)
        score = res.answer.scores[metric][truth].score
        out[metric] = Reach({k: [o - r[i] for i, o in enumerate(own)] for k, r in reach.items()},
                            [u - lo for u, lo in zip(score.upper, score.lower)])
    return out


def _true_values(truth_columns: TruthColumns, batch: RegressionBatch, metrics: list[str],
                 n_w: int, probe_rows: tuple[int, int] | None) -> dict[str, Tensor]:
    """Per metric, the true columns its similarities read (as probes read, given rows).

    Predictions on every sequence, induced weights on the first ``n_w``; read as probes,
    the weights take the readout fitted on every sequence's predictions, as the
    candidates' do (`reading.probe_read`).
    """
    xs, ys = batch.xs.double(), batch.ys.double()
    preds = truth_columns(batch.xs, batch.ys, weights=False).preds.double()
    values = {}
    for metric in metrics:
        if METRIC_INFO[metric].on != "weights":
            values[metric] = preds if probe_rows is None else \
                reread(preds, None, xs, ys, probe_rows)[0]
            continue
        weights = truth_columns(batch.xs[:n_w], batch.ys[:n_w], weights=True).weights
        assert weights is not None  # asked for with weights=True
        values[metric] = weights.double() if probe_rows is None else \
            reread(preds, weights.double(), xs, ys, probe_rows)[1]  # type: ignore[assignment]
    return values


def _reaches(values: dict[str, Tensor], cands: dict[str, Candidate], batch: RegressionBatch,
             stats: algorithms.PrefixStats, spec: TableSpec, n_layers: int, n_w: int,
             probe_rows: tuple[int, int] | None = None
             ) -> dict[bool, dict[str, dict[str, list[float]]]]:
    """Per metric, each family's reach of the true columns ``values``.

    On its grid (False), and with its fine step sizes next to its match and its step sizes
    fitted (True), as `align` runs them read exactly.
    """
    ys = batch.ys.double()
    rows = {m: slice(0, n_w) if METRIC_INFO[m].on == "weights" else slice(None) for m in values}

    def table(m: str, cand: Candidate) -> Tensor:  # the family's columns, higher is better
        return (1.0 if metric_info(m).higher_is_better else -1.0) * similarity_values(
            values[m], cand.of(m), ys[rows[m]], m, **spec.kw(m))

    tables = {m: {k: table(m, c) for k, c in cands.items()} for m in values}
    grid = {m: families_reach(v, cands, ys[rows[m]], m, tables[m], **spec.kw(m))
            for m, v in values.items()}

    def run(fine: Mapping[str, Fine], weights: bool = True) -> dict[str, Candidate]:
        return build_candidates(list(fine), batch, stats, spec.window, n_layers,
                                slice(0, n_w) if n_w and weights else None, {}, probe_rows,
                                fine)[0]

    fine = refine.refined(
        cands, lambda k, groups: {c for m in values
                                for c in refine.best_columns(tables[m][k], groups)},
        batch, stats, spec.window, run)
    for k, more in fine.items():  # the fine columns after the grid's
        for m in values:
            tables[m][k] = torch.cat([tables[m][k], table(m, more)], 1)
    runs = [fine]
    fit = fit_steps.fit_metric(values)
    if fit is not None:
        places = {k: c.places + (fine[k].places if k in fine else []) for k, c in cands.items()}
        fits = fit_steps.fitted(places, fit, tables[fit], values[fit], ys, spec.kw(fit), batch,
                                stats, spec.window, lambda asks: run(asks, False),
                                within=None if probe_rows is None else fit_steps.PROBE_WITHIN)
        runs.append(run(fits) if fits else {})
        for k, more in runs[-1].items():  # the fitted columns after those
            for m in values:
                tables[m][k] = torch.cat([tables[m][k], table(m, more)], 1)
    fams = dict(cands)
    for k, (fam, _) in refine.joined(cands, *runs, batch=batch, stats=stats,
                                     window=spec.window).items():
        fams[k] = fam
    return {False: grid, True: {m: families_reach(v, fams, ys[rows[m]], m, tables[m],
                                                  **spec.kw(m)) for m, v in values.items()}}


def answer_counts(said: list[LayerAnswer], truth: str | None, reach: dict[str, Reach]
                  ) -> dict[str, int]:
    """Counts of one answer view over the live layers (see the module docstring)."""
    out = {"true": 0, "false": 0, "cannot tell": 0, "none": 0}
    if truth is not None:
        out.update(separable=0, true_separable=0)
    for layer, a in enumerate(said):
        if a.kind in DEAD:
            continue
        key = "true" if is_right(a, truth, reach, layer) else "false" if a.kind == RUNS else \
            "cannot tell" if a.kind == CANNOT_TELL else "none"
        out[key] += 1
        if truth is not None and separable_at(reach, layer):
            out["separable"] += 1
            out["true_separable"] += key == "true"
    return out


def is_right(a: LayerAnswer, truth: str | None, reach: dict[str, Reach], layer: int) -> bool:
    """Whether the answer is right (see the module docstring).

    Naming the truth; where the truth's iterate has converged to OLS's under every metric,
    naming OLS, or "cannot tell" among learners every one of which reaches the iterate
    within the resolution under every metric (a converged iterate is theirs as much as the
    truth's). For no truth nothing named is right: "cannot tell" and "none of them" are
    counted as such.
    """
    if truth is None:
        return False
    if a.kind == RUNS and a.learner == truth:
        return True
    if not reach or not all(r.converged(layer) for r in reach.values()):
        return False
    if a.kind == RUNS:
        return a.learner == "ols"
    names = {n for n in [a.learner, *a.others] if n is not None} - {truth}
    return a.kind == CANNOT_TELL and all(names <= r.alike(layer) for r in reach.values())


def totals(results: list[Any], view: str | None = None) -> dict[str, int]:
    """Counts over every counted cell (of one view: "protocol", "answer"), and divergences."""
    out = {"true": 0, "false": 0, "none": 0, "cannot tell": 0, "diverges": 0, "separable": 0,
           "true_separable": 0}
    for r in results:
        if r.diverges:
            out["diverges"] += 1
            continue
        for name, counts in r.counts.items():
            if view is not None and name != view and not name.startswith(view + " "):
                continue
            if view == ANSWER and name != ANSWER:
                continue  # the per-metric answers are not summed into the answer
            for key, value in counts.items():
                out[key] += value
    return out


def names_truth(label: str, truth: str) -> bool:
    """Whether a view's label names ``truth`` ("prefers gd", or the answer "gd (...)")."""
    return label == f"prefers {truth}" or label == truth or label.startswith(truth + " (")

