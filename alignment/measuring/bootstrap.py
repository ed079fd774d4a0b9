"""The bootstrap over sequences: resampling weights, and the intervals read off replicates.

Every interval `align` reports or decides by is an *expanded percentile* interval
(Hesterberg, "What teachers should know about the bootstrap", The American Statistician
69, 2015): the replicates' quantiles at the levels α' where the normal quantile is
``√(n/(n−1)) · t_{n−1}`` at the asked level, for n resampled sequences. The plain
percentile interval is too narrow by about that factor at small n (1.12 × at the 16
weight sequences, 1.003 × at 512). Each quantile is the ``(B + 1)·p``-th order statistic of
the B replicates, interpolated (Hyndman and Fan's type 6, numpy's ``"weibull"``), where
``torch.quantile``'s ``(B − 1)·p + 1`` puts a 95% interval of 200 replicates at their
3.0th and 97.0th percentiles. On 4000 data sets of n draws with a known mean (200
replicates each; tests/test_bootstrap.py) the two together cover it 94.8% of the time at
n = 16 normal draws, 92.4% at 16 exponential ones, 95.0% at 64 and 94.7% at 512, where
torch.quantile's plain percentiles cover 90.3%, 87.9%, 93.5% and 93.7%. What the
intervals of `align`'s tables cover is measured in docs/protocols.md ("How far the
intervals hold").
"""

from __future__ import annotations

import functools
import logging
import math

import torch
from torch import Tensor

logger = logging.getLogger(__name__)


def bootstrap_weights(batch: int, n_boot: int, seed: int) -> Tensor:
    """``[boot, batch]`` resampling weights (each row sums to 1), the same for one seed.

    One sequence is resampled as itself every time: its interval is a point, which is
    said (a warning), since it would read as a certainty.
    """
    if batch == 1:
        logger.warning("a bootstrap over 1 sequence: every resample is that sequence, so its "
                       "interval is a point (lower == upper) and measures no spread; use 2 "
                       "or more sequences (tens for intervals worth reading)")
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(batch, (n_boot, batch), generator=gen)
    counts = torch.zeros(n_boot, batch, dtype=torch.float64)
    return counts.scatter_add_(1, picks, torch.ones(n_boot, batch, dtype=torch.float64)) / batch


@functools.lru_cache(maxsize=64)
def levels(confidence: float, n: int) -> tuple[float, float]:
    """The expanded percentile interval's two levels for ``n`` resampled sequences.

    ``α'/2 = Φ(−√(n/(n−1)) · t_{n−1}(1 − α/2))`` with ``α = 1 − confidence``; for one
    sequence (no spread to widen) the plain ``α/2``.
    """
    half = (1.0 - confidence) / 2.0
    if n < 2:
        return half, 1.0 - half
    from scipy.special import ndtr, stdtrit  # scikit-learn's dependency: always installed

    low = float(ndtr(-math.sqrt(n / (n - 1.0)) * float(stdtrit(n - 1, 1.0 - half))))
    return low, 1.0 - low


def quantiles(boot: Tensor, probs: tuple[float, ...], skip_nan: bool = False) -> Tensor:
    """``[len(probs), ...]``: each ``(B + 1)·p``-th order statistic of ``boot [..., B]``.

    Interpolated linearly between neighbours, the first and last order statistics beyond
    them (type 6; numpy's ``quantile(..., method="weibull")``). A row with a NaN gives NaN,
    as ``torch.quantile``; ``skip_nan``: over each row's other replicates (B their count;
    NaN where none is left).
    """
    nan = torch.isnan(boot)
    ordered = torch.where(nan, math.inf, boot).sort(-1).values if skip_nan else \
        boot.sort(-1).values
    count = ((~nan).sum(-1, keepdim=True) if skip_nan else
             torch.full(boot.shape[:-1] + (1,), boot.shape[-1])).to(torch.float64)
    last = (count - 1).clamp(min=0)
    out = []
    for p in probs:
        rank = torch.minimum((p * (count + 1) - 1).clamp(min=0), last)  # 0-based, fractional
        below = rank.floor()
        above = torch.minimum(below + 1, last)
        low = ordered.gather(-1, below.long())
        high = ordered.gather(-1, above.long())
        value = torch.lerp(low, high, (rank - below).to(boot.dtype))[..., 0]
        value = torch.where(low[..., 0] == high[..., 0], low[..., 0], value)  # ±inf ties
        if skip_nan:
            value = torch.where(count[..., 0] > 0, value, math.nan)
        else:
            value = torch.where(nan.any(-1), math.nan, value)
        out.append(value)
    return torch.stack(out)


def interval(boot: Tensor, confidence: float, n: int, skip_nan: bool = False
             ) -> tuple[Tensor, Tensor]:
    """The expanded percentile interval of replicates ``[..., boot]`` over ``n`` sequences."""
    lower, upper = quantiles(boot, levels(confidence, n), skip_nan)
    return lower, upper


def lower_end(boot: Tensor, confidence: float, n: int) -> Tensor:
    """`interval`'s lower end alone (the bound a paired difference is read by)."""
    return quantiles(boot, levels(confidence, n)[:1])[0]
