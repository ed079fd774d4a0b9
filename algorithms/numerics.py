"""What the learners share in computing: checks, float64 results back in the data's units.

`finish` turns a learner's float64 results on scaled data into `Iterates` in the data's
units and dtype, refusing iterates that are not finite or that diverge; `scaled_number`,
`log2` and `rescale` handle exact power-of-two scalings. Axis legend: ``step``, ``batch``,
``pos``, ``n_dims``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from iclprobe._checks import is_number
from iclprobe._finite import all_finite
from iclprobe.algorithms.base import Iterates
from iclprobe.algorithms.prefix import PrefixStats, from_eigenbasis
from iclprobe.errors import InputError


def check_positive(value: Any, name: str, allow_zero: bool = False) -> float:
    """A finite number > 0 (or >= 0)."""
    ok = is_number(value) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InputError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def collect(stats: PrefixStats, coefs: Iterable[Tensor], want_weights: bool
            ) -> tuple[Tensor, Tensor | None]:
    """Predictions (and weights) from eigenbasis coefficients ``u [batch, pos, n_dims]``.

    In float64 and in the units of the scaled data (see `PrefixStats`); `finish` maps back.
    """
    preds, weights = [], []
    for coef in coefs:
        preds.append((coef * stats.query_eig).sum(-1))
        if want_weights:
            weights.append(from_eigenbasis(stats, coef))
    return torch.stack(preds), (torch.stack(weights) if want_weights else None)


def out_dtype(xs: Tensor) -> torch.dtype:
    """Results come back in the input's floating dtype (float32 for integer input)."""
    return xs.dtype if xs.is_floating_point() else torch.float32


#: An iterate whose squared error exceeds this multiple of the zero predictor's has diverged.
GROWTH_LIMIT = 1e3


class Diverged(InputError):
    """A learner's iterates grow without bound on these data at these hyperparameters."""


def fixed_number(value: Any) -> bool:
    """Whether a hyperparameter is one number (then `finish` checks the iterates' growth).

    Not a rule ("max", "tuned") nor one value per prefix: such learners may be read at one
    position only (a model trained at the last position), where the others grow freely.
    """
    return is_number(value)


def finish(name: str, steps: Tensor, preds: Tensor, weights: Tensor | None,
           hyper: dict[str, Any], dtype: torch.dtype, scale: tuple[float, float] = (1.0, 1.0),
           unstable: Callable[[], str | None] | None = None,
           map_weights: Callable[[Tensor], Tensor] | None = None,
           ys: Tensor | None = None) -> Iterates:
    """`Iterates` in the data's units and in ``dtype``, refusing results that are not finite.

    Args:
        preds, weights: float64 results on the data divided by ``scale = (s_x, s_y)``:
            predictions are multiplied back by s_y, weights by s_y / s_x.
        unstable: called when a result is not finite, or (given ``ys``) when a step's
            squared error exceeds `GROWTH_LIMIT` times the zero predictor's; says why
            (e.g. "lr=… diverges … the largest stable lr …") or returns None when the
            hyperparameters are stable.
        map_weights: applied to the weights in the data's units (pgd's change of basis).
        ys: the targets ``[batch, pos]``, for the growth check: a diverging learner is
            refused before it overflows (``1e105`` against ``|y| ≤ 1e3`` is no answer).
    """
    sx, sy = scale
    if sy != 1.0:
        preds = preds * sy
    if weights is not None and (sx, sy) != (1.0, 1.0):
        weights = weights * (sy / sx)
    if weights is not None and map_weights is not None:
        weights = map_weights(weights)
    out: list[Tensor | None] = []
    for label, t in (("predictions", preds), ("weights", weights)):
        if t is None:
            out.append(None)
            continue
        cast = t.to(dtype)
        if not all_finite(cast):
            why, diverged = _not_finite(name, label, t, dtype, unstable)
            raise (Diverged if diverged else InputError)(why)
        out.append(cast)
    if ys is not None and unstable is not None:
        _check_growth(name, steps, preds, ys, unstable)
    return Iterates(steps, out[0], out[1], hyper, name)  # type: ignore[arg-type]


def _check_growth(name: str, steps: Tensor, preds: Tensor, ys: Tensor,
                  unstable: Callable[[], str | None]) -> None:
    """Refuse iterates far worse than predicting 0 when the hyperparameters are unstable.

    Over every sequence and position: a fixed rate beyond the bound of the shortest
    prefixes (t = 1: S_1/1 has the largest top eigenvalue) blows up there first. A learner
    meant to be read at some positions only takes one value per prefix (not checked).
    """
    y = ys.detach().to(device=preds.device, dtype=torch.float64)
    zero = y.pow(2).mean()
    if not zero > 0:
        return
    ratio = (preds.double() - y).pow(2).mean((1, 2)) / zero  # [step]
    worst = int(ratio.argmax())
    if ratio[worst] > GROWTH_LIMIT:
        why = unstable()
        if why is not None:
            raise Diverged(f"{name}: {why} (after {int(steps[worst])} steps the squared "
                             f"error is {ratio[worst].item():.3g} times the zero "
                             "predictor's)")


def _not_finite(name: str, label: str, t: Tensor, dtype: torch.dtype,
                unstable: Callable[[], str | None] | None) -> tuple[str, bool]:
    """Why a learner's ``label`` (computed in float64 as ``t``) is not finite in ``dtype``.

    Also whether the hyperparameters are the cause (they diverge on these data).
    """
    why = unstable() if unstable is not None else None
    if why is not None:
        return f"{name}: {why}", True
    if not all_finite(t):
        return (f"{name}: the {label} overflow float64 on these data (no finite answer); "
                "check the data's scale and the hyperparameters"), False
    largest = t.abs().max().item()
    wider = "float64" if dtype == torch.float32 else "float32 or float64"
    return (f"{name}: the {label} reach {largest:.3g}, beyond the range of {dtype}, the dtype "
            f"of xs (largest {torch.finfo(dtype).max:.3g}): pass {wider} xs"), False


def scaled_number(value: float, exp2: int) -> str:
    """``value · 2**exp2`` as text, also where that is beyond float64's range."""
    if value == 0.0 or not math.isfinite(value):
        return f"{value:.3g}"
    try:
        exact = math.ldexp(value, exp2)
    except OverflowError:
        exact = math.inf
    if math.isfinite(exact) and abs(exact) >= sys.float_info.min:
        return f"{exact:.3g}"
    log10 = math.log10(abs(value)) + exp2 * math.log10(2.0)
    power = math.floor(log10)
    return f"{'-' if value < 0 else ''}{10 ** (log10 - power):.3g}e{power:+03d}"


def log2(scale: float) -> int:
    """The exponent of a power of two."""
    return math.frexp(scale)[1] - 1


def rescale(value: float, scale: float, power: int) -> float:
    """``value · scale**power`` for a power-of-two ``scale``: exact, inf on overflow."""
    try:
        return math.ldexp(value, power * log2(scale))
    except OverflowError:
        return math.inf
