"""Learners decoded from a layer's residual stream: how much of each learner's prediction it holds.

A layer probe (`cross_fit`, `LayerProbes`) fits the true y from a layer's residual stream,
and its prediction is then compared with each learner's. Its estimation error is of the
size of the layer's own error from y: at an early layer, most of y. Decoding turns the fit
around: each learner's column (its predictions on the evaluation sequences, a target
without noise) is fitted from the residual. Where the layer holds a column linearly the fit
is exact whatever the number of rows; a rival's column is decoded only as far as the layer
holds it. Akyürek et al. (2023) probe a transformer for the learners' intermediate
quantities in the same way.

`decodability` returns, per layer and column, the unexplained share ``1 − R²`` of the
column (uncentered: ``Σ (decoded − column)² / Σ column²``) when it is decoded by a linear
map of the residual plus an intercept, fitted on the other folds' sequences (contiguous
folds, as `cross_fit`'s) at the positions ``t_min..t_max``. The fits are ridge regressions
with a penalty ``alpha`` on the residual's coefficients (not the intercept); by default a
small one, ``ALPHA_SCALE`` × the sum of the residual's squares over the fitted rows, which
only keeps a rank-deficient residual's fit defined.
"""

from __future__ import annotations

import torch
from torch import Tensor

from iclprobe._checks import is_int
from iclprobe.errors import InputError

#: the default penalty, relative to the sum of the fitted rows' squared residual features
ALPHA_SCALE = 1e-10


def decodability(resid: Tensor, targets: Tensor, folds: int = 4, t_min: int = 1,
                 t_max: int | None = None, alpha: float | None = None) -> Tensor:
    """Unexplained share of each column ``targets[k]`` decoded from each layer, ``[layer, K]``.

    Args:
        resid: the layers' residual streams ``[layer, batch, pos, d_model]``.
        targets: the columns to decode, ``[K, batch, pos]`` (e.g. a learner's iterates).
        folds: contiguous blocks of sequences; each is decoded by maps fitted on the others.
        t_min, t_max: the positions fitted and scored (default: t >= 1).
        alpha: the ridge penalty on the residual's coefficients (None: the default above).

    Raises:
        InputError: shapes that do not match, a bad fold count or window, non-finite
            inputs, or a column that is 0 at every position of the window (nothing to
            decode: its share is undefined).
    """
    n_layers, batch, n, width = _checked(resid, targets, folds, t_min, t_max)
    window = slice(t_min, (n - 1 if t_max is None else t_max) + 1)
    cols = targets[:, :, window].to(torch.float64)  # [K, batch, m]
    total = cols.pow(2).sum((1, 2))
    zero = (total == 0).nonzero().flatten().tolist()
    if zero:
        raise InputError(f"decodability: targets {zero[:8]} are 0 at every position "
                         f"t = {t_min}..{window.stop - 1}: nothing to decode")
    if alpha is not None and not (isinstance(alpha, (int, float)) and alpha >= 0):
        raise InputError(f"alpha must be a number >= 0, got {alpha!r}")
    edges = [round(k * batch / folds) for k in range(folds + 1)]
    k = cols.shape[0]
    out = torch.empty(n_layers, k, dtype=torch.float64)
    for layer in range(n_layers):
        x = resid[layer, :, window].to(torch.float64)  # [batch, m, width]
        feats = torch.cat([x, torch.ones_like(x[..., :1])], -1).flatten(0, 1)  # [rows, w+1]
        y = cols.flatten(1).T  # [rows, K]
        rows = [slice(a * x.shape[1], b * x.shape[1]) for a, b in zip(edges[:-1], edges[1:])]
        grams = [feats[r].T @ feats[r] for r in rows]
        cross = [feats[r].T @ y[r] for r in rows]
        gram_all, cross_all = sum(grams), sum(cross)
        sse = torch.zeros(k, dtype=torch.float64)
        for r, g, c in zip(rows, grams, cross):
            train = gram_all - g
            penalty = alpha if alpha is not None else \
                ALPHA_SCALE * float(train.diagonal()[:width].sum())
            train = train + penalty * torch.diag(torch.cat([torch.ones(width),
                                                             torch.zeros(1)]).double())
            coef = torch.linalg.lstsq(train, cross_all - c).solution  # [w+1, K]
            sse += (feats[r] @ coef - y[r]).pow(2).sum(0)
        out[layer] = sse / total
    return out


def _checked(resid: Tensor, targets: Tensor, folds: int, t_min: int, t_max: int | None
             ) -> tuple[int, int, int, int]:
    """`decodability`'s arguments checked: ``resid``'s shape."""
    if resid.ndim != 4:
        raise InputError(f"resid must have shape [layer, batch, pos, d_model], "
                         f"got {tuple(resid.shape)}")
    n_layers, batch, n, width = resid.shape
    if targets.ndim != 3 or targets.shape[1:] != (batch, n):
        raise InputError(f"targets must have shape [K, {batch}, {n}], got {tuple(targets.shape)}")
    if not is_int(folds) or not 2 <= folds <= batch:
        raise InputError(f"folds must be an integer in [2, {batch}], got {folds!r}")
    last = n - 1 if t_max is None else t_max
    if not (is_int(t_min) and is_int(last) and 0 <= t_min <= last < n):
        raise InputError(f"t_min and t_max must satisfy 0 <= t_min <= t_max < {n}, "
                         f"got t_min={t_min!r}, t_max={t_max!r}")
    for what, t in (("resid", resid), ("targets", targets)):
        if not bool(torch.isfinite(t).all()):
            raise InputError(f"decodability: {what} are not finite (found NaN or Inf)")
    return n_layers, batch, n, width
