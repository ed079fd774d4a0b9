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

from iclprobe._checks import ConfigError, check_bool, check_one_line, check_type
from iclprobe._finite import all_finite
from iclprobe.algorithms.prefix import ols_predictions
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models.adapter import HookedAdapter
from iclprobe.models.base import Regressor, check_model, input_dtype
from iclprobe.models.files import RUN_CHECKPOINT
from iclprobe.tasks import RegressionBatch, RegressionTask
from iclprobe.training.config import TrainConfig, check_curriculum
from iclprobe.training.run_dir import (
    METRICS_FILE,
    RunBusyError,
    open_run,
    read_train_config,
    restore,
    save_run_checkpoint,
    trim_metrics,
)

logger = logging.getLogger(__name__)
#: TrainConfig fields that only some families accept (see `Regressor.train_options`).
FAMILY_TRAIN_OPTIONS = tuple(f.name for f in dataclasses.fields(TrainConfig)
                             if f.metadata.get("family_only"))
__all__ = ["RunBusyError", "TrainResult", "TrainingDiverged", "TrainingInterrupted",
           "read_train_config", "train"]


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
    if isinstance(model, HookedAdapter):  # it reads a model trained elsewhere
        raise InputTypeError("train: model is a HookedAdapter, which reads a model trained "
                             "elsewhere and is not an iclprobe model family: train its module "
                             "there")
    if not isinstance(task, RegressionTask):
        raise InputTypeError(f"task must be a RegressionTask, got {type(task).__name__}")
    if not isinstance(cfg, TrainConfig):
        raise InputTypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    dtype = input_dtype(model)
    if dtype != torch.float32:  # the task's batches are float32, as are the checkpoints
        raise InputError(f"train: the model's weights are {dtype}; train takes a float32 "
                         f"model (its data and checkpoints are float32): model.float() "
                         f"converts it, and the trained model can be converted back")
    model.check_task(task)
    family = type(model).__name__
    if cfg.curriculum_every:
        if not model.curriculum:
            raise ConfigError("TrainConfig", "curriculum_every", "TrainConfig.curriculum_every "
                              f"does not apply to {family}")
        check_curriculum(cfg, task)
    defaults = TrainConfig()
    for field in FAMILY_TRAIN_OPTIONS:
        if getattr(cfg, field) != getattr(defaults, field) and \
                field not in model.train_options():
            raise ConfigError("TrainConfig", field, f"TrainConfig.{field} does not apply to "
                              f"{family}")
    model.check_train_config(cfg)
    if cfg.optimizer == "lbfgs" and cfg.resample_every != 0:
        raise ConfigError("TrainConfig", "resample_every", "TrainConfig.optimizer='lbfgs' "
                          "trains on one fixed dataset: set "
                          f"resample_every=0, got {cfg.resample_every}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("TrainConfig", "device", "TrainConfig.device='cuda' but no CUDA "
                          "device is available")


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


class TrainingDiverged(RuntimeError):
    """The loss or the weights became non-finite; the run's last checkpoint was kept."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during `train`: ``step`` steps were done, the last checkpoint is kept."""

    def __init__(self, step: int, checkpoint_step: int | None):
        super().__init__(f"interrupted after step {step}")
        self.step, self.checkpoint_step = step, checkpoint_step


def train(
    model: Regressor,
    task: RegressionTask,
    cfg: TrainConfig | None = None,
    out: str | os.PathLike[str] | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    data_ranks: tuple[int, ...] | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train ``model`` in place on ``task``.

    Args:
        model: a model of any registered family.
        task: the task to draw training data from (saved with every checkpoint).
        cfg: the recipe (default `TrainConfig()`).
        out: run directory: ``metrics.jsonl`` and the latest ``checkpoint/`` (loadable with
            `models.load`); None keeps nothing on disk. One trainer at a time: a second
            one on the same directory fails at once (`RunBusyError`).
        resume: continue from ``out/checkpoint`` (bitwise identical to an uninterrupted run
            on CPU). Resuming a run that has done ``cfg.steps`` steps does nothing.
        overwrite: start afresh in a run directory that already holds a run of iclprobe's.
        data_ranks: draw the data of these ranks (default: this process's rank). A single
            process given every rank of a DDP run takes the same steps.
        progress: show a tqdm bar (rank 0 only).

    Under torchrun (``WORLD_SIZE > 1``) the model is wrapped in DistributedDataParallel
    (gloo on CPU, nccl on CUDA) and only rank 0 writes.

    Raises:
        TrainingDiverged: the loss (or, at a checkpoint, a weight) became NaN or infinite;
            the message names the step, and the last finite checkpoint is left untouched.
        TrainingInterrupted: Ctrl-C (a `KeyboardInterrupt`); the last checkpoint is kept.
        ValueError: a bad setup, or ``resume`` with ``cfg.steps`` below the steps done.
        OutputExistsError: ``out`` is not a directory a fresh run may use.
    """
    cfg = cfg if cfg is not None else TrainConfig()
    check_setup(model, task, cfg)
    for name, flag in (("resume", resume), ("overwrite", overwrite), ("progress", progress)):
        check_bool("train", name, flag)
    out_path = _run_path(out, resume)
    if resume and out_path is None:
        raise InputError("resume=True needs the run directory `out`")
    if resume and overwrite:
        raise InputError("overwrite=True starts a fresh run: it cannot be combined with resume")
    rank, world, started_group = _distributed(cfg)
    lock = None
    try:
        if rank == 0 and out_path is not None:
            lock = open_run(out_path, resume, overwrite)
        return _train(model, task, cfg, out_path, resume, world, data_ranks or (rank,),
                      progress and rank == 0, writer=lock is not None)
    finally:
        if lock is not None:
            lock.close()
        if started_group:
            dist.destroy_process_group()


def _run_path(out: Any, resume: bool) -> Path | None:
    """``train``'s ``out`` as a Path; a new run's in one line (the CLI names models after it)."""
    if out is None:
        return None
    check_type("train", "out", out, (str, os.PathLike), "a directory path (or None)")
    return Path(out if resume else check_one_line("train", "out", out))


def _train(model: Regressor, task: RegressionTask, cfg: TrainConfig, out: Path | None,
           resume: bool, world: int, ranks: tuple[int, ...], progress: bool,
           writer: bool) -> TrainResult:
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
                          if cfg.device == "cuda" else "cpu")
    model.to(device).train()
    model.task = task
    model.apply_constraints(cfg)
    # The family says what the optimizer updates (a PQ model with zero_b leaves B out, so
    # L-BFGS sees consistent curvature pairs) and projects its weights after each step.
    params = model.trainable_parameters(cfg)
    optimizer = make_optimizer(params, cfg)
    start = restore(out, model, cfg, optimizer) if resume else 0  # type: ignore[arg-type]
    if resume and writer:
        trim_metrics(out / METRICS_FILE, start)  # type: ignore[operator]
    if start > cfg.steps:
        raise InputError(f"cannot resume {out}: the run has done {start} steps, more than "
                         f"steps={cfg.steps}")
    if resume and start == cfg.steps:
        logger.info("%s: the run has done all %d steps; nothing to do", out, start)
    net: nn.Module = model
    if world > 1:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    loop = _Loop(model, net, task, cfg, optimizer, params, ranks, out if writer else None,
                 checkpoint_step=start if resume else None)
    history = loop.run(start, progress)
    model.eval()
    return TrainResult(history)


@dataclasses.dataclass
class _Loop:
    """The optimizer steps of one `train` call, with their logging and checkpoints."""

    model: Regressor
    net: nn.Module
    task: RegressionTask
    cfg: TrainConfig
    optimizer: torch.optim.Optimizer
    params: list[nn.Parameter]
    ranks: tuple[int, ...]
    out: Path | None  # None: this process writes nothing
    checkpoint_step: int | None  # the step of the last checkpoint on disk

    def run(self, start: int, progress: bool) -> list[dict[str, Any]]:
        cfg, history = self.cfg, []
        bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc="train",
                   disable=not progress, dynamic_ncols=True)
        t0, last_logged, done = time.perf_counter(), start, start
        try:
            for step in bar:
                for group in self.optimizer.param_groups:
                    group["lr"] = cfg.lr * cfg.lr_factor(step)
                batch = batch_for_step(self.task, cfg, step, self.ranks).to(
                    next(self.model.parameters()).device)
                loss = _optimizer_step(self.net, self.optimizer, self.params, batch, cfg)
                if not bool(torch.isfinite(loss)):
                    self._diverged(step + 1, f"the loss is {loss.item()}")
                self.model.apply_constraints(cfg)
                done = step + 1
                if done % cfg.log_every == 0 or done == cfg.steps:
                    rate = (done - last_logged) / max(time.perf_counter() - t0, 1e-9)
                    t0, last_logged = time.perf_counter(), done
                    history.append(self._log(done, loss.item(), batch, step, rate, bar))
                if (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == cfg.steps:
                    self._checkpoint(done)
        except KeyboardInterrupt:
            raise TrainingInterrupted(done, self.checkpoint_step) from None
        finally:
            bar.close()
        return history

    def _log(self, done: int, loss: float, batch: RegressionBatch, step: int, rate: float,
             bar: Any) -> dict[str, Any]:
        row = _metrics(done, loss, batch, self.cfg, rate, active_size(self.task, self.cfg, step)[0])
        bar.set_postfix(loss=f"{row['loss']:.4f}", norm=f"{row['normalized_loss']:.4f}")
        if self.out is not None:
            with open(self.out / METRICS_FILE, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        return row

    def _checkpoint(self, done: int) -> None:
        if self.out is None:
            return
        bad = [name for name, p in self.model.named_parameters() if not all_finite(p)]
        if bad:
            self._diverged(done, f"parameters {bad[:3]} are not finite")
        save_run_checkpoint(self.out, self.model, self.task, self.cfg, self.optimizer, done)
        self.checkpoint_step = done

    def _diverged(self, step: int, what: str) -> None:
        kept = ""
        if self.out is not None:
            kept = (f"; the last checkpoint (step {self.checkpoint_step}) in "
                    f"{self.out / RUN_CHECKPOINT} is kept" if self.checkpoint_step is not None
                    else "; no checkpoint was written")
        raise TrainingDiverged(f"training diverged at step {step}: {what} (lr "
                               f"{self.cfg.lr * self.cfg.lr_factor(step - 1):g}); stopped{kept}")


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
