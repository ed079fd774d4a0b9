"""Import of Garg et al. / Fu et al. run directories (``config.yaml`` + ``state.pt``).

Their model is ``_read_in`` (Linear) → ``_backbone`` (Hugging Face ``GPT2Model``, fed
``inputs_embeds``) → ``_read_out`` (Linear), softmax attention on the interleaved layout.
GPT-2's ``Conv1D`` weights are stored ``[in, out]``; ours are split per head.

Fu et al.'s probing runs set ``model.use_first_n_layer: k`` below ``n_layer``: their model
then predicts ``_read_out(hidden_states[k])``, Hugging Face's hidden state after k blocks
(``hidden_states[0]`` is the embedding), which has no final LayerNorm (only
``hidden_states[n_layer]`` has). Such a run imports as a k-block `GPTRegressor` with
``final_norm=False``; the weights of the later blocks and of ``ln_f`` go unused.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import yaml
from einops import rearrange
from torch import Tensor

from iclprobe._checks import is_int
from iclprobe.models.config import GPTConfig
from iclprobe.models.files import load_state_into
from iclprobe.models.gpt import GPTRegressor
from iclprobe.models.size import check_loadable
from iclprobe.storage import CheckpointError, torch_load_tensors
from iclprobe.tasks import RegressionTask

logger = logging.getLogger(__name__)

# HF buffers and the unused token embedding, present in some or all of their files.
_IGNORED = re.compile(r"^_backbone\.(wte\.weight|h\.\d+\.attn\.(bias|masked_bias))$")
SIZE_FIELDS = ("n_dims", "n_positions", "n_embd", "n_layer", "n_head")


def _read_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.yaml"
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path}: file is missing")
    try:
        cfg = yaml.safe_load(cfg_path.read_text())
    except yaml.YAMLError as err:
        raise CheckpointError(f"{cfg_path}: invalid YAML ({err})") from None
    except RecursionError:
        raise CheckpointError(f"{cfg_path}: invalid YAML (nested too deeply to be read)") \
            from None
    model = cfg.get("model") if isinstance(cfg, dict) else None
    if not isinstance(model, dict):
        raise CheckpointError(f"{cfg_path}: no 'model:' section")
    if model.get("family", "gpt2") != "gpt2":
        raise CheckpointError(f"{cfg_path}: model family {model.get('family')!r} is not gpt2")
    missing = [k for k in SIZE_FIELDS if k not in model]
    if missing:
        raise CheckpointError(f"{cfg_path}: model section lacks {missing}")
    for key in SIZE_FIELDS:
        _positive_int(model[key], f"model.{key}", cfg_path)
    return cfg


def _positive_int(value: Any, field: str, cfg_path: Path) -> int:
    """``value`` if it is a positive integer (YAML's ``3``, not ``"3"``, ``3.0`` or ``true``)."""
    if not is_int(value) or value < 1:
        raise CheckpointError(f"{cfg_path}: {field} must be a positive integer, got "
                              f"{str(value)[:60] if not isinstance(value, str) else repr(value)}")
    return value


def _task_from(cfg: dict[str, Any], n_dims: int, n_positions: int, cfg_path: Path
               ) -> RegressionTask:
    node = cfg.get("training")  # training.curriculum.points.end, where given
    for key in ("curriculum", "points"):
        node = node.get(key) if isinstance(node, dict) else None
    points = node.get("end", n_positions) if isinstance(node, dict) else n_positions
    points = _positive_int(points, "training.curriculum.points.end", cfg_path)
    try:
        return RegressionTask(n_dims=n_dims, n_points=points)
    except ValueError as err:
        raise CheckpointError(f"{cfg_path}: {err}") from None


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


def first_n_layers(cfg: dict[str, Any], cfg_path: Path) -> int:
    """The depth Fu et al.'s model reads out at: ``model.use_first_n_layer`` or ``n_layer``."""
    n_layer, k = int(cfg["model"]["n_layer"]), cfg["model"].get("use_first_n_layer")
    if k is None:  # absent or null: their code uses all n_layer blocks
        return n_layer
    if not is_int(k) or not 1 <= k <= n_layer:
        why = (" (0 reads out the embedding alone: iclprobe models have at least one block)"
               if k == 0 else "")
        raise CheckpointError(f"{cfg_path}: model.use_first_n_layer must be an integer in "
                              f"1..n_layer={n_layer}, got {k!r}{why}")
    return k


def _drop_unused(state: dict[str, Tensor], k: int, source: Path) -> dict[str, Tensor]:
    """Remove blocks ``k..`` and ``ln_f``, which a model reading out after block k never uses."""
    kept, dropped = {}, set()
    for key, value in state.items():
        m = re.match(r"^_backbone\.(?:h\.(\d+)|ln_f)\.", key)
        if m and (m.group(1) is None or int(m.group(1)) >= k):
            dropped.add("ln_f" if m.group(1) is None else f"block {m.group(1)}")
        else:
            kept[key] = value
    if dropped:
        logger.info("%s: model.use_first_n_layer=%d: the weights of %s are unused", source, k,
                    ", ".join(sorted(dropped, key=lambda n: (n == "ln_f", len(n), n))))
    return kept


def _read_state(state_path: Path) -> dict[str, Tensor]:
    if not state_path.is_file():
        raise CheckpointError(f"{state_path}: file is missing")
    raw = torch_load_tensors(state_path)
    if not isinstance(raw, dict) or not isinstance(raw.get("model_state_dict"), dict):
        raise CheckpointError(f"{state_path}: no 'model_state_dict' in the file")
    return raw["model_state_dict"]


def load_garg_run(path: str | Path) -> GPTRegressor:
    """Import a Garg et al. / Fu et al. run directory into a `GPTRegressor`.

    A Fu et al. probing run (``model.use_first_n_layer: k`` < ``n_layer``) loads as the model
    their code evaluates: k blocks, no final LayerNorm (see the module docstring).
    """
    path = Path(path)
    cfg_yaml = _read_config(path)
    m = cfg_yaml["model"]
    n_layers = first_n_layers(cfg_yaml, path / "config.yaml")
    truncated = n_layers < int(m["n_layer"])
    state = _read_state(path / "state.pt")
    if truncated:
        state = _drop_unused(state, n_layers, path / "state.pt")
    try:
        cfg = GPTConfig(n_dims=int(m["n_dims"]), n_positions=int(m["n_positions"]),
                        n_layers=n_layers, d_model=int(m["n_embd"]),
                        n_heads=int(m["n_head"]), attention="softmax", layout="interleaved",
                        final_norm=not truncated)
    except ValueError as err:
        raise CheckpointError(f"{path / 'config.yaml'}: {err}") from None
    # before building: a config.yaml edited to n_layer: 1000000 would take minutes, then
    # exhaust memory (as for native checkpoints)
    stored = sum(v.numel() for v in state.values() if isinstance(v, Tensor))
    check_loadable(GPTRegressor, cfg, stored, path / "config.yaml", "state.pt",
                   ", ".join(f"{k}={m[k]}" for k in SIZE_FIELDS))
    model = GPTRegressor(cfg)
    load_state_into(model, convert_garg_state(state, cfg), path / "state.pt")
    model.task = _task_from(cfg_yaml, cfg.n_dims, cfg.n_positions, path / "config.yaml")
    return model
