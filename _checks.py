"""Validators of config and task fields (no heavy imports).

Each names ``Owner.field``, the value and what is allowed. A value of the wrong type (a
string, a bool for a number) is a TypeError; a number out of range, NaN or infinite is a
ValueError.
"""

from __future__ import annotations

import math
from typing import Any

#: Seeds go to ``torch.manual_seed``, which takes 64-bit values; iclprobe's are 0 .. 2^63-1.
SEED_LIMIT = 2**63


def _num(x: float) -> str:
    return f"{x:g}".replace("e+0", "e").replace("e+", "e")


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    if math.isinf(high):
        return f"{'>' if low_open else '>='} {_num(low)}"
    return f"in {'(' if low_open else '['}{_num(low)}, {_num(high)}{')' if high_open else ']'}"


def check_int(owner: str, name: str, value: Any, low: int = 1, high: int | None = None) -> int:
    """An integer (not a bool) with ``low <= value`` (and ``value < high``)."""
    allowed = ("a positive integer" if low == 1 and high is None else
               f"an integer >= {low}" if high is None else f"an integer in [{low}, {high})")
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be {allowed}, got {value!r}")
    if value < low or (high is not None and value >= high):
        raise ValueError(f"{owner}.{name} must be {allowed}, got {value!r}")
    return value


def check_real(owner: str, name: str, value: Any, low: float, high: float = math.inf, *,
               low_open: bool = False, high_open: bool = False) -> float:
    """A finite int or float (not a bool) in the interval from ``low`` to ``high``."""
    allowed = f"a number {_interval(low, high, low_open, high_open)}"
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be {allowed}, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be {allowed}, got {value!r} (not finite)")
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above:
        raise ValueError(f"{owner}.{name} must be {allowed}, got {value!r}")
    return float(value)


def check_seed(owner: str, name: str, value: Any) -> int:
    """A seed for ``torch.manual_seed``: an integer in [0, 2^63)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be an integer seed in [0, 2**63), got {value!r}")
    if not 0 <= value < SEED_LIMIT:
        raise ValueError(f"{owner}.{name} must be an integer seed in [0, 2**63), got {value!r}")
    return value
