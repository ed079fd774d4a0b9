"""The alignment pipeline behind ``iclprobe align``: which learner does each layer run?

For a checkpoint: draw evaluation data (the model's own task by default); read every
layer's prediction out (ridge `LayerProbes` for a GPT, the exact readout −Z[query, d] for
a PQ transformer); run the protocol's learners on the same data; compare layers with
steps by error cosine and, through induced weights on a subset, by weight cosine; then
compare the learners with each other per layer, calibrated by their own resemblance.

A model is aligned where it was trained: every prefix for a model trained on all
positions (Garg et al.), only the trained context length for one trained on the last
position (Ahn et al.), where the error cosine is taken across sequences.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from iclprobe import algorithms, probes
from iclprobe.alignment import comparison as C
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.measuring.layers import (
    family_runs,
    layer_predictions,
    layer_weight_fn,
    needs_probes,
)
from iclprobe.alignment.measuring.liveness import live_layers
from iclprobe.alignment.measuring.matching import Match, match_steps
from iclprobe.alignment.measuring.memory import check_align_fits
from iclprobe.alignment.measuring.probe_source import given_probes, resolve_probes
from iclprobe.alignment.measuring.runs import run_spec
from iclprobe.alignment.measuring.similarities import Similarity, similarity
from iclprobe.alignment.measuring.timing import Timings
from iclprobe.alignment.metrics import METRIC_INFO, metric_info
from iclprobe.alignment.output import display
from iclprobe.alignment.protocols import Protocol, RunSpec, verdict_pairs
from iclprobe.alignment.views.fitted import fitted_pairs
from iclprobe.alignment.views.separation import Separation, separation_views
from iclprobe.alignment.views.spectral import SpectralOrder
from iclprobe.errors import InputError
from iclprobe.models.base import Regressor
from iclprobe.tasks import RegressionBatch, RegressionTask

logger = logging.getLogger(__name__)

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
        return C.sentence(labels, "newton", "gd", None) if labels else ""

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
            "verdict": {"view": "fitted step sizes, metrics combined", "layers": self.verdict,
                        "source": self.verdict_source},
            "similarities": {r: {m: s.to_dict() for m, s in by.items()}
                             for r, by in self.similarities.items()},
            "matches": {r: {m: x.to_dict() for m, x in by.items()}
                        for r, by in self.matches.items()},
        }


def evaluation_task(model: Regressor, cfg: AlignConfig) -> RegressionTask:
    """The data `align` evaluates on: the model's task, or isotropic/ill-conditioned."""
    task = getattr(model, "task", None)
    if cfg.data == "task":
        if task is None:
            raise InputError("the checkpoint has no task.json: pass --data isotropic or "
                             "ill-conditioned")
        return task
    if task is not None:
        n_dims, n_points = task.n_dims, task.n_points
    else:  # a taskless model (Ahn et al.'s bare allparam): its context length
        from iclprobe.models.ahn import DEFAULT_N_CONTEXT

        n_dims = model.cfg.n_dims
        n_points = getattr(model.cfg, "n_positions", None) or DEFAULT_N_CONTEXT + 1
        logger.warning("the model has no task: evaluating on %d points (%s)", n_points,
                       "its n_positions" if hasattr(model.cfg, "n_positions") else
                       f"Ahn et al.'s N = {DEFAULT_N_CONTEXT} examples and a query")
    return RegressionTask(n_dims=n_dims, n_points=n_points, cov=cfg.data,
                          condition_number=cfg.condition_number)


def trained_positions(model: Regressor) -> str:
    """"last" for a model trained on the last position only (Ahn et al.), else "all"."""
    recipe = getattr(model, "train_config", None) or {}
    if "loss" in recipe:
        return "last" if recipe["loss"] == "last" else "all"
    return model.default_positions


def _window(cfg: AlignConfig, protocol: Protocol, positions: str, n: int) -> tuple[int, int]:
    if positions == "last":
        return n - 1, n - 1
    t_min = protocol.t_min if cfg.t_min is None else cfg.t_min
    t_max = n - 1 if cfg.t_max is None else cfg.t_max
    if not t_min <= t_max < n:
        raise InputError(f"t_min={t_min}, t_max={t_max}: need t_min <= t_max <= {n - 1} "
                         f"for {n} points")
    return t_min, t_max


def _check_finite(what: str, tensor: Tensor) -> None:
    if not bool(torch.isfinite(tensor).all()):
        raise InputError(f"align: the {what} are not finite (found NaN or Inf)")


def align(model: Regressor, cfg: AlignConfig | None = None, name: str = "model",
          layer_probes: probes.LayerProbes | None = None,
          eval_task: RegressionTask | None = None) -> AlignResult:
    """Align every layer of ``model`` with the reference learners (see the module doc).

    ``layer_probes`` None: the probes are resolved as ``iclprobe align`` resolves them
    (`resolve_probes`: saved ones that fit, else fitted as ``cfg.probe_fit`` says).
    """
    cfg = cfg or AlignConfig()
    model = model.to(cfg.device).eval()
    task = eval_task or evaluation_task(model, cfg)
    check_align_fits(model, task, cfg, needs_probes(model), name)  # before allocating
    if layer_probes is None:
        layer_probes, probes_info = resolve_probes(model, cfg, task, name)
    else:
        probes_info = given_probes(layer_probes)
    positions = trained_positions(model) if cfg.positions == "auto" else cfg.positions
    batch = task.sample(cfg.n_sequences, generator=torch.Generator().manual_seed(cfg.seed))
    n_weight = min(cfg.n_weight_sequences, cfg.n_sequences)
    if layer_probes is None and cfg.probe_fit == "crossfit" and needs_probes(model):
        n_weight = min(n_weight, cfg.n_sequences // cfg.probe_folds)  # within one fold
    sub = slice(0, n_weight)
    extra, notes = family_runs(model, batch)
    if n_weight < cfg.n_weight_sequences and any(METRIC_INFO[m].on == "weights"
                                                 for m in cfg.metrics):
        notes.append(f"induced weights on {n_weight} sequences, not n_weight_sequences="
                     f"{cfg.n_weight_sequences} (--n-weight-sequences): at most n_sequences"
                     + (" / probe_folds (within one fold)" if n_weight < cfg.n_sequences
                        else ""))
    _check_algorithms(cfg, extra, name)  # before the forward work
    timings = Timings()
    with timings.stage("layer predictions (forward pass, probes)"):
        layer_preds, readout, probe_r2, layer_probes = layer_predictions(
            model, task, batch, cfg, layer_probes, sub,
            _window(cfg, cfg.protocol_spec, positions, task.n_points))
    layer_w = None
    if any(METRIC_INFO[m].on == "weights" for m in cfg.metrics):
        d = task.n_dims
        n_q = cfg.queries_for(d)
        cov = batch.cov[sub] if batch.cov.ndim == 3 else batch.cov
        with timings.stage("induced weights (query tokens)"):
            layer_w = probes.induced_weights(layer_weight_fn(model, layer_probes),
                                             batch.xs[sub], batch.ys[sub], n_queries=n_q,
                                             cov=cov, generator=cfg.seed).double()
    result = align_layers(layer_preds, batch, cfg, layer_weights=layer_w, name=name,
                          positions=positions, extra_runs=extra, notes=notes, task=task,
                          timings=timings, probe_t_min=probe_rows(model, layer_probes))
    result.readout, result.probe_r2, result.probes_info = readout, probe_r2, probes_info
    return result


def probe_rows(model: Regressor, layer_probes: probes.LayerProbes | None) -> int | None:
    """The first position the model's layer probes were fitted on; None: an exact readout."""
    if not needs_probes(model):
        return None
    return int(getattr(layer_probes, "t_min", 1)) if layer_probes is not None else 1


def _check_algorithms(cfg: AlignConfig, extra_runs: dict[str, Any], name: str) -> list[str]:
    """The runs of the protocol that this model cannot have (refused if asked for by name)."""
    protocol = cfg.protocol_spec
    chosen = cfg.algorithms or [*extra_runs, *protocol.runs]
    unavailable = [k for k in chosen if not (protocol.accepts(k) or k in extra_runs)]
    if cfg.algorithms and unavailable:
        offered = ", ".join([*extra_runs, *(k for k in protocol.runs if k not in extra_runs)])
        if protocol.explicit_runs is None:
            offered += ", or any learner registered in iclprobe.algorithms"
        raise InputError(f"algorithms: {', '.join(map(repr, unavailable))} cannot be run on "
                         f"{name} under protocol {protocol.name!r}; available here: {offered}")
    return unavailable


def compare(models: Sequence[Regressor], cfg: AlignConfig | None = None,
            names: Sequence[str] | None = None,
            layer_probes: Sequence[probes.LayerProbes | None] | None = None,
            eval_task: RegressionTask | None = None) -> list[AlignResult]:
    """Align several models on the same evaluation data (the first model's task).

    Args:
        models: models of one input dimension (e.g. softmax against linear attention).
        cfg: what to compute (shared).
        names: one per model (default ``model0``, ``model1``, …); must be unique.
        layer_probes: fitted probes per model (None entries: fitted here).
        eval_task: the data (default: ``evaluation_task(models[0], cfg)``).
    """
    cfg = cfg or AlignConfig()
    if not models:
        raise InputError("compare needs at least one model")
    names = list(names) if names is not None else [f"model{i}" for i in range(len(models))]
    if len(names) != len(models) or len(set(names)) != len(names):
        raise InputError(f"names must be unique, one per model; got {names} for "
                         f"{len(models)} models")
    lps = list(layer_probes) if layer_probes is not None else [None] * len(models)
    task = eval_task or evaluation_task(models[0], cfg)
    for model, name in zip(models, names):
        if model.cfg.n_dims != task.n_dims:
            raise InputError(f"{name} has n_dims={model.cfg.n_dims}, but the data has "
                             f"d={task.n_dims}: compare models of one dimension")
    return [align(model, cfg, name=name, layer_probes=lp, eval_task=task)
            for model, name, lp in zip(models, names, lps)]


def align_layers(layer_preds: Tensor, batch: RegressionBatch, cfg: AlignConfig | None = None,
                 layer_weights: Tensor | None = None, name: str = "model",
                 positions: str = "all",
                 extra_runs: dict[str, RunSpec] | None = None,
                 notes: list[str] | None = None,
                 task: RegressionTask | None = None,
                 timings: Timings | None = None,
                 probe_t_min: int | None = None) -> AlignResult:
    """Align per-layer predictions of any model with the protocol's learners.

    Args:
        layer_preds: ``[L+1, B, n]``, layer l's prediction of ``batch.ys`` at every prefix.
        batch: the evaluation data the predictions were made on.
        cfg: the protocol, metrics and statistics (its ``positions`` is ignored here).
        layer_weights: ``[L+1, B', n, d]`` induced weights of the layers on the first B'
            sequences (needed for the weight metrics, e.g. ``weight_cosine``).
        positions: "all" (every prefix) or "last" (the last position only).
        extra_runs: learners beyond the protocol's, ``key -> RunSpec`` (a family's claims).
        notes: lines to carry into the result.
        task: the task ``batch`` came from (recorded; default: dims and points only).
        timings: where to add the seconds of each stage (`AlignResult.timings`).
        probe_t_min: the layer predictions were read by linear probes fitted on the
            positions ``t >= probe_t_min`` (None: an exact readout); the fitted view then
            reads the learners the same way (`alignment.views.fitted.probe_read`).
    """
    timings = timings if timings is not None else Timings()
    cfg = cfg or AlignConfig()
    protocol = cfg.protocol_spec
    n_layers = layer_preds.shape[0] - 1
    n, d = batch.xs.shape[1], batch.xs.shape[2]
    if layer_preds.shape[1:] != batch.ys.shape:
        raise InputError(f"layer_preds must have shape [layer, {batch.ys.shape[0]}, {n}], "
                         f"got {tuple(layer_preds.shape)}")
    window = _window(cfg, protocol, positions, n)
    notes = list(notes or [])
    t_lo, t_hi = window
    _check_finite("layer predictions (model output read per layer)",
                  layer_preds[..., t_lo:t_hi + 1])
    if not bool(torch.isfinite(layer_preds).all()):  # only outside the aligned window
        notes.append(f"layer predictions outside t = {t_lo}..{t_hi} are not finite (the model "
                     f"is valid only where it is aligned); they are not used")
        inside = torch.zeros(n, dtype=torch.bool)
        inside[t_lo:t_hi + 1] = True
        layer_preds = torch.where(inside, layer_preds, torch.zeros_like(layer_preds))
    layer_preds, ys64 = layer_preds.double(), batch.ys.double()
    err_by_t = (layer_preds - ys64).pow(2).mean(1) / d  # [L+1, n]
    zero_error = float(ys64[:, t_lo:t_hi + 1].pow(2).mean() / d)
    weight_metrics = [m for m in cfg.metrics if METRIC_INFO[m].on == "weights"]
    weights_needed = bool(weight_metrics)
    if weights_needed:
        if layer_weights is None:
            raise InputError(f"metrics {weight_metrics} need layer_weights")
        _check_finite("induced weights of the layers", layer_weights[..., t_lo:t_hi + 1, :])
        layer_weights = torch.nan_to_num(layer_weights.double(), nan=0.0, posinf=0.0,
                                         neginf=0.0)  # non-finite only outside the window
    sub = slice(0, layer_weights.shape[1] if layer_weights is not None else 0)
    with timings.stage("learners"):
        stats = algorithms.prefix_stats(batch.xs.double(), ys64)
    over = "sequences" if positions == "last" else "positions"
    extra_runs = extra_runs or {}
    chosen = cfg.algorithms or [*extra_runs, *protocol.runs]
    unavailable = _check_algorithms(cfg, extra_runs, name)
    runs = {k: extra_runs[k] if k in extra_runs else protocol.run(k)
            for k in chosen if k not in unavailable}
    sims: dict[str, dict[str, Similarity]] = {}
    matches: dict[str, dict[str, Match]] = {}
    iterates: dict[str, algorithms.Iterates] = {}  # predictions on every sequence
    iterates_w: dict[str, algorithms.Iterates] = {}  # with weights, on the weight subset
    labels: dict[str, str] = {}
    live_by: dict[str, Match] = {}
    live = live_layers(layer_preds, ys64, window, cfg.n_boot, cfg.confidence, cfg.seed)
    for key, spec in runs.items():
        with timings.stage("learners"):
            it = dataclasses.replace(run_spec(spec, batch, n_layers, False, stats, cfg.seed),
                                     name=key)
            _check_finite(f"{key} iterates", it.preds)
            if weights_needed:  # weights only where the weight metrics need them
                it_w = dataclasses.replace(run_spec(spec, batch, n_layers, True, stats,
                                                    cfg.seed, sequences=sub), name=key)
                assert it_w.weights is not None
                _check_finite(f"{key} weight iterates", it_w.weights)
                iterates_w[key] = it_w
        iterates[key], labels[key] = it, spec.label
        with timings.stage("similarities, bootstrap, matching"):
            sims[key], matches[key] = {}, {}
            sim_e = similarity(layer_preds, it, ys64, "error_cosine", t_min=t_lo, t_max=t_hi,
                               over=over, n_boot=cfg.n_boot, confidence=cfg.confidence,
                               seed=cfg.seed)
            log2 = algorithms.learner_info(spec.learner).step_scale == "log2"
            live_by[key] = match_steps(sim_e, tol=protocol.tie_tol, log2=log2)
            # a match counts where the layer is live and the learner beats the zero predictor
            match_e = match_steps(sim_e, tol=protocol.tie_tol, log2=log2,
                                  live=[a and b for a, b in zip(live, live_by[key].above_zero)],
                                  fit_dead=cfg.fit_layers == "all")
            for metric in cfg.metrics:
                if metric == "error_cosine":
                    sims[key][metric], matches[key][metric] = sim_e, match_e
                    continue
                on_w = METRIC_INFO[metric].on == "weights"
                if on_w:
                    assert layer_weights is not None
                    values, target = layer_weights, iterates_w[key]
                    ys_m, lo = ys64[sub], t_lo if positions == "last" else \
                        max(t_lo, protocol.weight_t_min)
                else:
                    values, target, ys_m, lo = layer_preds, it, ys64, t_lo
                sim = similarity(values, target, ys_m, metric, t_min=lo, t_max=t_hi,
                                 over=over if METRIC_INFO[metric].across else "positions",
                                 n_boot=cfg.n_boot, confidence=cfg.confidence, seed=cfg.seed)
                sims[key][metric] = sim
                # liveness comes from the error cosine: the zero reference of other metrics
                # (a cosine with the zero vector, a distance to 0) says nothing of a layer
                matches[key][metric] = match_steps(sim, tol=protocol.tie_tol, log2=log2,
                                                   live=match_e.above_zero,
                                                   fit_dead=cfg.fit_layers == "all")
    matched = [any(m.above_zero[layer] for m in live_by.values())
               for layer in range(n_layers + 1)]
    layer_error = err_by_t[:, t_lo:t_hi + 1].mean(-1).tolist()
    with timings.stage("learner table, calibration"):
        pairs = verdict_pairs({k: runs[k] for k in sorted(runs, key=lambda k: k in extra_runs)})
        comparisons = {m: _compare(m, pairs, sims, matches,
                                   iterates_w if METRIC_INFO[m].on == "weights" else iterates,
                                   ys64[sub] if METRIC_INFO[m].on == "weights" else ys64, live,
                                   matched)
                       for m in cfg.metrics}
    meaningless = None
    last_error = float(err_by_t[-1, t_lo:t_hi + 1].mean())
    if not live[-1]:
        meaningless = (f"the model does not solve this task (last layer's normalized error "
                       f"{last_error:.3f} is not below the zero predictor's {zero_error:.3f} "
                       "beyond its interval): its layers cannot be aligned with a learner")
    fitted: dict[str, C.PairVerdict] = {}
    spectral = None
    if cfg.fitted and {"newton", "gd"} <= set(iterates):
        with timings.stage("fitted step sizes"):
            fitted, _, spectral = fitted_pairs(
                layer_preds, layer_weights, batch.xs.double(), ys64, stats, window,
                protocol.weight_t_min, list(cfg.metrics), over, live, matched, cfg.n_boot,
                cfg.confidence, cfg.seed, probe_t_min)
    separation = None
    if cfg.separation and positions == "all" and {"newton", "gd"} <= set(iterates):
        with timings.stage("separation views"):
            separation = separation_views(d, n, protocol, iterates, iterates_w, batch, sub,
                                          window, cfg.seed, cfg.condition_number)
    return AlignResult(
        name=name, n_layers=n_layers,
        task=task.to_dict() if task is not None else {"n_dims": d, "n_points": n,
                                                     "cov": "given"},
        protocol=protocol.to_dict(), positions=positions, window=window,
        readout="given layer predictions",
        layer_error=layer_error,
        layer_error_by_t=err_by_t.tolist(), zero_error=zero_error,
        learner_error_by_t=_learner_curves(iterates, live_by, ys64, d), probe_r2=[],
        run_labels=labels, similarities=sims, matches=matches, comparisons=comparisons,
        separation=separation, notes=notes, live=live, meaningless=meaningless,
        timings=timings, fitted=fitted, spectral=spectral)


def _learner_curves(iterates: dict[str, algorithms.Iterates], matches: dict[str, Match],
                    ys: Tensor, d: int) -> dict[str, list[float]]:
    """Each learner's error by t at the step that best matches the last layer (error cosine)."""
    curves = {}
    for key, it in iterates.items():
        k = matches[key].best_column[-1]
        label = f"{key} (step {it.steps[k].item()})" if it.steps.numel() > 1 else key
        curves[label] = ((it.preds[k].double() - ys).pow(2).mean(0) / d).tolist()
    return curves


def _compare(metric: str, pairs: list[tuple[str, str]], sims: dict[str, dict[str, Similarity]],
             matches: dict[str, dict[str, Match]], iterates: dict[str, algorithms.Iterates],
             ys: Tensor, live: list[bool], matched: list[bool]) -> C.LearnerComparison:
    """The learner table for one metric: best scores, paired differences, verdicts."""
    scores = {r: C.learner_score(by[metric], matches[r][metric].best_column)
              for r, by in sims.items()}
    verdicts = []
    for a, b in pairs:
        sa, sb = sims[a][metric], sims[b][metric]
        ma, mb = matches[a][metric], matches[b][metric]
        diff = C.difference(sa, sb)
        cal = C.calibrate(iterates[a], iterates[b], ys, sa, sb, ma.best_column, mb.best_column)
        labels = C.verdicts(scores[a], scores[b], diff, cal, live, sa.higher_is_better,
                            matched)
        verdicts.append(C.PairVerdict(a, b, metric, diff, cal, labels,
                                      C.sentence(labels, a, b, metric)))
    return C.LearnerComparison(metric, scores, verdicts, list(live))
