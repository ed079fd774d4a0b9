"""Interventions by hook: truncated runs, zero/mean ablation, residual patching.

Each helper is a context manager (or a function) built on TransformerLens's
``model.hooks(...)``, which removes every hook it added on exit, also on error.
Block indices are 0-based (``blocks.{b}``); residual layers follow docs/architecture.md
(0 = embedding, l = output of block l−1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import Tensor

from iclprobe._checks import check_type
from iclprobe._finite import all_finite
from iclprobe.errors import InputError
from iclprobe.hooks.residuals import check_layers, points_of, readout_rows, resid_hook_name
from iclprobe.models.base import Regressor, check_model

HookFn = Callable[..., Tensor]


class _Stop(Exception):  # noqa: N818 - control flow, not an error
    def __init__(self, value: Tensor):
        super().__init__()
        self.value = value


def run_first_layers(model: Regressor, xs: Tensor, ys: Tensor, n_blocks: int) -> Tensor:
    """Run only the first ``n_blocks`` blocks; return the residual after them (full shape).

    ``n_blocks = 0`` returns the embedded input. The remaining blocks are never computed.
    """
    check_model(model)
    check_layers(model, [n_blocks])

    def stop(value: Tensor, hook: object) -> Tensor:
        raise _Stop(value)

    try:
        with model.hooks(fwd_hooks=[(resid_hook_name(n_blocks, model), stop)]):
            model(xs, ys)
    except _Stop as halt:
        return halt.value
    raise RuntimeError("the residual hook never fired")  # pragma: no cover


def _check_block(model: Regressor, block: int) -> None:
    n = model.cfg.n_layers
    if not (isinstance(block, int) and 0 <= block < n):
        raise InputError(f"block must be an integer in 0..{n - 1}, got {block!r}")


def _replace(kind: str) -> Callable[[Tensor], Tensor]:
    if kind == "zero":
        return lambda t: t.new_zeros(()).expand_as(t)
    if kind == "mean":  # the mean over the batch being run, per position
        return lambda t: t.mean(0, keepdim=True).expand_as(t)
    raise InputError(f"kind must be 'zero' or 'mean', got {kind!r}")


@contextlib.contextmanager
def ablate(model: Regressor, block: int, head: int | None = None,
           kind: str = "zero") -> Iterator[Regressor]:
    """Zero- or mean-ablate block ``block``'s output, or one of its heads.

    A whole block: the hooks its family names in ``block_output_hooks`` (GPT: its attention
    and MLP outputs, ``hook_attn_out`` and ``hook_mlp_out``); for a family that names none,
    the block's update of the residual stream (layer ``block + 1``'s residual minus layer
    ``block``'s). A head: its slice of ``attn.hook_z`` (GPT) or of ``attn.hook_pattern`` (PQ,
    whose head outputs are summed inside the layer). Mean ablation uses the batch mean per
    position.
    """
    check_model(model)
    _check_block(model, block)
    replace = _replace(kind)
    hooks: list[tuple[str | Callable[..., Any], Callable[..., Any]]]
    if head is None and not model.block_output_hooks:
        hooks = _update_hooks(model, block, replace)
    elif head is None:
        names = [f"blocks.{block}.{name}" for name in model.block_output_hooks]
        unknown = [n for n in names if n not in model.hook_dict]
        if unknown:
            raise InputError(f"{type(model).__name__}.block_output_hooks names hooks it does "
                             f"not have: {unknown}; its hooks of block {block}: "
                             f"{[n for n in model.hook_dict if n.startswith(f'blocks.{block}.')]}")
        hooks = [(name, lambda t, hook: replace(t)) for name in names]
    else:
        if model.head_hook is None:
            raise InputError(f"{type(model).__name__} has no attention heads to ablate: "
                             "pass head=None to ablate the whole block")
        n_heads = model.cfg.n_heads
        if not (isinstance(head, int) and 0 <= head < n_heads):
            raise InputError(f"head must be an integer in 0..{n_heads - 1}, got {head!r}")
        name, axis = model.head_hook

        def ablate_head(t: Tensor, hook: object) -> Tensor:
            t = t.clone()
            index = [slice(None)] * t.ndim
            index[axis] = slice(head, head + 1)
            t[tuple(index)] = replace(t[tuple(index)])
            return t

        hooks = [(f"blocks.{block}.{name}", ablate_head)]
    with model.hooks(fwd_hooks=hooks):
        yield model


def _update_hooks(model: Regressor, block: int, replace: Callable[[Tensor], Tensor]
                  ) -> list[tuple[str | Callable[..., Any], Callable[..., Any]]]:
    """Hooks that replace block ``block``'s residual update ``out − in`` by ``replace``."""
    seen: dict[str, Tensor] = {}

    def keep(t: Tensor, hook: object) -> Tensor:
        seen["in"] = t
        return t

    def swap(t: Tensor, hook: object) -> Tensor:
        return seen["in"] + replace(t - seen["in"])

    return [(resid_hook_name(block, model), keep), (resid_hook_name(block + 1, model), swap)]


@contextlib.contextmanager
def patch_residual(model: Regressor, layer: int, source: Tensor) -> Iterator[Regressor]:
    """Replace residual layer ``layer`` with ``source`` (e.g. from another run).

    ``source`` is either the hook's whole tensor (every token: ``[B, tok, d_model]``, PQ
    ``[B, prefix, row, d_model]``, as ``collect_residuals(..., positions="all")[layer]``)
    or its readout rows ``[B, n, d_model]`` (as ``collect_residuals(...)[layer]``): those
    are written into the readout positions, every other token left as computed. It must be
    finite: a NaN or Inf would reach every prediction after ``layer`` without a word.
    """
    check_model(model)
    check_layers(model, [layer])
    check_type("patch_residual", "source", source, Tensor, "a torch.Tensor")
    if not source.is_meta and not all_finite(source):  # meta: shapes only
        raise InputError(f"patch_residual: source must be finite, found NaN or Inf in a tensor "
                         f"of shape {tuple(source.shape)}")
    name = resid_hook_name(layer, model)

    def patch(value: Tensor, hook: object) -> Tensor:
        if source.shape == value.shape:
            return source.to(value)
        try:
            return model.set_readout_rows(value, source)
        except (ValueError, RuntimeError, IndexError):
            rows = None
            if _full_forward(model, value):
                rows = tuple(readout_rows(model, value, points_of(model, value)).shape)
            readout = f" or its readout rows {rows}" if rows else ""
            raise InputError(f"source has shape {tuple(source.shape)}, but {name} has "
                             f"{tuple(value.shape)} (every token){readout}") from None

    with model.hooks(fwd_hooks=[(name, patch)]):
        yield model


def _full_forward(model: Regressor, value: Tensor) -> bool:
    """Whether readout rows can be read off ``value`` (false for extra query rows)."""
    try:
        model.set_readout_rows(value, readout_rows(model, value, points_of(model, value)))
    except (ValueError, RuntimeError, IndexError):
        return False
    return True
