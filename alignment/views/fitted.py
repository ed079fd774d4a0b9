"""The fitted view: Newton and GD matched over their step sizes as well as their steps.

A protocol runs each learner at one step-size rule (GD at 1/λ_max or 0.01, Newton at
α = 1/‖SSᵀ‖_F or 2/‖SSᵀ‖_F) on a grid of step counts. A model that runs the same
algorithm at another step size then sits between its own learner's columns and can sit
nearer to another learner's: the known-answer benchmark (``bench/known_answers.py``)
counts such false attributions. The fitted view gives both learners the same
flexibility — 15 step-size variants × 25 step counts each — and compares their best
matches:

- GD: per-prefix rules ``m/λ_max(S_t/t)`` on the mean loss, fixed steps ``η = m/max
  λ_max(S_t/t)`` on the mean loss and ``η = m/max λ_max(S_t)`` on the summed loss (the
  largest over the evaluation window), m ∈ {1/8, 1/4, 1/2, 1, 3/2}; steps 0, 1, 2, 3, 4,
  6, 8, 11, …, 4096 (powers of √2, rounded);
- Newton–Schulz: ``α = m/‖SSᵀ‖_F`` per prefix, m ∈ {1/2, 0.71, 1, 1.41, 2} (2/λ_max is
  GD's boundary, 2/‖SSᵀ‖_F converges at rank ≥ 2), fixed ``α_t = (m/max λ_max(S_t/t)²)/t²``
  and fixed ``α = m/max λ_max(S_t)²``, m ∈ {0.35, 1/2, 0.71, 1, 1.41}; steps 0…24. A
  Newton step doubles the effective step (α λ² → 2^k α λ²), so multiples an octave apart
  are nearly redundant and Newton's are √2 apart: with octave-spaced multiples, Newton at
  0.7 × 1/‖SSᵀ‖_F fell between its columns (the benchmark's held-out slice found it).

Fixed steps act inside the evaluation window only (0 elsewhere: a model valid only at its
trained length is matched there). Layers read by linear probes are compared with the
learners read the same way (`probe_read`). Intervals, paired differences, calibration and
verdicts are those of the protocol's learner table (`iclprobe.alignment.comparison`),
computed on these columns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.algorithms.prefix import PrefixStats, stats_rows
from iclprobe.alignment import comparison as C
from iclprobe.alignment.evaluation import Evaluation
from iclprobe.alignment.fitted_grid import (
    GD_SCALES,
    GD_STEPS,
    NEWTON_FIXED,
    NEWTON_SCALES,
    NEWTON_STEPS,
)
from iclprobe.alignment.measuring.layers import Layers
from iclprobe.alignment.measuring.matching import Matched
from iclprobe.alignment.measuring.runs import Learners, concat_iterates
from iclprobe.alignment.measuring.similarities import Similarity, similarity
from iclprobe.alignment.metrics import METRIC_INFO
from iclprobe.alignment.views.spectral import SpectralOrder, spectral_view

LEARNERS = ("newton", "gd")


def variants(learner: str, stats: PrefixStats, window: tuple[int, int]
             ) -> list[tuple[str, dict[str, Any]]]:
    """The step-size variants of ``learner``: ``(label, hyperparameters)``."""
    t_lo, t_hi = max(window[0], 1), window[1]
    n = stats.counts.numel()
    inside = torch.zeros(n, dtype=torch.float64)
    inside[t_lo:t_hi + 1] = 1.0
    t = stats.counts.clamp(min=1)
    top = stats.eigvals[:, t_lo:t_hi + 1, -1] / t[t_lo:t_hi + 1]  # λ_max(S_t / t)
    top_max = float(top.max()) if top.numel() else 1.0
    top_max = top_max if top_max > 0 else 1.0
    scale = stats.x_scale**2  # the eigenvalues are of the scaled data
    top_sum = float(stats.eigvals[:, t_lo:t_hi + 1, -1].max()) if top.numel() else 1.0
    top_sum = top_sum if top_sum > 0 else 1.0  # λ_max(S_t), the summed loss's Hessian
    if learner == "gd":
        rule = [(f"{m:g}/λmax", {"lr": "max", "normalize": True, "lr_scale": m})
                for m in GD_SCALES]
        fixed = [(f"η {m / top_max / scale:.3g}",
                  {"lr": inside * (m / top_max / scale), "normalize": True}) for m in GD_SCALES]
        summed = [(f"η {m / top_sum / scale:.3g} (sum)",
                   {"lr": inside * (m / top_sum / scale), "normalize": False})
                  for m in GD_SCALES]
        return rule + fixed + summed
    rule = [(f"{m:g}/‖SSᵀ‖", {"alpha": "frobenius", "alpha_scale": m}) for m in NEWTON_SCALES]
    fixed = [(f"a {m / top_max**2 / scale**2:.3g}",
              {"alpha": inside * (m / top_max**2 / scale**2) / t**2}) for m in NEWTON_FIXED]
    constant = [(f"α {m / top_sum**2 / scale**2:.3g}",
                 {"alpha": inside * (m / top_sum**2 / scale**2)}) for m in NEWTON_FIXED]
    return rule + fixed + constant


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
    read = a[:, None, None] * preds + torch.einsum("kd,bnd->kbn", slope, xs) + c[:, None, None]
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


def family_iterates(learner: str, xs: Tensor, ys: Tensor, stats: PrefixStats,
                    window: tuple[int, int], weights: bool) -> algorithms.Iterates:
    """Every (variant, step) column of ``learner`` on ``xs, ys`` (float64)."""
    steps = GD_STEPS if learner == "gd" else NEWTON_STEPS
    parts, names = [], []
    for label, hyper in variants(learner, stats, window):
        parts.append(algorithms.iterates(learner, xs, ys, steps=steps, weights=weights,
                                         stats=stats, **hyper))
        names.append(label)
    it = concat_iterates(parts, "variant", names)
    for key in ("lr", "alpha", "lr_scale", "alpha_scale"):
        it.hyper.pop(key, None)  # recorded per column in "variant"
    return it


def fitted_pairs(layer_preds: Tensor, layer_weights: Tensor | None, xs: Tensor, ys: Tensor,
                 stats: PrefixStats, window: tuple[int, int], weight_t_min: int,
                 metrics: list[str], over: str, live: list[bool], matched: list[bool],
                 n_boot: int, confidence: float, seed: int, probe_t_min: int | None = None
                 ) -> tuple[dict[str, C.PairVerdict], dict[str, dict[str, Similarity]],
                            SpectralOrder | None]:
    """Newton vs GD in the fitted view, per metric, with the similarity tables.

    With induced weights, also the spectral view (`alignment.views.spectral`): each layer's
    filter order, beside the order of each learner's best match by the weight metric.

    ``probe_t_min``: the layers were read by linear probes fitted on the positions
    ``t >= probe_t_min``; layers and learners are then both read by a linear readout of
    ``[prediction, x_t, 1]`` fitted on the window (`reread`, `probe_read`), so that a
    probe's rescaling of a layer's prediction does not hide its learner. None: the layers'
    exact readout, compared with the raw iterates.
    """
    n_w = layer_weights.shape[1] if layer_weights is not None else 0
    sub = slice(0, n_w)
    its = {k: family_iterates(k, xs, ys, stats, window, False) for k in LEARNERS}
    its_w = {}
    if any(METRIC_INFO[m].on == "weights" for m in metrics) and n_w:
        its_w = {k: family_iterates(k, xs[sub], ys[sub], stats_rows(stats, sub), window, True)
                 for k in LEARNERS}
    if probe_t_min is not None:
        rows = (max(window[0], probe_t_min), window[1])
        for k in LEARNERS:
            its[k], read_w = probe_read(its[k], xs, ys, rows, its_w.get(k))
            if read_w is not None:
                its_w[k] = read_w
        layer_preds, layer_weights = reread(layer_preds, layer_weights, xs, ys, rows)
    pairs, sims = {}, {}
    spectral = None
    for metric in metrics:
        on_w = METRIC_INFO[metric].on == "weights"
        if on_w and not its_w:
            continue
        values = layer_weights if on_w and layer_weights is not None else layer_preds
        ys_m = ys[sub] if on_w else ys
        lo = max(window[0], weight_t_min) if on_w and over == "positions" else window[0]
        by = {k: similarity(values, (its_w if on_w else its)[k], ys_m, metric, t_min=lo,
                            t_max=window[1],
                            over=over if METRIC_INFO[metric].across else "positions",
                            n_boot=n_boot, confidence=confidence, seed=seed)
              for k in LEARNERS}
        sign = 1.0 if by["newton"].higher_is_better else -1.0
        best = {k: (sign * s.values).argmax(1).tolist() for k, s in by.items()}
        scores = {k: C.learner_score(by[k], best[k]) for k in LEARNERS}
        diff = C.difference(by["newton"], by["gd"])
        cal = C.calibrate((its_w if on_w else its)["newton"], (its_w if on_w else its)["gd"],
                          ys_m, by["newton"], by["gd"], best["newton"], best["gd"])
        labels = C.verdicts(scores["newton"], scores["gd"], diff, cal, live,
                            by["newton"].higher_is_better, matched)
        sentence = C.sentence(labels, *LEARNERS, metric).replace(" by ", " (step sizes fitted) by ", 1)
        pairs[metric] = C.PairVerdict("newton", "gd", metric, diff, cal, labels, sentence)
        sims[metric] = by
        if on_w and spectral is None:
            spectral = _spectral(values, its_w, best, stats_rows(stats, sub), window, live,
                                 (n_boot, confidence, seed))
    return pairs, sims, spectral


def _spectral(layer_weights: Tensor, its_w: dict[str, algorithms.Iterates],
              best: dict[str, list[int]], stats: PrefixStats, window: tuple[int, int],
              live: list[bool], boot: tuple[int, float, int]) -> SpectralOrder:
    """The spectral view, beside each learner's columns that best match the layers."""
    best_w = {k: w[torch.tensor(best[k])] for k in LEARNERS
              if (w := its_w[k].weights) is not None}
    return spectral_view(layer_weights, best_w, stats, window, live, *boot)



def fitted_view(ev: Evaluation, layers: Layers, learners: Learners, matched: Matched
                ) -> tuple[dict[str, C.PairVerdict], SpectralOrder | None]:
    """`align`'s stage: Newton vs GD with step sizes fitted, and the spectral view."""
    cfg = ev.cfg
    fitted, _, spectral = fitted_pairs(
        layers.preds, layers.weights, ev.batch.xs.double(), ev.ys, learners.stats, ev.window,
        ev.protocol.weight_t_min, list(cfg.metrics), ev.averaging, matched.live,
        matched.matched, cfg.n_boot, cfg.confidence, cfg.seed, layers.probe_t_min)
    return fitted, spectral
