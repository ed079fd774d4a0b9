"""Wall time per stage of an alignment (the profile ``bench/demo.py`` prints)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class Timings(dict[str, float]):
    """Seconds spent per stage, summed over the times a stage is entered."""

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block and add it to ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - start
