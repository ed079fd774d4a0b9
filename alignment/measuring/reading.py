"""Learners read as a linear probe reads a layer: on ``[prediction, x_t, 1]``.

A ridge probe returns the best linear fit of y from a layer's residual stream, not the
prediction the layer holds: a layer that holds ``ŷ`` (and ``x_t``) is read as
``a ŷ + bᵀx_t + c``, with ``a`` well away from 1 for an early, shrunk iterate (1.2–20
measured on the known-answer models). Matched against the raw iterates, a probed layer
then fits no learner; read the same way (`reread`, `probe_read`), the layer and its
learner agree again.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from iclprobe import algorithms


def reread(preds: Tensor, weights: Tensor | None, xs: Tensor, ys: Tensor,
           rows: tuple[int, int]) -> tuple[Tensor, Tensor | None]:
    """Predictions as a linear readout of ``[ŷ_k, x_t, 1]`` reads them, per leading index k.

    Least squares of y on ``[ŷ_k, x_t, 1]`` over the positions ``rows = (lo, hi)`` of every
    sequence gives ``a_k ŷ_k + b_kᵀx_t + c_k``; ``weights`` (the same k on the first
    sequences, ``[K, B', n, d]``) become ``a_k w_k + b_k``, that readout's induced weights.
    Predictions related by an affine map with x_t (``ŷ' = a ŷ + bᵀx_t + c``) read the
    same, since they span the same features.
    """
    d, k = xs.shape[-1], preds.shape[0]
    lo, hi = rows
    x = xs[:, lo:hi + 1].reshape(-1, d)
    y = ys[:, lo:hi + 1].reshape(-1)
    one = torch.ones(x.shape[0], 1, dtype=x.dtype)
    z = torch.cat([x, one], 1)  # the features shared by every k: [x_t, 1]
    pk = preds[:, :, lo:hi + 1].reshape(k, -1)
    gram = torch.empty(k, d + 2, d + 2, dtype=x.dtype)  # the normal equations, by blocks
    gram[:, 0, 0] = pk.pow(2).sum(1)
    gram[:, 0, 1:] = gram[:, 1:, 0] = pk @ z
    gram[:, 1:, 1:] = z.T @ z
    rhs = torch.cat([(pk @ y)[:, None], (z.T @ y).expand(k, -1)], 1)
    jitter = 1e-12 * gram.diagonal(dim1=1, dim2=2).sum(-1).clamp(min=1.0)
    gram = gram + jitter[:, None, None] * torch.eye(d + 2, dtype=gram.dtype)
    coef = torch.linalg.solve(gram, rhs[..., None]).squeeze(-1)
    a, slope, c = coef[:, 0], coef[:, 1:d + 1], coef[:, d + 1]
    # a ŷ + bᵀx + c, summed in place into the one new [K, batch, pos] tensor
    read = torch.einsum("kd,bnd->kbn", slope, xs).add_(c[:, None, None])
    read.addcmul_(a[:, None, None], preds)
    read_w = None if weights is None else \
        a[:, None, None, None] * weights + slope[:, None, None, :]
    return read, read_w


def probe_read(it: algorithms.Iterates, xs: Tensor, ys: Tensor, rows: tuple[int, int],
               weights: algorithms.Iterates | None = None
               ) -> tuple[algorithms.Iterates, algorithms.Iterates | None]:
    """A learner's columns as a linear probe of ``[ŷ_k, x_t, 1]`` would read them (`reread`).

    A ridge probe returns the best linear fit of y from a layer's residual stream, not the
    prediction the layer holds: a layer that holds ``ŷ`` (and ``x_t``) is read as
    ``a ŷ + bᵀx_t + c``, with ``a`` well away from 1 for an early, shrunk iterate (1.2–20
    measured on the known-answer models). Matched against the raw iterates, a probed layer
    then fits no learner; read the same way, the layer and its learner agree again.
    ``weights``: the same columns with weights on the first sequences.
    """
    w_in = weights.weights if weights is not None else None
    preds, w = reread(it.preds, w_in, xs, ys, rows)
    read = dataclasses.replace(it, preds=preds, weights=None)
    if weights is None or w is None:
        return read, None
    return read, dataclasses.replace(weights, preds=preds[:, :weights.preds.shape[1]], weights=w)
