"""Which views of the data tell Newton from GD apart? The learners' own resemblance.

Newton's own iterates, used as if they were layers, are matched by GD: if GD imitates
Newton step k at similarity 0.99 under a view, a layer's preference for Newton under that
view can be at most 0.01, and a smaller preference is no evidence. This module measures,
for several Newton steps, the best similarity any GD step reaches with it under each view:
the error cosine over the protocol's positions; the error cosine only around t ≈ d (where
a prefix is barely determined and the learners differ most); the induced-weight cosine;
and the error cosine on ill-conditioned data (κ = 100). The lower the resemblance, the
better the view separates the learners.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.algorithms.base import REFERENCE_PAIR
from iclprobe.alignment.comparison import imitation
from iclprobe.alignment.evaluation import Evaluation
from iclprobe.alignment.measuring.runs import Learners, run_spec
from iclprobe.alignment.metrics import on_weights
from iclprobe.alignment.protocols import Protocol
from iclprobe.tasks import RegressionBatch, RegressionTask

NEWTON_PROBE_STEPS = (3, 6, 9, 12, 15, 18)
SEPARATION_SEQUENCES = 256


@dataclasses.dataclass
class SeparationView:
    """Under one view: per Newton step, the best-matching GD step and its similarity."""

    view: str
    newton_steps: list[int]
    gd_steps: list[int]
    resemblance: list[float]  # best similarity of any GD step with Newton step k

    @property
    def separation(self) -> float:
        """1 − mean resemblance: how far apart the view keeps the learners."""
        return 1.0 - sum(self.resemblance) / len(self.resemblance)


@dataclasses.dataclass
class Separation:
    """The views, best-separating first."""

    views: list[SeparationView]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"views": [{**dataclasses.asdict(v), "separation": v.separation}
                          for v in self.views]}


def _best_gd(newton: algorithms.Iterates, gd: algorithms.Iterates, ys: Tensor, cols: list[int],
             metric: str, t_min: int, t_max: int | None) -> tuple[list[int], list[float]]:
    values = newton.weights if on_weights(metric) else newton.preds
    assert values is not None
    res, best = imitation(values[cols], gd, ys, metric, t_min=t_min, t_max=t_max)
    return [int(gd.steps[i]) for i in best], res


def separation_views(d: int, n: int, protocol: Protocol,
                     iterates: dict[str, algorithms.Iterates],
                     iterates_w: dict[str, algorithms.Iterates], batch: RegressionBatch,
                     sub: slice, window: tuple[int, int], seed: int,
                     condition_number: float = 100.0) -> Separation:
    """Newton-vs-GD resemblance under each view, on the evaluation data and on κ-data.

    ``iterates`` holds the protocol's "newton" and "gd" runs on ``batch``, ``iterates_w``
    the same with weights on the sequences ``sub`` (for the weight view; may be empty).
    """
    newton, gd = iterates["newton"], iterates["gd"]
    steps = newton.steps.tolist()
    cols = [steps.index(k) for k in NEWTON_PROBE_STEPS if k in steps]
    probe_steps = [steps[c] for c in cols]
    ys = batch.ys.to(torch.float64)
    lo, hi = max(window[0], d // 2), min(window[1], (3 * d) // 2)
    views = [(f"error cosine, t = {window[0]}..{window[1]}", "error_cosine", *window)]
    if lo <= hi and (lo, hi) != window:
        views.append((f"error cosine, t = {lo}..{hi} (around t = d)", "error_cosine", lo, hi))
    out = []
    for label, metric, t_min, t_max in views:
        gd_steps, res = _best_gd(newton, gd, ys, cols, metric, t_min, t_max)
        out.append(SeparationView(label, probe_steps, gd_steps, res))
    if "newton" in iterates_w and "gd" in iterates_w:
        gd_steps, res = _best_gd(iterates_w["newton"], iterates_w["gd"], ys[sub], cols,
                                 "weight_cosine", max(protocol.weight_t_min, window[0]),
                                 window[1])  # the positions align's weight tables use
        out.append(SeparationView("weight cosine", probe_steps, gd_steps, res))
    ill = RegressionTask(n_dims=d, n_points=n, cov="ill-conditioned",
                         condition_number=condition_number)
    # learners only: a few hundred sequences pin their resemblance down to ~1e-3
    ill_batch = ill.sample(min(batch.xs.shape[0], SEPARATION_SEQUENCES),
                           generator=torch.Generator().manual_seed(seed + 7))
    ill_stats = algorithms.prefix_stats(ill_batch.xs.double(), ill_batch.ys.double())
    its = {k: run_spec(protocol.runs[k], ill_batch, 0, False, ill_stats, seed)
           for k in REFERENCE_PAIR}
    gd_steps, res = _best_gd(its["newton"], its["gd"], ill_batch.ys.double(), cols,
                             "error_cosine", window[0], window[1])
    out.append(SeparationView(f"error cosine, ill-conditioned data (κ = {condition_number:g})",
                              probe_steps, gd_steps, res))
    return Separation(sorted(out, key=lambda v: -v.separation))


def separation_view(ev: Evaluation, learners: Learners) -> Separation:
    """`align`'s stage: the separation views of the evaluation's Newton and GD runs."""
    n, d = ev.batch.xs.shape[1], ev.batch.xs.shape[2]
    return separation_views(d, n, ev.protocol, learners.iterates, learners.with_weights,
                            ev.batch, slice(0, ev.weight_rows), ev.window, ev.cfg.seed,
                            ev.cfg.condition_number)
