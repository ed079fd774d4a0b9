"""Plain-text layout shared by the command line and the screens (no torch import).

What ``iclprobe`` prints fits `WIDTH` columns: `wrap` breaks sentences there,
continuations indented. The one exception is ``align --verbose``'s full tables (a column
per candidate learner and per difference) and their title lines, as wide as they are; its
verdict paragraph wraps.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

#: the widest line any command prints
WIDTH = 100


def wrap(lines: Sequence[str], indent: str = "  ") -> list[str]:
    """Each line wrapped to `WIDTH` columns, continuations indented (empty lines dropped)."""
    out = []
    for line in lines:
        out += textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False)
    return out
