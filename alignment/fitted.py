"""The fitted view: Newton and GD matched over their step sizes as well as their steps.

A protocol runs each learner at one step-size rule (GD at 1/λ_max or 0.01, Newton at
α = 1/‖SSᵀ‖_F or 2/‖SSᵀ‖_F) on a grid of step counts. A model that runs the same
algorithm at another step size then sits between its own learner's columns and can sit
nearer to another learner's: the known-answer benchmark (``bench/known_answers.py``)
counts such false attributions. The fitted view gives both learners the same
flexibility — 10 step-size variants × 25 step counts each — and compares their best
matches:

- GD: per-prefix rules ``m/λ_max(S_t/t)`` and fixed steps ``η = m/max λ_max(S̄)`` (the
  largest over the evaluation window), m ∈ {1/8, 1/4, 1/2, 1, 3/2}, on the mean loss;
  steps 0, 1, 2, 3, 4, 6, 8, 11, …, 4096 (powers of √2, rounded);
- Newton–Schulz: ``α = m/‖SSᵀ‖_F`` per prefix, m ∈ {1/8, 1/4, 1/2, 1, 2} (each rule up to
  its own stability bound: 2/λ_max is GD's boundary, 2/‖SSᵀ‖_F converges at rank ≥ 2), and
  fixed ``α_t = (m/max λ_max(S̄)²)/t²`` with GD's m; steps 0…24.

Fixed steps act inside the evaluation window only (0 elsewhere: a model valid only at its
trained length is matched there). Intervals, paired differences, calibration and verdicts
are those of the protocol's learner table (`iclprobe.alignment.comparison`), computed on
these columns.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.algorithms.prefix import PrefixStats, stats_rows
from iclprobe.alignment import comparison as C
from iclprobe.alignment.metrics import METRIC_INFO
from iclprobe.alignment.runs import concat_iterates
from iclprobe.alignment.similarities import Similarity, similarity

GD_SCALES = (0.125, 0.25, 0.5, 1.0, 1.5)  # 2 / λ_max is on the boundary
NEWTON_SCALES = (0.125, 0.25, 0.5, 1.0, 2.0)  # 2 / ‖SSᵀ‖_F converges (rank >= 2)
GD_STEPS = tuple(sorted({0} | {round(2 ** (j / 2)) for j in range(25)}))
NEWTON_STEPS = tuple(range(25))
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
    if learner == "gd":
        rule = [(f"{m:g}/λmax", {"lr": "max", "normalize": True, "lr_scale": m})
                for m in GD_SCALES]
        fixed = [(f"η {m / top_max / scale:.3g}",
                  {"lr": inside * (m / top_max / scale), "normalize": True}) for m in GD_SCALES]
        return rule + fixed
    rule = [(f"{m:g}/‖SSᵀ‖", {"alpha": "frobenius", "alpha_scale": m}) for m in NEWTON_SCALES]
    fixed = [(f"a {m / top_max**2 / scale**2:.3g}",
              {"alpha": inside * (m / top_max**2 / scale**2) / t**2}) for m in GD_SCALES]
    return rule + fixed


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
                 metrics: list[str], over: str, live: list[bool], predicts: list[bool],
                 n_boot: int, confidence: float, seed: int
                 ) -> tuple[dict[str, C.PairVerdict], dict[str, dict[str, Similarity]]]:
    """Newton vs GD in the fitted view, per metric, with the similarity tables."""
    n_w = layer_weights.shape[1] if layer_weights is not None else 0
    sub = slice(0, n_w)
    its = {k: family_iterates(k, xs, ys, stats, window, False) for k in LEARNERS}
    its_w = {}
    if any(METRIC_INFO[m].on == "weights" for m in metrics) and n_w:
        its_w = {k: family_iterates(k, xs[sub], ys[sub], stats_rows(stats, sub), window, True)
                 for k in LEARNERS}
    pairs, sims = {}, {}
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
                            by["newton"].higher_is_better, predicts)
        sentence = C.sentence(labels, "newton", "gd", metric).replace(
            " by ", " (step sizes fitted) by ", 1)
        pairs[metric] = C.PairVerdict("newton", "gd", metric, diff, cal, labels, sentence)
        sims[metric] = by
    return pairs, sims

