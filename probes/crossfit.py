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

import torch
from torch import Tensor

from iclprobe._checks import is_int
from iclprobe.errors import InputError
from iclprobe.models.base import Regressor
from iclprobe.probes.layer_probes import (
    LayerProbes,
    ProbeMetrics,
    check_rows,
    model_hash,
    probe_metrics,
)
from iclprobe.probes.ridge import RidgeSums, ridge_from_sums, ridge_sums


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

    def probes_excluding(self, rows: slice) -> LayerProbes:
        """Probes fitted on every fold that holds none of the sequences ``rows``."""
        start, stop = rows.start or 0, rows.stop
        keep = [k for k, (a, b) in enumerate(self.folds) if b <= start or a >= stop]
        if not keep:
            raise InputError(f"every fold holds some of the sequences {start}..{stop - 1}: "
                             "no probe is out of sample for them")
        fit = ridge_from_sums(_total([self.sums[k] for k in keep]), self.alphas)
        probes = LayerProbes(t_min=self.t_min)
        probes.coef_, probes.intercept_, probes.alpha_ = fit.coef, fit.intercept, fit.alpha
        probes.n_layers_, probes.model = fit.coef.shape[0], self.model
        probes.model_hash_ = model_hash(self.model)
        probes.n_dims_ = self.model.cfg.n_dims
        probes.metrics_ = self.metrics
        return probes


def _total(sums: list[RidgeSums]) -> RidgeSums:
    out = sums[0]
    for s in sums[1:]:
        out = out + s
    return out


def cross_fit(model: Regressor, resid: Tensor, ys: Tensor, folds: int = 4, t_min: int = 1,
              alphas: Tensor | None = None) -> CrossFit:
    """Ridge probes (GCV per layer) cross-fitted on residuals ``[L+1, B, n, d_model]``.

    The probes' target is the true y (positions ``t >= t_min`` enter the fits); every
    position is predicted.
    """
    n_layers, batch, n, width = resid.shape
    if ys.shape != (batch, n):
        raise InputError(f"ys must have shape {(batch, n)}, got {tuple(ys.shape)}")
    if not is_int(folds) or not 2 <= folds <= batch:
        raise InputError(f"folds must be an integer in [2, {batch}], got {folds!r}")
    if not isinstance(t_min, int) or not 0 <= t_min < n:
        raise InputError(f"t_min must be in [0, {n - 1}], got {t_min!r}")
    edges = [round(k * batch / folds) for k in range(folds + 1)]
    bounds = list(zip(edges[:-1], edges[1:]))
    fitted_on = batch - max(b - a for a, b in bounds)  # the fewest sequences a probe sees
    check_rows(fitted_on * (n - t_min), width, f"the other {folds - 1} of {folds} folds "
                f"({fitted_on} sequences) x {n - t_min} positions t >= {t_min}", n - t_min)
    sums = [ridge_sums(resid[:, a:b, t_min:].flatten(1, 2), ys[a:b, t_min:].flatten())
            for a, b in bounds]
    total = _total(sums)
    preds = torch.empty(n_layers, batch, n, dtype=torch.float64)
    for (a, b), own in zip(bounds, sums):
        fit = ridge_from_sums(total - own, alphas)
        block = resid[:, a:b].to(torch.float64)
        preds[:, a:b] = torch.einsum("lbnd,ld->lbn", block, fit.coef) + fit.intercept[:, None, None]
    metrics = probe_metrics(preds, ys, ys, t_min, model.cfg.n_dims)  # the target is y
    return CrossFit(preds, metrics, bounds, sums, model, t_min, alphas)
