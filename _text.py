"""Plain-text layout shared by the command line and the screens (no torch import).

What ``iclprobe`` prints fits `WIDTH` columns: `wrap` breaks sentences there,
continuations indented; `aligned` lays a table out in blocks of the columns that fit
beside each other (``align --verbose``'s full tables: a column per candidate learner and
per difference), its headings wrapped where that saves a block, a cell wider than a
block's room wrapped.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

#: the widest line any command prints
WIDTH = 100


def wrap(lines: Sequence[str], indent: str = "  ", width: int = WIDTH,
         whole_words: bool = False) -> list[str]:
    """Each line wrapped to ``width`` columns, continuations indented (empty lines dropped).

    ``whole_words``: a word longer than a line (a path) is not cut, so it can be copied.
    """
    out = []
    for line in lines:
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=not whole_words)
    return out


def percent(confidence: float) -> str:
    """A confidence level as printed: 0.95 -> "95%", 0.975 -> "97.5%"."""
    return f"{100 * confidence:g}%"


def grid_text(steps: Sequence[int]) -> str:
    """A step grid in few words: "0–24", "1, 2, 4, …, 4096", or its steps (their count past 6).

    Only a run of consecutive steps or of doublings is abbreviated to its ends: any other
    grid's gaps are its own ("0, 1, 2, …, 16 (9 steps)").
    """
    steps = list(steps)
    if not steps:
        return "none"
    if len(steps) > 2 and steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}–{steps[-1]}"
    doubling = steps[0] > 0 and all(b == 2 * a for a, b in zip(steps, steps[1:]))
    if len(steps) > 4 and doubling:
        return f"{', '.join(map(str, steps[:3]))}, …, {steps[-1]}"
    if len(steps) > 6:
        return f"{', '.join(map(str, steps[:3]))}, …, {steps[-1]} ({len(steps)} steps)"
    return ", ".join(map(str, steps))


def aligned(header: Sequence[str], body: Sequence[Sequence[str]], right: bool = True,
            narrow: bool = False) -> list[str]:
    """Rows as aligned plain text within `WIDTH` columns.

    A table that fits is one block. Otherwise columns that do not fit beside the ones
    before them go in further blocks, after an empty line, each block with the first column
    (the layer); with ``narrow``, headings wrap over lines (each column as wide as its cells
    or its longest word) where that saves a block. A cell wider than the room beside the
    first column wraps over lines of its row.
    """
    rows = [list(header), *map(list, body)]
    widths = _capped([max(len(row[i]) for row in rows) for i in range(len(header))])
    if narrow:
        words = _capped([max([len(w) for w in h.split()] + [len(row[i]) for row in rows[1:]],
                             default=0) for i, h in enumerate(header)])
        if len(_blocks(words)) < len(_blocks(widths)):  # natural on a tie
            widths = _widened(words, widths)
    pad = str.rjust if right else str.ljust
    lines: list[str] = []
    for cols in _blocks(widths) or [[]]:
        lines += [""] if lines else []
        shown = [0, *cols] if header else []
        for row in rows:
            cells = [[row[i]] if len(row[i]) <= widths[i] else wrap([row[i]], "", widths[i])
                     for i in shown]
            for k in range(max(map(len, cells), default=1)):
                lines.append("  ".join(pad(cell[k] if k < len(cell) else "", widths[i])
                                       for cell, i in zip(cells, shown)).rstrip())
    return lines


def _capped(widths: list[int]) -> list[int]:
    """Column widths, each after the first within the room beside the first."""
    room = max(WIDTH - widths[0] - 2, 10) if widths else WIDTH
    return widths[:1] + [min(w, room) for w in widths[1:]]


def _widened(narrow: list[int], natural: list[int]) -> list[int]:
    """``narrow``'s widths with each block's spare room given back.

    A column at a time to the one furthest from its natural width, so that the headings
    share the room and stand as few lines tall as it allows.
    """
    out = list(narrow)
    for block in _blocks(narrow):
        spare = WIDTH - sum(narrow[i] + 2 for i in [0, *block]) + 2
        while spare > 0:
            short = max(block, key=lambda i: natural[i] - out[i])
            if natural[short] <= out[short]:
                break
            out[short], spare = out[short] + 1, spare - 1
    return out


def _blocks(widths: Sequence[int]) -> list[list[int]]:
    """The columns after the first, in order, in blocks that fit `WIDTH` beside it."""
    blocks: list[list[int]] = []
    for col in range(1, len(widths)):
        used = sum(widths[i] + 2 for i in [0, *blocks[-1]]) if blocks else WIDTH + 1
        if used + widths[col] > WIDTH:
            blocks.append([])
        blocks[-1].append(col)
    return blocks
