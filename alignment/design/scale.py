"""Where a designed distribution's data are aligned, and at what scale."""

from __future__ import annotations

import dataclasses
import math

import torch

from iclprobe import algorithms
from iclprobe._checks import check_choice, check_real, check_type
from iclprobe.algorithms.families import FamilyContext
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.design.family import Distribution
from iclprobe.alignment.evaluation import aligned_window, evaluation_task
from iclprobe.models.base import Regressor
from iclprobe.tasks import RegressionTask

#: Where data are aligned (`AlignConfig.positions` once resolved)
POSITIONS = ("all", "last")


def designed_positions(task: RegressionTask, positions: str) -> str:
    """Where data of ``task`` are aligned: ``positions``, or the last position alone.

    The last alone where the queries are drawn apart from the context
    (``query="low-variance"``).
    """
    return "last" if task.query == "low-variance" else positions


def own_curvature(model: Regressor, cfg: AlignConfig, positions: str) -> float:
    """The curvature of the model's own evaluation sequences (see `matched_scale`)."""
    task = evaluation_task(model, cfg)
    return _curvature(task, cfg, aligned_window(cfg, positions, task.n_points))


def matched_scale(model: Regressor, cfg: AlignConfig, positions: str, chosen: Distribution,
                  seed: int, own: float | None = None) -> float:
    """The scale of ``chosen``'s data at which its curvature is the model's own task's.

    The curvature: the largest λ_max(S_t/t) over the evaluation sequences (``cfg``'s
    n_sequences and seed, as `align` samples them) and the aligned window's prefixes — what
    a fixed step size is relative to (its stability bound, the families' fixed step sizes,
    `FamilyContext.top_mean`). At that scale a model that runs fixed step sizes (a
    construction, a network trained on its own task) runs them at the same multiple of
    the designed data's bound as of its own data's, within the families' reach; keeping Σ's
    largest eigenvalue instead, a spread spectrum's sequences are shorter (‖x‖² ≈ tr Σ), a
    Newton construction's fixed α fell below its family's smallest step size there, and
    its layers matched no learner. ``own``: `own_curvature`, where already computed.
    """
    check_choice("matched_scale", "positions", positions, POSITIONS)
    check_type("matched_scale", "chosen", chosen, Distribution, "a Distribution")
    own = own_curvature(model, cfg, positions) if own is None else \
        check_real("matched_scale", "own", own, 0, low_open=True)
    there = chosen.task(evaluation_task(model, cfg).n_dims, seed)
    window = aligned_window(dataclasses.replace(cfg, t_max=None),
                            designed_positions(there, positions), chosen.n_points)
    return chosen.scale * math.sqrt(own / _curvature(there, cfg, window))


def _curvature(task: RegressionTask, cfg: AlignConfig, window: tuple[int, int]) -> float:
    """`FamilyContext.top_mean` of ``task``'s evaluation sequences over ``window``."""
    batch = task.sample(cfg.n_sequences, generator=torch.Generator().manual_seed(cfg.seed))
    xs = batch.xs.to(torch.float64)
    stats = algorithms.prefix_stats(xs, torch.zeros(xs.shape[:2], dtype=torch.float64))
    return FamilyContext(stats, batch.cov, window).top_mean()
