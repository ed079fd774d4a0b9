"""Whether a candidate distribution keeps every answered layer's learner live.

The designed evaluation's objective (`search.separation`) is judged on a small sample of
each distribution (``DesignFamily.n_sequences``, 64). A learner can do regression there
and none on the sequences `align` then reads: online GD at 1.2/‖x‖² on κ 1000 data with
label noise 0.5 (the known-answer benchmark's held-out slice) had its first pass's error at
0.49 of the zero predictor's on the 64 judging sequences and at 0.98 on the 256 evaluation
sequences (a step of m/‖x_j‖² adds example j's label noise to w scaled by m/‖x_j‖, heavy-
tailed across sequences: three other draws of 64 gave 0.66, 0.81 and 0.95), and the
oracle's first two layers then computed nothing there: the designed data lost two answers
the own task had. Here each answered layer's learner is run on the very sequences
`align_designed` would read, at its matched column, and judged by the liveness rule
`align` judges a layer by (`live_layers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.algorithms.families import FamilyContext, NotACandidate
from iclprobe.algorithms.numerics import Diverged
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.evaluation import aligned_window, family_runs
from iclprobe.alignment.measuring.liveness import live_layers
from iclprobe.alignment.measuring.runs import run_spec
from iclprobe.alignment.protocols import RunSpec
from iclprobe.models.base import Regressor, input_dtype
from iclprobe.tasks import RegressionBatch, RegressionTask


def live_learners(task: RegressionTask, pairs: Mapping[int, Sequence[tuple[str, str]]],
                  places: Mapping[str, Sequence[tuple[float, int]]], n_layers: int,
                  cfg: AlignConfig, positions: str, model: Regressor) -> dict[int, bool | None]:
    """Per answered layer, whether its learner's matched column is live on ``task``'s data.

    The data are the evaluation sequences `align` samples with ``cfg`` (its n_sequences and
    seed, in the model's input dtype); ``positions``: where they are aligned. A layer's
    learner is the first of its contending pairs (the answer's). None where it cannot be
    judged: the learner is no candidate on these data (GD preconditioned by Σ⁻¹ on
    isotropic data) or the model's claim is not among its runs; False where its matched
    variant diverges there.
    """
    batch = task.sample(cfg.n_sequences, generator=torch.Generator().manual_seed(cfg.seed),
                        dtype=input_dtype(model))
    window = aligned_window(cfg, positions, task.n_points)
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    claims = family_runs(model, batch)[0]
    wanted: dict[str, dict[int, tuple[float, int]]] = {}
    for layer, ps in pairs.items():
        learner = ps[0][0]
        if learner in places:
            rank, step = places[learner][layer]
            wanted.setdefault(learner, {})[layer] = (float(rank), int(step))
    out: dict[int, bool | None] = {layer: None for layer in pairs}
    for learner, at in wanted.items():
        try:
            cols = _matched_columns(learner, sorted(set(at.values())), batch, stats, window,
                                    n_layers, claims.get(learner))
        except NotACandidate:
            continue
        layers = [layer for layer in at if cols.get(at[layer]) is not None]
        out.update({layer: False for layer in at if at[layer] in cols and layer not in layers})
        if layers:
            preds = torch.stack([cols[at[layer]] for layer in layers])  # type: ignore[misc]
            live = live_layers(preds, batch.ys, window, cfg.n_boot, cfg.confidence, cfg.seed)
            out.update(dict(zip(layers, live)))
    return out


def _matched_columns(key: str, places: Sequence[tuple[float, int]], batch: RegressionBatch,
                     stats: algorithms.PrefixStats, window: tuple[int, int], n_layers: int,
                     claim: RunSpec | None) -> dict[tuple[float, int], Tensor | None]:
    """The predictions of ``key``'s columns at ``places`` (variant rank, step).

    Only those variants are run, each at its matched steps (a family's grid variant, a fine
    one, or a step size on its continuum); None for a variant that diverges here, absent
    for one that is no variant of the family on these data (a ridge λ beyond the grid of a
    less spread spectrum). Raises `NotACandidate` where the family says the learner is none
    on these data.
    """
    by_rank: dict[float, list[int]] = {}
    for rank, step in places:
        by_rank.setdefault(float(rank), []).append(int(step))
    if claim is not None:  # a model's own learner: its one run
        specs = {0.0: claim}
    elif key not in algorithms.LEARNERS:
        raise NotACandidate(f"{key}: not claimed by this model on these data")
    else:
        info = algorithms.learner_info(key)
        family = info.fitted_family
        ctx = FamilyContext(stats, batch.cov, window)
        grid = family.grid(ctx)
        specs = {}
        for rank, steps in by_rank.items():
            if not family.holds(ctx, rank):
                continue
            label, hyper = grid[int(rank)][0] if rank == int(rank) else family.variant_at(ctx, rank)
            specs[rank] = RunSpec(key, info.label, None if family.steps is None
                                  else tuple(sorted(set(steps))), hyper)
    out: dict[tuple[float, int], Tensor | None] = {
        (float(r), int(s)): None for r, s in places if float(r) in specs}
    for rank, spec in specs.items():
        try:
            it = run_spec(spec, batch, n_layers, False, stats)
        except Diverged:
            continue
        for i, step in enumerate(it.steps.tolist()):
            if (rank, int(step)) in out:
                out[(rank, int(step))] = it.preds[i]
        if spec.steps is None and it.steps.numel() == 1:  # a closed form: its one column
            out.update({(r, s): it.preds[0] for r, s in out if r == rank})
    return out
