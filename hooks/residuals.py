"""Residual-stream collection at the readout positions (or all), batched, optionally to disk.

Layer l's residual: l = 0 is ``blocks.0.hook_resid_pre`` (the embedded input), l ≥ 1 is
``blocks.{l-1}.hook_resid_post`` (before the final norm). Readout positions: the x tokens
of the interleaved layout, every token of the paired one, and for `PQTransformer` the
query row of each prefix. ``positions="all"`` keeps every token instead: the hooks' own
shapes, which `patch_residual` takes back. Axis legend: ``layer``, ``batch``, ``pos``,
``tok`` (tokens: 2n interleaved, n paired), ``prefix``, ``row`` (PQ: n context slots and
the query), ``d_model``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from jaxtyping import Float
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm.auto import tqdm

from iclprobe._checks import check_type, is_int
from iclprobe._text import WIDTH
from iclprobe.atomic import atomic_directory
from iclprobe.errors import InputError
from iclprobe.models.base import Regressor, check_model, tensor_home
from iclprobe.storage import parse_json


def resid_hook_name(layer: int, model: Regressor | None = None) -> str:
    """The hook whose output is layer ``layer``'s residual stream (the family may rename)."""
    if model is not None:
        return model.resid_hook_name(layer)
    return "blocks.0.hook_resid_pre" if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"


def check_layers(model: Regressor, layers: Sequence[int] | None) -> list[int]:
    """Layer indices 0..n_layers (default: all), validated."""
    n = model.cfg.n_layers
    if layers is None:
        return list(range(n + 1))
    out = list(layers)
    bad = [layer for layer in out if not (isinstance(layer, int) and 0 <= layer <= n)]
    if bad or not out:
        raise InputError(f"layers must be integers in 0..{n} (n_layers={n}), got {out}")
    return out


def readout_rows(model: Regressor, resid: Tensor, n_points: int) -> Tensor:
    """A hook's residual → ``[batch, pos, d_model]`` at the readout positions."""
    return model.readout_rows(resid, n_points)


def points_of(model: Regressor, resid: Tensor) -> int:
    """The number of examples n of a forward pass, from one of its residual hooks' tensor."""
    return model.n_points_of(resid)


POSITIONS = ("readout", "all")
#: sequences per forward pass when residuals are collected: at Garg size (12 layers, 256
#: wide, 82 tokens) 64 run 30% faster than 256, with 0.4 GB less peak memory
#: (`bench/demo.py`'s floor uses it too)
BATCH_SEQUENCES = 64


def iter_residuals(model: Regressor, xs: Tensor, ys: Tensor, layers: Sequence[int] | None = None,
                   batch_size: int = BATCH_SEQUENCES, progress: bool = False,
                   positions: str = "readout"
                   ) -> Iterator[Float[Tensor, "layer batch ..."]]:
    """Residuals batch by batch, caching only the hooks needed (``names_filter``)."""
    check_model(model)
    layers = check_layers(model, layers)
    if positions not in POSITIONS:
        raise InputError(f"positions must be one of {POSITIONS}, got {positions!r}")
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    names = [resid_hook_name(layer, model) for layer in layers]
    model.check_resid_hooks(names)
    wanted = set(names)
    device = tensor_home(model)[0]
    starts = range(0, xs.shape[0], batch_size)
    # the bar within the width of what iclprobe prints, not the terminal's
    for s in tqdm(starts, desc="residuals", disable=not progress, ncols=WIDTH):
        xb, yb = xs[s:s + batch_size].to(device), ys[s:s + batch_size].to(device)
        with torch.no_grad():
            _, cache = model.run_with_cache(xb, yb, names_filter=lambda name: name in wanted,
                                            return_cache_object=False)
        if positions == "all":
            yield torch.stack([cache[name] for name in names])
        else:
            yield torch.stack([readout_rows(model, cache[name], xs.shape[1]) for name in names])


def collect_residuals(model: Regressor, xs: Tensor, ys: Tensor,
                      layers: Sequence[int] | None = None, batch_size: int = BATCH_SEQUENCES,
                      progress: bool = False, positions: str = "readout"
                      ) -> Float[Tensor, "layer batch ..."]:
    """Every layer's residual stream, at the readout positions or at all positions.

    ``positions="readout"``: ``[L+1, B, n, d_model]``, the rows probes read. ``"all"``:
    each hook's whole tensor, ``[L+1, B, tok, d_model]`` (GPT) or
    ``[L+1, B, prefix, row, d_model]`` (PQ), so that a layer can be patched back
    with `patch_residual` (which takes readout rows too).

    Only the residual hooks are cached, one batch of ``batch_size`` sequences at a time, and
    each batch is copied into the result as it comes, so memory holds the result plus one
    batch's residuals, never a full cache (nor the batches and their concatenation).
    """
    out: Tensor | None = None
    at = 0
    for part in iter_residuals(model, xs, ys, layers, batch_size, progress, positions):
        if out is None:
            out = part.new_empty((part.shape[0], xs.shape[0], *part.shape[2:]))
        out[:, at:at + part.shape[1]] = part
        at += part.shape[1]
    if out is None:  # no sequences: no forward pass checked them
        raise InputError(f"xs must hold at least one sequence, got shape {tuple(xs.shape)}")
    return out


class ResidualStore:
    """Residuals written to disk as safetensors shards, for runs too large for memory."""

    INDEX = "index.json"

    def __init__(self, path: str | os.PathLike[str]):
        check_type("ResidualStore", "path", path, (str, os.PathLike),
                   "a directory path (str or os.PathLike)")
        self.path = Path(path)
        index = self.path / self.INDEX
        if not index.is_file():
            raise FileNotFoundError(f"{index}: not a residual store (no index)")
        self.layers, self.shards, self.shape = _read_index(index)

    @classmethod
    def write(cls, path: str | os.PathLike[str], model: Regressor, xs: Tensor, ys: Tensor,
              layers: Sequence[int] | None = None, batch_size: int = 256,
              progress: bool = True, overwrite: bool = False) -> ResidualStore:
        """Collect residuals shard by shard (one per batch) into ``path``, atomically.

        ``overwrite=True`` replaces a store that iclprobe wrote at ``path``.
        """
        layers = check_layers(model, layers)
        shards = []
        with atomic_directory(path, "residuals", overwrite) as tmp:
            for i, resid in enumerate(iter_residuals(model, xs, ys, layers, batch_size,
                                                     progress)):
                name = f"resid-{i:05d}.safetensors"
                save_file({"resid": resid.contiguous().cpu()}, str(tmp / name))
                shards.append(name)
            shape = [len(layers), xs.shape[0], xs.shape[1], model.cfg.d_model]
            (tmp / cls.INDEX).write_text(json.dumps({"layers": layers, "shards": shards,
                                                     "shape": shape}))
        return cls(path)

    def __iter__(self) -> Iterator[Tensor]:
        for name in self.shards:
            shard = self.path / name
            try:
                yield load_file(str(shard))["resid"]
            except (SafetensorError, KeyError) as err:
                raise InputError(f"{shard}: truncated or corrupt residual shard ({err})") \
                    from None

    def load(self) -> Tensor:
        """All shards concatenated: ``[layer, batch, pos, d_model]``."""
        return torch.cat(list(self), dim=1)


def _read_index(index: Path) -> tuple[list[int], list[str], list[int]]:
    """``(layers, shards, shape)`` of a store's index, else an `InputError` naming the file."""
    try:
        meta = parse_json(index.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{index}: not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{index}: expected a JSON object with layers, shards and shape, got "
                         f"{type(meta).__name__}")
    missing = [k for k in ("layers", "shards", "shape") if k not in meta]
    if missing:
        raise InputError(f"{index}: missing keys {missing}")
    layers, shards, shape = meta["layers"], meta["shards"], meta["shape"]
    wrong = [k for k, ok in (
        ("layers", isinstance(layers, list) and layers and all(
            is_int(v) and v >= 0 for v in layers)),
        ("shards", isinstance(shards, list) and all(
            isinstance(v, str) and v and Path(v).name == v and v != ".." for v in shards)),
        ("shape", isinstance(shape, list) and len(shape) == 4 and all(
            is_int(v) and v >= 0 for v in shape))) if not ok]
    if wrong:
        raise InputError(f"{index}: invalid {', '.join(f'{k}={meta[k]!r:.40}' for k in wrong)} "
                         "(layers: indices >= 0; shards: file names in the store; shape: "
                         "[layer, batch, pos, d_model])")
    absent = [name for name in shards if not (index.parent / name).is_file()]
    if absent:
        raise InputError(f"{index}: lists shards that are missing: {absent[:5]}")
    return layers, shards, shape
