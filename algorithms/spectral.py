"""The closed forms of GD and Newton–Schulz in each prefix's eigenbasis: their decays.

GD's k steps from 0 and Newton–Schulz's are ``u = (β/λ)(1 − decay)`` in the eigenbasis of
``S_t`` (decay ``(1 − η c λ)^k`` and ``(1 − α λ²)^(2^k)``), heavy ball's too with its own
decay (`iclprobe.algorithms.recurrences`): `power_decays` takes the powers,
`spectral_iterates` turns decays into predictions and weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import Tensor

from iclprobe.algorithms.prefix import PrefixStats, by_blocks, from_eigenbasis, spectral_terms

#: `power_decays` stacks this many bytes of decays at most: a block's few dozen step counts
#: in two or three stacks, each one call of each elementwise operation and one batched
#: product (GD's family at Garg size in 0.69 of the time of one decay per stack,
#: `bench/families.py`)
STACK_BYTES = 2**23


def power_decays(x: Tensor, exponents: Iterable[float]) -> Iterator[Tensor]:
    """``(1 − x)^e`` for each integer exponent e >= 0 (as a float, to hold Newton's 2^k).

    As ``±exp(e log|1 − x|)`` with the logarithm by ``log1p(−x)`` where x < 1: one logarithm
    for every exponent, then one exponential each (a fifth of the time of torch's float64
    ``**``), and no rounding of 1 − x, which ``(1 − x)**e`` would amplify e-fold. Values
    below 1e-304 come out as ~1e-304 instead of 0 or subnormals.

    Yields fresh stacks ``[..., k, x.shape[-1]]`` (a 0-d x is read as ``[1]``): the decays
    of consecutive exponents on the axis before the last (at most `STACK_BYTES` each), each
    decay the same number for number as computed alone.
    """
    x = x.reshape(1) if x.dim() == 0 else x
    log_abs, over, sign = torch.log1p(-x), x > 1, None  # log_abs: -inf at x = 1
    if bool(over.any()):  # 1 − x < 0: lr or alpha past 1/(c λ), or "max" rounded up
        log_abs[over] = torch.log(x[over] - 1.0)
        sign = torch.where(over, -1.0, 1.0)
    wanted = list(exponents)
    per = max(1, STACK_BYTES // max(1, x.numel() * x.element_size()))
    for lo in range(0, len(wanted), per):
        part = wanted[lo:lo + per]
        # exp is some 50 times slower where it underflows: stop at e^-700 ~ 1e-304 instead
        es = torch.tensor(part, dtype=log_abs.dtype, device=log_abs.device)[:, None]
        out = torch.mul(log_abs.unsqueeze(-2), es).clamp_(min=-700.0).exp_()
        for i, e in enumerate(part):
            if e == 0:
                out[..., i, :] = 1.0  # also where log_abs is -inf
            elif sign is not None and e % 2:
                out[..., i, :].mul_(sign)
        yield out


def one_by_one(decays: Iterable[Tensor]) -> Iterator[Tensor]:
    """Single decays ``[..., n_dims]`` as stacks of one, for `spectral_iterates`."""
    return (decay.unsqueeze(-2) for decay in decays)


def spectral_iterates(stats: PrefixStats, decays_of: Callable[[PrefixStats], Iterable[Tensor]],
                      want_weights: bool) -> tuple[Tensor, Tensor | None]:
    """Predictions (and weights) of ``u = (β/λ)(1 − decay)``, one decay per step count.

    GD's k steps and Newton's are of this form (decay ``(1 − η c λ)^k`` and
    ``(1 − α λ²)^(2^k)``). The prediction ``Σ_i u_i q_i`` (``q = Vᵀ x_t``) is
    ``Σ_i g_i − Σ_i g_i decay_i`` with ``g = (β/λ) q``: one exponential per step count and
    one batched product per stack of them. ``decays_of(stats)`` yields the decays of a block
    of sequences (see `by_blocks`) in step order, as stacks of consecutive ones
    ``[..., k, n_dims]`` broadcasting to ``[batch, pos, k, n_dims]`` (`power_decays`;
    `one_by_one` for single decays). In float64 on the scaled data, as `collect` returns
    them.
    """
    def run(block: PrefixStats) -> tuple[Tensor, Tensor | None]:
        base, g, total = spectral_terms(block)
        lead, d = g.shape[:-1], g.shape[-1]
        rows = math.prod(lead)
        per = max(1, STACK_BYTES // max(1, g.numel() * g.element_size()))
        preds, coefs = [], []
        for stack in decays_of(block):
            for lo in range(0, stack.shape[-2], per):  # a broadcast stack's copy bounded
                part = stack[..., lo:lo + per, :]
                k = part.shape[-2]
                part = part.expand(*lead, k, d)
                # each row's dot products with the stack's decays, as `rowdot` sums them
                dots = torch.bmm(part.reshape(rows, k, d), g.reshape(rows, d, 1))
                preds.append((total[..., None] - dots.view(*lead, k)).movedim(-1, 0))
                if want_weights:
                    coefs.append((base[..., None, :] * part.neg().add_(1.0)).movedim(-2, 0))
        weights = from_eigenbasis(block, torch.cat(coefs)) if want_weights else None
        return torch.cat(preds), weights

    return by_blocks(stats, run)
