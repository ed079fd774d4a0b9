"""Import of Garg et al. / Fu et al. run directories (``config.yaml`` + ``state.pt``).

Their model is ``_read_in`` (Linear) → ``_backbone`` (Hugging Face ``GPT2Model``, fed
``inputs_embeds``) → ``_read_out`` (Linear), softmax attention on the interleaved layout.
GPT-2's ``Conv1D`` weights are stored ``[in, out]``; ours are split per head.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch
import yaml
from einops import rearrange
from torch import Tensor

from iclprobe.models.checkpoint import CheckpointError, load_state_into
from iclprobe.models.config import GPTConfig
from iclprobe.models.gpt import GPTRegressor
from iclprobe.models.io import torch_load_failure
from iclprobe.tasks import RegressionTask

# HF buffers and the unused token embedding, present in some or all of their files.
_IGNORED = re.compile(r"^_backbone\.(wte\.weight|h\.\d+\.attn\.(bias|masked_bias))$")


def _read_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.yaml"
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path}: file is missing")
    try:
        cfg = yaml.safe_load(cfg_path.read_text())
    except yaml.YAMLError as err:
        raise CheckpointError(f"{cfg_path}: invalid YAML ({err})") from None
    model = cfg.get("model") if isinstance(cfg, dict) else None
    if not isinstance(model, dict):
        raise CheckpointError(f"{cfg_path}: no 'model:' section")
    if model.get("family", "gpt2") != "gpt2":
        raise CheckpointError(f"{cfg_path}: model family {model.get('family')!r} is not gpt2")
    missing = [k for k in ("n_dims", "n_positions", "n_embd", "n_layer", "n_head") if k not in model]
    if missing:
        raise CheckpointError(f"{cfg_path}: model section lacks {missing}")
    return cfg


def _task_from(cfg: dict[str, Any], n_dims: int, n_positions: int) -> RegressionTask:
    training = cfg.get("training") or {}
    points = ((training.get("curriculum") or {}).get("points") or {}).get("end", n_positions)
    return RegressionTask(n_dims=n_dims, n_points=int(points))


def convert_garg_state(state: dict[str, Tensor], cfg: GPTConfig) -> dict[str, Tensor]:
    """Map a Garg ``model_state_dict`` onto `GPTRegressor`'s parameter names."""
    h = cfg.n_heads
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if _IGNORED.match(key):
            continue
        if key.startswith("_read_in.") or key.startswith("_read_out."):
            out[key[1:].replace("_read_", "read_")] = value
            continue
        if key == "_backbone.wpe.weight":
            out["W_pos"] = value
            continue
        if key.startswith("_backbone.ln_f."):
            out["ln_final." + {"weight": "w", "bias": "b"}[key.rsplit(".", 1)[1]]] = value
            continue
        m = re.match(r"^_backbone\.h\.(\d+)\.(.+)$", key)
        if not m:
            out[key] = value  # reported as unexpected by load_state_into
            continue
        prefix, rest = f"blocks.{m.group(1)}.", m.group(2)
        if rest.startswith(("ln_1.", "ln_2.")):
            ln = "ln1" if rest.startswith("ln_1") else "ln2"
            out[f"{prefix}{ln}." + {"weight": "w", "bias": "b"}[rest.split(".")[1]]] = value
        elif rest == "attn.c_attn.weight":  # [d_model, 3 * d_model]
            for name, w in zip("QKV", value.chunk(3, dim=1)):
                out[f"{prefix}attn.W_{name}"] = rearrange(w, "m (h e) -> h m e", h=h)
        elif rest == "attn.c_attn.bias":
            for name, b in zip("QKV", value.chunk(3)):
                out[f"{prefix}attn.b_{name}"] = rearrange(b, "(h e) -> h e", h=h)
        elif rest == "attn.c_proj.weight":  # [d_model (heads), d_model]
            out[f"{prefix}attn.W_O"] = rearrange(value, "(h e) m -> h e m", h=h)
        elif rest == "attn.c_proj.bias":
            out[f"{prefix}attn.b_O"] = value
        elif rest in ("mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"):
            layer, kind = rest.split(".")[1:]
            name = ("W_" if kind == "weight" else "b_") + ("in" if layer == "c_fc" else "out")
            out[f"{prefix}mlp.{name}"] = value
        else:
            out[key] = value
    return {k: v.contiguous() for k, v in out.items()}


def load_garg_run(path: str | Path) -> GPTRegressor:
    """Import a Garg et al. / Fu et al. run directory into a `GPTRegressor`."""
    path = Path(path)
    cfg_yaml = _read_config(path)
    m = cfg_yaml["model"]
    state_path = path / "state.pt"
    if not state_path.is_file():
        raise CheckpointError(f"{state_path}: file is missing")
    try:
        raw = torch.load(state_path, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as err:
        raise CheckpointError(f"{state_path}: truncated, corrupt or unsafe "
                              f"({torch_load_failure(err)})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_state_dict"), dict):
        raise CheckpointError(f"{state_path}: no 'model_state_dict' in the file")
    try:
        cfg = GPTConfig(n_dims=int(m["n_dims"]), n_positions=int(m["n_positions"]),
                        n_layers=int(m["n_layer"]), d_model=int(m["n_embd"]),
                        n_heads=int(m["n_head"]), attention="softmax", layout="interleaved")
    except ValueError as err:
        raise CheckpointError(f"{path / 'config.yaml'}: {err}") from None
    model = GPTRegressor(cfg)
    load_state_into(model, convert_garg_state(raw["model_state_dict"], cfg), state_path)
    model.task = _task_from(cfg_yaml, cfg.n_dims, cfg.n_positions)
    return model
