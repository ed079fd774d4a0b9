"""What a model of a config holds, measured on the meta device before anything is allocated.

A family's size is read off the model itself, not off a formula of its config: the class is
built on ``torch.device("meta")`` (tensors with shapes and no storage) and its state dict
counted; a training step's activations are the tensors a forward pass on meta inputs saves
for backward. Every family is measured the same way, so a new one writes no formula.

Building takes time in proportion to the depth (a million layers: minutes, even on the
meta device), so a config is first bounded cheaply: models of depth 1 and 2 give the cost
of one more layer, and the count at the config's depth is extrapolated from them (exact
where the layers are alike, as in every shipped family). A config beyond the memory, or
far beyond the weight file it comes with, is refused on that bound, before the full model
is built even on the meta device.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from iclprobe._checks import check_fits, sizes
from iclprobe.storage import CheckpointError

logger = logging.getLogger(__name__)

#: A config within this margin of its weight file (2x + 2^20 weights) is cheap to build, and
#: loading then names each mismatching tensor.
FILE_MARGIN = (2, 2**20)
#: The count of a tensor too large to describe (its size overflows int64): a lower bound.
OVERFLOW = 2**63


def build_meta(model_cls: Any, cfg: Any) -> nn.Module:
    """``model_cls(cfg)`` on the meta device: its tensors have shapes and no storage."""
    with torch.device("meta"):
        return model_cls(cfg)


def count_parameters(model: nn.Module) -> int:
    """The values in ``model``'s state dict (weights and buffers: what a checkpoint holds)."""
    return sum(t.numel() for t in model.state_dict().values())


def count_held(model: nn.Module) -> int:
    """Every value ``model`` holds: parameters and buffers, saved or rebuilt from a seed."""
    return sum(t.numel() for t in model.parameters()) + sum(t.numel() for t in model.buffers())


def _overflowing(err: RuntimeError) -> bool:
    """Whether torch refused a shape whose size overflows int64 (more than 2^63 values)."""
    return "overflow" in str(err)


def count_activations(model: Any, batch_size: int, n_points: int,
                      last_only: bool = False) -> int:
    """The floats a forward pass of ``model`` on ``[batch_size, n_points]`` saves for backward.

    ``model`` is a regressor (its ``cfg.n_dims``; called as ``model(xs, ys, last_only)``).

    Counted by `torch.autograd.graph.saved_tensors_hooks` over a pass on the model's device
    (meta: nothing is computed; tensors a family creates without a device land there too),
    each storage once; the weights themselves are left out (they count as parameters). On
    the meta device the reference kernels run: a device's fused kernels save somewhat other
    tensors (measured at small sizes: a GPT's fused softmax attention on the CPU 10% less,
    the CPU's LSTM kernel more; linear attention and PQ layers the same).
    """
    weight = next(iter(model.parameters()), None)
    device, dtype = (weight.device, weight.dtype) if weight is not None else \
        (torch.device("cpu"), torch.float32)
    params = {id(p) for p in model.parameters()}
    saved: dict[int, torch.Tensor] = {}  # by storage; kept alive so that ids stay unique

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t if t._base is None else t._base
        if id(t) not in params and id(base) not in params:
            saved.setdefault(id(base), base)
        return t

    try:
        with torch.device(device), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            # zeros, not empty: a model refuses inputs that are not finite, and uninitialized
            # memory may hold NaN (on meta both are shapes only)
            xs = torch.zeros(batch_size, n_points, model.cfg.n_dims, dtype=dtype)
            model(xs, torch.zeros(batch_size, n_points, dtype=dtype), last_only=last_only)
    except RuntimeError as err:
        if _overflowing(err):
            return OVERFLOW
        raise
    return sum(t.numel() for t in saved.values())


def at_depth(cfg: Any, measure: Callable[[Any], tuple[int, ...]]) -> tuple[int, ...]:
    """``measure(cfg)``, extrapolated from configs of depth 1 and 2 (cheap at any depth).

    Exact where every layer holds the same; a config of depth 1 or 2, or one that takes no
    other depth, is measured as it is.
    """
    depth = cfg.n_layers
    if depth <= 2:
        return measure(cfg)
    try:
        one, two = (dataclasses.replace(cfg, n_layers=k) for k in (1, 2))
    except (TypeError, ValueError):
        return measure(cfg)
    first, second = measure(one), measure(two)
    return tuple(a + (depth - 1) * (b - a) for a, b in zip(first, second, strict=True))


def measure(model_cls: Any, cfg: Any, activations: Callable[[nn.Module], int] | None = None,
            held: bool = False) -> tuple[int, int]:
    """``(parameters, activations)`` of ``model_cls(cfg)``, built on the meta device.

    ``activations`` counts what the model keeps besides its weights (`count_activations`;
    None: 0); ``held=True`` counts every tensor it holds as its parameters (`count_held`:
    also buffers a checkpoint does not store, an oracle's rotation). A weight too large to
    describe (its size overflows int64) gives `OVERFLOW`.
    """
    try:
        model = build_meta(model_cls, cfg)
    except RuntimeError as err:
        if _overflowing(err):
            return OVERFLOW, 0
        raise
    count = count_held(model) if held else count_parameters(model)
    return count, _measured(activations, model) if activations else 0


def parameter_bound(model_cls: Any, cfg: Any) -> int:
    """The parameters of ``model_cls(cfg)``, extrapolated over depth (`at_depth`)."""
    return at_depth(cfg, lambda c: measure(model_cls, c))[0]


def parameter_count(model_cls: Any, cfg: Any) -> int:
    """The parameters of ``model_cls(cfg)``, counted on the meta device (its whole depth)."""
    return measure(model_cls, cfg)[0]


def check_loadable(model_cls: Any, cfg: Any, stored: int, config_file: Path,
                   weights_name: str, described: str | None = None) -> None:
    """Before building: refuse a config of far more weights than its file holds, or memory.

    Args:
        model_cls, cfg: the model a checkpoint describes.
        stored: the values the weight file holds (from its header, or the loaded tensors).
        config_file, weights_name: named by the message.
        described: the config's sizes as the user wrote them (default: `sizes` of ``cfg``).

    Raises:
        CheckpointError: ``CONFIG: the config describes a model of N parameters (...), but
            WEIGHTS holds M`` (an edited ``n_layers = 10**6``: refused on the cheap bound).
        ValueError: two copies of the weights (the file's and the model's) cannot fit.
    """
    described = described or sizes(cfg)
    factor, extra = FILE_MARGIN
    count = 0
    for count_of in (parameter_bound, parameter_count):  # the cheap one refuses absurd configs
        count = count_of(model_cls, cfg)
        if count > factor * stored + extra:
            raise CheckpointError(f"{config_file}: the config describes a model of {count:,} "
                                  f"parameters ({described}), but {weights_name} holds "
                                  f"{stored:,}")
    held = at_depth(cfg, lambda c: measure(model_cls, c, held=True))[0]  # buffers rebuilt too
    check_fits(max(count, held), f"loading {config_file.parent}", described)


def check_model_fits(model_cls: Any, cfg: Any, what: str, copies: int = 2,
                     activations: Callable[[nn.Module], int] | None = None,
                     extra_floats: int = 0, available: int | None = None,
                     held: bool = False) -> None:
    """Refuse a model whose ``copies`` of weights (and activations) cannot fit in memory.

    First on the cheap bound (`at_depth`), then on the model built on the meta device.

    Args:
        model_cls, cfg: the model to build.
        what: what would be done, for the message ("training").
        copies: float32 copies of the weights held at once (4 to train with Adam: weights,
            gradients, two moments).
        activations: the floats a model keeps besides its weights (`count_activations`).
        extra_floats: further float32 values (data).
        available: bytes available (default: what the system says).
        held: count every tensor the model holds, buffers too (`count_held`).
    """
    def need(c: Any) -> tuple[int, ...]:
        return measure(model_cls, c, activations, held)

    for bound in (lambda: at_depth(cfg, need), lambda: need(cfg)):  # the cheap bound first
        n_params, kept = bound()
        check_fits(n_params, what, sizes(cfg), copies, kept + extra_floats, available)


def _measured(activations: Callable[[nn.Module], int], model: nn.Module) -> int:
    """``activations(model)``, or 0 (with a warning) where a family cannot run on meta."""
    try:
        return activations(model)
    except (RuntimeError, NotImplementedError) as err:
        logger.warning("%s: activations not measured on the meta device (%s); only the "
                       "weights are checked against memory", type(model).__name__, err)
        return 0
