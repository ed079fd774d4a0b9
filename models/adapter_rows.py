"""Where an adapted model's residual hooks hold each example's readout row.

Two layouts (`HookedAdapter`'s ``resid_layout``):

- ``"tokens"``: a hook gives ``[batch, tok, d_model]``, one pass over the sequence; example
  t is read at token ``offset + stride * t`` (``positions``);
- ``"prefix"``: a hook gives ``[batch, prefix, row, d_model]``: one forward computes, for
  each prefix t, the rows of the sequence whose query is ``xs[:, t]`` (as iclprobe's
  `PQTransformer` lays out per-prefix copies: t context slots, then the query row);
  example t is read at row ``query_row`` of prefix t (default -1: the last row).

Axis legend: ``batch``, ``tok``, ``prefix``, ``row``, ``pos`` (examples), ``d_model``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from iclprobe.errors import InputError, InputTypeError

RESID_LAYOUTS = ("tokens", "prefix")
_SHAPES = {"tokens": "[batch, tok, d_model]", "prefix": "[batch, prefix, row, d_model]"}


def check_layout(resid_layout: Any, query_row: Any, positions: Any) -> None:
    """``resid_layout`` and ``query_row`` valid, and ``positions`` only with tokens."""
    if resid_layout not in RESID_LAYOUTS:
        raise InputError(f"resid_layout must be 'tokens' (hooks {_SHAPES['tokens']}) or "
                         f"'prefix' (hooks {_SHAPES['prefix']}), got {resid_layout!r}")
    if not isinstance(query_row, int) or isinstance(query_row, bool):
        raise InputTypeError(f"query_row must be an integer (a row index of each prefix block, "
                        f"negative from the end), got {query_row!r}")
    if resid_layout == "prefix" and positions is not None:
        raise InputError(f"positions applies to resid_layout='tokens'; with resid_layout="
                         f"'prefix' example t is read at row query_row of prefix t: drop "
                         f"positions={positions!r}")
    if resid_layout == "tokens" and query_row != -1:
        raise InputError(f"query_row applies to resid_layout='prefix'; with resid_layout="
                         f"'tokens' the readout tokens are given by positions: drop "
                         f"query_row={query_row!r}")


def _shape(activation: Any) -> str:
    return str(tuple(activation.shape)) if isinstance(activation, Tensor) else \
        type(activation).__name__


def readout_rows(cfg: Any, activation: Any, n_points: int) -> Tensor:
    """A hook's tensor at the readout rows of ``n_points`` examples: ``[batch, pos, d_model]``.

    A tensor of the other layout, or too short or narrow, is a ValueError naming the shape
    seen and the shapes ``cfg`` accepts.
    """
    if cfg.resid_layout == "prefix":
        ok = (isinstance(activation, Tensor) and activation.ndim == 4
              and activation.shape[-1] == cfg.d_model and activation.shape[1] >= n_points
              and -activation.shape[2] <= cfg.query_row < activation.shape[2])
        if not ok:
            hint = " (a [batch, tok, d_model] hook: resid_layout='tokens')" \
                if isinstance(activation, Tensor) and activation.ndim == 3 else ""
            raise InputError(f"a residual hook gave {_shape(activation)}, but resid_layout="
                             f"'prefix' with {n_points} examples needs [batch, >= {n_points} "
                             f"prefixes, rows (query_row={cfg.query_row} among them), "
                             f"d_model={cfg.d_model}]{hint}: check resid_hooks, d_model and "
                             "query_row")
        return activation[:, :n_points, cfg.query_row]
    need = cfg.readout_offset + cfg.readout_stride * (n_points - 1) + 1
    if (not isinstance(activation, Tensor) or activation.ndim != 3
            or activation.shape[-1] != cfg.d_model or activation.shape[1] < need):
        hint = " (a [batch, prefix, row, d_model] hook: resid_layout='prefix')" \
            if isinstance(activation, Tensor) and activation.ndim == 4 else ""
        raise InputError(f"a residual hook gave {_shape(activation)}, but {n_points} examples "
                         f"need [batch, >= {need} tokens, d_model={cfg.d_model}]{hint}: check "
                         "resid_hooks, d_model and positions")
    index = cfg.readout_offset + cfg.readout_stride * _arange(n_points, activation)
    return activation[:, index]


def set_readout_rows(cfg: Any, activation: Tensor, rows: Tensor) -> Tensor:
    """A copy of ``activation`` with ``rows [batch, pos, d_model]`` at its readout rows."""
    n = n_points_of(cfg, activation)
    readout_rows(cfg, activation, n)  # the layout checked
    expected = (activation.shape[0], n, activation.shape[-1])
    if tuple(rows.shape) != expected:
        raise InputError(f"rows must have shape {expected} for this tensor, got "
                         f"{tuple(rows.shape)}")
    out = activation.clone()
    if cfg.resid_layout == "prefix":
        out[:, :, cfg.query_row] = rows.to(activation)
    else:
        out[:, cfg.readout_offset + cfg.readout_stride * _arange(n, activation)] = \
            rows.to(activation)
    return out


def n_points_of(cfg: Any, activation: Tensor) -> int:
    """Examples in a hook tensor: its prefixes, or the readout tokens it reaches."""
    if cfg.resid_layout == "prefix":
        return int(activation.shape[1])
    stride = cfg.readout_stride
    return (activation.shape[1] - cfg.readout_offset + stride - 1) // stride


def tokens_per_sequence(cfg: Any, n_points: int) -> int:
    """About how many token rows one sequence of ``n_points`` examples takes (for chunks)."""
    if cfg.resid_layout == "prefix":
        return n_points * (n_points + 1)  # n prefixes of about n + 1 rows
    return cfg.readout_offset + cfg.readout_stride * n_points


def _arange(n: int, like: Tensor) -> Tensor:
    return torch.arange(n, device=like.device)
