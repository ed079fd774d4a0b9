"""`train`: the trainer behind ``iclprobe train`` (exact resume, torchrun DDP).

The data of step s on rank r come from a generator seeded by (run seed, r, s), so a resumed
run needs no RNG state to draw the same batches, and a single process given the data of
every rank (``data_ranks``) takes the same steps as a DistributedDataParallel run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm.auto import tqdm

from iclprobe.algorithms.prefix import ols_predictions
from iclprobe.models.checkpoint import RUN_CHECKPOINT, load_state_into, write_checkpoint_files
from iclprobe.models.gpt import GPTRegressor
from iclprobe.models.io import atomic_directory, write_text_atomic
from iclprobe.models.lstm import LSTMRegressor  # family wiring: lstm
from iclprobe.models.pq import PQTransformer
from iclprobe.models.regressor import Regressor, check_model
from iclprobe.models.train_config import TrainConfig
from iclprobe.tasks import RegressionBatch, RegressionTask

logger = logging.getLogger(__name__)
METRICS_FILE, TRAINER_FILE, TRAIN_CONFIG_FILE = "metrics.jsonl", "trainer.pt", "train.json"


@dataclasses.dataclass
class TrainResult:
    """What a run logged: one dict per logged step (also in ``metrics.jsonl``)."""

    history: list[dict[str, Any]]

    @property
    def final(self) -> dict[str, Any]:
        """The last logged metrics."""
        return self.history[-1] if self.history else {}


def data_seed(seed: int, rank: int, step: int) -> int:
    """The generator seed of (run seed, rank, step): stable across runs and platforms."""
    digest = hashlib.sha256(f"iclprobe:{seed}:{rank}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def active_size(task: RegressionTask, cfg: TrainConfig, step: int) -> tuple[int, int]:
    """(active dims, points) of step's data: the curriculum, within the task's truncation."""
    return cfg.curriculum(step, task.active_dims or task.n_dims, task.n_points)


def batch_for_step(task: RegressionTask, cfg: TrainConfig, step: int,
                   ranks: tuple[int, ...]) -> RegressionBatch:
    """The training batch of ``step``: the concatenated batches of ``ranks``."""
    data_step = step - step % cfg.resample_every if cfg.resample_every else 0
    dims, points = active_size(task, cfg, step)
    parts = [task.sample(cfg.batch_size, generator=data_seed(cfg.seed, r, data_step),
                         n_points=points, active_dims=dims) for r in ranks]
    if len(parts) == 1:
        return parts[0]
    cov = torch.cat([p.cov for p in parts]) if parts[0].cov.ndim == 3 else parts[0].cov
    return RegressionBatch(xs=torch.cat([p.xs for p in parts]),
                           ys=torch.cat([p.ys for p in parts]),
                           ws=torch.cat([p.ws for p in parts]), cov=cov)


def check_setup(model: Regressor, task: RegressionTask, cfg: TrainConfig) -> None:
    """Refuse a bad combination before any training starts, naming the field."""
    check_model(model)
    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask, got {type(task).__name__}")
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    if model.cfg.n_dims != task.n_dims:
        raise ValueError(f"task.n_dims={task.n_dims} but the model has n_dims={model.cfg.n_dims}")
    # family wiring: lstm -- the LSTM takes the GPT's token layouts, limit and curriculum
    is_seq = isinstance(model, (GPTRegressor, LSTMRegressor))
    if is_seq and task.n_points > model.cfg.n_positions:  # type: ignore[union-attr]
        raise ValueError(f"task.n_points={task.n_points} is more than the model's "
                         f"n_positions={model.cfg.n_positions}")  # type: ignore[union-attr]
    family = type(model).__name__
    if cfg.curriculum_every:
        if not is_seq:
            raise ValueError("TrainConfig.curriculum_every is for GPTRegressor and "
                             f"LSTMRegressor, not {family}")
        if cfg.curriculum_dims[0] > task.n_dims or cfg.curriculum_points[0] > task.n_points:
            raise ValueError(f"TrainConfig.curriculum_dims/points start {cfg.curriculum_dims[0]}/"
                             f"{cfg.curriculum_points[0]} exceeds the task's "
                             f"{task.n_dims}/{task.n_points}")
    for field in ("project_sparse", "zero_b"):
        if getattr(cfg, field) and is_seq:
            raise ValueError(f"TrainConfig.{field} is for PQTransformer, not {family}")
    if cfg.project_sparse and isinstance(model, PQTransformer) and model.cfg.sparse:
        raise ValueError("TrainConfig.project_sparse needs a dense PQ model (PQConfig.sparse="
                         "False); this one is sparse by construction")
    if cfg.optimizer == "lbfgs" and cfg.resample_every != 0:
        raise ValueError("TrainConfig.optimizer='lbfgs' trains on one fixed dataset: set "
                         f"resample_every=0, got {cfg.resample_every}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("TrainConfig.device='cuda' but no CUDA device is available")


def make_optimizer(params: list[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer that ``cfg.optimizer`` names."""
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    return torch.optim.LBFGS(params, lr=cfg.lr, history_size=cfg.history_size,
                             max_iter=cfg.max_iter, line_search_fn="strong_wolfe")


def clip_gradients(params: list[nn.Parameter], cfg: TrainConfig) -> None:
    """Global-norm clipping, or Ahn et al.'s per-matrix clipping."""
    if cfg.clip == "global":
        nn.utils.clip_grad_norm_(params, cfg.clip_norm)
    elif cfg.clip == "per-matrix":
        for p in params:
            if p.grad is None:
                continue
            g = p.grad.view(-1, *p.shape[-2:]) if p.ndim >= 2 else p.grad.view(1, -1)
            norms = g.flatten(1).norm(dim=1).clamp(min=1e-12)
            g.mul_((cfg.clip_norm / norms).clamp(max=1.0).view(-1, *[1] * (g.ndim - 1)))


@torch.no_grad()
def apply_constraints(model: Regressor, cfg: TrainConfig) -> None:
    """PQ constraints: Eq. 8 projection of a dense model, and B = 0."""
    if not isinstance(model, PQTransformer):
        return
    d = model.cfg.n_dims
    for block in model.blocks:
        attn = block.attn
        if cfg.project_sparse:
            attn.P[:, :d, d] = 0.0
            attn.P[:, d, :d] = 0.0
            attn.P[:, d, d] = 1.0
            attn.Q[:, d, :] = 0.0
            attn.Q[:, :, d] = 0.0
        if cfg.zero_b:
            (attn.B if model.cfg.sparse else attn.P[:, :d, :d]).zero_()


def loss_of(preds: Tensor, ys: Tensor, cfg: TrainConfig) -> Tensor:
    """Mean squared error over every prefix, or at the last position only.

    ``preds`` is ``[batch, pos]``, or ``[batch, 1]`` from a ``last_only`` forward.
    """
    if cfg.loss == "last":
        return (preds[:, -1] - ys[:, -1]).pow(2).mean()
    return (preds - ys).pow(2).mean()


def _distributed(cfg: TrainConfig) -> tuple[int, int, bool]:
    """(rank, world size, whether we started the process group) under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, False
    started = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cfg.device == "cuda" else "gloo")
        started = True
    return dist.get_rank(), dist.get_world_size(), started


def save_run_checkpoint(out: Path, model: Regressor, task: RegressionTask, cfg: TrainConfig,
                        optimizer: torch.optim.Optimizer, step: int) -> None:
    """Atomically replace ``out/checkpoint``: model, task, optimizer, step, RNG, config."""
    state = {"step": step, "optimizer": optimizer.state_dict(),
             "schedule": {"kind": cfg.schedule, "lr_factor": cfg.lr_factor(step)},
             "torch_rng": torch.get_rng_state()}
    with atomic_directory(out / RUN_CHECKPOINT) as tmp:
        write_checkpoint_files(model, tmp, task)
        torch.save(state, tmp / TRAINER_FILE)
        (tmp / TRAIN_CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))


def read_train_config(out: str | os.PathLike[str]) -> TrainConfig:
    """The `TrainConfig` stored in a run directory's checkpoint."""
    path = Path(out) / RUN_CHECKPOINT / TRAIN_CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no checkpoint to resume from")
    return TrainConfig.from_dict(json.loads(path.read_text()))


def _restore(out: Path, model: Regressor, cfg: TrainConfig,
             optimizer: torch.optim.Optimizer) -> int:
    """Load the run's checkpoint into ``model`` and ``optimizer``; returns its step."""
    from safetensors.torch import load_file

    ckpt = out / RUN_CHECKPOINT
    saved = read_train_config(out)
    differ = [f for f in saved.to_dict() if f not in ("steps", "log_every", "checkpoint_every")
              and getattr(saved, f) != getattr(cfg, f)]
    if differ:
        raise ValueError(f"cannot resume {out}: TrainConfig fields {differ} differ from the run's")
    load_state_into(model, load_file(str(ckpt / "model.safetensors")), ckpt / "model.safetensors")
    state = torch.load(ckpt / TRAINER_FILE, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    metrics = out / METRICS_FILE
    if metrics.exists():  # drop what was logged after the checkpoint
        keep = [line for line in metrics.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= state["step"]]
        write_text_atomic(metrics, "".join(f"{line}\n" for line in keep))
    return int(state["step"])


def train(
    model: Regressor,
    task: RegressionTask,
    cfg: TrainConfig | None = None,
    out: str | os.PathLike[str] | None = None,
    *,
    resume: bool = False,
    data_ranks: tuple[int, ...] | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train ``model`` in place on ``task``.

    Args:
        model: a `GPTRegressor`, `PQTransformer` or `LSTMRegressor`.
        task: the task to draw training data from (saved with every checkpoint).
        cfg: the recipe (default `TrainConfig()`).
        out: run directory: ``metrics.jsonl`` and the latest ``checkpoint/`` (loadable with
            `models.load`); None keeps nothing on disk.
        resume: continue from ``out/checkpoint`` (bitwise identical to an uninterrupted run
            on CPU).
        data_ranks: draw the data of these ranks (default: this process's rank). A single
            process given every rank of a DDP run takes the same steps.
        progress: show a tqdm bar (rank 0 only).

    Under torchrun (``WORLD_SIZE > 1``) the model is wrapped in DistributedDataParallel
    (gloo on CPU, nccl on CUDA) and only rank 0 writes.
    """
    cfg = cfg if cfg is not None else TrainConfig()
    check_setup(model, task, cfg)
    out_path = Path(out) if out is not None else None
    if resume and out_path is None:
        raise ValueError("resume=True needs the run directory `out`")
    if out_path is not None and not resume and (out_path / RUN_CHECKPOINT).exists():
        raise FileExistsError(f"{out_path} already holds a run: resume it or choose another out")
    rank, world, started_group = _distributed(cfg)
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
                          if cfg.device == "cuda" else "cpu")
    model.to(device).train()
    model.task = task
    apply_constraints(model, cfg)
    # With zero_b on a sparse PQ model, B is held at 0 by leaving it out of the optimizer
    # (zeroing it after each step would feed L-BFGS inconsistent curvature pairs).
    frozen = cfg.zero_b and isinstance(model, PQTransformer) and model.cfg.sparse
    params = [p for name, p in model.named_parameters()
              if p.requires_grad and not (frozen and name.endswith("attn.B"))]
    optimizer = make_optimizer(params, cfg)
    start = _restore(out_path, model, cfg, optimizer) if resume else 0  # type: ignore[arg-type]
    net: nn.Module = model
    if world > 1:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    ranks = data_ranks if data_ranks is not None else (rank,)
    writer = rank == 0 and out_path is not None
    if writer:
        out_path.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
    history: list[dict[str, Any]] = []
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc="train",
               disable=not progress or rank != 0, dynamic_ncols=True)
    t0, last_logged = time.perf_counter(), start
    try:
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * cfg.lr_factor(step)
            batch = batch_for_step(task, cfg, step, ranks).to(device)

            loss = _optimizer_step(net, optimizer, params, batch, cfg)
            apply_constraints(model, cfg)
            done = step + 1
            if done % cfg.log_every == 0 or done == cfg.steps:
                rate = (done - last_logged) / max(time.perf_counter() - t0, 1e-9)
                t0, last_logged = time.perf_counter(), done
                row = _metrics(done, loss.item(), batch, cfg, rate,
                               active_size(task, cfg, step)[0])
                history.append(row)
                bar.set_postfix(loss=f"{row['loss']:.4f}", norm=f"{row['normalized_loss']:.4f}")
                if writer:
                    with open(out_path / METRICS_FILE, "a") as fh:  # type: ignore[operator]
                        fh.write(json.dumps(row) + "\n")
            if writer and ((cfg.checkpoint_every and done % cfg.checkpoint_every == 0)
                           or done == cfg.steps):
                save_run_checkpoint(out_path, model, task, cfg, optimizer, done)  # type: ignore[arg-type]
    finally:
        bar.close()
        if started_group:
            dist.destroy_process_group()
    model.eval()
    return TrainResult(history)


def _optimizer_step(net: nn.Module, optimizer: torch.optim.Optimizer,
                    params: list[nn.Parameter], batch: RegressionBatch, cfg: TrainConfig) -> Tensor:
    """One optimizer step on ``batch``; returns the loss before the step."""

    def closure() -> Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(net(batch.xs, batch.ys, last_only=cfg.loss == "last"), batch.ys, cfg)
        loss.backward()
        clip_gradients(params, cfg)
        return loss

    if cfg.optimizer == "lbfgs":
        return optimizer.step(closure)  # type: ignore[arg-type,return-value]
    loss = closure()
    optimizer.step()
    return loss


def _metrics(step: int, loss: float, batch: RegressionBatch, cfg: TrainConfig,
             rate: float, active: int) -> dict[str, Any]:
    """Loss, Garg's normalized loss (÷ active dims) and OLS's loss on the same batch."""
    ols = loss_of(ols_predictions(batch.xs, batch.ys), batch.ys, cfg).item()
    return {"step": step, "lr": cfg.lr * cfg.lr_factor(step - 1), "loss": loss,
            "normalized_loss": loss / active, "ols_loss": ols,
            "ols_normalized_loss": ols / active, "active_dims": active,
            "n_points": batch.xs.shape[1], "steps_per_s": rate}
