"""Running a protocol's learners on an evaluation batch.

Hyperparameters that depend on the data are named symbolically in a protocol and resolved
here: ``precond="inverse_cov"`` is Σ⁻¹ of the batch. Learners that accept ``stats`` share
one eigendecomposition of the prefix matrices. A run with a ``grid`` becomes one column per
(grid value, step count), the values recorded per column in ``hyper``. `run_learners` is
`align`'s stage: every run of the evaluation, with weights where a weight metric needs them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from iclprobe import algorithms
from iclprobe.algorithms.base import parameters
from iclprobe.algorithms.prefix import stats_rows
from iclprobe.algorithms.sequential import initial_weights
from iclprobe.alignment.evaluation import Evaluation, refuse_nonfinite
from iclprobe.alignment.metrics import on_weights
from iclprobe.alignment.protocols import RunSpec
from iclprobe.tasks import RegressionBatch


@dataclasses.dataclass(frozen=True)
class Learners:
    """The learners' iterates on the evaluation sequences (float64).

    Attributes:
        stats: the prefix statistics they share (one eigendecomposition per prefix).
        iterates: run key -> its iterates on every sequence, predictions only.
        with_weights: run key -> its iterates with weights on the first sequences (empty
            where no weight metric needs them).
    """

    stats: algorithms.PrefixStats
    iterates: dict[str, algorithms.Iterates]
    with_weights: dict[str, algorithms.Iterates]

    def of(self, metric: str) -> dict[str, algorithms.Iterates]:
        """The iterates ``metric`` compares: with weights for a weight metric."""
        return self.with_weights if on_weights(metric) else self.iterates


def run_learners(ev: Evaluation, n_layers: int) -> Learners:
    """`align`'s stage: the iterates of every run of ``ev`` (a model of ``n_layers`` blocks).

    Raises:
        InputError: a learner's iterates are not finite.
    """
    stats = ev.stats
    iterates, with_weights = {}, {}
    for key, spec in ev.runs.items():
        it = run_spec(spec, ev.batch, n_layers, False, stats, ev.cfg.seed)
        iterates[key] = dataclasses.replace(it, name=key)
        refuse_nonfinite(f"{key} iterates", it.preds)
        if ev.weight_metrics:  # weights only where the weight metrics need them
            it_w = run_spec(spec, ev.batch, n_layers, True, stats, ev.cfg.seed,
                            sequences=slice(0, ev.weight_rows))
            assert it_w.weights is not None
            refuse_nonfinite(f"{key} weight iterates", it_w.weights)
            with_weights[key] = dataclasses.replace(it_w, name=key)
    return Learners(stats, iterates, with_weights)


def _resolve_hyper(hyper: dict[str, Any], batch: RegressionBatch) -> dict[str, Any]:
    out = dict(hyper)
    if out.get("precond") == "inverse_cov":
        out["precond"] = torch.linalg.inv(batch.cov.to(torch.float64))
    return out


def concat_iterates(parts: list[algorithms.Iterates], key: str,
                    values: list[Any]) -> algorithms.Iterates:
    """Columns of several runs side by side; ``hyper[key]`` lists each column's value."""
    steps = torch.cat([p.steps for p in parts])
    preds = torch.cat([p.preds for p in parts])
    weights = None if any(p.weights is None for p in parts) else \
        torch.cat([p.weights for p in parts])  # type: ignore[misc]
    hyper = dict(parts[0].hyper)
    hyper[key] = [v for v, p in zip(values, parts) for _ in range(p.steps.numel())]
    return algorithms.Iterates(steps, preds, weights, hyper, parts[0].name)


def run_spec(spec: RunSpec, batch: RegressionBatch, n_layers: int, weights: bool,
             stats: algorithms.PrefixStats | None = None, seed: int = 0,
             sequences: slice | None = None) -> algorithms.Iterates:
    """The iterates of ``spec`` on ``batch`` (float64), with shared ``stats`` if it takes them.

    ``sequences``: run on these sequences of ``batch`` only (their iterates equal those rows
    of a run on the whole batch: random starts are drawn for the whole batch and sliced).
    """
    rows = sequences or slice(None)
    fn = algorithms.learner_info(spec.learner).fn
    params = parameters(fn)
    kw: dict[str, Any] = {**_resolve_hyper(dict(spec.hyper), batch), "weights": weights}
    init_uniform = "generator" in params and kw.get("init") == "uniform"
    if init_uniform:  # one start per (sequence, prefix) of the whole batch, then the rows
        shape = (batch.xs.shape[0], batch.xs.shape[1], batch.xs.shape[2])
        kw["init"] = initial_weights("uniform", shape, seed, torch.device("cpu"))[rows]
    for key in ("precond", "preconds"):
        value = kw.get(key)
        if sequences is not None and isinstance(value, torch.Tensor) and value.ndim == (
                3 if key == "precond" else 4):
            kw[key] = value[rows] if key == "precond" else value[:, rows]
    xs, ys = batch.xs[rows].to(torch.float64), batch.ys[rows].to(torch.float64)
    if "stats" in params and stats is not None:
        kw["stats"] = stats_rows(stats, rows) if sequences is not None else stats
    steps = spec.resolve_steps(xs.shape[-1], n_layers)
    if steps is not None:
        kw["steps"] = steps
    if spec.grid is None:
        it = algorithms.iterates(spec.learner, xs, ys, **kw)
    else:
        key, values = spec.grid
        parts = [algorithms.iterates(spec.learner, xs, ys, **{**kw, key: v}) for v in values]
        it = concat_iterates(parts, key, list(values))
    if init_uniform:
        it.hyper["init"] = "uniform"
    return it
