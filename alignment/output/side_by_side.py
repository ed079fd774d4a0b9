"""Several models side by side: per layer, each model's matched step or verdict.

What ``iclprobe compare`` prints after the models' screens (`comparison_lines`, within the
screen's 100 columns) and the report's side-by-side tables (`comparison_rows`,
`side_by_side_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from iclprobe._text import aligned, wrap
from iclprobe.alignment.output.tables import nice_float, protocol_verdict

if TYPE_CHECKING:
    from iclprobe.alignment.result import AlignResult


def comparison_rows(results: Sequence[AlignResult], metric: str = "error_cosine",
                    learner: str = "newton") -> tuple[list[str], list[list[str]]]:
    """Side by side: each model's best step per layer (†: not live); * marks differences."""
    header = ["layer"] + [f"{r.name} step (sim)" for r in results]
    depth = max(r.n_layers for r in results) + 1
    body = []
    for layer in range(depth):
        cells, steps = [str(layer)], set()
        for r in results:
            m = r.matches.get(learner, {}).get(metric)
            if m is None or layer >= len(m.best_step):
                cells.append("-")
                continue
            steps.add(m.best_step[layer])
            mark = "" if m.above_zero[layer] else "†"
            cells.append(f"{m.best_step[layer]}{mark} ({nice_float(m.best_value[layer])})")
        if len(steps) > 1:
            cells[0] += " *"
        body.append(cells)
    fits = ["fit (live layers)"]
    for r in results:
        m = r.matches.get(learner, {}).get(metric)
        fits.append("-" if m is None or m.fit is None else m.fit.describe())
    return header, body + [fits]


def comparison_lines(results: Sequence[AlignResult], learner: str = "newton") -> list[str]:
    """`comparison_rows` as screen lines: the table, then each model's line fit (`Fit.describe`).

    Within `WIDTH` columns (`aligned`): models whose columns do not fit beside each other go in
    further blocks, each with the layer column; the line fits go below (as one cell each they
    widened the table past the screen), wrapped.
    """
    header, body = comparison_rows(results, learner=learner)
    *rows, fits = body
    return aligned(header, rows, right=False) + wrap([f"{res.name}: {fit}" for res, fit
                                                      in zip(results, fits[1:])])


def side_by_side_rows(results: Sequence[AlignResult]) -> tuple[list[str], list[list[str]]]:
    """Per layer, each model's verdict / protocol view ("-" past its depth)."""
    header = ["layer"] + [f"{r.name}: verdict / protocol view" for r in results]
    body = []
    for layer in range(max(r.n_layers for r in results) + 1):
        cells = [str(layer)]
        for res in results:
            proto = protocol_verdict(res)
            views = [labels[layer] for labels in (res.verdict, proto[2] if proto else [])
                     if layer < len(labels)]
            cells.append(" / ".join(views) if views and not res.meaningless else "-")
        body.append(cells)
    return header, body
