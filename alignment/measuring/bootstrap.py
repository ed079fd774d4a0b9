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
replicates each, as tests/test_bootstrap.py draws them) the two together cover it 94.8% of
the time at n = 16 normal draws, 92.4% at 16 exponential ones, 95.0% at 64 exponential and
94.7% at 512 normal, where torch.quantile's plain percentiles cover 90.3%, 87.9%, 93.5% and
93.7%. Below n = 8 at 200 replicates (n = 11 at 100) the widened level lies beyond the
replicates (α'/2 < 1/(B + 1)) and the interval is their range, which covers less: 92.7% at
n = 6, 82.8% at 4, 74.1% at 3 normal draws. What the
intervals of `align`'s tables cover is measured in docs/protocols.md ("How far the
intervals hold").
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from iclprobe._text import percent

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


#: beyond this many replicates `few_resamples_note` asks for more sequences, not resamples
MOST_RESAMPLES_ASKED = 2000


def fewest_resamples(confidence: float, n: int) -> int:
    """The fewest replicates B whose expanded percentile interval lies within them.

    Its lower end is the ``(B + 1)·α'/2``-th order statistic (`levels`, `quantiles`): below
    ``B = ⌈2/α'⌉ − 1`` it falls before the first, and the interval is the replicates' range,
    narrower than asked and moving with B (39 plain at 95%; 72 at 16 sequences). Past
    `MOST_RESAMPLES_ASKED` (over a handful of sequences: 14,632,424 at 3 and 95%; at 2 and
    99% α' underflows to 0) it returns ``MOST_RESAMPLES_ASKED + 1``: more than any asks.
    """
    low = levels(confidence, n)[0]
    if low * (MOST_RESAMPLES_ASKED + 1) < 1.0:
        return MOST_RESAMPLES_ASKED + 1
    return max(math.ceil(1.0 / low - 1e-9) - 1, 1)


def few_resamples_note(n_boot: int, confidence: float, n: int, what: str, flag: str
                       ) -> str | None:
    """A line for the result where ``n_boot`` replicates are too few (`fewest_resamples`).

    ``what``: the intervals over those ``n`` sequences ("the weight metrics'"); ``flag``:
    the option that sets ``n``. Over a handful of sequences no sensible B reaches the
    expanded level: the line then asks for sequences.
    """
    fewest = fewest_resamples(confidence, n)
    if n_boot >= fewest:
        return None
    level = percent(confidence)
    need = f"more than {MOST_RESAMPLES_ASKED}" if fewest > MOST_RESAMPLES_ASKED else fewest
    head = (f"n_boot={n_boot} bootstrap resamples are too few for {what} {level} intervals "
            f"over {n} sequences ({flag}; they need {need}): each is the resamples' range, "
            f"narrower than {level}")
    if fewest > MOST_RESAMPLES_ASKED:
        return head + f"; more sequences need fewer resamples ({flag})"
    return head + f", and moves with n_boot; pass n_boot >= {fewest} (--n-boot)"


def quantiles(boot: Tensor, probs: Sequence[float | Tensor], skip_nan: bool = False
              ) -> Tensor:
    """``[len(probs), ...]``: each ``(B + 1)·p``-th order statistic of ``boot [..., B]``.

    Interpolated linearly between neighbours, the first and last order statistics beyond
    them (type 6; numpy's ``quantile(..., method="weibull")``, but where a neighbour is
    infinite the infinite one where it weighs at all, not NaN). A p may be a tensor of one
    level per row (``boot.shape[:-1]``). A row with a NaN gives NaN, as
    ``torch.quantile``; ``skip_nan``: over each row's other replicates (B their count; NaN
    where none is left).
    """
    nan = torch.isnan(boot)
    ordered = torch.where(nan, math.inf, boot).sort(-1).values if skip_nan else \
        boot.sort(-1).values
    count = ((~nan).sum(-1, keepdim=True) if skip_nan else
             torch.full(boot.shape[:-1] + (1,), boot.shape[-1])).to(torch.float64)
    last = (count - 1).clamp(min=0)
    out = []
    for p in probs:
        level = p[..., None].to(torch.float64) if isinstance(p, Tensor) else p
        rank = torch.minimum((level * (count + 1) - 1).clamp(min=0), last)  # 0-based
        below = rank.floor()
        weight = (rank - below).to(boot.dtype)
        low = ordered.gather(-1, below.long())
        high = ordered.gather(-1, torch.minimum(below + 1, last).long())
        value = torch.lerp(low, high, weight)
        value = torch.where(torch.isinf(high) & (weight > 0), high, value)
        value = torch.where(torch.isinf(low) | (weight == 0), low, value)[..., 0]
        if skip_nan:
            value = torch.where(count[..., 0] > 0, value, math.nan)
        else:
            value = torch.where(nan.any(-1), math.nan, value)
        out.append(value)
    return torch.stack(out)


def interval(boot: Tensor, confidence: float, n: int | Tensor, skip_nan: bool = False
             ) -> tuple[Tensor, Tensor]:
    """The expanded percentile interval of replicates ``[..., boot]`` over ``n`` sequences.

    ``n``: the sequences the replicates resample, or per row of ``boot`` the number that
    count (a ratio's sequences with a nonzero denominator, say).
    """
    if isinstance(n, Tensor):
        low = torch.tensor([levels(confidence, int(k))[0] for k in n.flatten().tolist()],
                           dtype=torch.float64).reshape(n.shape)
        lower, upper = quantiles(boot, (low, 1.0 - low), skip_nan)
    else:
        lower, upper = quantiles(boot, levels(confidence, n), skip_nan)
    return lower, upper


def lower_end(boot: Tensor, confidence: float, n: int) -> Tensor:
    """`interval`'s lower end alone (the bound a paired difference is read by)."""
    return quantiles(boot, levels(confidence, n)[:1])[0]
