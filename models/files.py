"""The checkpoint format: its files, and writing them (below the families: no model is built).

A checkpoint is a directory holding ``config.json`` (format version, family, config),
``model.safetensors`` and ``task.json`` (the task the model was trained on); a training run
adds ``train.json`` (its recipe). `save` replaces a directory atomically and only one that
iclprobe wrote. `Regressor.save` writes through here; reading a checkpoint builds a model,
so `iclprobe.models.checkpoint` (above the families) does it, with `load_state_into` and
`read_json` from here.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from iclprobe._checks import check_one_line, check_type
from iclprobe._finite import all_finite
from iclprobe.atomic import atomic_directory
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models import registry
from iclprobe.storage import CheckpointError, parse_json
from iclprobe.tasks import RegressionTask

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE, TASK_FILE = "config.json", "model.safetensors", "task.json"
RUN_CHECKPOINT = "checkpoint"  # where `train` keeps its latest checkpoint in a run dir
TRAIN_CONFIG_FILE = "train.json"  # the TrainConfig a checkpoint was trained with


def write_checkpoint_files(model: Any, directory: Path, task: RegressionTask | None) -> None:
    """Write ``config.json``, ``model.safetensors`` and ``task.json`` into ``directory``.

    ``model`` is a model of a registered family (a `Regressor`; not imported here: the base
    class imports this module).
    """
    if task is not None and not isinstance(task, RegressionTask):
        raise InputTypeError(f"task must be a RegressionTask or None, got {type(task).__name__}")
    if task is not None:
        model.check_task(task)  # a d = 2 task beside a d = 3 model would load, then fail
    bad = [k for k, v in model.state_dict().items()
           if v.is_floating_point() and not all_finite(v)]
    if bad:  # `load` refuses such a file: refused here, before it is written
        raise InputError(f"the model's weights {bad[:3]} hold NaN or inf: not saved")
    config = {"format_version": FORMAT_VERSION, "family": registry.family_of(model),
              "config": model.cfg.to_dict()}
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_FILE))
    if task is not None:
        (directory / TASK_FILE).write_text(task.to_json())
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))


def save(model: Any, path: str | os.PathLike[str], task: RegressionTask | None = None,
         overwrite: bool = False) -> Path:
    """Write ``model`` (and ``task``, default ``model.task``) as a checkpoint directory.

    ``path`` must not exist or be empty; ``overwrite=True`` replaces a checkpoint that
    iclprobe wrote there. Anything else (a file, another directory) is refused with
    `OutputExistsError` and left as it was.
    """
    check_type("save", "path", path, (str, os.PathLike), "a directory path (str or os.PathLike)")
    check_one_line("save", "path", path)  # the CLI names a model after its checkpoint
    task = task if task is not None else getattr(model, "task", None)
    path = Path(path)
    with atomic_directory(path, "checkpoint", overwrite) as tmp:
        write_checkpoint_files(model, tmp, task)
    return path


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; a `CheckpointError` naming the file otherwise."""
    if not path.is_file():
        raise CheckpointError(f"{path}: file is missing")
    try:
        data = parse_json(path.read_text())
    except ValueError as err:  # bad JSON, bad UTF-8, nested too deeply
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def load_state_into(model: nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """Copy ``state`` into ``model``, naming the file and tensor on any mismatch.

    Refused: missing or unexpected names, other shapes, integer, bool or complex tensors
    where the model has floating weights (a cast would truncate: int64 zeroes small
    weights), and NaN or inf. Other float dtypes are cast to the model's: silently where
    the cast is exact (float16 and bfloat16 into float32 always are), with a logged warning
    naming what changed where it rounds (float64 into float32).
    """
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: tensors do not match the model (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    cast, rounded = {}, []
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(expected[name].shape)}"
            )
        cast[name] = _cast_exactly(tensor, expected[name].dtype, name, source)
        if not torch.equal(cast[name].to(tensor.dtype), tensor):
            change = (cast[name].double() - tensor.double()).abs().max().item()
            rounded.append(f"{name!r} ({tensor.dtype}, by up to {change:.2g})")
    if rounded:
        logger.warning("%s: %d tensor(s) rounded to the model's %s: %s", source, len(rounded),
                       next(iter(expected.values())).dtype, ", ".join(rounded[:5]))
    model.load_state_dict(cast)


def _cast_exactly(tensor: torch.Tensor, dtype: torch.dtype, name: str, source: Path
                  ) -> torch.Tensor:
    """``tensor`` in ``dtype``, refusing truncating casts and non-finite values."""
    if tensor.dtype == dtype and not dtype.is_floating_point:
        return tensor
    if not (dtype.is_floating_point and tensor.dtype.is_floating_point):
        raise CheckpointError(f"{source}: tensor {name!r} is stored as {tensor.dtype}, but the "
                              f"model's is {dtype}: refusing a cast that would truncate it")
    if not all_finite(tensor):
        bad = int((~torch.isfinite(tensor)).sum())
        raise CheckpointError(f"{source}: tensor {name!r} holds {bad} NaN or inf value(s)")
    out = tensor.to(dtype)
    if not all_finite(out):
        raise CheckpointError(f"{source}: tensor {name!r} ({tensor.dtype}) has values beyond "
                              f"the range of the model's {dtype}")
    return out



def stored_parameters(weights: Path) -> int:
    """The number of values in a safetensors file, from its header alone (nothing is read)."""
    try:
        with safe_open(str(weights), framework="pt") as f:
            return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{weights}: truncated or corrupt weights ({err})") from None
