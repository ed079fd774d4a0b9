"""One row's similarity to mixes of columns, from the columns' products alone.

A mix ``v = (1 − w) m + w p`` of two columns is linear in them, so its inner product with
a row ``a`` and its own squared norm follow from the pairwise products of ``a``, ``m`` and
``p``: ``⟨a, v⟩ = (1 − w)⟨a, m⟩ + w⟨a, p⟩`` and
``‖v‖² = (1 − w)²‖m‖² + 2w(1 − w)⟨m, p⟩ + w²‖p‖²``. A cosine is ``⟨a, v⟩ / (‖a‖ ‖v‖)``, a
squared distance ``‖a‖² − 2⟨a, v⟩ + ‖v‖²``. So the built-in metrics per sequence
(`mix_scores`) need three products per part instead of every mix as a column of its own
(the answer's continua compare each layer with some 170 mixes, about 60 parts at three
weights each: built as columns, they were a sixth of the known-answer benchmark's time). The numbers are
those of the mixes' columns up to float64 round-off (tested against them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from iclprobe.alignment.measuring.bootstrap import bootstrap_weights
from iclprobe.alignment.measuring.products import fast_form, inverse_norm
from iclprobe.alignment.metrics import check_window, metric_info


def mix_scores(row: Tensor, groups: Sequence[tuple[Tensor, Tensor]], weights: Sequence[float],
               ys: Tensor, metric: str, t_min: int, t_max: int | None, over: str
               ) -> Tensor | None:
    """Metric ``metric`` per sequence between ``row`` and every mix, ``[mix, batch]``.

    ``row``: one layer's values ``[batch, pos]`` (predictions) or ``[batch, pos, d]``
    (weights); ``groups``: ``(m, parts)`` pairs, ``m`` one column and ``parts``
    ``[part, ...]``, each mixed as ``(1 − w) m + w part`` at every weight. The mixes are
    ordered group by group, part by part, the weight fastest. None where the metric has no
    such form: a metric other than the built-in error and weight cosine, SPD and ILWD (or
    one registered over them), or over sequences (a model aligned at one position).
    """
    if over != "positions" or fast_form(metric) is None:
        return None
    info = metric_info(metric)
    on_w = info.on == "weights"
    last = check_window(t_min, t_max, ys.shape[-1])
    window = slice(t_min, last + 1)
    ys_w = ys.to(torch.float64)[..., window]

    def windowed(v: Tensor) -> Tensor:  # the window's entries; residuals for the error cosine
        v = v[..., window, :] if on_w else v[..., window]
        return v.to(torch.float64) - ys_w if metric == "error_cosine" else v.to(torch.float64)

    def dot(u: Tensor, v: Tensor) -> Tensor:  # over the last axis: time (preds) or d (weights)
        return (u * v).sum(-1)

    a = windowed(row)
    mines = windowed(torch.stack([mine for mine, _ in groups]))  # [group, ...]
    parts = windowed(torch.cat([p for _, p in groups]))  # [part, ...], group by group
    owner = torch.cat([torch.full((len(p),), g) for g, (_, p) in enumerate(groups)])
    aa = dot(a, a)
    am, mm = dot(a, mines)[owner], dot(mines, mines)[owner]  # each part's own column's
    ap, pp, mp = dot(a, parts), dot(parts, parts), dot(mines[owner], parts)
    w = torch.tensor(list(weights), dtype=torch.float64).view(1, -1, *[1] * aa.ndim)
    av = (1 - w) * am[:, None] + w * ap[:, None]  # [part, weight, ...]
    vv = (1 - w).pow(2) * mm[:, None] + 2 * w * (1 - w) * mp[:, None] + w.pow(2) * pp[:, None]
    if info.geometry == "cosine":
        score = av * inverse_norm(aa.sqrt()) * inverse_norm(vv.clamp(min=0.0).sqrt())
    else:
        score = (aa - 2.0 * av + vv).clamp(min=0.0)
        if not on_w:  # SPD: the mean over the window's positions
            score = score / a.shape[-1]
    if on_w:  # per position, then its mean over the window
        score = score.mean(-1)
    return score.flatten(0, 1)


def mix_replicates(scores: Tensor, n_boot: int, seed: int) -> tuple[Tensor, Tensor]:
    """Values ``[mix]`` and bootstrap replicates ``[mix, boot]`` from per-sequence scores.

    The replicates resample the sequences as `similarity`'s do (the same seed: the same
    resamples as every table's).
    """
    resample = bootstrap_weights(scores.shape[-1], n_boot, seed)  # [boot, batch]
    return scores.mean(-1), scores @ resample.T
