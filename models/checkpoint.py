"""Loading checkpoints: iclprobe's own, training runs, Garg/Fu run directories, Ahn's files.

This module sits above the families it builds (and above the importers `garg` and `ahn`);
the format and its writer are `iclprobe.models.files`, below them. A checkpoint's config is
checked against its weight file and the memory before the model is built
(`iclprobe.models.size`); a model without weights (an oracle, rebuilt from its seed) may
have an empty ``model.safetensors``, or none. Nothing here unpickles arbitrary objects:
foreign ``state.pt``
files go through ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from iclprobe._shipped import PRETRAINED_DIR, shipped_models
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models import registry
from iclprobe.models.ahn import load_ahn
from iclprobe.models.files import (
    CONFIG_FILE,
    FORMAT_VERSION,
    RUN_CHECKPOINT,
    TASK_FILE,
    TRAIN_CONFIG_FILE,
    WEIGHTS_FILE,
    load_state_into,
    read_json,
    stored_parameters,
)
from iclprobe.models.garg import load_garg_run
from iclprobe.models.size import check_loadable, check_model_fits, parameter_bound
from iclprobe.plugins import load_plugins
from iclprobe.storage import CheckpointError
from iclprobe.tasks import RegressionTask

if TYPE_CHECKING:
    from iclprobe.models.base import Regressor

logger = logging.getLogger(__name__)


def resolve(path_or_name: str | os.PathLike[str]) -> Path:
    """A checkpoint directory from a path or the name of a shipped model."""
    if not os.fspath(path_or_name).strip():  # Path("") is the current directory
        names = [name for name, _ in shipped_models()]
        raise FileNotFoundError(f"checkpoint must be a checkpoint directory or a shipped "
                                f"model's name ({names}), got {str(path_or_name)!r}")
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

    The model comes back in eval mode with ``model.task`` set (None if no task was stored)
    and ``model.checkpoint``, the absolute path it was loaded from (where `align` looks
    for the probes ``iclprobe probe`` saved for it).
    """
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise InputTypeError(f"load: path_or_name must be a path or a shipped model's name "
                             f"(`iclprobe models`), got {type(path_or_name).__name__} "
                             f"{path_or_name!r}")
    device = check_device("load", device)
    source = resolve(path_or_name)
    model = _load(source, ahn_index).to(device).eval()
    model.checkpoint = Path(os.path.abspath(source))
    return model


def check_device(who: str, device: Any) -> torch.device:
    """``device`` as a torch.device that can hold a model's weights, else an `InputError`."""
    if not isinstance(device, (str, torch.device)):
        raise InputTypeError(f"{who}: device must be a string or a torch.device, got "
                             f"{type(device).__name__} {device!r}")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise InputError(f"{who}: device {device!r} is not a torch device (such as 'cpu', "
                         "'cuda', 'cuda:1')") from None
    if parsed.type == "meta":
        raise InputError(f"{who}: device 'meta' holds no weights (shapes without values); "
                         "load onto 'cpu' or a GPU")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"{who}: device {device!r}: no CUDA device is available to torch "
                         f"{torch.__version__}; use 'cpu'")
    return parsed


def _load(path: Path, ahn_index: int | None) -> Regressor:
    if path.is_file() and path.suffix in (".pt", ".pth"):
        return load_ahn(path, index=-1 if ahn_index is None else ahn_index)
    if ahn_index is not None:
        raise InputError(f"ahn_index applies to Ahn et al.'s .pt/.pth files, not to {path}")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a checkpoint is a directory (or an Ahn et al. .pt file)")
    if not (path / CONFIG_FILE).exists() and (path / RUN_CHECKPOINT / CONFIG_FILE).exists():
        path = path / RUN_CHECKPOINT  # an `iclprobe train` run directory
    if not (path / CONFIG_FILE).exists() and (path / "state.pt").exists():
        return load_garg_run(path)
    if not (path / CONFIG_FILE).exists() and (path / "config.yaml").exists():
        raise CheckpointError(f"{path / 'state.pt'}: file is missing (a Garg et al. run holds "
                              f"its weights there, beside config.yaml)")
    if not (path / CONFIG_FILE).exists():
        raise CheckpointError(f"{path} is not a checkpoint: it holds no {CONFIG_FILE} (an "
                              f"iclprobe checkpoint or `iclprobe train` run), no config.yaml "
                              "(a Garg et al. / Fu et al. run), and it is no Ahn et al. .pt file")
    return _load_native(path)


def _read_weights(model_cls: Any, cfg: Any, path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, its config checked against them and the memory first.

    A model without weights (none on the meta device: an oracle, rebuilt from its seed) may
    have no weights file, or an empty one.
    """
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        if parameter_bound(model_cls, cfg) == 0:  # what it holds is rebuilt: fits?
            check_model_fits(model_cls, cfg, f"loading {path}", copies=1, held=True)
            return {}
        raise CheckpointError(f"{weights}: file is missing")
    check_loadable(model_cls, cfg, stored_parameters(weights), path / CONFIG_FILE, WEIGHTS_FILE)
    try:
        return load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{weights}: truncated or corrupt weights ({err})") from None


def _load_native(path: Path) -> Regressor:
    meta = read_json(path / CONFIG_FILE)
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path / CONFIG_FILE}: unknown format_version {version!r} (supported: {FORMAT_VERSION})"
        )
    family = meta.get("family")
    if family not in registry.FAMILIES:
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
    state = _read_weights(model_cls, cfg, path)
    model = model_cls(cfg)
    load_state_into(model, state, weights)
    recipe = path / TRAIN_CONFIG_FILE  # when known
    model.train_config = read_json(recipe) if recipe.is_file() else None
    task_path = path / TASK_FILE
    if task_path.exists():
        try:
            model.task = RegressionTask.from_dict(read_json(task_path))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{task_path}: invalid task ({err})") from None
        try:  # as `save` checks it: a task the model cannot take would fail only later
            model.check_task(model.task)
        except InputError as err:
            raise CheckpointError(f"{task_path}: the task does not fit the model of "
                                  f"{path / CONFIG_FILE} ({err})") from None
    return model
