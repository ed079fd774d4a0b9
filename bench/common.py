"""Timing helpers shared by the benchmarks: medians of alternating repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def alternate(fns: dict[str, Callable[[], object]], repeats: int, inner: int = 1,
              warmup: int = 2) -> dict[str, list[float]]:
    """Time each function ``repeats`` times, alternating between them; seconds per call."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - start) / inner)
    return times


def median_ratio(times: dict[str, list[float]], baseline: str, candidate: str) -> float:
    """Median over repeats of baseline time / candidate time (> 1: candidate is faster)."""
    pairs = zip(times[baseline], times[candidate])
    return statistics.median(b / c for b, c in pairs)
