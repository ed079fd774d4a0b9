"""Learners decoded from a layer's residual stream: how much of each learner's prediction it holds.

A layer probe (`cross_fit`, `LayerProbes`) fits the true y from a layer's residual stream,
and its prediction is then compared with each learner's. Its estimation error is of the
size of the layer's own error from y: at an early layer, most of y. Decoding turns the fit
around: each learner's column (its predictions on the evaluation sequences, a target
without noise) is fitted from the residual. Where the layer holds a column linearly the fit
is exact whatever the number of rows; a rival's column is decoded only as far as the layer
holds it. Akyürek et al. (2023) probe a transformer for the learners' intermediate
quantities in the same way.

`decodability` returns, per layer and column, the unexplained share of the column
(uncentred: ``Σ (decoded − column)² / Σ column²``, ``1 − R²`` in sample; out of sample it
can pass 1) when it is decoded by a linear
map of the residual plus an intercept, fitted on the other folds' sequences (contiguous
folds, as `cross_fit`'s) at the positions ``t_min..t_max``. The fits are ridge regressions
with a penalty ``alpha`` on the residual's coefficients (not the intercept); by default a
small one, ``ALPHA_SCALE`` × the trace of the training rows' centred covariance, which only
keeps a rank-deficient residual's fit defined.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from iclprobe._checks import is_int
from iclprobe._finite import all_finite
from iclprobe._linalg import sym_eigh
from iclprobe.algorithms.prefix import check_real, power_of_two_scale
from iclprobe.errors import InputError, InputTypeError
from iclprobe.probes.ridge import FeatureSums

#: the default penalty, relative to the trace of the training rows' centred covariance
ALPHA_SCALE = 1e-10


def decodability(resid: Tensor, targets: Tensor, folds: int = 4, t_min: int = 1,
                 t_max: int | None = None, alpha: float | None = None) -> Tensor:
    """Unexplained share of each column ``targets[k]`` decoded from each layer, ``[layer, K]``.

    The share is ``Σ (decoded − column)² / Σ column²`` over the window's rows; out of sample
    it can pass 1 (a column the layer does not hold at all is decoded worse than by 0).
    Computed on the CPU in float64: each layer's residual is centred on its mean, and
    scaled by a power of two where its magnitude is extreme (`power_of_two_scale`), before
    the fits (which changes no fit), so offsets and scales far from 1 do not square into
    the normal equations.

    Args:
        resid: the layers' residual streams ``[layer, batch, pos, d_model]``.
        targets: the columns to decode, ``[K, batch, pos]`` (e.g. a learner's iterates).
        folds: contiguous blocks of sequences; each is decoded by maps fitted on the others.
        t_min, t_max: the positions fitted and scored (default: t >= 1).
        alpha: the ridge penalty on the residual's coefficients, in the residual's units
            (None: the default above).

    Raises:
        InputError: shapes that do not match, fewer than 2 sequences or a bad fold count,
            a bad window, non-finite inputs, an alpha that is not a finite number >= 0, or
            a column that is 0 at every position of the window (its share is undefined).
    """
    n_layers, batch, n, width = _checked(resid, targets, folds, t_min, t_max, alpha)
    window = slice(t_min, (n - 1 if t_max is None else t_max) + 1)
    y = targets[:, :, window].detach().to("cpu", torch.float64).flatten(1).T  # [rows, K]
    y = y / power_of_two_scale(y)
    total = y.pow(2).sum(0)
    zero = (total == 0).nonzero().flatten().tolist()
    if zero:
        raise InputError(f"decodability: targets {zero[:8]} are 0 at every position "
                         f"t = {t_min}..{window.stop - 1}: nothing to decode")
    y = y - y.mean(0)  # the intercept absorbs it: the fits' errors are those of y itself
    m = window.stop - window.start
    edges = [round(k * batch / folds) * m for k in range(folds + 1)]
    rows = [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]
    out = torch.empty(n_layers, y.shape[1], dtype=torch.float64)
    for layer in range(n_layers):
        x = resid[layer, :, window].detach().to("cpu", torch.float64).flatten(0, 1)
        x = x - x.mean(0)
        scale = power_of_two_scale(x)
        x = x / scale
        penalty = None if alpha is None else alpha / scale**2
        sse = torch.zeros(y.shape[1], dtype=torch.float64)
        for r in rows:
            train = torch.ones(x.shape[0], dtype=torch.bool)
            train[r] = False
            sse += (_fit_predict(x[train], y[train], x[r], penalty) - y[r]).pow(2).sum(0)
        out[layer] = sse / total
    return out


def held_shares(resid: Tensor, targets: Tensor, t_min: int = 1,
                t_max: int | None = None, features: FeatureSums | None = None) -> Tensor:
    """In-sample unexplained share of each column ``targets[k]`` by each layer, ``[layer, K]``.

    The share `decodability` measures out of sample (``Σ (decoded − column)² / Σ column²``
    over the window's rows), here from one fit on every row: the ridge residual sum of
    squares of the column on the layer's centred residual, from the normal equations in the
    eigenbasis of its covariance (eigenvalues under the round-off of the largest dropped,
    the penalty `ALPHA_SCALE` × the trace). No folds: one product of the residual with the
    columns per layer, so that thousands of columns can be ranked. `align` ranks the
    candidates' columns by it to choose each layer's probe target
    (`iclprobe.alignment.measuring.held`). A column that is 0 on the whole window has share
    +inf.

    Args:
        resid: the layers' residual streams ``[layer, batch, pos, d_model]``.
        targets: the columns, ``[K, batch, pos]``.
        t_min, t_max: the positions fitted (default: t >= 1).
        features: the residual's `FeatureSums` on those rows, where they are computed
            already (`iclprobe.probes.fold_features`, added up): its covariance is then
            taken from them, not formed again (the cost of a few columns' shares).

    Raises:
        InputError: shapes that do not match, fewer than 2 sequences, a bad window, or
            non-finite inputs.
    """
    n_layers, _, n, width = _checked(resid, targets, 2, t_min, t_max, None, "held_shares")
    window = slice(t_min, (n - 1 if t_max is None else t_max) + 1)
    y = targets[:, :, window].detach().to("cpu", torch.float64).flatten(1)  # [K, rows]
    y = y / power_of_two_scale(y)
    rows = y.shape[1]
    if features is not None and not isinstance(features, FeatureSums):
        raise InputTypeError(f"held_shares: features must be a FeatureSums "
                             f"(probes.fold_features, added up) or None, got "
                             f"{type(features).__name__}")
    if features is not None and (features.n != rows or features.sx.shape != (n_layers, width)):
        raise InputError(f"features must be the sums of the {rows} rows of {n_layers} layers x "
                         f"{width} features, got {features.n:g} rows of "
                         f"{tuple(features.sx.shape)}")
    total = y.pow(2).sum(1)
    yy = total - y.sum(1).pow(2) / rows  # centred: the intercept takes the mean
    out = torch.empty(n_layers, y.shape[0], dtype=torch.float64)
    for layer in range(n_layers):
        x = resid[layer, :, window].detach().to("cpu", torch.float64).flatten(0, 1)
        cov, yx = _products(x, y, features, layer, window)
        lam, vec = sym_eigh(cov, "the residual's covariance")
        lam = lam.clamp(min=0)
        pen = ALPHA_SCALE * float(lam.sum())
        top = float(lam.max()) if lam.numel() else 0.0
        keep = lam > 100 * x.shape[1] * torch.finfo(torch.float64).eps * top
        inv = torch.where(keep, 1.0 / torch.where(keep, lam + pen, 1.0), 0.0)
        z = yx @ vec  # [K, w]
        out[layer] = (yy - z.pow(2) @ (2 * inv - lam * inv.pow(2))).clamp(min=0) / total
    return torch.where(total > 0, out, torch.full_like(out, math.inf))


def _products(x: Tensor, y: Tensor, features: FeatureSums | None, layer: int,
              window: slice) -> tuple[Tensor, Tensor]:
    """`held_shares`' covariance of the centred rows ``x`` and their products with ``y``.

    From ``features`` where given (the same rows' sums, checked: as many rows of another
    window would pass unseen), else from ``x`` (scaled by a power of two: no change to a
    share).
    """
    if features is None:
        x = x - x.mean(0)
        x = x / power_of_two_scale(x)
        return x.T @ x, y @ x  # x is centred, so y's mean drops out
    sx = features.sx[layer].to("cpu", torch.float64)
    cgram = features.cgram[layer].to("cpu", torch.float64)
    # Σ_i √(n Σ x_i²) >= Σ |x|, from the sums themselves (no pass over x for it)
    bound = float((features.n * (cgram.diagonal() + sx.pow(2) / x.shape[0]).clamp(min=0)
                   ).sqrt().sum())
    if not torch.allclose(sx, x.sum(0), rtol=1e-9, atol=1e-9 * bound):
        raise InputError(f"features must be the sums of resid's rows at t = "
                         f"{window.start}..{window.stop - 1}: their sums differ at layer "
                         f"{layer}")
    return cgram, y @ (x - sx / x.shape[0])


def _fit_predict(x: Tensor, y: Tensor, x_new: Tensor, penalty: float | None) -> Tensor:
    """Ridge of ``y [rows, K]`` on ``x [rows, w]`` with an intercept, applied to ``x_new``.

    Centred on the training rows and solved in the eigenbasis of their covariance (no
    normal equations of the raw rows); eigenvalues under the round-off of the largest are
    dropped (a pseudo-inverse where ``penalty`` is 0).
    """
    mx, my = x.mean(0), y.mean(0)
    xc = x - mx
    lam, vec = sym_eigh(xc.T @ xc, "the residual's covariance")
    pen = ALPHA_SCALE * float(lam.clamp(min=0).sum()) if penalty is None else penalty
    top = float(lam.max()) if lam.numel() else 0.0
    keep = lam > 100 * x.shape[1] * torch.finfo(torch.float64).eps * top
    inv = torch.where(keep, 1.0 / torch.where(keep, lam + pen, 1.0), 0.0)
    coef = vec @ (inv[:, None] * (vec.T @ (xc.T @ (y - my))))  # [w, K]
    return (x_new - mx) @ coef + my


def _checked(resid: Tensor, targets: Tensor, folds: int, t_min: int, t_max: int | None,
             alpha: float | None, who: str = "decodability") -> tuple[int, int, int, int]:
    """`decodability`'s arguments checked: ``resid``'s shape."""
    for name, value in (("resid", resid), ("targets", targets)):  # real: no part dropped
        check_real(f"{who}: {name}", value)
    if resid.ndim != 4:
        raise InputError(f"resid must have shape [layer, batch, pos, d_model], "
                         f"got {tuple(resid.shape)}")
    n_layers, batch, n, width = resid.shape
    if targets.ndim != 3 or targets.shape[1:] != (batch, n):
        raise InputError(f"targets must have shape [K, {batch}, {n}], got {tuple(targets.shape)}")
    if batch < 2:
        raise InputError(f"{who} needs at least 2 sequences (folds of sequences), "
                         f"got resid with batch {batch}")
    if not is_int(folds) or not 2 <= folds <= batch:
        raise InputError(f"folds must be an integer in [2, {batch}] (the sequences), "
                         f"got {folds!r}")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real)
                              or not math.isfinite(alpha) or alpha < 0):
        raise InputError(f"alpha must be a finite number >= 0 (or None), got {alpha!r}")
    last = n - 1 if t_max is None else t_max
    if not (is_int(t_min) and is_int(last) and 0 <= t_min <= last < n):
        raise InputError(f"t_min and t_max must satisfy 0 <= t_min <= t_max < {n}, "
                         f"got t_min={t_min!r}, t_max={t_max!r}")
    for what, t in (("resid", resid[:, :, t_min:last + 1]),
                    ("targets", targets[:, :, t_min:last + 1])):  # only the rows fitted
        if not all_finite(t):
            raise InputError(f"{who}: {what} are not finite at positions {t_min}..{last} "
                             f"(found NaN or Inf)")
    return n_layers, batch, n, width
