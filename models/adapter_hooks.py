"""Argument checks and forward hooks behind `iclprobe.models.adapter.HookedAdapter`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from iclprobe.errors import InputError, InputTypeError
from iclprobe.models._tl import HookPoint
from iclprobe.models.config import LAYOUTS

#: Readout positions of the standard layouts, as (stride, offset) token indices.
_POSITIONS = {"interleaved": (2, 0), "paired": (1, 0)}


def check_inputs_arg(inputs: Any, read_in: Any, input_name: Any) -> str | None:
    """The layout named by ``inputs`` (None for a callable or None), validated."""
    if isinstance(inputs, str):
        if inputs not in LAYOUTS:
            raise InputError(f"inputs must be one of {LAYOUTS}, a callable (xs, ys) -> the "
                             f"module's inputs, or None, got {inputs!r}")
        if read_in is not None and not callable(read_in):
            raise InputTypeError(f"read_in must be a module or callable, got {read_in!r}")
        if input_name is not None and not isinstance(input_name, str):
            raise InputTypeError(f"input_name must be a str or None, got {input_name!r}")
        return inputs
    if inputs is not None and not callable(inputs):
        raise InputTypeError(f"inputs must be one of {LAYOUTS}, a callable (xs, ys) -> the "
                        f"module's inputs, or None, got {inputs!r}")
    for name, value in (("read_in", read_in), ("input_name", input_name)):
        if value is not None:
            raise InputError(f"{name} applies to the layout's tokens: pass inputs="
                             f"'interleaved' or 'paired' with it, got inputs={inputs!r}")
    return None


def readout_stride(positions: Any, layout: str | None) -> tuple[int, int]:
    """``(stride, offset)`` of the readout tokens."""
    positions = layout if positions is None else positions
    if positions is None:
        raise InputError("positions is required when inputs is not a layout name: "
                         "'interleaved', 'paired' or (stride, offset)")
    if isinstance(positions, str):
        if positions not in _POSITIONS:
            raise InputError(f"positions must be one of {tuple(_POSITIONS)} or (stride, "
                             f"offset), got {positions!r}")
        return _POSITIONS[positions]
    if not (isinstance(positions, tuple) and len(positions) == 2):
        raise InputTypeError(f"positions must be one of {tuple(_POSITIONS)} or a tuple (stride, "
                        f"offset), got {positions!r}")
    return positions[0], positions[1]  # AdapterConfig validates both


def check_names(names: Any, n_layers: int) -> list[str]:
    """``resid_hooks`` as a list of n_layers + 1 distinct names, validated."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise InputTypeError(f"resid_hooks must be a sequence of {n_layers + 1} hook names or "
                        f"module paths, got {names!r}")
    names = list(names)
    if len(names) != n_layers + 1 or not all(isinstance(n, str) and n for n in names):
        raise InputError(f"resid_hooks must name n_layers + 1 = {n_layers + 1} hooks (layer 0: "
                         f"the embedded input), got {names!r}")
    if len(set(names)) != len(names):
        raise InputError(f"resid_hooks must name a different hook per layer, got {names!r}")
    return names


def submodule(module: nn.Module, path: str, own: dict[str, HookPoint]) -> nn.Module:
    """The submodule of ``module`` at ``path``; a `ValueError` naming some real ones if none."""
    try:
        return module.get_submodule(path)
    except AttributeError:
        known = sorted(own) if own else [n for n, _ in module.named_modules() if n]
        raise InputError(f"resid_hooks: {path!r} is not a hook or submodule of "
                         f"{type(module).__name__} (some that are: {known[:8]})") from None


def keeper(keep: list[Tensor | None], wanted: bool) -> Callable[[nn.Module, Any, Any], None]:
    """A forward hook recording each run of a hook point (its output if ``wanted``)."""
    def record(_module: nn.Module, _inputs: Any, out: Any) -> None:
        keep.append(out if wanted else None)
    return record


def router(name: str, point: HookPoint) -> Callable[[nn.Module, Any, Any], Any]:
    """A forward hook passing a module's output (or its first item) through ``point``."""
    def route(_module: nn.Module, _inputs: Any, out: Any) -> Any:
        if isinstance(out, Tensor):
            return point(out)
        if type(out) is tuple and out and isinstance(out[0], Tensor):
            return (point(out[0]), *out[1:])
        raise InputTypeError(f"resid_hooks: module {name!r} returned {type(out).__name__}; a "
                        "residual module must return a Tensor or a tuple whose first item "
                        "is the residual")
    return route
