"""Helpers of scripts/ahn_reviewers.py: sizes, training with a distance trajectory, errors.

Every model is a `PQTransformer` trained by `iclprobe.training.train` on Ahn et al.'s
in-context loss (the last position: N = 20 context examples and one query); evaluation
uses one fixed test batch per task. Errors are normalized: mean squared error at the
query over the mean of y² there (the zero predictor scores 1).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from iclprobe import algorithms, models, probes, tasks, training
from iclprobe.alignment.measuring.bootstrap import bootstrap_weights, interval

D, N_CONTEXT = 5, 20
TEST_SEED, OPTIMUM_SEED = 10_000, 20_000

#: Recipes. L-BFGS trains on one fixed dataset (Ahn et al.'s code does the same); its
#: "steps" are outer steps of max_iter iterations each.
RECIPES: dict[str, dict[str, Any]] = {
    "adam": dict(optimizer="adam", lr=0.05, betas=(0.9, 0.99), schedule="cosine"),
    "sgd": dict(optimizer="sgd", lr=0.05, momentum=0.9, schedule="cosine", clip="per-matrix",
                clip_norm=0.5),
    "lbfgs": dict(optimizer="lbfgs", lr=1.0, resample_every=0, max_iter=20, history_size=50),
}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much each question trains (defaults: the ≤ 30-minute study on 2 CPU cores)."""

    restarts: int = 5  # Q4, Q6
    few_restarts: int = 3  # Q2, Q3, Q5
    steps: int = 800  # Adam and SGD steps
    batch: int = 500  # Adam and SGD sequences per step
    lbfgs_steps: int = 20  # L-BFGS outer steps (x 20 iterations)
    lbfgs_batch: int = 1000  # the fixed L-BFGS dataset
    segments: int = 5  # distance measurements along a run (Q2's trajectories)
    optimum_steps: int = 25  # Q3's numerical optimum: L-BFGS outer steps
    optimum_batch: int = 4000  # ... on this many fixed sequences
    d_ks: tuple[int, ...] = (5, 2)  # Q2: d_k = d and d_k < d
    grid_layers: tuple[int, ...] = (1, 2, 3, 4)  # Q7
    grid_dims: tuple[int, ...] = (3, 5, 8)
    grid_kappas: tuple[float, ...] = (1.0, 10.0, 100.0)
    grid_restarts: int = 2
    grid_steps: int = 10  # Q7: L-BFGS outer steps per cell
    grid_batch: int = 500
    test: int = 2000  # test sequences per task
    softmax_batch: int = 250  # Q4: Adam sequences per step (softmax-ahn is 3x slower)
    align_sequences: int = 256  # Q5
    boot: int = 200  # bootstrap resamples of the test sequences
    mc_samples: int = 100_000  # Q3's Monte Carlo check of the one-layer optimum

    @classmethod
    def small(cls) -> Sizes:
        """A version for the test suite: seconds, not minutes."""
        return cls(restarts=2, few_restarts=1, steps=5, batch=32, lbfgs_steps=2,
                   lbfgs_batch=64, segments=2, optimum_steps=1, optimum_batch=128, d_ks=(3, 1),
                   grid_layers=(1, 2), grid_dims=(3,), grid_kappas=(1.0, 10.0),
                   grid_restarts=1, grid_steps=1, grid_batch=64, test=128, softmax_batch=32,
                   align_sequences=32, boot=20, mc_samples=4000)


def ahn_task(n_dims: int = D, w_prior: str = "inverse-cov",
             eigenvalues: tuple[float, ...] | None = None) -> tasks.RegressionTask:
    """Ahn et al.'s rotated Σ (seed 0), N = 20 context examples and a query."""
    return tasks.RegressionTask(n_dims=n_dims, n_points=N_CONTEXT + 1, cov="rotated",
                                w_prior=w_prior, eigenvalues=eigenvalues)


def eval_batch(task: tasks.RegressionTask, sizes: Sizes) -> tasks.RegressionBatch:
    return task.sample(sizes.test, generator=TEST_SEED)


def recipe(optimizer: str, sizes: Sizes, seed: int, steps: int | None = None,
           batch: int | None = None, **extra: Any) -> training.TrainConfig:
    lbfgs = optimizer == "lbfgs"
    return training.TrainConfig(**{
        **RECIPES[optimizer], "steps": steps or (sizes.lbfgs_steps if lbfgs else sizes.steps),
        "batch_size": batch or (sizes.lbfgs_batch if lbfgs else sizes.batch), "loss": "last",
        "seed": seed, "log_every": 10**6, "checkpoint_every": 0, **extra})


def train(model: models.PQTransformer, task: tasks.RegressionTask, cfg: training.TrainConfig,
          track: Tensor | None = None, segments: int = 1) -> list[dict[str, Any]]:
    """Train in place; with ``track`` (a [d, d] M), measure max_l dist(A_l, M) along the way.

    The run is cut into ``segments`` resumed pieces (bitwise the uninterrupted run, its
    optimizer state included); returns ``[{"step", "dist"}]`` after each piece.
    """
    if track is None or segments <= 1:
        training.train(model, task, cfg, progress=False)
        return [] if track is None else [_point(model, track, cfg.steps)]
    ends = sorted({max(1, round(cfg.steps * (i + 1) / segments)) for i in range(segments)})
    trajectory = []
    with tempfile.TemporaryDirectory(prefix="ahn-reviewers-") as tmp:
        run = Path(tmp) / "run"
        for i, end in enumerate(ends):
            training.train(model, task, dataclasses.replace(cfg, steps=end), out=run,
                           resume=i > 0, progress=False)
            trajectory.append(_point(model, track, end))
    return trajectory


def _point(model: models.PQTransformer, track: Tensor, step: int) -> dict[str, Any]:
    dist = probes.distance(probes.preconditioners(model).A, track)[0]
    return {"step": step, "dist": float(dist.max())}


def pq(n_layers: int, seed: int, n_dims: int = D, **cfg: Any) -> models.PQTransformer:
    """A PQ model at Ahn et al.'s initialization scale (factors: √0.01, so A starts alike)."""
    init = math.sqrt(0.01) if cfg.get("d_k") is not None else 0.01
    return models.PQTransformer(models.PQConfig(n_dims=n_dims, n_layers=n_layers, seed=seed,
                                                init_std=init, **cfg))


@torch.no_grad()
def last_errors(model: Any, batch: tasks.RegressionBatch) -> Tensor:
    """Per test sequence: squared error at the query over the batch's mean y² there."""
    preds = model(batch.xs, batch.ys, last_only=True)[:, 0].double()
    ys = batch.ys[:, -1].double()
    return (preds - ys) ** 2 / ys.pow(2).mean()


def boot_ci(values: Tensor, sizes: Sizes, seed: int = 0) -> list[float]:
    """The mean's 95% bootstrap interval over the sequences, as `align` reads its intervals.

    The sequences resampled by `bootstrap_weights`, the interval the expanded percentile
    one (`interval`; at the 2000 test sequences it is the plain percentile
    interval widened by 0.09%, read at the (B + 1)·p-th order statistics).
    """
    means = bootstrap_weights(len(values), sizes.boot, seed) @ values.double()
    lower, upper = interval(means, 0.95, len(values))
    return [float(lower), float(upper)]


def spread(values: list[float]) -> dict[str, float]:
    """Mean, standard deviation (n − 1; 0 for one value), min and max."""
    t = torch.tensor(values, dtype=torch.float64)
    sd = float(t.std()) if len(values) > 1 else 0.0
    return {"mean": float(t.mean()), "sd": sd, "min": float(t.min()), "max": float(t.max())}


def describe(model: models.PQTransformer, inv_cov: Tensor) -> dict[str, Any]:
    """A_l against Σ⁻¹ (distance, a_l), definiteness, and B_l against I."""
    pre = probes.preconditioners(model)
    dist, scale = probes.distance(pre.A, inv_cov)
    pd = probes.definiteness(pre.A)
    b_dist, b_scale = probes.distance(pre.B, torch.eye(pre.B.shape[-1]))
    b_norm = pre.B.double().norm(dim=(-1, -2)) / pre.A.double().norm(dim=(-1, -2))
    return {"dist": dist.tolist(), "scale": scale.tolist(),
            "min_sym_eig": pd.smallest.tolist(), "skew_ratio": pd.skew_ratio.tolist(),
            "b_dist_to_identity": b_dist.tolist(), "b_scale": b_scale.tolist(),
            "b_over_a_norm": b_norm.tolist()}


def best_step_size(batch: tasks.RegressionBatch, steps: int, scale: float,
                   precond: Tensor | None = None) -> tuple[float, float]:
    """(error, lr) of ``steps`` steps of (preconditioned) GD at the best of 40 step sizes.

    GD on the mean loss from w = 0 over the query's N examples, ``w <- w − η M (S̄w − b̄)``,
    for all 40 step sizes at once; the grid spans 1e-2 .. 4 times ``1/scale`` (scale: λ_max
    of the Hessian on average); the best is picked on ``batch`` itself.
    """
    xs, ys = batch.xs[:, :-1].double(), batch.ys[:, :-1].double()
    n, d = xs.shape[1], xs.shape[2]
    gram, xty = xs.transpose(1, 2) @ xs / n, torch.einsum("bnd,bn->bd", xs, ys) / n
    m = torch.eye(d, dtype=torch.float64) if precond is None else precond.double()
    grid = torch.logspace(-2, math.log10(4.0), 40, dtype=torch.float64) / scale
    w = torch.zeros(len(grid), *xty.shape, dtype=torch.float64)  # [lr, batch, d]
    for _ in range(steps):
        grad = torch.einsum("bde,kbe->kbd", gram, w) - xty
        w = w - grid[:, None, None] * grad @ m.T
    yq = batch.ys[:, -1].double()
    err = ((torch.einsum("kbd,bd->kb", w, batch.xs[:, -1].double()) - yq) ** 2).mean(1)
    err = torch.nan_to_num(err / yq.pow(2).mean(), nan=math.inf)
    best = int(err.argmin())
    return float(err[best]), float(grid[best])


def ols_error(batch: tasks.RegressionBatch) -> float:
    it = algorithms.iterates("ols", batch.xs.double(), batch.ys.double(), weights=False)
    ys = batch.ys[:, -1].double()
    return float(((it.preds[0, :, -1] - ys) ** 2).mean() / ys.pow(2).mean())


def mc_optimum(task: tasks.RegressionTask, sizes: Sizes) -> Tensor:
    """The one-layer optimum by Monte Carlo: least squares of y_q on x_q hᵀ, h = Xᵀy / n.

    One linear layer with B = 0 predicts ``x_qᵀ A h``, linear in A: the A minimizing the
    sample loss is an ordinary least-squares fit over ``sizes.mc_samples`` sequences.
    """
    b = task.sample(sizes.mc_samples, generator=OPTIMUM_SEED + 1, n_points=N_CONTEXT + 1,
                    dtype=torch.float64)
    xs, ys = b.xs[:, :N_CONTEXT], b.ys[:, :N_CONTEXT]
    h = torch.einsum("bnd,bn->bd", xs, ys) / N_CONTEXT
    phi = (b.xs[:, -1, :, None] * h[:, None, :]).flatten(1)  # [batch, d*d]
    sol = torch.linalg.lstsq(phi, b.ys[:, -1:]).solution
    return sol.reshape(task.n_dims, task.n_dims)


def layer_models(model: models.PQTransformer) -> list[models.PQTransformer]:
    """The first l layers of a linear sparse model, l = 1..L (layer l's exact readout)."""
    pre = probes.preconditioners(model)
    return [models.PQTransformer.from_matrices(A=pre.A_heads[:n], B=pre.B_heads[:n],
                                               kernel=model.cfg.kernel)
            for n in range(1, model.cfg.n_layers + 1)]
