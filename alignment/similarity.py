"""Layer × step similarity tables with bootstrap bounds, and best-step matching.

Axis legend: ``layer`` (L + 1 rows: the embedding, then each block), ``step`` (K step
counts of a learner), ``batch``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from typing import Any

import torch
from torch import Tensor

from iclprobe.algorithms.base import Iterates
from iclprobe.alignment import metrics as M

PRED_METRICS = ("error_cosine", "spd")
WEIGHT_METRICS = ("weight_cosine", "ilwd")
METRICS = PRED_METRICS + WEIGHT_METRICS
HIGHER_IS_BETTER = {"error_cosine": True, "weight_cosine": True, "spd": False, "ilwd": False}
LOG_STEP_LEARNERS = ("gd", "pgd", "momentum", "online_gd")


@dataclasses.dataclass
class Similarity:
    """``values[l, k]``: similarity of layer l with the learner after ``steps[k]`` steps."""

    metric: str
    learner: str
    steps: list[int]
    values: Tensor  # [layer, step]
    lower: Tensor  # [layer, step] bootstrap bound
    upper: Tensor  # [layer, step]
    zero: Tensor  # [step]: the zero predictor's similarity, the "computes nothing" reference
    higher_is_better: bool
    t_min: int
    n_sequences: int
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (tensors as nested lists)."""
        out = dataclasses.asdict(self)
        for key in ("values", "lower", "upper", "zero"):
            out[key] = getattr(self, key).tolist()
        return out

    def to_json(self) -> str:
        """The table as JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        """One row per (layer, step): value, bounds and the zero predictor's value."""
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["metric", "learner", "layer", "step", "value", "lower", "upper",
                         "zero_predictor"])
        for layer in range(self.values.shape[0]):
            for k, step in enumerate(self.steps):
                writer.writerow([self.metric, self.learner, layer, step,
                                 f"{self.values[layer, k].item():.6g}",
                                 f"{self.lower[layer, k].item():.6g}",
                                 f"{self.upper[layer, k].item():.6g}",
                                 f"{self.zero[k].item():.6g}"])
        return buf.getvalue()


def _per_sequence(metric: str, a: Tensor, b: Tensor, ys: Tensor, t_min: int) -> Tensor:
    """``a [L, ...]`` against ``b [K, ...]`` → ``[L, K, batch]``."""
    a, b = a[:, None], b[None]
    if metric == "error_cosine":
        return M.error_cosine_per_sequence(a, b, ys, t_min)
    if metric == "spd":
        return M.spd_per_sequence(a, b, t_min)
    if metric == "weight_cosine":
        return M.weight_cosine_per_sequence(a, b, t_min)
    return M.ilwd_per_sequence(a, b, t_min)


def similarity(layer_values: Tensor, iterates: Iterates, ys: Tensor,
               metric: str = "error_cosine", t_min: int = 1, n_boot: int = 200,
               confidence: float = 0.95, seed: int = 0, chunk: int = 64) -> Similarity:
    """Similarity of every layer with every step count of a learner.

    Args:
        layer_values: per-layer predictions ``[layer, batch, pos]`` (error_cosine, spd) or
            induced weights ``[layer, batch, pos, n_dims]`` (weight_cosine, ilwd).
        iterates: the learner's `Iterates` (with weights for the weight metrics).
        ys: ``[batch, pos]``.
        metric: one of ``METRICS``.
        t_min: positions t < t_min are left out.
        n_boot: bootstrap resamples of the sequences (seeded by ``seed``).
        confidence: width of the bootstrap interval.
        chunk: step counts evaluated at once (bounds memory at thousands of steps).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    other = iterates.weights if metric in WEIGHT_METRICS else iterates.preds
    if other is None:
        raise ValueError(f"metric {metric!r} needs the learner's weights: "
                         "compute the iterates with weights=True")
    if layer_values.shape[1:] != other.shape[1:]:
        raise ValueError(f"layer_values must have shape [layer, "
                         f"{', '.join(map(str, other.shape[1:]))}] to match the iterates, "
                         f"got {tuple(layer_values.shape)}")
    if ys.shape != iterates.preds.shape[1:]:
        raise ValueError(f"ys must have shape {tuple(iterates.preds.shape[1:])}, "
                         f"got {tuple(ys.shape)}")
    a, ys64 = layer_values.to(torch.float64), ys.to(torch.float64)
    per_seq = torch.cat([_per_sequence(metric, a, other[s:s + chunk].to(torch.float64), ys64,
                                       t_min) for s in range(0, other.shape[0], chunk)], dim=1)
    zero = _per_sequence(metric, torch.zeros_like(a[:1]), other.to(torch.float64), ys64, t_min)
    batch = per_seq.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(batch, (n_boot, batch), generator=gen)
    weights = torch.zeros(n_boot, batch, dtype=torch.float64).scatter_add_(
        1, picks, torch.ones(n_boot, batch, dtype=torch.float64)) / batch
    boots = per_seq @ weights.T  # [layer, step, n_boot]
    q = torch.tensor([(1 - confidence) / 2, (1 + confidence) / 2], dtype=torch.float64)
    lower, upper = torch.quantile(boots, q, dim=-1)
    return Similarity(metric, iterates.name, iterates.steps.tolist(), per_seq.mean(-1), lower,
                      upper, zero[0].mean(-1), HIGHER_IS_BETTER[metric], t_min, batch,
                      confidence)
