"""Best-matching step per layer, its ties, and the fit of matched step against layer.

Fu et al. 2024 (Fig. 3a): the best-matching Newton step grows linearly with depth, the
best GD step exponentially (so GD steps are fitted in log₂). Ties — steps within ``tol``
of the best — are reported, as are layers whose best match does not beat the zero
predictor by more than its bootstrap interval (a layer that computes nothing matches any
learner's first tiny step).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import torch

from iclprobe.alignment.similarity import LOG_STEP_LEARNERS, Similarity


@dataclasses.dataclass
class Fit:
    """Least-squares line ``step ≈ slope · layer + intercept`` (log₂ step if ``log2``)."""

    slope: float
    intercept: float
    r2: float
    layers: list[int]
    log2: bool


@dataclasses.dataclass
class Match:
    """Per layer: the best step, its value, the tied steps, and whether it beats zero."""

    learner: str
    metric: str
    best_step: list[int]
    best_value: list[float]
    ties: list[list[int]]
    above_zero: list[bool]
    fit: Fit | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """As JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        """One row per layer."""
        rows = ["layer,best_step,best_value,ties,above_zero"]
        for layer, (s, v, t, z) in enumerate(zip(self.best_step, self.best_value, self.ties,
                                                 self.above_zero)):
            rows.append(f"{layer},{s},{v:.6g},{' '.join(map(str, t))},{z}")
        return "\n".join(rows) + "\n"


def fit_line(layers: list[int], steps: list[float]) -> tuple[float, float, float]:
    """Slope, intercept and R² of ordinary least squares (R² = 1 for a perfect or flat fit)."""
    x = torch.tensor(layers, dtype=torch.float64)
    y = torch.tensor(steps, dtype=torch.float64)
    xc, yc = x - x.mean(), y - y.mean()
    sxx = (xc * xc).sum()
    slope = (xc * yc).sum() / sxx if sxx > 0 else torch.tensor(0.0, dtype=torch.float64)
    intercept = y.mean() - slope * x.mean()
    ss_tot = (yc * yc).sum()
    ss_res = ((y - slope * x - intercept) ** 2).sum()
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else torch.tensor(1.0, dtype=torch.float64)
    return float(slope), float(intercept), float(r2)


def match_steps(sim: Similarity, steps: Sequence[int] | torch.Tensor | None = None,
                tol: float = 1e-3,
                layers: list[int] | range | None = None, log2: bool | None = None) -> Match:
    """Best step per layer (with ties within ``tol``) and the fit over ``layers``.

    Args:
        sim: a `Similarity` table.
        steps: the step counts of its columns (default: ``sim.steps``).
        tol: steps whose value is within ``tol`` of the best are reported as ties.
        layers: the layers the line is fitted over (default: 1..L, the blocks).
        log2: fit log₂(step) (default: True for GD-like learners, False otherwise).
    """
    if isinstance(steps, torch.Tensor):
        steps = steps.tolist()
    steps = [int(s) for s in (sim.steps if steps is None else steps)]
    n_layers, n_steps = sim.values.shape
    if len(steps) != n_steps:
        raise ValueError(f"steps has {len(steps)} entries, the table has {n_steps} columns")
    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise ValueError(f"tol must be a number >= 0, got {tol!r}")
    layers = list(range(1, n_layers) if layers is None else layers)
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range: the table has layers 0..{n_layers - 1}")
    sign = 1.0 if sim.higher_is_better else -1.0
    score = sign * sim.values  # higher is better from here on
    best = score.argmax(dim=1)
    best_step = [steps[int(i)] for i in best]
    best_score = score.max(dim=1).values
    ties = [[steps[k] for k in range(n_steps) if score[layer, k] >= best_score[layer] - tol]
            for layer in range(n_layers)]
    # A match counts only if its bootstrap bound clears the zero predictor's value: a layer
    # that computes nothing matches a learner's first tiny step (error cosine ~0.95) or
    # nothing at all (weight cosine ~0), and its "best step" is noise.
    rows = torch.arange(n_layers)
    bound = (sim.lower if sim.higher_is_better else sim.upper)[rows, best]
    above_zero = [bool(sign * bound[layer] > sign * sim.zero[best[layer]] + tol)
                  for layer in range(n_layers)]
    log2 = sim.learner in LOG_STEP_LEARNERS if log2 is None else log2
    fit_layers = [layer for layer in layers if not (log2 and best_step[layer] <= 0)]
    fit = None
    if len(fit_layers) >= 2:
        ys = [math.log2(best_step[layer]) if log2 else float(best_step[layer])
              for layer in fit_layers]
        slope, intercept, r2 = fit_line(fit_layers, ys)
        fit = Fit(slope, intercept, r2, fit_layers, log2)
    return Match(sim.learner, sim.metric, best_step, [float(sign * v) for v in best_score],
                 ties, above_zero, fit)
