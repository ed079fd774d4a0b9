"""`AlignResult`: everything `align` measured for one model, built once from its stages.

A plain dataclass (JSON through `to_dict`) whose verdict is the fitted view's metrics
combined; it renders itself in a notebook through `iclprobe.alignment.output.display`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from iclprobe import algorithms
from iclprobe.algorithms.base import REFERENCE_PAIR
from iclprobe.alignment import comparison as C
from iclprobe.alignment.evaluation import Evaluation
from iclprobe.alignment.measuring.layers import Layers
from iclprobe.alignment.measuring.matching import Match, Matched
from iclprobe.alignment.measuring.runs import Learners
from iclprobe.alignment.measuring.similarities import Similarity
from iclprobe.alignment.metrics import metric_info
from iclprobe.alignment.output import display
from iclprobe.alignment.views.answer import Answer
from iclprobe.alignment.views.separation import Separation
from iclprobe.alignment.views.spectral import SpectralOrder


@dataclasses.dataclass
class AlignResult:
    """Everything `align` measured for one model."""

    name: str
    n_layers: int
    task: dict[str, Any]
    protocol: dict[str, Any]
    positions: str  # "all" or "last"
    window: tuple[int, int]  # the positions t that enter the metrics
    readout: str  # how layer predictions were read
    layer_error: list[float]  # normalized error per layer over the window
    layer_error_by_t: list[list[float]]  # [layer][t]
    zero_error: float  # the zero predictor's normalized error over the window
    learner_error_by_t: dict[str, list[float]]  # each learner at the last layer's best step
    probe_r2: list[float]
    run_labels: dict[str, str]  # run key -> what it is
    similarities: dict[str, dict[str, Similarity]]  # run -> metric -> table
    matches: dict[str, dict[str, Match]]
    comparisons: dict[str, C.LearnerComparison]  # metric -> learner table and verdicts
    separation: Separation | None
    notes: list[str]  # one line each: what was skipped or means little, and why
    live: list[bool] = dataclasses.field(default_factory=list)  # alignment.measuring.liveness, per layer
    meaningless: str | None = None  # set when no alignment means anything for this model
    probes_info: dict[str, Any] | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per stage
    fitted: dict[str, C.PairVerdict] = dataclasses.field(default_factory=dict)  # metric ->
    #   Newton vs GD with step sizes fitted (alignment.views.fitted), the view verdicts come from
    spectral: SpectralOrder | None = None  # each layer's filter order (alignment.views.spectral)
    answer: Answer | None = None  # what each layer runs over every candidate (views.answer)

    @property
    def verdict_pairs(self) -> list[C.PairVerdict]:
        """The fitted view's pairs the verdict combines.

        Those of its verdict metrics (`register_metric`'s ``verdict``: error and weight
        cosine and spd among the built-in ones, not ilwd), else every one computed.
        """
        chosen = [p for m, p in self.fitted.items() if metric_info(m).verdict]
        return chosen or list(self.fitted.values())

    @property
    def verdict_learners(self) -> tuple[str, ...]:
        """The learners the verdict compares (empty without the fitted view)."""
        pairs = self.verdict_pairs
        return (pairs[0].a, pairs[0].b) if pairs else ()

    @property
    def verdict(self) -> list[str]:
        """Newton vs GD per layer: the fitted view's metrics combined (`comparison.combined`).

        The view the known-answer benchmark holds to 0 false attributions; empty where
        the fitted view was not run (``AlignConfig(fitted=False)``, or Newton or GD absent).
        """
        return C.combined(self.verdict_pairs)[0]

    @property
    def verdict_sentence(self) -> str:
        """`verdict` in words (empty where the fitted view was not run)."""
        labels = self.verdict
        return C.sentence(labels, *REFERENCE_PAIR, None) if labels else ""

    @property
    def verdict_source(self) -> list[str]:
        """Per layer, the metrics behind `verdict` (or why it cannot tell)."""
        return C.combined(self.verdict_pairs)[1]

    @property
    def step_runs(self) -> list[str]:
        """Runs with more than one column, in protocol order (closed forms left out)."""
        return [r for r, by in self.similarities.items()
                if len(next(iter(by.values())).steps) > 1]

    def table(self, metric: str = "error_cosine") -> list[dict[str, Any]]:
        """Per layer: error, best step of each learner, its value, ties, liveness."""
        rows = []
        for layer in range(self.n_layers + 1):
            row: dict[str, Any] = {"layer": layer, "normalized_error": self.layer_error[layer]}
            for run in self.step_runs:
                if metric not in self.matches[run]:
                    continue
                m, sim = self.matches[run][metric], self.similarities[run][metric]
                k = m.best_column[layer]
                row[f"{run}_step"] = m.best_step[layer]
                row[f"{run}_column"] = sim.column_label(k)
                row[f"{run}_sim"] = m.best_value[layer]
                row[f"{run}_ties"] = m.ties[layer]
                row[f"{run}_zero_sim"] = float(sim.zero[k])
                row[f"{run}_above_zero"] = m.above_zero[layer]
            rows.append(row)
        return rows

    def __repr__(self) -> str:
        return display.short_repr(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's pretty print: what ``iclprobe align`` prints."""
        printer.text(repr(self) if cycle else display.screen(self))

    def _repr_html_(self) -> str:
        """Jupyter's rendering: the per-layer table of matched steps and verdicts."""
        return display.to_html(self)

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per layer (`iclprobe.alignment.output.display.to_frame`)."""
        return display.to_frame(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (similarity tables included)."""
        return {
            "name": self.name, "n_layers": self.n_layers, "task": self.task,
            "protocol": self.protocol, "positions": self.positions,
            "window": list(self.window), "readout": self.readout,
            "layer_error": self.layer_error, "layer_error_by_t": self.layer_error_by_t,
            "zero_error": self.zero_error, "learner_error_by_t": self.learner_error_by_t,
            "probe_r2": self.probe_r2, "run_labels": self.run_labels, "notes": self.notes,
            "meaningless": self.meaningless, "probes": self.probes_info, "live": self.live,
            "table": {m: self.table(m) for m in self.comparisons},
            "comparisons": {m: c.to_dict() for m, c in self.comparisons.items()},
            "separation": self.separation.to_dict() if self.separation else None,
            "fitted": {m: dataclasses.asdict(p) for m, p in self.fitted.items()},
            "spectral": self.spectral.to_dict() if self.spectral else None,
            "answer": self.answer.to_dict() if self.answer else None,
            "verdict": {"view": "fitted step sizes, metrics combined", "layers": self.verdict,
                        "source": self.verdict_source},
            "similarities": {r: {m: s.to_dict() for m, s in by.items()}
                             for r, by in self.similarities.items()},
            "matches": {r: {m: x.to_dict() for m, x in by.items()}
                        for r, by in self.matches.items()},
        }


@dataclasses.dataclass(frozen=True)
class Views:
    """What the views made of the measured tables (the result's verdicts)."""

    comparisons: dict[str, C.LearnerComparison]  # the protocol's: metric -> learner table
    fitted: dict[str, C.PairVerdict] = dataclasses.field(default_factory=dict)
    spectral: SpectralOrder | None = None
    separation: Separation | None = None
    answer: Answer | None = None


def build_result(ev: Evaluation, layers: Layers, learners: Learners, matched: Matched,
                 views: Views, timings: dict[str, float],
                 probes_info: dict[str, Any] | None = None) -> AlignResult:
    """The `AlignResult` of the stages' outputs: errors, learner curves, whether it means much."""
    n, d = ev.batch.xs.shape[1], ev.batch.xs.shape[2]
    t_lo, t_hi = ev.window
    err_by_t = (layers.preds - ev.ys).pow(2).mean(1) / d  # [L+1, n]
    zero_error = float(ev.ys[:, t_lo:t_hi + 1].pow(2).mean() / d)
    meaningless = None
    if not matched.live[-1]:
        last_error = float(err_by_t[-1, t_lo:t_hi + 1].mean())
        meaningless = (f"the model does not solve this task (last layer's normalized error "
                       f"{last_error:.3f} is not below the zero predictor's {zero_error:.3f} "
                       "beyond its interval): its layers cannot be aligned with a learner")
    task = ev.task.to_dict() if ev.task is not None else {"n_dims": d, "n_points": n,
                                                          "cov": "given"}
    if layers.probe_targets:  # per layer, the column its probe was fitted to
        probes_info = {**(probes_info or {}), "targets": list(layers.probe_targets)}
    return AlignResult(
        name=ev.name, n_layers=layers.n_layers, task=task, protocol=ev.protocol.to_dict(),
        positions=ev.positions, window=ev.window, readout=layers.readout,
        layer_error=err_by_t[:, t_lo:t_hi + 1].mean(-1).tolist(),
        layer_error_by_t=err_by_t.tolist(), zero_error=zero_error,
        learner_error_by_t=learner_curves(learners.iterates, matched.error_matches, ev.ys, d),
        probe_r2=layers.probe_r2, run_labels={k: spec.label for k, spec in ev.runs.items()},
        similarities=matched.sims, matches=matched.matches, comparisons=views.comparisons,
        separation=views.separation, notes=[*ev.notes, *layers.notes], live=matched.live,
        meaningless=meaningless, probes_info=probes_info, timings=timings,
        fitted=views.fitted, spectral=views.spectral, answer=views.answer)


def learner_curves(iterates: dict[str, algorithms.Iterates], matches: dict[str, Match],
                   ys: Tensor, d: int) -> dict[str, list[float]]:
    """Each learner's error by t at the step that best matches the last layer (error cosine)."""
    curves = {}
    for key, it in iterates.items():
        k = matches[key].best_column[-1]
        label = f"{key} (step {it.steps[k].item()})" if it.steps.numel() > 1 else key
        curves[label] = ((it.preds[k].double() - ys).pow(2).mean(0) / d).tolist()
    return curves
