"""What `LayerProbes` checks of its inputs: real, finite tensors of sequences that fit.

A NaN, an infinity or a value whose square overflows float64 would give non-finite probes
without a word; a numpy array or an empty batch would fail deep inside torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from iclprobe._checks import check_bytes, check_int
from iclprobe._finite import all_finite
from iclprobe.algorithms.prefix import check_real
from iclprobe.errors import InputError

if TYPE_CHECKING:
    from iclprobe.models.base import Regressor
    from iclprobe.tasks import RegressionTask

#: Residuals and targets beyond this magnitude are refused: their squares, summed over
#: rows, would overflow float64 (1e150² = 1e300).
MAX_MAGNITUDE = 1e150


def check_fit_fits(model: Regressor, task: RegressionTask, n_sequences: int,
                   n_heldout: int) -> None:
    """Refuse, before any draw, a `LayerProbes.fit` whose residuals cannot fit in memory.

    Every layer's residual stream on every sequence is held at once (float32).
    """
    check_int("LayerProbes.fit", "n_sequences", n_sequences)
    check_int("LayerProbes.fit", "n_heldout", n_heldout)
    layers, width = model.cfg.n_layers + 1, model.cfg.d_model
    check_bytes((n_sequences + n_heldout) * task.n_points * (layers * width + task.n_dims + 1)
                * 4, f"fitting probes on n_sequences={n_sequences} and n_heldout={n_heldout} "
                f"sequences ({layers} layers of width {width})")


def check_tensors(**tensors: Any) -> None:
    """TypeError unless each argument is a real torch tensor (numpy arrays included)."""
    for name, t in tensors.items():
        check_real(name, t)


def check_axes(name: str, value: Any, axes: str) -> Tensor:
    """``value`` if it is a real tensor with one dimension per axis of ``axes``.

    ``axes`` reads as the message does, e.g. "layer, batch, pos, d_model".
    """
    check_tensors(**{name: value})
    if value.ndim != len(axes.split(",")):
        raise InputError(f"{name} must be a [{axes}] tensor, got shape {tuple(value.shape)}")
    return value


def check_finite_inputs(**tensors: Tensor) -> None:
    """ValueError for NaN or infinite values, and for magnitudes whose squares overflow."""
    for name, t in tensors.items():
        if not all_finite(t):
            raise InputError(f"{name} must be finite: found {int((~torch.isfinite(t)).sum())} "
                             "NaN or infinite value(s)")
        largest = t.abs().max().item() if t.numel() else 0.0
        if largest > MAX_MAGNITUDE:
            raise InputError(f"{name} reaches {largest:.3g}: the ridge fit squares it beyond "
                             f"float64's range (values up to {MAX_MAGNITUDE:.0e} are fitted); "
                             "rescale it")


def check_batch(**tensors: Any) -> None:
    """Real, finite tensors of at least one sequence."""
    check_tensors(**tensors)
    for name, t in tensors.items():
        if t.ndim == 0 or t.shape[0] == 0:
            raise InputError(f"{name} must hold at least one sequence, got shape "
                             f"{tuple(t.shape)}")
    check_finite_inputs(**{k: v for k, v in tensors.items()})
