"""The alignment pipeline behind ``iclprobe align``: which learner does each layer run?

For a checkpoint: draw evaluation data (the model's own task by default), read every
layer's prediction out with `LayerProbes` (fitted on fresh draws, or loaded next to the
checkpoint), compute the reference learners' iterates on the same data (one shared
eigendecomposition), and compare layers with steps by error cosine and, through induced
weights on a subset, by weight cosine.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from iclprobe import algorithms, probes
from iclprobe.alignment.matching import Match, match_steps
from iclprobe.alignment.similarity import Similarity, similarity
from iclprobe.models.regressor import Regressor
from iclprobe.tasks import RegressionBatch, RegressionTask

logger = logging.getLogger(__name__)

DEFAULT_ALGORITHMS = ("newton", "gd", "pgd", "cg", "ols")
DATA_CHOICES = ("task", "isotropic", "ill-conditioned")
METRIC_CHOICES = ("error_cosine", "weight_cosine")


@dataclasses.dataclass(frozen=True)
class AlignConfig:
    """What `align` computes (defaults sized for a CPU)."""

    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    metrics: tuple[str, ...] = METRIC_CHOICES
    n_sequences: int = 512  # evaluation sequences
    n_probe_sequences: int = 1000  # fresh sequences the layer probes are fitted on
    n_probe_heldout: int = 256  # fresh sequences the probes' R² is measured on
    n_weight_sequences: int = 64  # sequences for induced weights (weight_cosine)
    n_queries: int | None = None  # queries per prefix for induced weights (default 1.5 d)
    data: str = "task"  # "task" | "isotropic" | "ill-conditioned"
    condition_number: float = 100.0
    newton_steps: int = 24  # Newton steps 0..newton_steps
    gd_max_log2: int = 12  # GD steps 2^0..2^gd_max_log2 (Fu et al.'s grid)
    gd_lr: float | str = "max"  # GD step size (default 1/λ_max of each prefix's Hessian)
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        unknown = [a for a in self.algorithms if a not in algorithms.LEARNERS]
        if unknown or not self.algorithms:
            raise ValueError(f"unknown learner(s) {unknown or list(self.algorithms)}; valid: "
                             f"{sorted(algorithms.LEARNERS)}")
        bad = [m for m in self.metrics if m not in METRIC_CHOICES]
        if bad or not self.metrics:
            raise ValueError(f"metric must be among {METRIC_CHOICES}, got {list(self.metrics)}")
        if self.data not in DATA_CHOICES:
            raise ValueError(f"data must be one of {DATA_CHOICES}, got {self.data!r}")
        for name in ("n_sequences", "n_probe_sequences", "n_weight_sequences", "newton_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.condition_number < 1:
            raise ValueError(f"condition_number must be >= 1, got {self.condition_number!r}")


@dataclasses.dataclass
class AlignResult:
    """Everything `align` measured for one model."""

    name: str
    n_layers: int
    task: dict[str, Any]
    layer_error: list[float]  # normalized error per layer, mean over t >= 1
    layer_error_by_t: list[list[float]]  # [layer][t]
    learner_error_by_t: dict[str, list[float]]  # each learner at the last layer's best step
    probe_r2: list[float]
    similarities: dict[str, dict[str, Similarity]]  # learner -> metric -> table
    matches: dict[str, dict[str, Match]]

    def table(self, metric: str = "error_cosine") -> list[dict[str, Any]]:
        """Per layer: error, best Newton/GD step, similarity, ties, zero reference."""
        rows = []
        for layer in range(self.n_layers + 1):
            row: dict[str, Any] = {"layer": layer, "normalized_error": self.layer_error[layer]}
            for learner in ("newton", "gd"):
                if learner not in self.matches or metric not in self.matches[learner]:
                    continue
                m, sim = self.matches[learner][metric], self.similarities[learner][metric]
                k = sim.steps.index(m.best_step[layer])
                row[f"{learner}_step"] = m.best_step[layer]
                row[f"{learner}_sim"] = m.best_value[layer]
                row[f"{learner}_ties"] = m.ties[layer]
                row[f"{learner}_zero_sim"] = float(sim.zero[k])
                row[f"{learner}_above_zero"] = m.above_zero[layer]
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (similarity tables included)."""
        return {
            "name": self.name, "n_layers": self.n_layers, "task": self.task,
            "layer_error": self.layer_error, "layer_error_by_t": self.layer_error_by_t,
            "learner_error_by_t": self.learner_error_by_t, "probe_r2": self.probe_r2,
            "table": {m: self.table(m) for m in next(iter(self.matches.values()), {})},
            "similarities": {lrn: {m: s.to_dict() for m, s in by.items()}
                             for lrn, by in self.similarities.items()},
            "matches": {lrn: {m: x.to_dict() for m, x in by.items()}
                        for lrn, by in self.matches.items()},
        }


def evaluation_task(model: Regressor, cfg: AlignConfig) -> RegressionTask:
    """The data `align` evaluates on: the model's task, or isotropic/ill-conditioned."""
    task = getattr(model, "task", None)
    if task is None:
        raise ValueError("the checkpoint has no task.json: pass --data isotropic or "
                         "ill-conditioned")
    if cfg.data == "task":
        return task
    return RegressionTask(n_dims=task.n_dims, n_points=task.n_points, cov=cfg.data,
                          condition_number=cfg.condition_number)


def _steps(cfg: AlignConfig, learner: str, n_dims: int) -> list[int] | None:
    if learner in ("ols", "ridge"):
        return None
    if learner in ("gd", "pgd", "momentum"):
        return [2**i for i in range(cfg.gd_max_log2 + 1)]
    if learner == "cg":
        return list(range(n_dims + 2))
    if learner in ("online_gd", "gd_plus_plus"):
        return list(range(1, 9))
    return list(range(cfg.newton_steps + 1))


def run_learner(name: str, batch: RegressionBatch, cfg: AlignConfig,
                stats: algorithms.PrefixStats | None, weights: bool) -> algorithms.Iterates:
    """A learner's iterates with `align`'s default hyperparameters."""
    steps = _steps(cfg, name, batch.xs.shape[-1])
    kw: dict[str, Any] = {"weights": weights}
    if name in ("gd", "momentum"):
        kw["lr"] = cfg.gd_lr
    if name == "pgd":
        kw.update(precond=torch.linalg.inv(batch.cov.double()), lr=cfg.gd_lr)
    elif name in ("gd", "momentum", "newton", "cg", "ols", "ridge"):
        kw["stats"] = stats
    if steps is not None:
        kw["steps"] = steps
    return algorithms.iterates(name, batch.xs.double(), batch.ys.double(), **kw)


def align(model: Regressor, cfg: AlignConfig | None = None, name: str = "model",
          layer_probes: probes.LayerProbes | None = None,
          eval_task: RegressionTask | None = None) -> AlignResult:
    """Align every layer of ``model`` with the reference learners (see the module doc)."""
    cfg = cfg or AlignConfig()
    model = model.to(cfg.device).eval()
    task = eval_task or evaluation_task(model, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    if layer_probes is None:
        layer_probes = probes.LayerProbes().fit(model, task, n_sequences=cfg.n_probe_sequences,
                                                generator=gen, n_heldout=cfg.n_probe_heldout)
    batch = task.sample(cfg.n_sequences, generator=gen)
    xs, ys = batch.xs.to(cfg.device), batch.ys.to(cfg.device)
    layer_preds = layer_probes.predict(xs, ys).double().cpu()  # [L+1, B, n]
    ys64 = batch.ys.double()
    err_by_t = (layer_preds - ys64).pow(2).mean(1) / task.n_dims  # [L+1, n]
    weights_needed = "weight_cosine" in cfg.metrics
    sub = slice(0, min(cfg.n_weight_sequences, cfg.n_sequences))
    layer_w = None
    if weights_needed:
        n_q = cfg.n_queries or task.n_dims + max(2, task.n_dims // 2)
        cov = batch.cov[sub] if batch.cov.ndim == 3 else batch.cov
        layer_w = probes.induced_weights(layer_probes.predict_queries, xs[sub], ys[sub],
                                         n_queries=n_q, cov=cov, generator=cfg.seed).double()
    stats = algorithms.prefix_stats(batch.xs.double(), ys64)
    sims: dict[str, dict[str, Similarity]] = {}
    matches: dict[str, dict[str, Match]] = {}
    curves: dict[str, list[float]] = {}
    for learner in cfg.algorithms:
        it = run_learner(learner, batch, cfg, stats, weights_needed)
        sims[learner], matches[learner] = {}, {}
        for metric in cfg.metrics:
            if metric == "error_cosine":
                sim = similarity(layer_preds, it, ys64, metric, seed=cfg.seed)
            else:
                assert it.weights is not None and layer_w is not None
                sub_it = algorithms.Iterates(it.steps, it.preds[:, sub], it.weights[:, sub],
                                             it.hyper, it.name)
                sim = similarity(layer_w, sub_it, ys64[sub], metric, seed=cfg.seed)
            sims[learner][metric] = sim
            matches[learner][metric] = match_steps(sim)
        # The reference curve: the step that best matches the last layer.
        last = matches[learner][cfg.metrics[0]].best_step[-1]
        k = it.steps.tolist().index(last)
        curves[f"{learner} (step {last})" if it.steps.numel() > 1 else learner] = (
            (it.preds[k] - ys64).pow(2).mean(0) / task.n_dims).tolist()
    return AlignResult(
        name=name, n_layers=model.cfg.n_layers, task=task.to_dict(),
        layer_error=err_by_t[:, 1:].mean(-1).tolist(), layer_error_by_t=err_by_t.tolist(),
        learner_error_by_t=curves, probe_r2=list(layer_probes.metrics_.r2)
        if hasattr(layer_probes, "metrics_") else [], similarities=sims, matches=matches)
