"""The fitted view: Newton and GD matched over their step sizes as well as their steps.

A protocol runs each learner at one step-size rule (GD at 1/λ_max or 0.01, Newton at
α = 1/‖SSᵀ‖_F or 2/‖SSᵀ‖_F) on a grid of step counts. A model that runs the same
algorithm at another step size then sits between its own learner's columns and can sit
nearer to another learner's: the known-answer benchmark (``bench/known_answers.py``)
counts such false attributions. The fitted view gives both learners the same
flexibility — each over its fitted family (`iclprobe.algorithms.families`: 21 step-size
variants for GD at 41 step counts 0…4096, 15 for Newton at 0…32) — and compares their best
matches, on the tables the answer over every candidate computed
(`alignment.measuring.candidates`). Intervals,
paired differences, calibration and verdicts are those of the protocol's learner table
(`iclprobe.alignment.comparison`), computed on these columns (`candidates.Candidates`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from iclprobe.algorithms.base import REFERENCE_PAIR
from iclprobe.algorithms.prefix import PrefixStats, stats_rows
from iclprobe.alignment import comparison as C
from iclprobe.alignment.measuring.candidates import Candidate, Candidates
from iclprobe.alignment.measuring.similarities import Similarity, first_best
from iclprobe.alignment.metrics import METRIC_INFO
from iclprobe.alignment.views.spectral import SpectralOrder, spectral_view

if TYPE_CHECKING:
    from iclprobe.alignment.evaluation import Evaluation

LEARNERS = REFERENCE_PAIR  # Newton vs GD: Fu et al.'s question


def fitted_pairs(tables: Mapping[str, Mapping[str, Similarity]],
                 cands: Mapping[str, Candidate], ys: Tensor, layer_weights: Tensor | None,
                 stats: PrefixStats, window: tuple[int, int], live: list[bool],
                 matched: list[bool], boot: tuple[int, float, int],
                 noisy: Sequence[Tensor] = ()
                 ) -> tuple[dict[str, C.PairVerdict], SpectralOrder | None]:
    """Newton vs GD in the fitted view, per metric, from the candidates' tables.

    ``tables``: ``metric -> candidate -> table`` (`candidates.candidate_tables`, the layers
    read as the learners are); ``cands``: the candidates, Newton and GD among them; ``ys``
    the evaluation targets. With induced weights (``layer_weights``, read the same way),
    also the spectral view (`alignment.spectral`): each layer's filter order, beside the
    order of each learner's best match by the weight metric; ``noisy``: the layer weights
    read with the readout's noise sample added and subtracted, whose intervals each
    layer's is joined with (`spectral_view`).
    """
    pairs: dict[str, C.PairVerdict] = {}
    spectral = None
    for metric, by_all in tables.items():
        by = {k: by_all[k] for k in LEARNERS}
        its = {k: cands[k].of(metric) for k in LEARNERS}
        ys_m = ys[:by["newton"].n_sequences]
        sign = 1.0 if by["newton"].higher_is_better else -1.0
        best = {k: first_best(sign * s.values).tolist() for k, s in by.items()}
        scores = {k: C.learner_score(by[k], best[k]) for k in LEARNERS}
        diff = C.difference(by["newton"], by["gd"])
        cal = C.calibrate(its["newton"], its["gd"], ys_m, by["newton"], by["gd"],
                          best["newton"], best["gd"])
        labels = C.verdicts(scores["newton"], scores["gd"], diff, cal, live,
                            by["newton"].higher_is_better, matched)
        sentence = C.sentence(labels, *LEARNERS, metric).replace(
            " by ", " (step sizes fitted) by ", 1)
        pairs[metric] = C.PairVerdict(*LEARNERS, metric, diff, cal, labels, sentence)
        if METRIC_INFO[metric].on == "weights" and spectral is None \
                and layer_weights is not None:
            rows = stats_rows(stats, slice(0, layer_weights.shape[1]))
            spectral = _spectral(layer_weights, its, best, rows, window, live, boot, noisy)
    return pairs, spectral


def _spectral(layer_weights: Tensor, its_w: Mapping[str, Any], best: dict[str, list[int]],
              stats: PrefixStats, window: tuple[int, int], live: list[bool],
              boot: tuple[int, float, int], noisy: Sequence[Tensor]) -> SpectralOrder:
    """The spectral view, beside each learner's columns that best match the layers."""
    best_w = {k: w[torch.tensor(best[k])] for k in LEARNERS
              if (w := its_w[k].weights) is not None}
    return spectral_view(layer_weights, best_w, stats, window, live, *boot, noisy=noisy)


def fitted_view(ev: Evaluation, stats: PrefixStats, live: list[bool], matched: list[bool],
                cands: Candidates) -> tuple[dict[str, C.PairVerdict], SpectralOrder | None]:
    """`align`'s stage: Newton vs GD with step sizes fitted, and the spectral view.

    From the candidates' tables (Newton and GD among them; else nothing to compare).
    """
    if not set(LEARNERS) <= set(cands.members):
        return {}, None
    boot = (ev.cfg.n_boot, ev.cfg.confidence, ev.cfg.seed)
    noisy = [w for draw in cands.noisy if (w := draw.get("weights")) is not None]
    return fitted_pairs(cands.tables, cands.members, ev.ys, cands.layers["weights"], stats,
                        ev.window, live, matched, boot, noisy)
