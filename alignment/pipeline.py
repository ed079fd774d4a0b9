"""The alignment pipeline behind ``iclprobe align``: which learner does each layer run?

`align` runs its stages over one `Evaluation` (the data, the window, the learners, the
config), each stage a function of its own that returns what the next one needs:

1. `model_evaluation`: draw the evaluation data (the model's own task by default), at the
   positions the model was trained on, with the learners its family claims;
2. `read_layers`: every layer's prediction (ridge probes for a GPT, the exact readout
   −Z[query, d] for a PQ transformer) and, on a subset, its induced weights;
3. `checked_layers`: refuse readings that are not finite where they are aligned;
4. `run_learners`: the learners' iterates on the same data;
5. `match_runs`: layer × step similarity tables per learner and metric, the best steps,
   and which layers compute something;
6. the views: `protocol_view` (the learner table, calibrated by the learners' own
   resemblance), `fitted_view` (Newton vs GD with step sizes fitted, and the spectral
   view), `separation_view`;
7. `build_result`: the `AlignResult`, built once.

`align_layers` runs stages 3-7 on layer predictions a caller made, `compare` aligns
several models on the same data.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from iclprobe import probes
from iclprobe._checks import check_choice, check_int, check_one_line, check_type
from iclprobe.algorithms.base import REFERENCE_PAIR
from iclprobe.algorithms.prefix import check_real, forget_kept
from iclprobe.alignment.comparison import PairVerdict
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.evaluation import (
    Evaluation,
    check_evaluation,
    evaluation,
    evaluation_task,
    model_evaluation,
)
from iclprobe.alignment.measuring import kept
from iclprobe.alignment.measuring.bootstrap import few_resamples_note
from iclprobe.alignment.measuring.candidates import measure_candidates
from iclprobe.alignment.measuring.held import targets_for
from iclprobe.alignment.measuring.layers import Layers, checked_layers, needs_probes, read_layers
from iclprobe.alignment.measuring.matching import match_runs
from iclprobe.alignment.measuring.memory import check_align_fits
from iclprobe.alignment.measuring.probe_source import given_probes, resolve_probes
from iclprobe.alignment.measuring.runs import run_learners
from iclprobe.alignment.measuring.timing import Timings
from iclprobe.alignment.protocols import RunSpec
from iclprobe.alignment.result import AlignResult, Views, build_result
from iclprobe.alignment.views.answer import Answer, answer_view, matched_by
from iclprobe.alignment.views.fitted import fitted_view
from iclprobe.alignment.views.protocol import protocol_view
from iclprobe.alignment.views.separation import Separation, separation_view
from iclprobe.alignment.views.spectral import SpectralOrder
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models.base import Regressor, check_model, check_precision
from iclprobe.tasks import RegressionBatch, RegressionTask

__all__ = ["AlignConfig", "AlignResult", "align", "align_layers", "compare", "evaluation_task",
           "run_stages"]


def align(model: Regressor, cfg: AlignConfig | None = None, name: str = "model",
          layer_probes: probes.LayerProbes | None = None,
          eval_task: RegressionTask | None = None) -> AlignResult:
    """Align every layer of ``model`` with the reference learners (see the module doc).

    ``layer_probes`` None: the probes are resolved as ``iclprobe align`` resolves them
    (`resolve_probes`: saved ones that fit, else fitted as ``cfg.probe_fit`` says). The
    model is moved to ``cfg.device`` (and stays there) and run in eval mode; its training
    mode is restored after.
    """
    cfg = cfg or AlignConfig()
    check_model(model)
    check_type("align", "cfg", cfg, AlignConfig, "an AlignConfig")
    check_one_line("align", "name", check_type("align", "name", name, str, "a string"))
    check_precision(model, "align", name)
    if layer_probes is not None:
        check_type("align", "layer_probes", layer_probes, probes.LayerProbes,
                   "a LayerProbes (or None: resolved here)")
    if eval_task is not None:
        check_type("align", "eval_task", eval_task, RegressionTask,
                   "a RegressionTask (or None: the model's task)")
        try:
            model.check_task(eval_task)
        except InputError as e:
            raise InputError(f"align: eval_task does not fit {name}: {e}") from None
    training = model.training  # restored after: a model aligned mid-training trains on
    try:
        return _align(model.to(cfg.device).eval(), cfg, name, layer_probes, eval_task)
    finally:
        model.train(training)


def _align(model: Regressor, cfg: AlignConfig, name: str,
           layer_probes: probes.LayerProbes | None, eval_task: RegressionTask | None
           ) -> AlignResult:
    """`align` on a model in eval mode on ``cfg.device``."""
    task = eval_task or evaluation_task(model, cfg)
    check_align_fits(model, task, cfg, needs_probes(model), name)  # before allocating
    check_evaluation(model, task, cfg, name)  # before any probe is fitted or announced
    if layer_probes is None:
        layer_probes, probes_info = resolve_probes(model, cfg, task, name)
    else:
        probes_info = given_probes(layer_probes)
    crossfit = layer_probes is None and cfg.probe_fit == "crossfit" and needs_probes(model)
    ev = model_evaluation(model, task, cfg, name, crossfit)  # refuses before the forward work
    timings = Timings()
    with kept.reusing_in_alignment():  # the probe targets' candidates, measured after
        layers = read_layers(model, ev, layer_probes, timings, targets_for(ev))
        if probes_info.get("source") == "saved":  # they change the numbers: on the screen
            layers = dataclasses.replace(layers, readout=(
                f"the ridge probes saved in {probes_info['path']} (fitted per layer to "
                f"{probes_info['target']} on {probes_info['n_sequences']} fresh sequences; "
                "refit_probes=True, --refit-probes, ignores them)"))
        return run_stages(ev, layers, timings, probes_info)


def run_stages(ev: Evaluation, layers: Layers, timings: Timings,
               probes_info: dict[str, Any] | None = None) -> AlignResult:
    """The stages after the layers are read, each timed in ``timings`` (see the module doc)."""
    try:
        return _stages(ev, layers, timings, probes_info)
    finally:
        forget_kept()  # the batch's prefix statistics are not held once the result is out


def _resample_notes(ev: Evaluation) -> list[str]:
    """What bootstrap intervals are too few resamples for: the evaluation's, the weights'."""
    groups = [("the", ev.batch.xs.shape[0], "--n-sequences")]
    if ev.weight_rows and ev.weight_metrics:
        groups.append(("the weight metrics'", ev.weight_rows, "--n-weight-sequences"))
    notes = [few_resamples_note(ev.cfg.n_boot, ev.cfg.confidence, n, what, flag)
             for what, n, flag in groups]
    return [note for note in notes if note]


def _stages(ev: Evaluation, layers: Layers, timings: Timings,
            probes_info: dict[str, Any] | None) -> AlignResult:
    """`run_stages`' work."""
    layers = checked_layers(ev, layers)
    ev = dataclasses.replace(ev, notes=(*ev.notes, *_resample_notes(ev)))
    with timings.stage("learners"):
        learners = run_learners(ev, layers.n_layers)
    with timings.stage("similarities, bootstrap, matching"):
        matched = match_runs(ev, layers, learners)
    with timings.stage("learner table, calibration"):
        comparisons = protocol_view(ev, matched, learners)
    fitted: dict[str, PairVerdict] = {}
    spectral: SpectralOrder | None = None
    separation: Separation | None = None
    answer: Answer | None = None
    if ev.cfg.fitted:
        with timings.stage("candidates: fitted families and tables"):
            cands = measure_candidates(ev, layers, learners.stats)
        with timings.stage("the answer, Newton vs GD"):
            answer = answer_view(ev, matched.live, cands)
            fitted, spectral = fitted_view(ev, learners.stats, matched.live, matched_by(answer),
                                           cands)
    if ev.cfg.separation and ev.positions == "all" and set(REFERENCE_PAIR) <= set(ev.runs):
        with timings.stage("separation views"):
            separation = separation_view(ev, learners)
    if answer is not None and answer.notes:
        ev = dataclasses.replace(ev, notes=(*ev.notes, *answer.notes))
    views = Views(comparisons, fitted, spectral, separation, answer)
    return build_result(ev, layers, learners, matched, views, timings, probes_info)


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
    if isinstance(models, (Mapping, str)) or not hasattr(models, "__len__"):
        raise InputTypeError(f"compare: models must be a list of models (names= names them), "
                             f"got {type(models).__name__}")
    models = list(models)  # a ModuleList too
    if not models:
        raise InputError("compare needs at least one model")
    names = list(names) if names is not None else [f"model{i}" for i in range(len(models))]
    if len(names) != len(models) or len(set(names)) != len(names):
        raise InputError(f"names must be unique, one per model; got {names} for "
                         f"{len(models)} models")
    for i, name in enumerate(names):
        check_one_line("compare", f"names[{i}]", name)
    lps = list(layer_probes) if layer_probes is not None else [None] * len(models)
    if len(lps) != len(models):
        raise InputError(f"layer_probes must hold one entry per model (None: fitted here), "
                         f"got {len(lps)} for {len(models)} models")
    task = eval_task or evaluation_task(models[0], cfg)
    for model, name in zip(models, names):  # every model before the first is aligned
        check_model(model)
        check_precision(model, "compare", name)
        try:
            model.check_task(task)
        except InputError as e:
            raise InputError(f"compare: {name} cannot take the data ({e}): compare models "
                             f"that take one task") from None
    with kept.reusing():  # the candidates' families depend on the data alone
        results = [align(model, cfg, name=name, layer_probes=lp, eval_task=task)
                   for model, name, lp in zip(models, names, lps)]
    for model, res in zip(models, results):
        res.notes.extend(_other_task(model, task))
    return results


def _check_layers_arguments(layer_preds: Any, batch: RegressionBatch, name: Any,
                            extra_runs: Any, notes: Any, task: Any) -> None:
    """`align_layers`' recorded arguments: what the result would carry unchecked."""
    who = "align_layers"
    check_type(who, "batch", batch, RegressionBatch, "a RegressionBatch (task.sample(...))")
    check_type(who, "layer_preds", layer_preds, Tensor, "a torch.Tensor [L+1, B, n]")
    check_one_line(who, "name", check_type(who, "name", name, str, "a string"))
    if extra_runs is not None:
        check_type(who, "extra_runs", extra_runs, dict, "a dict of name -> RunSpec (or None)")
        for key, spec in extra_runs.items():
            check_type(who, f"extra_runs[{key!r}]", spec, RunSpec, "a RunSpec")
    if notes is not None and (isinstance(notes, str) or not isinstance(notes, Sequence)
                              or not all(isinstance(n, str) for n in notes)):
        raise InputTypeError(f"{who}: notes must be a list of strings (one line each), got "
                             f"{type(notes).__name__} {notes!r:.60}")
    if task is not None:
        check_type(who, "task", task, RegressionTask, "a RegressionTask (or None)")
        got = (task.n_dims, task.n_points)
        if got != (batch.xs.shape[-1], batch.xs.shape[1]):
            raise InputError(f"{who}: task has n_dims={got[0]}, n_points={got[1]}, but the "
                             f"batch has n_dims={batch.xs.shape[-1]}, n_points="
                             f"{batch.xs.shape[1]}: pass the task the batch was drawn from")


def _check_readings(layer_preds: Tensor, layer_weights: Any, readout_noise: Any) -> None:
    """`align_layers`' induced weights and readout noise: real tensors of the readings' shapes.

    The noise's finiteness is checked with the readings' (`checked_layers`: in the window).
    """
    who = "align_layers"
    if layer_weights is not None:
        check_real(f"{who}: layer_weights", layer_weights, "[L+1, B', n, d] (or None)")
    if readout_noise is None:
        return
    if not isinstance(readout_noise, tuple) or len(readout_noise) != 2:
        size = f" of {len(readout_noise)}" if isinstance(readout_noise, Sequence) else ""
        raise InputTypeError(f"{who}: readout_noise must be a pair (the noise in layer_preds, "
                             f"the noise in layer_weights or None), got a "
                             f"{type(readout_noise).__name__}{size}")
    pairs = [("readout_noise[0]", readout_noise[0], "layer_preds", layer_preds)]
    if readout_noise[1] is not None and layer_weights is None:
        raise InputError(f"{who}: readout_noise[1] is the noise in layer_weights, which is None: "
                         f"give None for it")
    if readout_noise[1] is not None:
        pairs.append(("readout_noise[1]", readout_noise[1], "layer_weights", layer_weights))
    for what, noise, of, readings in pairs:
        check_real(f"{who}: {what}", noise, f"of {of}'s shape")
        shape = tuple(readings.shape)
        if noise.shape != shape:
            raise InputError(f"{who}: {what} is the noise in {of} and must have its shape "
                             f"{shape}, got {tuple(noise.shape)}")


def _other_task(model: Regressor, task: RegressionTask) -> list[str]:
    """A note where ``model`` is aligned on data other than its own task's.

    (`compare`'s shared data, or the CLI's ``--data``.) κ is named only where both tasks'
    covariances are ill-conditioned: elsewhere it is an unused default.
    """
    own = getattr(model, "task", None)
    if not isinstance(own, RegressionTask):
        return []
    mine, used = json.loads(own.to_json()), json.loads(task.to_json())
    unused = {"condition_number"} if {mine.get("cov"), used.get("cov")} != {"ill-conditioned"} \
        else set()
    differ = [f"{k} {used.get(k)!r}, not its own {mine.get(k)!r}"
              for k in sorted((set(mine) | set(used)) - unused) if mine.get(k) != used.get(k)]
    return [f"aligned on other data than its own task's: {'; '.join(differ)}"] if differ else []


def align_layers(layer_preds: Tensor, batch: RegressionBatch, cfg: AlignConfig | None = None,
                 layer_weights: Tensor | None = None, name: str = "model",
                 positions: str = "all",
                 extra_runs: dict[str, RunSpec] | None = None,
                 notes: list[str] | None = None,
                 task: RegressionTask | None = None,
                 timings: Timings | None = None,
                 probe_t_min: int | None = None,
                 readout_noise: tuple[Tensor, Tensor | None] | None = None) -> AlignResult:
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
            positions ``t >= probe_t_min`` (None: an exact readout); the candidates are
            then read the same way (`alignment.measuring.reading.probe_read`).
        readout_noise: a sample of the readout's own noise in ``layer_preds`` and (or None)
            in ``layer_weights`` (`probes.ReadoutNoise`): the candidates' tables are
            corrected for it (`alignment.measuring.candidates.noise_ceilings`).
    """
    check_choice("align_layers", "positions", positions, ("all", "last"))
    _check_layers_arguments(layer_preds, batch, name, extra_runs, notes, task)
    _check_readings(layer_preds, layer_weights, readout_noise)
    if probe_t_min is not None:
        check_int("align_layers", "probe_t_min", probe_t_min, 0, batch.xs.shape[1])
    rows = layer_weights.shape[1] if layer_weights is not None else 0
    ev = evaluation(cfg or AlignConfig(), batch, name, positions, extra_runs, notes or (), task,
                    rows)
    noise, weight_noise = readout_noise if readout_noise is not None else (None, None)
    layers = Layers(layer_preds, layer_weights, probe_t_min=probe_t_min, noise=noise,
                    weight_noise=weight_noise)
    return run_stages(ev, layers, timings if timings is not None else Timings())
