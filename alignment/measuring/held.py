"""Each layer's probe target: the candidate's prediction the layer's residual holds best.

A ridge probe fitted to y reads a layer with an estimation error of the size of the
layer's own error from y, about √(p/N) of it (p residual features, N rows): at an early
layer, most of y. Through such probes GD's late iterates and heavy ball's, or a layer
between two of GD's step sizes and its neighbours, differ by less than that error. Fitted
to a learner's column instead — a target without label noise — a probe reads a layer that
holds that column exactly whatever the rows, and a layer that holds a column near it with
an error of the size of that distance, not of the layer's error from y.

So `align`, reading a model through cross-fitted probes with
``AlignConfig.probe_target="column"`` (the default), ranks every column of every
candidate's grid by the share of it the layer's residual leaves unexplained
(`iclprobe.probes.held_shares`, on the probes' rows) and fits that layer's probe to the
column it holds best: the layer's reading is then the part of that column the layer holds,
on the scale of the column. The learners are read as such a reading is (on
``[prediction, x_t, 1]``, `reading`), so its scale and any part linear in ``x_t`` do not
matter. What the layer holds is not always what it outputs: a residual stream can hold
several learners' predictions; the probe reads the one it holds best, as Akyürek et al.
(2023) probe for a learner's quantities.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from iclprobe._finite import finite_rows
from iclprobe.alignment.evaluation import Evaluation
from iclprobe.alignment.measuring.candidates import build_candidates, candidate_keys
from iclprobe.alignment.measuring.layers import Y_TARGET, Targets
from iclprobe.probes import FeatureSums, held_shares

#: columns per layer ranked again on every sequence after the first ranking on a part
SHORTLIST = 8
#: a layer whose residual leaves more than this share of every column unexplained holds
#: none: its probe is fitted to y (a Newton construction's layer that predicts 0 holds 9%
#: of one of Newton's columns, and a probe fitted to it read the layer as computing
#: something, "prefers gd", where the exact readout finds nothing)
MAX_SHARE = 0.5
#: rows per residual feature the first ranking reads at least (an eighth of the sequences
#: where that is more)
ROWS_PER_FEATURE = 16


def held_targets(ev: Evaluation, resid: Tensor, t_min: int,
                 features: FeatureSums | None = None) -> tuple[Tensor, list[str]]:
    """Per layer, the candidate column its residual holds best, ``[L+1, B, n]``, described.

    Over the grid columns of every candidate `align`'s answer reads (``ev.cfg.algorithms``
    and the model's claims), on the positions ``t >= t_min``: every column ranked by its
    share on the leading sequences (an eighth, or `ROWS_PER_FEATURE` rows per residual
    feature where that is more), then each layer's `SHORTLIST` best by their shares on
    every sequence; the column is put on y's scale (`_on_y_scale`). A layer that leaves
    more than `MAX_SHARE` of every column unexplained holds none: its target is y. The
    descriptions read "gd (0.5/λmax, step 6): 1.2e-05 unexplained", or "y, as no column
    is held: newton (...): 0.91 unexplained". ``features``: the residual's `FeatureSums` on
    the positions ``t >= t_min`` of every sequence, where they are computed already (the
    shortlists' shares then take its covariance from them).
    """
    claims = {k: ev.runs[k] for k in ev.claimed if k in ev.runs}
    keys = candidate_keys(ev.cfg.algorithms, claims)
    batch = ev.batch
    stats = ev.stats
    n_layers = resid.shape[0] - 1
    cands, _ = build_candidates(keys, batch, stats, ev.window, n_layers,
                                slice(0, ev.weight_rows) if ev.weight_metrics else None,
                                claims, None, peek=True)  # raw, kept for the answer's stage
    # the products of the residual with thousands of columns are the cost; a part of the
    # sequences ranks them as the whole does but for near ties, which the shortlist holds
    n_seq, per_seq = resid.shape[1], resid.shape[2] - t_min
    part = min(n_seq, max(-(-n_seq // 8),
                          -(-ROWS_PER_FEATURE * (resid.shape[-1] + 1) // max(per_seq, 1))))
    # every family's columns in one ranking: the residual's covariance decomposed once
    keys = list(cands)
    sizes = [cands[k].preds.preds.shape[0] for k in keys]
    joint = torch.cat([cands[k].preds.preds[:, :part] for k in keys])
    usable = _finite(joint, t_min)  # a column may diverge outside the window
    shares = torch.where(usable, held_shares(resid[:, :part], joint.nan_to_num_(), t_min),
                         torch.inf)
    ranked = dict(zip(keys, shares.split(sizes, dim=1)))
    columns = {k: c.preds.preds for k, c in cands.items()}
    picked, best = zip(*(_best_of_shortlist(layer, ranked, columns, resid, t_min, features)
                         for layer in range(resid.shape[0])))
    ys = batch.ys.double()
    targets = torch.stack([_on_y_scale(cands[k].preds.preds[col].double(), ys, t_min)
                           if b <= MAX_SHARE else ys for (k, col), b in zip(picked, best)])
    notes = [f"{'' if b <= MAX_SHARE else Y_TARGET}{k} "
             f"({cands[k].columns[col]}): {b:.2g} unexplained" for (k, col), b in zip(picked, best)]
    return targets, notes


def _best_of_shortlist(layer: int, ranked: dict[str, Tensor], columns: dict[str, Tensor],
                       resid: Tensor, t_min: int, features: FeatureSums | None
                       ) -> tuple[tuple[str, int], float]:
    """``((candidate, column), share)``: the layer's best column on every sequence.

    Among the first `SHORTLIST` finite ones of its ranking on the leading sequences
    (``ranked``: candidate -> ``[layer, column]`` shares; checked in that order until the
    shortlist is full).
    """
    order = sorted((float(v), key, col) for key, shares in ranked.items()
                   for v, col in zip(*map(torch.Tensor.tolist, torch.topk(
                       shares[layer], min(2 * SHORTLIST, shares.shape[1]), largest=False))))
    short = list(itertools.islice(
        (s for s in order if _finite(columns[s[1]][s[2]][None], t_min)), SHORTLIST))
    if not short:
        raise RuntimeError("no candidate column is finite on every sequence")
    cols = torch.stack([columns[key][col] for _, key, col in short])
    mine = None if features is None else FeatureSums(
        features.n, features.sx[layer:layer + 1], features.cgram[layer:layer + 1])
    full = held_shares(resid[layer:layer + 1], cols, t_min, features=mine)[0]
    at = int(full.argmin())
    if not math.isfinite(float(full[at])):
        raise RuntimeError("no candidate column is nonzero on the probes' rows")  # t >= 1
    return short[at][1:], float(full[at])


def _finite(columns: Tensor, t_min: int) -> Tensor:
    """``[K]``: whether each column ``[K, batch, pos]`` is finite at every ``t >= t_min``."""
    return finite_rows(columns[:, :, t_min:])


def _on_y_scale(column: Tensor, ys: Tensor, t_min: int) -> Tensor:
    """``a · column + c`` with ``a, c`` the least squares of y on ``[column, 1]`` (t >= t_min).

    A probe fitted to it reads the layer on y's scale, the same for any of the columns that
    differ by a scale (GD's step 1 at every step size: which one ranks first is round-off),
    so a layer's error and liveness do not depend on which was picked.
    """
    c, y = column[:, t_min:].flatten(), ys[:, t_min:].flatten()
    c0, y0 = c - c.mean(), y - y.mean()
    a = float(c0 @ y0) / max(float(c0 @ c0), torch.finfo(torch.float64).tiny)
    return a * (column - c.mean()) + y.mean()


def targets_for(ev: Evaluation) -> Targets | None:
    """What `read_layers` fits cross-fitted probes to: `held_targets` (None: y).

    Per ``ev.cfg.probe_target``: "column" fits each layer's probe to its best-held
    candidate column, "y" to the labels.
    """
    if ev.cfg.probe_target == "y":
        return None
    return lambda resid, t_min, features: held_targets(ev, resid, t_min, features)
