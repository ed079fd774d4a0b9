"""Similarity metrics between predictors, per sequence and averaged.

Fu et al. 2024, Def. 3.1 (similarity of errors) and Def. 3.2 (similarity of induced
weights); Akyürek et al. 2023 (SPD: squared prediction difference; ILWD: implicit linear
weight difference). Axis legend: ``batch``, ``pos`` (t), ``n_dims``; any leading axes
broadcast. Positions ``t < t_min`` are left out (t = 0 has no context: every learner
predicts 0 there).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_t_min(t_min: int, n: int) -> None:
    if not isinstance(t_min, int) or t_min < 0 or t_min >= n:
        raise ValueError(f"t_min must be an integer in [0, {n - 1}], got {t_min!r}")


def _cosine(a: Tensor, b: Tensor) -> Tensor:
    """Cosine along the last axis; 0 where either vector is 0."""
    num = (a * b).sum(-1)
    den = a.norm(dim=-1) * b.norm(dim=-1)
    return torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)


def error_cosine_per_sequence(preds_a: Tensor, preds_b: Tensor, ys: Tensor,
                              t_min: int = 1) -> Tensor:
    """Per sequence, the cosine between the residual vectors (pred − y) over t ≥ t_min."""
    _check_t_min(t_min, ys.shape[-1])
    ra = (preds_a - ys)[..., t_min:]
    rb = (preds_b - ys)[..., t_min:]
    return _cosine(ra, rb)


def error_cosine(preds_a: Tensor, preds_b: Tensor, ys: Tensor, t_min: int = 1) -> Tensor:
    """Fu et al.'s similarity of errors: mean over sequences of the residual cosine.

    ``t_min=0`` reproduces their code (which includes the context-free position).
    """
    return error_cosine_per_sequence(preds_a, preds_b, ys, t_min).mean(-1)


def weight_cosine_per_sequence(w_a: Tensor, w_b: Tensor, t_min: int = 1) -> Tensor:
    """Per sequence, the mean over t ≥ t_min of the cosine of the induced weights."""
    _check_t_min(t_min, w_a.shape[-2])
    return _cosine(w_a[..., t_min:, :], w_b[..., t_min:, :]).mean(-1)


def weight_cosine(w_a: Tensor, w_b: Tensor, t_min: int = 1) -> Tensor:
    """Fu et al.'s similarity of induced weights, averaged over (sequence, t ≥ t_min)."""
    return weight_cosine_per_sequence(w_a, w_b, t_min).mean(-1)


def spd_per_sequence(preds_a: Tensor, preds_b: Tensor, t_min: int = 1,
                     n_dims: int | None = None) -> Tensor:
    """Per sequence, the mean squared prediction difference over t ≥ t_min (÷ d if given)."""
    _check_t_min(t_min, preds_a.shape[-1])
    out = (preds_a - preds_b)[..., t_min:].pow(2).mean(-1)
    return out / n_dims if n_dims else out


def spd(preds_a: Tensor, preds_b: Tensor, t_min: int = 1, n_dims: int | None = None) -> Tensor:
    """Akyürek et al.'s SPD; dimension-normalized (÷ d, Garg's convention) with ``n_dims``."""
    return spd_per_sequence(preds_a, preds_b, t_min, n_dims).mean(-1)


def ilwd_per_sequence(w_a: Tensor, w_b: Tensor, t_min: int = 1,
                      normalized: bool = False) -> Tensor:
    """Per sequence, the mean squared weight distance ‖w_a − w_b‖² over t ≥ t_min."""
    _check_t_min(t_min, w_a.shape[-2])
    out = (w_a - w_b)[..., t_min:, :].pow(2).sum(-1).mean(-1)
    return out / w_a.shape[-1] if normalized else out


def ilwd(w_a: Tensor, w_b: Tensor, t_min: int = 1, normalized: bool = False) -> Tensor:
    """Akyürek et al.'s ILWD; ÷ d when ``normalized``."""
    return ilwd_per_sequence(w_a, w_b, t_min, normalized).mean(-1)
