"""Checkpoints: save/load of iclprobe models, and import of Garg/Fu run directories.

A checkpoint is a directory holding ``config.json`` (format version, family, config),
``model.safetensors`` (empty, or absent, for a model without weights: an oracle) and
``task.json`` (the task the model was trained on). Directories
are replaced atomically. Nothing here unpickles arbitrary objects: foreign ``state.pt``
files go through ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from iclprobe._checks import check_fits, sizes
from iclprobe._shipped import PRETRAINED_DIR, shipped_models
from iclprobe.models import registry
from iclprobe.storage import CheckpointError, atomic_directory, parse_json
from iclprobe.tasks import RegressionTask

if TYPE_CHECKING:
    from iclprobe.models.regressor import Regressor

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE, TASK_FILE = "config.json", "model.safetensors", "task.json"
RUN_CHECKPOINT = "checkpoint"  # where `models.train` keeps its latest checkpoint in a run dir
TRAIN_CONFIG_FILE = "train.json"  # the TrainConfig a checkpoint was trained with


def family_of(model: Regressor) -> str:
    """The registry name under which ``model``'s family is saved."""
    return registry.family_of(model)


def write_checkpoint_files(model: Regressor, directory: Path, task: RegressionTask | None) -> None:
    """Write ``config.json``, ``model.safetensors`` and ``task.json`` into ``directory``."""
    if task is not None and not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask or None, got {type(task).__name__}")
    config = {"format_version": FORMAT_VERSION, "family": family_of(model),
              "config": model.cfg.to_dict()}
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_FILE))
    if task is not None:
        (directory / TASK_FILE).write_text(task.to_json())
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))


def save(model: Regressor, path: str | os.PathLike[str], task: RegressionTask | None = None,
         overwrite: bool = False) -> Path:
    """Write ``model`` (and ``task``, default ``model.task``) as a checkpoint directory.

    ``path`` must not exist or be empty; ``overwrite=True`` replaces a checkpoint that
    iclprobe wrote there. Anything else (a file, another directory) is refused with
    `OutputExistsError` and left as it was.
    """
    task = task if task is not None else getattr(model, "task", None)
    path = Path(path)
    with atomic_directory(path, "checkpoint", overwrite) as tmp:
        write_checkpoint_files(model, tmp, task)
    return path


def _read_json(path: Path) -> dict[str, Any]:
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
    if not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise CheckpointError(f"{source}: tensor {name!r} holds {bad} NaN or inf value(s)")
    out = tensor.to(dtype)
    if not bool(torch.isfinite(out).all()):
        raise CheckpointError(f"{source}: tensor {name!r} ({tensor.dtype}) has values beyond "
                              f"the range of the model's {dtype}")
    return out


def check_weights_match(cfg: Any, weights: Path) -> None:
    """Before building: refuse a config describing far more weights than the file holds.

    The file's tensor shapes come from its header alone. A config within a small margin of
    the file (2x + 2^20 weights) is cheap to build, and `load_state_into` then names each
    mismatching tensor; beyond it (``n_layers = 10**6`` in an edited config.json) building
    alone could exhaust memory.
    """
    try:
        with safe_open(str(weights), framework="pt") as f:
            stored = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{weights}: truncated or corrupt weights ({err})") from None
    refuse_oversized(cfg, stored, weights.parent / CONFIG_FILE, weights.name, sizes(cfg))


def refuse_oversized(cfg: Any, stored: int, config_file: Path, weights_name: str,
                     described: str) -> None:
    """Refuse a config of far more parameters than the ``stored`` ones (see above)."""
    if cfg.n_parameters() > 2 * stored + 2**20:
        raise CheckpointError(
            f"{config_file}: the config describes a model of {cfg.n_parameters():,} "
            f"parameters ({described}), but {weights_name} holds {stored:,}"
        )


def resolve(path_or_name: str | os.PathLike[str]) -> Path:
    """A checkpoint directory from a path or the name of a shipped model."""
    path = Path(path_or_name)
    if path.exists():
        return path
    shipped = PRETRAINED_DIR / str(path_or_name)
    if isinstance(path_or_name, str) and "/" not in path_or_name and shipped.is_dir():
        return shipped
    names = [name for name, _ in shipped_models()]
    raise FileNotFoundError(
        f"checkpoint {str(path_or_name)!r} not found: no such directory"
        + (f", and no shipped model of that name (shipped: {names})" if names else "")
    )


def load(path_or_name: str | os.PathLike[str], device: str | torch.device = "cpu", *,
         ahn_index: int | None = None) -> Regressor:
    """Load an iclprobe checkpoint or training run, a Garg/Fu run, or a shipped model by name.

    A ``.pt``/``.pth`` file is read as Ahn et al.'s ``allparam`` or training history (see
    `load_ahn`, which also takes their softmax); ``ahn_index`` picks the history entry
    (default: the last).

    The model comes back in eval mode with ``model.task`` set (None if no task was stored).
    """
    path = resolve(path_or_name)
    if path.is_file() and path.suffix in (".pt", ".pth"):
        from iclprobe.models.ahn import load_ahn

        return load_ahn(path, index=-1 if ahn_index is None else ahn_index).to(device).eval()
    if ahn_index is not None:
        raise ValueError(f"ahn_index applies to Ahn et al.'s .pt/.pth files, not to {path}")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a checkpoint is a directory (or an Ahn et al. .pt file)")
    if not (path / CONFIG_FILE).exists() and (path / RUN_CHECKPOINT / CONFIG_FILE).exists():
        path = path / RUN_CHECKPOINT  # an `iclprobe train` run directory
    if not (path / CONFIG_FILE).exists() and (path / "state.pt").exists():
        from iclprobe.models.garg import load_garg_run

        model: Regressor = load_garg_run(path)
    else:
        model = _load_native(path)
    return model.to(device).eval()


def _read_weights(cfg: Any, weights: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``weights``, checked against ``cfg``; none for a weightless config.

    A model without weights (``cfg.n_parameters() == 0``: an oracle, rebuilt from its
    seed) may have no weights file, or an empty one.
    """
    if not weights.is_file():
        if cfg.n_parameters() == 0:
            return {}
        raise CheckpointError(f"{weights}: file is missing")
    check_weights_match(cfg, weights)
    check_fits(cfg, f"loading {weights.parent}")
    try:
        return load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{weights}: truncated or corrupt weights ({err})") from None


def _load_native(path: Path) -> Regressor:
    meta = _read_json(path / CONFIG_FILE)
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path / CONFIG_FILE}: unknown format_version {version!r} (supported: {FORMAT_VERSION})"
        )
    family = meta.get("family")
    if family not in registry.FAMILIES:
        from iclprobe.plugins import load_plugins

        load_plugins()  # an installed package may register it (docs/architecture.md)
    if family not in registry.FAMILIES:
        raise CheckpointError(
            f"{path / CONFIG_FILE}: unknown family {family!r} (known: "
            f"{sorted(registry.FAMILIES)})"
        )
    config_cls = registry.FAMILIES[family].config
    model_cls = registry.FAMILIES[family].model_class()
    fields = meta.get("config", {})
    if not isinstance(fields, dict):
        raise CheckpointError(f"{path / CONFIG_FILE}: 'config' must be a JSON object of "
                              f"{config_cls.__name__}'s fields, got a {type(fields).__name__}")
    try:
        cfg = config_cls.from_dict(fields)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path / CONFIG_FILE}: invalid config ({err})") from None
    weights = path / WEIGHTS_FILE
    state = _read_weights(cfg, weights)
    model = model_cls(cfg)
    load_state_into(model, state, weights)
    recipe = path / TRAIN_CONFIG_FILE  # when known
    model.train_config = _read_json(recipe) if recipe.is_file() else None
    task_path = path / TASK_FILE
    if task_path.exists():
        try:
            model.task = RegressionTask.from_dict(_read_json(task_path))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{task_path}: invalid task ({err})") from None
    return model
