"""Wall time per stage of an alignment (the profile ``bench/demo.py`` prints)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

#: the stages an `align` enters, the first of them first (the CLI's progress bar counts them)
FIRST_STAGE = "layer predictions (forward pass, probes)"
N_STAGES = 8


class Timings(dict[str, float]):
    """Seconds spent per stage, summed over the times a stage is entered."""

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block and add it to ``name`` (logged as it starts: the CLI shows it)."""
        logger.info("%s", name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - start
