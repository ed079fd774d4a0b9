"""Cross-fitted layer probes: read every evaluation sequence with probes fitted on the others.

`align` needs each layer's prediction on its evaluation sequences, read by a linear probe
that was not fitted on those sequences. Instead of fitting on fresh draws (a second forward
pass over as many sequences again), the evaluation sequences are split into K contiguous
folds and fold k is read by the probe fitted on the other K − 1: every prediction is
out-of-sample, the held-out R² comes from the same predictions, and the K fits cost one pass
over the rows (the ridge sums of the folds add up; fold k's training sums are the total
minus its own). Axis legend: ``layer``, ``batch``, ``pos``, ``d_model``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from iclprobe._checks import is_int
from iclprobe.errors import InputError, NonFinite
from iclprobe.models.base import Regressor
from iclprobe.probes.inputs import check_axes, check_finite_inputs, check_tensors
from iclprobe.probes.layer_probes import (
    LayerProbes,
    ProbeMetrics,
    check_rows,
    model_hash,
    probe_metrics,
)
from iclprobe.probes.ridge import (
    FeatureSums,
    RidgeFit,
    RidgeSums,
    feature_sums,
    ridge_coef_at,
    ridge_from_sums,
    ridge_sums,
)


@dataclasses.dataclass
class CrossFit:
    """Out-of-fold predictions of every layer, their quality, and the folds' sums."""

    preds: Tensor  # [layer, batch, pos]: fold k read by the probe fitted without it
    metrics: ProbeMetrics  # held-out R² and normalized error of those predictions
    folds: list[tuple[int, int]]  # [start, end) sequences of each fold
    sums: list[RidgeSums]  # per fold
    model: Regressor
    t_min: int
    alphas: Tensor | None
    #: per fold, the fit on the other folds that read it (None: not kept; refitted)
    fold_fits: list[RidgeFit] | None = None

    @property
    def extra(self) -> list[int]:
        """The sums of sequences only fitted on, never read (``sums`` after the folds')."""
        return list(range(len(self.folds), len(self.sums)))

    def others(self, rows: slice) -> list[int]:
        """The sums that hold none of the sequences ``rows``: other folds, and the extra."""
        start, stop = rows.start or 0, rows.stop
        keep = [k for k, (a, b) in enumerate(self.folds) if b <= start or a >= stop]
        if not keep:
            raise InputError(f"every fold holds some of the sequences {start}..{stop - 1}: "
                             "no probe is out of sample for them")
        return keep + self.extra

    def probes_excluding(self, rows: slice) -> LayerProbes:
        """Probes fitted on every fold that holds none of the sequences ``rows``."""
        fit = self.fit_on(self.others(rows))
        probes = LayerProbes(t_min=self.t_min)
        probes.coef_, probes.intercept_, probes.alpha_ = fit.coef, fit.intercept, fit.alpha
        probes.n_layers_, probes.model = fit.coef.shape[0], self.model
        probes.model_hash_ = model_hash(self.model)
        probes.n_dims_ = self.model.cfg.n_dims
        probes.metrics_ = self.metrics
        return probes

    def fit_on(self, keep: list[int]) -> RidgeFit:
        """The ridge fit (GCV per layer) on the folds ``keep``: a fold's own where it is one."""
        left_out = [k for k in range(len(self.sums)) if k not in keep]
        if self.fold_fits is not None and len(left_out) == 1:
            return self.fold_fits[left_out[0]]
        return ridge_from_sums(_total([self.sums[k] for k in keep]), self.alphas)


def _total(sums: list[RidgeSums]) -> RidgeSums:
    out = sums[0]
    for s in sums[1:]:
        out = out + s
    return out


def cross_fit(model: Regressor, resid: Tensor, ys: Tensor, folds: int = 4, t_min: int = 1,
              alphas: Tensor | None = None, extra: Sequence[RidgeSums] = (),
              targets: Tensor | None = None, features: Sequence[FeatureSums] = ()
              ) -> CrossFit:
    """Ridge probes (GCV per layer) cross-fitted on residuals ``[L+1, B, n, d_model]``.

    The probes' target is the true y, or per layer ``targets [L+1, B, n]`` (positions
    ``t >= t_min`` enter the fits); every position is predicted. ``targets``: the column
    each layer's probe is fitted to instead of y, e.g. the learner's prediction the layer
    holds best (`held_shares`; `align` chooses them so): a target without label noise, so
    that a layer holding it is read without the estimation error a fit to y carries; the
    held-out R² is then against the target, the normalized error against y. ``extra``:
    the ridge sums (`fold_sums`) of further sequences that every fold's probe is also
    fitted on, none of them read (the probes' estimation error shrinks with their rows;
    the sequences read stay the B), in ``folds`` parts of equal size (`CrossFit.extra`), so
    that the halves the readout's noise is measured on (`readout_noise`) each hold some of
    them; sums fitted to y, so not with ``targets``. ``features``: the folds' `fold_features`
    (t_min's rows), where they were computed before (e.g. for `held_shares`' Gram).
    Positions ``t < t_min`` are predicted, never fitted on: a residual that is not finite
    there (a model valid only at its trained length) gives a prediction that is not finite
    there, and no other is touched (the fits' own rows are checked, `ridge_from_sums`).
    """
    check_axes("resid", resid, "layer, batch, pos, d_model")
    check_axes("ys", ys, "batch, pos")
    n_layers, batch, n, width = resid.shape
    if ys.shape != (batch, n):
        raise InputError(f"ys must have shape {(batch, n)}, got {tuple(ys.shape)}")
    if targets is not None and tuple(targets.shape) != (n_layers, batch, n):
        raise InputError(f"targets must have shape {(n_layers, batch, n)} (one column per "
                         f"layer), got {tuple(targets.shape)}")
    if targets is not None and extra:
        raise InputError("extra sums are fitted to y: they cannot join probes fitted to "
                         "targets")
    target = ys if targets is None else targets
    more = _check_extra(extra, folds, resid.shape)
    if not is_int(folds) or not 2 <= folds <= batch:
        raise InputError(f"folds must be an integer in [2, {batch}], got {folds!r}")
    if not isinstance(t_min, int) or not 0 <= t_min < n:
        raise InputError(f"t_min must be in [0, {n - 1}], got {t_min!r}")
    fitted = {"ys (the targets)": ys} if targets is None else {"ys": ys, "targets": targets}
    try:  # the rows fitted and scored
        check_finite_inputs(**{f"{name} at the positions t >= {t_min}": t[..., t_min:]
                               for name, t in fitted.items()})
    except InputError as err:  # as the probes' sums said it (the designed data read it)
        raise NonFinite(str(err)) from None
    bounds = fold_bounds(batch, folds)
    fitted_on = batch - max(b - a for a, b in bounds)  # the fewest sequences a probe sees
    check_rows(fitted_on * (n - t_min), width, f"the other {folds - 1} of {folds} folds "
                f"({fitted_on} sequences) x {n - t_min} positions t >= {t_min}", n - t_min,
               share=(folds - 1) / folds)
    if features and (isinstance(features, FeatureSums) or len(features) != folds or not all(
            isinstance(f, FeatureSums) for f in features)):
        raise InputError(f"features must be {folds} FeatureSums (one per fold, "
                         f"`fold_features`), got {type(features).__name__} of "
                         f"{len(features)}")
    sums = [fold_sums(resid[:, a:b], target[..., a:b, :], t_min, f)
            for (a, b), f in itertools.zip_longest(bounds, features)] + more
    preds, fits = _out_of_fold(resid, sums, bounds, alphas)
    metrics = probe_metrics(preds, target, ys, t_min, model.cfg.n_dims)
    return CrossFit(preds, metrics, bounds, sums, model, t_min, alphas, fits)


def fold_bounds(batch: int, folds: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each of ``folds`` contiguous folds of ``batch`` sequences."""
    edges = [round(k * batch / folds) for k in range(folds + 1)]
    return list(zip(edges[:-1], edges[1:]))


def fold_features(resid: Tensor, folds: int, t_min: int) -> list[FeatureSums]:
    """Each fold's `FeatureSums` of ``resid [layer, batch, pos, d_model]`` (``t >= t_min``).

    What `cross_fit` computes of its folds before any target: computed first, their total
    is every sequence's Gram matrix (`held_shares`' ``features``), and `cross_fit` takes
    them back (``features``).
    """
    batch, n = resid.shape[1], resid.shape[2]
    if not is_int(folds) or not 2 <= folds <= batch:
        raise InputError(f"folds must be an integer in [2, {batch}], got {folds!r}")
    _check_t_min(t_min, n)
    return [feature_sums(resid[:, a:b, t_min:].flatten(1, 2)) for a, b in fold_bounds(batch, folds)]


def fold_sums(resid: Tensor, ys: Tensor, t_min: int,
              features: FeatureSums | None = None) -> RidgeSums:
    """A block of sequences' ridge sums as a cross-fit adds them (positions ``t >= t_min``).

    ``ys``: the target, ``[B, n]`` for every layer or ``[layer, B, n]`` per layer;
    ``features``: the block's `fold_features`, computed before.
    """
    check_axes("resid", resid, "layer, batch, pos, d_model")
    check_tensors(ys=ys)  # real (ridge_sums checks its shape)
    _check_t_min(t_min, resid.shape[2])  # t_min -3 summed the last 3 positions, 99 none
    return ridge_sums(resid[:, :, t_min:].flatten(1, 2), ys[..., t_min:].flatten(-2), features)


def _check_t_min(t_min: int, n: int) -> None:
    if not is_int(t_min) or not 0 <= t_min < n:
        raise InputError(f"t_min must be in [0, {n - 1}], got {t_min!r}")


def _check_extra(extra: Sequence[RidgeSums], folds: int, shape: torch.Size) -> list[RidgeSums]:
    if not extra:
        return []
    n_layers, width = shape[0], shape[-1]
    if len(extra) != folds or any(tuple(e.sx.shape) != (n_layers, width) for e in extra):
        raise InputError(f"extra must be {folds} RidgeSums (one per fold) of {n_layers} "
                         f"layers x {width} features, got "
                         f"{[tuple(e.sx.shape) for e in extra]}")
    return list(extra)


def _out_of_fold(resid: Tensor, sums: list[RidgeSums], bounds: list[tuple[int, int]],
                 alphas: Tensor | None) -> tuple[Tensor, list[RidgeFit]]:
    """Every fold read by the ridge fit on the other folds' sums, ``[layer, batch, pos]``.

    Also returns those fits, one per fold.
    """
    n_layers, batch, n, _ = resid.shape
    total = _total(sums)
    preds = torch.empty(n_layers, batch, n, dtype=torch.float64)
    fits = []
    for (a, b), own in zip(bounds, sums):
        fit = ridge_from_sums(total - own, alphas)
        preds[:, a:b] = _read(resid[:, a:b], fit.coef, fit.intercept)
        fits.append(fit)
    return preds, fits


def _read(resid: Tensor, coef: Tensor, intercept: Tensor) -> Tensor:
    """Probes ``coef [layer, d_model]`` applied to ``resid [layer, batch, pos, d_model]``.

    In float64, one layer at a time: a float64 copy of one layer's residuals, not of all.
    """
    return torch.stack([torch.einsum("bnd,d->bn", r.to(torch.float64), c) + b
                        for r, c, b in zip(resid, coef, intercept)])


def _read_many(resid: Tensor, coefs: Sequence[Tensor], intercepts: Sequence[Tensor]) -> Tensor:
    """`_read` of several probes at once, ``[probe, layer, batch, pos]``.

    One float64 copy of each layer's residuals and one product for every probe: the copy,
    not the product, is the cost of a read at probe sizes.
    """
    coef, intercept = torch.stack(list(coefs), -1), torch.stack(list(intercepts), -1)
    out = torch.stack([r.to(torch.float64) @ c + b for r, c, b in zip(resid, coef, intercept)])
    return out.movedim(-1, 0)  # [layer, batch, pos, probe] -> [probe, layer, batch, pos]


@dataclasses.dataclass
class ReadoutNoise:
    """Samples of the cross-fitted readout's own estimation noise (`readout_noise`).

    ``draws [draw, layer, batch, pos]``: one per split of the other folds into halves,
    each zero-mean, with the variance and structure of the error the probes add to each
    layer's prediction of each sequence (their mean size is a steadier measure of the
    noise's size than one draw's).
    """

    draws: Tensor
    fit: CrossFit

    @property
    def noise(self) -> Tensor:
        """The first draw, ``[layer, batch, pos]`` (the split `noise_probes` reads with)."""
        return self.draws[0]

    @property
    def features(self) -> int:
        """The probes' input width: the degrees of freedom of their estimation error."""
        return int(self.fit.sums[0].sx.shape[-1])

    def noise_probes(self, rows: slice) -> LayerProbes:
        """Probes whose reading of a residual is a sample of that noise there.

        For the sequences ``rows`` (one fold's, as `CrossFit.probes_excluding` reads them):
        the scaled difference of probes fitted on two disjoint halves of the other folds.
        """
        keep = self.fit.others(rows)
        probes = self.fit.probes_excluding(rows)
        coef, intercept = _half_difference(self.fit, keep, probes.alpha_)
        probes.coef_, probes.intercept_ = coef, intercept
        return probes


def readout_noise(fit: CrossFit, resid: Tensor) -> ReadoutNoise:
    """The cross-fitted probes' estimation noise, measured by split halves.

    A probe fitted on finite data reads a layer with an error of its own, which lowers
    every similarity of the read layer. Fold k is read by the probe fitted on the other
    K − 1 folds; split those into two disjoint halves A and B, fit a probe on each (at
    fold k's α, scaled with the rows, so each is the same estimator on less data) and read
    fold k with both: their difference is the sum of two independent estimation errors,
    of variances ∝ 1/n_A and 1/n_B, and scaled by ``√((1/n) / (1/n_A + 1/n_B))`` it is a
    sample of the error of the probe on all n rows. Measured on the data themselves
    (their heteroscedasticity and correlations across positions included); only the
    folds' sums are refitted. Each rotation of the other folds gives another split
    (``ReadoutNoise.draws``): K − 1 draws, or (K − 1)/2 for odd
    K (the other rotations repeat them with the halves swapped). With 4 folds the three
    draws hold every contrast of the other folds' fits: their mean squared size has twice
    one draw's degrees of freedom. Sequences fitted on and never read (`cross_fit`'s
    ``extra``) are split between the halves with the folds; the draws are as many.
    """
    n_layers, batch, n, _ = resid.shape
    others = len(fit.folds) - 1
    # each rotation of the other folds split in two halves; with an even number of them,
    # rotation r + others/2 is rotation r with its halves swapped (the same draw, negated)
    n_draws = others // 2 if others % 2 == 0 else others
    draws = torch.empty(n_draws, n_layers, batch, n, dtype=torch.float64)
    for k, (a, b) in enumerate(fit.folds):
        keep = [j for j in range(len(fit.sums)) if j != k]  # the extra sequences' too
        alpha = fit.fit_on(keep).alpha
        coefs, intercepts = zip(*(_half_difference(fit, keep[r:] + keep[:r], alpha)
                                  for r in range(n_draws)))
        draws[:, :, a:b] = _read_many(resid[:, a:b], coefs, intercepts)
    return ReadoutNoise(draws, fit)


def _half_difference(fit: CrossFit, keep: list[int], alpha: Tensor) -> tuple[Tensor, Tensor]:
    """The scaled difference of ridge fits on two halves of the folds ``keep`` (see above)."""
    if len(keep) < 2:
        raise InputError("the readout's noise needs at least 3 folds (two halves of the "
                         "others)")
    halves = [keep[:len(keep) // 2], keep[len(keep) // 2:]]
    sums = [_total([fit.sums[j] for j in half]) for half in halves]
    rows = sum(s.n for s in sums)
    (coef_a, icpt_a), (coef_b, icpt_b) = (ridge_coef_at(s, alpha * s.n / rows) for s in sums)
    scale = ((1 / rows) / (1 / sums[0].n + 1 / sums[1].n)) ** 0.5
    return scale * (coef_a - coef_b), scale * (icpt_a - icpt_b)
