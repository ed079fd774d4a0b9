"""Every layer's reading: its predictions and induced weights, read exactly or by probes.

A family whose layers carry their own prediction (``Regressor.exact_layer_readout``: a PQ
transformer's query row, −Z[query, d]) is read exactly; any other is read by ridge probes
(`iclprobe.alignment.measuring.probe_source` picks them). `read_layers` is `align`'s stage:
every layer's predictions on the evaluation sequences and, for the weight metrics, its
induced weights on the first of them; `checked_layers` refuses readings that are not
finite where they are aligned, for `align` and `align_layers` alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from iclprobe import probes
from iclprobe._checks import ConfigError
from iclprobe._finite import all_finite
from iclprobe.alignment.evaluation import Evaluation, refuse_nonfinite
from iclprobe.alignment.measuring.timing import FIRST_STAGE, Timings
from iclprobe.alignment.metrics import on_weights
from iclprobe.errors import InputError
from iclprobe.hooks.residuals import collect_residuals
from iclprobe.models.base import Regressor, input_dtype
from iclprobe.tasks import RegressionBatch, RegressionTask

if TYPE_CHECKING:
    from iclprobe.alignment.config import AlignConfig

#: ``(resid, t_min, features) -> (columns [L+1, B, n], descriptions)``: each layer's probe target
Targets = Callable[[Tensor, int, "probes.FeatureSums | None"], tuple[Tensor, list[str]]]
#: how a layer's target description begins where the layer holds no column (fitted to y)
Y_TARGET = "y, as no column is held: "


@dataclasses.dataclass(frozen=True)
class Layers:
    """Every layer's reading on the evaluation sequences.

    Attributes:
        preds: ``[layer, batch, pos]`` each layer's predictions (float64 once checked).
        weights: ``[layer, batch', pos, n_dims]`` their induced weights on the first batch'
            sequences (None: no weight metric asked for them).
        readout: how the predictions were read, in words.
        probe_r2: the layer probes' held-out R² per layer (empty: none measured).
        probe_t_min: the first position the layer probes were fitted on (None: an exact
            readout); the candidates are read the same way.
        notes: what the check found (`checked_layers`).
        noise: a sample of the probes' own noise in ``preds`` (`probes.readout_noise`;
            None: not measured, as for an exact readout); ``weight_noise``: in ``weights``.
        noise_features: the width the probes read (the noise's degrees of freedom).
        more_noise: ``[draw, layer, batch, pos]``, further draws of that noise in ``preds``
            (`probes.ReadoutNoise.draws` after the first, ``noise``; None: ``noise`` alone).
        probe_targets: per layer, the column its probe was fitted to and the share of it
            the residual leaves unexplained (`held.held_targets`; empty: fitted to y, or
            no probes).
    """

    preds: Tensor
    weights: Tensor | None = None
    readout: str = "given layer predictions"
    probe_r2: list[float] = dataclasses.field(default_factory=list)
    probe_t_min: int | None = None
    notes: tuple[str, ...] = ()
    noise: Tensor | None = None
    weight_noise: Tensor | None = None
    noise_features: int | None = None
    more_noise: Tensor | None = None
    probe_targets: tuple[str, ...] = ()

    @property
    def holds_columns(self) -> bool:
        """Whether some layer was read by a probe fitted to a column it holds (`held`)."""
        return any(not t.startswith(Y_TARGET) for t in self.probe_targets)

    @property
    def n_layers(self) -> int:
        """The blocks read (the embedding is layer 0)."""
        return self.preds.shape[0] - 1

    def of(self, metric: str) -> Tensor:
        """What ``metric`` compares: the induced weights or the predictions."""
        if on_weights(metric):
            assert self.weights is not None  # checked_layers refuses a weight metric without
            return self.weights
        return self.preds


def read_layers(model: Regressor, ev: Evaluation, layer_probes: probes.LayerProbes | None,
                timings: Timings, targets: Targets | None = None) -> Layers:
    """`align`'s stage: every layer's predictions, and its induced weights where needed.

    ``layer_probes`` as `resolve_probes` gave them (None: cross-fitted on the evaluation
    sequences, or an exact readout). ``targets``: what cross-fitted probes are fitted to
    instead of y (`layer_predictions`; `held.targets_for` gives align's). The induced
    weights come from fresh queries on the first ``ev.weight_rows`` sequences, read by
    probes that did not see them.
    """
    cfg, batch = ev.cfg, ev.batch
    assert ev.task is not None  # a model's evaluation has its task
    sub = slice(0, ev.weight_rows)
    with timings.stage(FIRST_STAGE):
        preds, readout, r2, layer_probes, noise, held = layer_predictions(
            model, ev.task, batch, cfg, layer_probes, sub, ev.window, targets)
    weights = weight_noise = None
    if ev.weight_metrics:
        cov = batch.cov[sub] if batch.cov.ndim == 3 else batch.cov
        noisy = noise.noise_probes(sub) if noise is not None else None
        with timings.stage("induced weights (query tokens)"):
            weights = probes.induced_weights(layer_weight_fn(model, layer_probes, noisy),
                                             batch.xs[sub], batch.ys[sub],
                                             n_queries=cfg.queries_for(ev.task.n_dims), cov=cov,
                                             generator=cfg.seed + QUERY_SEED_OFFSET).double()
        if noisy is not None:  # the noise's weights came from the same query tokens
            weights, weight_noise = weights.chunk(2)
    return Layers(preds, weights, readout, r2, probe_rows(model, layer_probes),
                  noise=None if noise is None else noise.noise, weight_noise=weight_noise,
                  noise_features=None if noise is None else noise.features,
                  more_noise=None if noise is None else noise.draws[1:],
                  probe_targets=tuple(held))


def checked_layers(ev: Evaluation, layers: Layers) -> Layers:
    """The readings in float64, refused where they are not finite inside the window.

    Outside the window non-finite predictions are set to 0 (with a note): a model valid
    only where it is aligned (Ahn et al.'s, at its trained length) may blow up elsewhere.

    Raises:
        InputError: predictions of the wrong shape; non-finite readings in the window; a
            weight metric without induced weights.
    """
    preds, batch = layers.preds, ev.batch
    n = batch.xs.shape[1]
    if preds.shape[1:] != batch.ys.shape:
        raise InputError(f"layer_preds must have shape [layer, {batch.ys.shape[0]}, {n}], "
                         f"got {tuple(preds.shape)}")
    t_lo, t_hi = ev.window
    refuse_nonfinite("layer predictions (model output read per layer)",
                     preds[..., t_lo:t_hi + 1])
    notes = []
    if not all_finite(preds):  # only outside the aligned window
        notes.append(f"layer predictions outside t = {t_lo}..{t_hi} are not finite (the model "
                     f"is valid only where it is aligned); they are not used")
        inside = torch.zeros(n, dtype=torch.bool)
        inside[t_lo:t_hi + 1] = True
        preds = torch.where(inside, preds, torch.zeros_like(preds))
    weights = layers.weights
    if ev.weight_metrics:
        if weights is None:
            raise InputError(f"metrics {ev.weight_metrics} need layer_weights")
        refuse_nonfinite("induced weights of the layers", weights[..., t_lo:t_hi + 1, :])
        weights = torch.nan_to_num(weights.double(), nan=0.0, posinf=0.0,
                                   neginf=0.0)  # non-finite only outside the window
    for what, v in (("draws of the readout noise in the layer predictions", layers.noise),
                    ("draws of the readout noise in the induced weights", layers.weight_noise),
                    ("further draws of the readout noise", layers.more_noise)):
        if v is not None:
            refuse_nonfinite(what, v[..., t_lo:t_hi + 1, :] if v is layers.weight_noise
                             else v[..., t_lo:t_hi + 1])
    noise, weight_noise, draws = (
        None if v is None else torch.nan_to_num(v.double(), 0.0, 0.0, 0.0)
        for v in (layers.noise, layers.weight_noise, layers.more_noise))  # as the readings
    return dataclasses.replace(layers, preds=preds.double(), weights=weights,
                               notes=(*layers.notes, *notes), noise=noise,
                               weight_noise=weight_noise, more_noise=draws)


def probe_rows(model: Regressor, layer_probes: probes.LayerProbes | None) -> int | None:
    """The first position the model's layer probes were fitted on; None: an exact readout."""
    if not needs_probes(model):
        return None
    return int(getattr(layer_probes, "t_min", 1)) if layer_probes is not None else 1


def needs_probes(model: Regressor) -> bool:
    """Whether `align` reads this model's layers through fitted probes (else exactly)."""
    return not model.exact_layer_readout


def layer_predictions(model: Regressor, task: RegressionTask, batch: RegressionBatch,
                      cfg: AlignConfig, layer_probes: probes.LayerProbes | None,
                      weight_rows: slice | None = None, window: tuple[int, int] | None = None,
                      targets: Targets | None = None
                      ) -> tuple[Tensor, str, list[float], probes.LayerProbes | None,
                                 probes.ReadoutNoise | None, list[str]]:
    """Every layer's prediction ``[L+1, B, n]`` (float64), how it was read, probe R², probes.

    Given ``layer_probes`` (`resolve_probes` picks them for `align`) read the batch; else
    probes are cross-fitted on the batch itself (``cfg.probe_fit="crossfit"``: one forward
    pass, every sequence read by probes fitted on the others) or fitted on fresh sequences
    (``"fresh"``, seed + 1), on the aligned ``window``'s positions (`probe_start`; None:
    every t >= 1). Cross-fitted probes are fitted to y, or with ``targets`` given
    (``(resid, t_min, features) -> (columns [L+1, B, n], descriptions)``, the features the
    residual's `probes.FeatureSums` on the fitted rows; `held.targets_for` for
    ``cfg.probe_target="column"``) each layer's to its column (the descriptions returned
    last; empty where the probes were fitted to y). The probes returned are the ones to
    read the sequences ``weight_rows`` with (out of sample for them). Probes cross-fitted on
    3 folds or more also measure their own noise (`probes.readout_noise`; else None).
    """
    xs, ys = batch.xs.to(cfg.device), batch.ys.to(cfg.device)
    if model.exact_layer_readout:
        preds = probes.readout_predictions(model, xs, ys)
        return preds.double().cpu(), "the exact readout of each layer (its own prediction)", \
            [], None, None, []
    if layer_probes is None and cfg.probe_fit == "crossfit":
        return _cross_fitted(model, task, batch, cfg, weight_rows, window, targets)
    if layer_probes is None:
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        width = getattr(model.cfg, "d_model", None)  # unknown before a forward pass: t >= 1
        start = 1 if window is None or width is None else probe_start(
            window, task.n_points, width, cfg.fresh_probe_sequences)
        layer_probes = probes.LayerProbes(t_min=start).fit(
            model, task, n_sequences=cfg.fresh_probe_sequences, generator=gen,
            n_heldout=cfg.n_probe_heldout)
    fitted_on = (getattr(layer_probes, "fit_settings_", None) or {}).get("n_sequences")
    how = (f"ridge probes fitted per layer on {fitted_on} fresh sequences" if fitted_on
           else "given ridge probes")
    r2 = list(layer_probes.metrics_.r2) if hasattr(layer_probes, "metrics_") else []
    preds = layer_probes.predict(xs, ys).double().cpu()
    return preds, how, r2, layer_probes, None, []


def _cross_fitted(model: Regressor, task: RegressionTask, batch: RegressionBatch,
                  cfg: AlignConfig, weight_rows: slice | None, window: tuple[int, int] | None,
                  targets: Targets | None
                  ) -> tuple[Tensor, str, list[float], probes.LayerProbes,
                             probes.ReadoutNoise | None, list[str]]:
    """`layer_predictions` read by probes cross-fitted on the batch (its arguments)."""
    xs, ys = batch.xs.to(cfg.device), batch.ys.to(cfg.device)
    batch_size, n = batch.ys.shape
    _check_folds(cfg, batch_size)
    resid = collect_residuals(model, xs, ys).cpu()
    start = 1 if window is None else probe_start(
        window, n, resid.shape[-1], batch_size - -(-batch_size // cfg.probe_folds))
    extra, also = _extra_sums(model, task, cfg, start, resid)
    columns: Tensor | None = None
    held: list[str] = []
    features: list[probes.FeatureSums] = []
    if targets is not None:  # the folds' Gram matrices, for the targets and the fits
        features = probes.fold_features(resid, cfg.probe_folds, start)
        columns, held = targets(resid, start, sum(features[1:], features[0]))
        also += ("; each layer's probe fitted to the candidate's prediction its residual "
                 "holds best, not to y")
    fit = probes.cross_fit(model, resid, batch.ys, folds=cfg.probe_folds, t_min=start,
                           extra=extra, targets=columns, features=features)
    rows = weight_rows or slice(0, batch.xs.shape[0] // cfg.probe_folds)
    noise = probes.readout_noise(fit, resid) if cfg.probe_folds >= 3 else None
    return (fit.preds, f"ridge probes cross-fitted on the evaluation sequences "
            f"({cfg.probe_folds} folds: each sequence read by probes fitted on the others"
            f"{also})",
            fit.metrics.r2, fit.probes_excluding(rows), noise, held)


def _check_folds(cfg: AlignConfig, n_sequences: int) -> None:
    """Refuse more cross-fit folds than sequences, as the flag (before the forward pass)."""
    if cfg.probe_folds > n_sequences:
        raise ConfigError("AlignConfig", "probe_folds", f"AlignConfig.probe_folds must be at "
                          f"most the {n_sequences} sequences the probes are cross-fitted on "
                          f"(folds of sequences), got {cfg.probe_folds}")


def _extra_sums(model: Regressor, task: RegressionTask, cfg: AlignConfig, t_min: int,
                resid: Tensor) -> tuple[list[probes.RidgeSums], str]:
    """The ridge sums of ``cfg.probe_extra_sequences`` more sequences, and what they add.

    The sequences are the evaluation task's (seed + 2), one part per fold, with what the
    readout's description adds. One forward pass per fold's part, so that only one part's
    residuals are held. A sequence whose residuals at some layer (positions ``t >= t_min``)
    are larger than every evaluation sequence's there (``resid``) is left out: the probes
    never read such a residual, and it would weigh on their fit beyond the range they read
    (a model sized on the evaluation data diverging on a few others). Where the model
    refuses the sequences or a part keeps none, none are used.
    """
    n, folds = cfg.probe_extra_sequences, cfg.probe_folds
    if not n:
        return [], ""
    more = task.sample(n, generator=torch.Generator().manual_seed(cfg.seed + 2),
                       dtype=input_dtype(model))
    top = _sizes(resid, t_min).amax(1)  # [layer]
    edges = [round(k * n / folds) for k in range(folds + 1)]
    out, kept = [], 0
    for a, b in zip(edges[:-1], edges[1:]):
        try:
            r = collect_residuals(model, more.xs[a:b].to(cfg.device),
                                  more.ys[a:b].to(cfg.device)).cpu()
        except InputError:  # an oracle's learner diverging on them
            return [], f", not on {n} more: the model diverges on them"
        size = _sizes(r, t_min)  # [layer, sequence]
        inside = (size.isfinite() & (size <= top[:, None])).all(0)
        if not bool(inside.any()):
            return [], f", not on {n} more: their residuals lie beyond the evaluation's"
        out.append(probes.fold_sums(r[:, inside], more.ys[a:b][inside], t_min))
        kept += int(inside.sum())
    return out, f", and fitted on {kept} of {n} more" + \
        (" (the others' residuals beyond the evaluation's)" if kept < n else "")


def _sizes(resid: Tensor, t_min: int) -> Tensor:
    """Each sequence's squared residual norm per layer, ``[layer, batch]``, in float64.

    Summed in float64 without a float64 copy of the residuals (at Garg size, a gigabyte).
    """
    return torch.linalg.vector_norm(resid[:, :, t_min:], dim=(2, 3), dtype=torch.float64) ** 2


def probe_start(window: tuple[int, int], n_points: int, width: int, fitted_on: int) -> int:
    """The first position the layer probes are fitted on: the aligned window's (t >= 1).

    A probe fitted where the model is not aligned reads it where it may compute something
    else, or diverge: a model aligned at its trained length only (Ahn et al.'s, fitted on
    the last position) can blow up at shorter prefixes, and probes fitted there read the
    last position badly or not at all. Where the window leaves too few rows for a probe of
    ``width`` residual features (``fitted_on`` sequences a probe sees; fewer than twice
    features + 1 rows and its ridge fit nearly interpolates), every t >= 1 is used.
    """
    lo = max(window[0], 1)
    return lo if fitted_on * (n_points - lo) > 2 * (width + 1) else 1


def layer_weight_fn(model: Regressor, layer_probes: probes.LayerProbes | None,
                    noise_probes: probes.LayerProbes | None = None
                    ) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``(xs, ys, queries) -> [L+1, B, n, T]``: every layer's prediction at fresh queries.

    With ``noise_probes`` (`ReadoutNoise.noise_probes`), ``[2(L+1), B, n, T]``: below them
    the readout noise at the same queries, from the same pass over the query tokens. Its
    first call checks the family's ``query_residuals`` (`check_query_residuals`).
    """
    if model.exact_layer_readout:
        def read(xs: Tensor, ys: Tensor, queries: Tensor) -> Tensor:
            return model.query_residuals(xs, ys, queries, reduce=model.readout_residual)
    elif layer_probes is None:
        raise InputError("induced weights of a GPT's layers need its fitted layer probes")
    elif noise_probes is not None:
        both = (layer_probes, noise_probes)

        def read(xs: Tensor, ys: Tensor, queries: Tensor) -> Tensor:
            with torch.no_grad():
                return model.query_residuals(
                    xs, ys, queries, reduce=lambda r: torch.cat([p.apply(r) for p in both]))
    else:
        read = layer_probes.predict_queries
    checked: list[bool] = []

    def first_checked(xs: Tensor, ys: Tensor, queries: Tensor) -> Tensor:
        if not checked:
            check_query_residuals(model, xs, ys)
            checked.append(True)
        return read(xs, ys, queries)
    return first_checked


#: The induced weights' queries come from a stream of their own, ``AlignConfig.seed + 3``
#: (the probes' data use seed + 1 and seed + 2): drawn from the evaluation seed's, they
#: would repeat the normal draws behind the evaluation sequences' own examples.
QUERY_SEED_OFFSET = 3

#: How far the substitution may differ from the forward pass, relative to its largest value.
SUBSTITUTION_TOL = 1e-3


def check_query_residuals(model: Regressor, xs: Tensor, ys: Tensor) -> None:
    """Refuse a ``query_residuals`` that is not the substitution of the query into x_t.

    Given each prefix's own query ``x_t`` as its one query, ``query_residuals`` must give
    every layer's residual of the forward pass at the readout positions
    (`collect_residuals`); a family that computes something else would make every induced
    weight, and so every weight metric, silently wrong. Checked on two sequences.
    """
    xs, ys = xs[:2], ys[:2]
    with torch.no_grad():
        own = model.query_residuals(xs, ys, xs[:, :, None, :])
        plain = collect_residuals(model, xs, ys)
    cls = type(model).__name__
    if not isinstance(own, Tensor) or own.shape != (*plain.shape[:3], 1, plain.shape[3]):
        got = tuple(own.shape) if isinstance(own, Tensor) else type(own).__name__
        raise InputError(f"{cls}.query_residuals must return [L+1, batch, pos, T, d_model] = "
                         f"{(*plain.shape[:3], 1, plain.shape[3])} here, got {got}")
    own = own[:, :, :, 0].to(plain)
    finite = torch.isfinite(plain)  # a model may blow up where it was not trained, alike
    gap = (own - plain).abs()[finite].max().item() if bool(finite.any()) else 0.0
    scale = max(plain[finite].abs().max().item() if bool(finite.any()) else 0.0, 1.0)
    if not (gap <= SUBSTITUTION_TOL * scale and torch.equal(torch.isfinite(own), finite)):
        raise InputError(f"{cls}.query_residuals is not the substitution: with each prefix's "
                         f"own x_t as its query it must give the forward pass's residuals "
                         f"at the readout positions (hooks.collect_residuals), but differs "
                         f"by up to {gap:.3g} (largest residual {scale:.3g}); query j at "
                         "prefix t must be read as if it replaced x_t")
