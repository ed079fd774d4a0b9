"""The built-in metrics as layer × column products: the similarity tables' fast forms.

A table compares every layer ``[L, B, ...]`` with every column ``[K, B, ...]`` of a
learner. The generic path broadcasts them to ``[L, K, B, pos]`` and calls the metric per
sequence; for the built-in metrics (error and weight cosine, SPD, ILWD) the same numbers
come from contractions (`fast_form`): one batched product per sequence (`_cross`) or per
position (`_cross_weights`), and the norms of each side once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from iclprobe.alignment import metrics as M


def inverse_norm(norm: Tensor) -> Tensor:
    """``1 / norm``, 0 where the norm is below the dtype's smallest normal number.

    (Whose inverse overflows: a cosine with such a vector counts as 0, as with 0.)
    """
    ok = norm >= torch.finfo(norm.dtype).tiny
    return torch.where(ok, 1.0 / torch.where(ok, norm, 1.0), 0.0)


def _pair_cosines(num: Tensor, norm_a: Tensor, norm_b: Tensor) -> Tensor:
    """Cosines from products ``[L, K, ...]`` and norms ``[L, ...]``, ``[K, ...]`` (0 at 0).

    The inverse norms are taken on the small tensors, so the large one is touched once.
    """
    return num.mul_(inverse_norm(norm_a)[:, None]).mul_(inverse_norm(norm_b)[None])


def _cross(a: Tensor, b: Tensor) -> Tensor:
    """``Σ_t a[l, b, t] b[k, b, t]`` as ``[L, K, B]``: one product per sequence.

    A batched product over the sequences on views of ``a`` and ``b`` (no copy of the
    large ``b``, a family's columns): the sums torch's einsum gives, bit for bit, in about
    half its time.
    """
    return torch.bmm(a.transpose(0, 1), b.permute(1, 2, 0)).permute(1, 2, 0)


def _cross_weights(a: Tensor, b: Tensor) -> Tensor:
    """``Σ_d a[l, b, t, d] b[k, b, t, d]`` as ``[L, K, B, T]``: one product per position.

    One batched product over the (sequence, position) pairs (the sums einsum gives, in
    about half its time at the tables' sizes).
    """
    n_l, batch, pos, d = a.shape
    left = a.permute(1, 2, 0, 3).reshape(batch * pos, n_l, d)
    right = b.permute(1, 2, 3, 0).reshape(batch * pos, d, b.shape[0])
    return torch.bmm(left, right).view(batch, pos, n_l, -1).permute(2, 3, 0, 1)


def _fast_error_cosine(a: Tensor, b: Tensor, ys: Tensor, w: slice) -> Tensor:
    ra, rb = (a - ys)[..., w], (b - ys)[..., w]  # [L, B, T], [K, B, T]
    return _pair_cosines(_cross(ra, rb), ra.norm(dim=-1), rb.norm(dim=-1))


def _fast_weight_cosine(a: Tensor, b: Tensor, ys: Tensor, w: slice) -> Tensor:
    wa, wb = a[..., w, :], b[..., w, :]  # [L, B, T, d], [K, B, T, d]
    return _pair_cosines(_cross_weights(wa, wb), wa.norm(dim=-1), wb.norm(dim=-1)).mean(-1)


def _fast_spd(a: Tensor, b: Tensor, ys: Tensor, w: slice) -> Tensor:
    pa, pb = a[..., w], b[..., w]
    cross = _cross(pa, pb)
    sq = pa.pow(2).sum(-1)[:, None] + pb.pow(2).sum(-1)[None] - 2.0 * cross
    return sq.clamp(min=0.0) / pa.shape[-1]


def _fast_ilwd(a: Tensor, b: Tensor, ys: Tensor, w: slice) -> Tensor:
    wa, wb = a[..., w, :], b[..., w, :]
    cross = _cross_weights(wa, wb)
    sq = wa.pow(2).sum(-1)[:, None] + wb.pow(2).sum(-1)[None] - 2.0 * cross
    return sq.clamp(min=0.0).mean(-1)


#: Layer × column forms of the built-in metrics (``[L, B, ...] × [K, B, ...] -> [L, K, B]``
#: as contractions, without the ``[L, K, B, pos]`` broadcast of the generic path); used
#: only while the registered function is the built-in one.
_FAST = {"error_cosine": ("_error_cosine", _fast_error_cosine),
         "weight_cosine": ("_weight_cosine", _fast_weight_cosine),
         "spd": ("_spd", _fast_spd), "ilwd": ("_ilwd", _fast_ilwd)}


def fast_form(metric: str) -> Any:
    """The built-in ``metric``'s layer × column form (None: another metric, or re-registered)."""
    entry = _FAST.get(metric)
    if entry is None:
        return None
    builtin = getattr(M, entry[0], None)
    return entry[1] if M.metric_info(metric).per_sequence is builtin else None
