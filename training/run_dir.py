"""The run directory of `train`: one trainer at a time, its checkpoint and its log.

A run directory holds ``metrics.jsonl``, the latest ``checkpoint/`` and two small files of
iclprobe's own: the marker ``.iclprobe`` and the lock ``.iclprobe.lock``. The trainer holds
an exclusive ``flock`` on the lock for as long as it runs; the kernel releases it when the
process ends, however it ends, so a killed trainer never leaves the directory stuck.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import IO, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from iclprobe._checks import is_int
from iclprobe.atomic import atomic_directory, remove_abandoned, remove_abandoned_files
from iclprobe.errors import InputError
from iclprobe.models.base import Regressor
from iclprobe.models.files import (
    RUN_CHECKPOINT,
    TRAIN_CONFIG_FILE,
    WEIGHTS_FILE,
    load_state_into,
    write_checkpoint_files,
)
from iclprobe.storage import (
    MARKER,
    CheckpointError,
    OutputExistsError,
    check_output,
    check_target,
    foreign_entries,
    parse_json,
    read_marker,
    torch_load_tensors,
    write_marker,
    write_text_atomic,
)
from iclprobe.tasks import RegressionTask
from iclprobe.training.config import TrainConfig

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)
METRICS_FILE, TRAINER_FILE = "metrics.jsonl", "trainer.pt"
LOCK_FILE = ".iclprobe.lock"
RUN_KIND = "run"
RUN_FILES = (METRICS_FILE, RUN_CHECKPOINT, LOCK_FILE)


class RunBusyError(OSError):
    """Another trainer holds the run directory."""


def open_run(out: Path, resume: bool, overwrite: bool = False) -> IO[str]:
    """Take ``out`` for one trainer; returns the open lock file (close it to release).

    A fresh run needs ``out`` absent, empty, or a run directory of iclprobe's without a
    checkpoint (a run killed before its first checkpoint: its log is started afresh);
    ``overwrite`` replaces a finished or interrupted run. ``resume`` needs a checkpoint.
    """
    checkpoint = out / RUN_CHECKPOINT
    if resume:
        read_train_config(out)  # a readable checkpoint, or a clear error
    else:
        if read_marker(out) is None and (checkpoint / TRAIN_CONFIG_FILE).is_file():
            raise OutputExistsError(f"{out} already holds a run: resume it (--resume) or "
                                    "choose another out")  # written before runs were marked
        check_target(out, RUN_KIND, ignore=(LOCK_FILE,))
    out.mkdir(parents=True, exist_ok=True)
    lock = _lock(out)
    try:
        remove_abandoned(checkpoint)  # what a trainer killed mid-checkpoint left
        remove_abandoned_files(out, (METRICS_FILE, MARKER))  # or mid-log, mid-marker
        if resume:
            if read_marker(checkpoint) is None:  # written before checkpoints were marked
                write_marker(checkpoint, "checkpoint")
        else:
            _start_fresh(out, overwrite)
        if read_marker(out) is None:
            write_marker(out, RUN_KIND, list(RUN_FILES))
    except BaseException:
        lock.close()
        raise
    return lock


def _lock(out: Path) -> IO[str]:
    fh = open(out / LOCK_FILE, "a")  # noqa: SIM115 - held open for the whole run
    if fcntl is not None:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise RunBusyError(f"{out} is in use by another trainer (it holds "
                               f"{out / LOCK_FILE}): wait for it or choose another "
                               "--out") from None
    return fh


def _start_fresh(out: Path, overwrite: bool) -> None:
    """Under the lock: refuse or replace a previous run; restart a stale log."""
    checkpoint, metrics = out / RUN_CHECKPOINT, out / METRICS_FILE
    if checkpoint.exists():
        if not overwrite:
            raise OutputExistsError(f"{out} already holds a run: resume it (--resume), "
                                    "replace it (--overwrite) or choose another out")
        # the run's probes (RUN/probes) stay: only the checkpoint is replaced
        foreign = foreign_entries(out, read_marker(out) or {}, RUN_FILES, nested=True)
        if foreign:
            raise OutputExistsError(f"{out} also holds files that iclprobe did not write "
                                    f"({', '.join(foreign[:5])}): cannot replace the run")
        check_output(checkpoint, "checkpoint", overwrite=True)
        shutil.rmtree(checkpoint)
    if metrics.exists() and metrics.stat().st_size:
        logger.info("%s: no checkpoint, so the log of an interrupted run is started afresh",
                    metrics)
    if metrics.exists():
        write_text_atomic(metrics, "")


def save_run_checkpoint(out: Path, model: Regressor, task: RegressionTask, cfg: TrainConfig,
                        optimizer: torch.optim.Optimizer, step: int) -> None:
    """Atomically replace ``out/checkpoint``: model, task, optimizer, step, RNG, config."""
    state = {"step": step, "optimizer": optimizer.state_dict(),
             "schedule": {"kind": cfg.schedule, "lr_factor": cfg.lr_factor(step)},
             "torch_rng": torch.get_rng_state()}
    with atomic_directory(out / RUN_CHECKPOINT, "checkpoint", overwrite=True) as tmp:
        write_checkpoint_files(model, tmp, task)
        torch.save(state, tmp / TRAINER_FILE)
        (tmp / TRAIN_CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))


def read_train_config(out: str | os.PathLike[str]) -> TrainConfig:
    """The `TrainConfig` stored in a run directory's checkpoint."""
    path = Path(out) / RUN_CHECKPOINT / TRAIN_CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no checkpoint to resume from")
    try:
        return TrainConfig.from_dict(parse_json(path.read_text()))
    except (ValueError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path}: not a valid training config ({err})") from None


def restore(out: Path, model: Regressor, cfg: TrainConfig,
            optimizer: torch.optim.Optimizer) -> int:
    """Load the run's checkpoint into ``model`` and ``optimizer``; returns its step.

    The writer then trims the log to that step (`trim_metrics`).
    """
    ckpt = out / RUN_CHECKPOINT
    saved = read_train_config(out)
    differ = [f for f in saved.to_dict() if f not in ("steps", "log_every", "checkpoint_every")
              and getattr(saved, f) != getattr(cfg, f)]
    if differ:
        values = "; ".join(f"{f}: run {getattr(saved, f)!r}, given {getattr(cfg, f)!r}"
                           for f in differ)
        raise InputError(f"cannot resume {out}: TrainConfig fields differ from the run's "
                         f"({values})")
    try:
        weights = load_file(str(ckpt / WEIGHTS_FILE))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{ckpt / WEIGHTS_FILE}: truncated or corrupt weights "
                              f"({err})") from None
    load_state_into(model, weights, ckpt / WEIGHTS_FILE)
    state = _trainer_state(ckpt / TRAINER_FILE)
    try:
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise CheckpointError(f"{ckpt / TRAINER_FILE}: the optimizer or RNG state does not "
                              f"fit this run ({err})") from None
    return int(state["step"])


def _trainer_state(path: Path) -> dict[str, Any]:
    state = torch_load_tensors(path)
    missing = [k for k in ("step", "optimizer", "torch_rng")
               if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a trainer state (missing {missing})")
    step = state["step"]
    if not is_int(step) or step < 0:
        raise CheckpointError(f"{path}: step must be an integer >= 0, got {step!r}")
    return state


def trim_metrics(path: Path, step: int) -> None:
    """Keep the log's rows up to ``step``; torn (unreadable) lines are dropped, with a warning."""
    if not path.exists():
        return
    keep, torn = [], []
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row_step = parse_json(line)["step"]
            if not isinstance(row_step, int):
                raise TypeError(row_step)
        except (ValueError, KeyError, TypeError):
            torn.append(number)
            continue
        if row_step <= step:
            keep.append(line)
    if torn:
        logger.warning("%s: dropping %d torn line(s) (line %s of %d); resuming from step %d",
                       path, len(torn), ", ".join(map(str, torn[:5])), len(lines), step)
    write_text_atomic(path, "".join(f"{line}\n" for line in keep))
