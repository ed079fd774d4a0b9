"""One screen of answer: what ``iclprobe align`` prints by default.

A short header (model, protocol, data, window, readout); per live layer the matched steps
of the main learners and the verdicts — the fitted view's first (Newton and GD with their
step sizes fitted: the view with the fewest false attributions on the known-answer
benchmark), the protocol's beside it where the width allows; the layers that compute
nothing in one row; one sentence per learner pair; the step-growth fits. At most
`MAX_LINES` lines of at most `WIDTH` columns for a model of up to `MAX_ROWS` live layers:
a deeper model collapses runs of consecutive layers with the same verdicts into one row
("5–11", steps shown first–last); the legends and fits are dropped where they do not fit.
The full tables are `tables.text_table`'s (``--verbose``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from iclprobe._text import WIDTH, wrap
from iclprobe.alignment.comparison import PairVerdict, layer_ranges
from iclprobe.alignment.measuring.matching import GROWTH_WORDS, growth_verdict
from iclprobe.alignment.metrics import metric_info
from iclprobe.alignment.output.tables import (
    MAIN_PAIR,
    display_runs,
    level,
    main_pair,
    nice_float,
    step_legend,
    where,
)

if TYPE_CHECKING:
    from iclprobe.alignment.result import AlignResult

MAX_LINES = 40
MAX_ROWS = 12  # live rows before runs of layers with the same verdicts collapse
DEAD_WORDS = {"computes nothing": "error not below the zero predictor's",
              "matches no learner": "computes, but no learner run beats the zero predictor",
              "not live": "no learner run beats the zero predictor"}


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of the layer table."""

    group: str  # the heading over the columns of one group
    head: str
    cell: Callable[[Sequence[int]], str]  # the cell of a row of these layers
    labels: list[str] | None = None  # a verdict column's labels per layer (rows collapse on)
    view: str = ""  # "answer", "verdict", "fitted", "protocol", "spectral" ("": steps)


def verdict_columns(result: AlignResult) -> list[Column]:
    """Newton vs GD per layer, most trusted first.

    The verdict, each metric's fitted view, the spectral view's filter order, each
    metric's protocol view.
    """
    def labelled(group: str, head: str, labels: list[str], view: str) -> Column:
        return Column(group, head, lambda layers: labels[layers[0]], labels, view)

    a, b = MAIN_PAIR
    cols = []
    if result.answer is not None:
        shorts = [x.short for x in result.answer.layers]
        cols.append(Column("what it runs", "answer",
                           lambda layers: _first_last([shorts[i] for i in layers]),
                           [x.key for x in result.answer.layers], "answer"))
    cols += [labelled(f"{a} vs {b}", "verdict", result.verdict, "verdict")] \
        if result.verdict else []
    cols += [labelled("fitted view", short_metric(m), p.verdicts, "fitted")
             for m, p in result.fitted.items()]
    spec = result.spectral
    if spec is not None and any(p is not None for p in spec.order):
        orders = ["—" if p is None or r.startswith("too few") else f"{p:.2f}"
                  for p, r in zip(spec.order, spec.reading)]  # no order without its interval
        cols.append(Column("spectral", "order p",
                           lambda layers: _first_last([orders[i] for i in layers]),
                           view="spectral"))
    for metric in result.comparisons:
        pair = main_pair(result, metric)
        if pair is not None:
            group = "protocol view" if (pair.a, pair.b) == MAIN_PAIR else \
                f"{pair.a} vs {pair.b} (protocol)"
            cols.append(labelled(group, short_metric(metric), pair.verdicts, "protocol"))
    return cols


def short_metric(metric: str) -> str:
    """A metric's label for a column heading ("error cos.")."""
    return metric_info(metric).label.replace("cosine", "cos.")


@dataclasses.dataclass
class Row:
    """One row of the layer table: its layers, and cells (live) or a spanning text (dead)."""

    layers: list[int]
    cells: list[str]
    span: str | None = None


#: an answer's text ending in its step count: (before, step, after)
_STEP = re.compile(r"(.*step )(\d+)(\)?)")


def _first_last(texts: Sequence[str]) -> str:
    """``"a–b"`` of the ends, or one text with its steps' range ("gd (1/λmax, step 1–11)")."""
    first, last = (_STEP.fullmatch(t) for t in (texts[0], texts[-1]))
    if first and last and (first[1], first[3]) == (last[1], last[3]) and first[2] != last[2]:
        return f"{first[1]}{first[2]}–{last[2]}{first[3]}"
    return texts[0] if len(set(texts)) == 1 else f"{texts[0]}–{texts[-1]}"


def _steps(result: AlignResult, run: str, layers: Sequence[int]) -> str:
    """The matched step of ``run`` per metric ("2/3"), first–last over ``layers``; † not live."""
    parts = []
    for metric in result.comparisons:
        m, sim = result.matches[run].get(metric), result.similarities[run].get(metric)
        if m is None or sim is None:
            parts.append("-")
            continue
        shown = [sim.column_label(m.best_column[i]) + ("" if m.above_zero[i] else "†")
                 for i in layers]
        parts.append(_first_last(shown))
    return "/".join(parts)


def step_columns(result: AlignResult) -> list[Column]:
    """The matched steps of the main learners."""
    return [Column("matched step", run, functools.partial(_steps, result, run))
            for run in display_runs(result)]


def dead_labels(result: AlignResult) -> list[str]:
    """Per layer, the verdict's word for a layer that is not live."""
    pairs = [*result.fitted.values(), *(p for c in result.comparisons.values() for p in c.pairs)]
    return (result.verdict or (pairs[0].verdicts if pairs else [])) or \
        ["not live"] * (result.n_layers + 1)


def layer_rows(result: AlignResult, columns: Sequence[Column], collapse: bool) -> list[Row]:
    """The table's rows: live layers (runs of equal verdicts when ``collapse``), dead ones merged."""
    keyed = [c.labels for c in columns if c.labels is not None]
    groups: list[list[int]] = []
    for layer in (i for i in range(result.n_layers + 1) if result.live[i]):
        if collapse and groups and groups[-1][-1] == layer - 1 and \
                all(labels[layer] == labels[groups[-1][0]] for labels in keyed):
            groups[-1].append(layer)
        else:
            groups.append([layer])
    rows = [Row(layers, [_first_last([nice_float(result.layer_error[i]) for i in layers])]
                + [c.cell(layers) for c in columns]) for layers in groups]
    dead: dict[str, list[int]] = {}
    labels = dead_labels(result)
    for layer in range(result.n_layers + 1):
        if not result.live[layer]:
            dead.setdefault(labels[layer], []).append(layer)
    for label, layers in dead.items():
        errors = sorted(result.layer_error[i] for i in layers)
        error = _first_last([nice_float(errors[0]), nice_float(errors[-1])])
        words = f" ({DEAD_WORDS[label]})" if label in DEAD_WORDS else ""
        rows.append(Row(layers, [], f"{label}{words}, error {error}"))
    return sorted(rows, key=lambda r: r.layers[0])


def render_table(columns: Sequence[Column], rows: Sequence[Row]) -> list[str]:
    """Rows under a two-line heading (groups over the columns they span)."""
    groups: list[tuple[str, list[str]]] = [("", ["layer", "error"])]
    for col in columns:
        if groups[-1][0] == col.group:
            groups[-1][1].append(col.head)
        else:
            groups.append((col.group, [col.head]))
    heads = [h for _, hs in groups for h in hs]
    body = [[layer_ranges(r.layers), *r.cells] for r in rows]
    widths = [max([len(h)] + [len(b[i]) for b in body if i < len(b)]) for i, h in enumerate(heads)]
    top, k = [], 0
    for label, hs in groups:  # widen a group's last column until its label fits above it
        span = sum(widths[k:k + len(hs)]) + 2 * (len(hs) - 1)
        widths[k + len(hs) - 1] += max(0, len(label) - span)
        top.append(label.ljust(sum(widths[k:k + len(hs)]) + 2 * (len(hs) - 1)))
        k += len(hs)
    lines = ["  ".join(top).rstrip(),
             "  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip()]
    for row, cells in zip(rows, body):
        if row.span is not None:
            cells = [cells[0], row.span]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths + [0])).rstrip())
    return lines


def layer_table(result: AlignResult) -> tuple[list[str], list[Column]]:
    """The per-layer table within `WIDTH` columns and `MAX_ROWS` live rows, its columns.

    With more than `MAX_ROWS` live layers, runs of layers with the same verdicts collapse.
    Columns are dropped from the least trusted (the protocol view of the last metric)
    until the table fits; what still does not fit is cut, with a line saying so.
    """
    steps, columns = step_columns(result), verdict_columns(result)
    collapse = sum(result.live) > MAX_ROWS
    steps_by = "/".join(short_metric(m) for m in result.comparisons)
    while True:
        rows = layer_rows(result, steps + columns, collapse)
        lines = render_table(steps + columns, rows)
        n_live = sum(r.span is None for r in rows)
        if (max(map(len, lines)) <= WIDTH and n_live <= MAX_ROWS) or len(columns) <= 1:
            break
        columns = columns[:-1]
    views = [c for c in columns if c.view != "answer"]  # the columns kept say the title
    title = wrap([f"per layer: error, matched steps by {steps_by} († = not above the zero "
                  "predictor)" + (", what it runs" if len(views) < len(columns) else "")
                  + (f" and {' vs '.join(MAIN_PAIR)}: the verdict and its views" if views
                     else "")])
    cut = [line[:WIDTH - 1] + "…" if len(line) > WIDTH else line for line in lines]
    if n_live <= MAX_ROWS:
        return title + cut, columns
    kept, shown = [], 0
    for row, line in zip(rows, cut[2:]):
        shown += row.span is None
        if shown < MAX_ROWS:
            kept.append(line)
    more = f"… {len(rows) - len(kept)} more rows: --verbose shows every layer"
    return title + cut[:2] + kept + [more], columns


def pair_sentence(pairs: Sequence[PairVerdict], live: Sequence[bool], fitted: bool,
                  protocol: str = "") -> str:
    """One learner pair's live verdicts over its metrics, in words; metrics that agree merge.

    The view is named: "(step sizes fitted)", or "(protocol NAME)": each run at its
    protocol's hyperparameters (a model's claim at its own).
    """
    a, b = pairs[0].a, pairs[0].b
    by_labels: dict[str, list[str]] = {}
    for pair in pairs:
        kinds: dict[str, list[int]] = {}
        for layer, label in enumerate(pair.verdicts):
            if live[layer]:
                kinds.setdefault(label, []).append(layer)
        words = "; ".join(f"{label} at {layer_ranges(layers)}" for label, layers in
                          sorted(kinds.items(), key=lambda kv: kv[1][0]))
        by_labels.setdefault(words or "no live layer", []).append(metric_info(pair.metric).label)
    how = " (step sizes fitted)" if fitted else \
        (f" (protocol {protocol})" if protocol else "")
    clauses = [f"by {' and '.join(metrics)}: {words}" for words, metrics in by_labels.items()]
    return f"{a} vs {b}{how} " + "; ".join(clauses) + "."


def named(label: str) -> str | None:
    """The learner a verdict label names ("prefers X", "leans X"), else None."""
    return label.split(" ", 1)[1] if label.startswith(("prefers ", "leans ")) else None


def disagreements(result: AlignResult, pairs: Sequence[PairVerdict]) -> list[int]:
    """Live layers where a protocol pair names another learner than the verdict does."""
    verdict = result.verdict
    if not verdict or not pairs or {pairs[0].a, pairs[0].b} != set(result.verdict_learners):
        return []
    return [layer for layer, said in enumerate(verdict)
            if result.live[layer] and (mine := named(said)) is not None
            and any((theirs := named(p.verdicts[layer])) is not None and theirs != mine
                    for p in pairs)]


def sentences(result: AlignResult) -> list[str]:
    """The verdict in words, then one sentence per learner pair, then the spectral view.

    The pairs: the fitted view's first, then the protocol's.
    """
    out = [result.answer.sentence(result.live)] if result.answer is not None else []
    out += [result.verdict_sentence] if result.verdict_sentence else []
    if result.fitted:
        out.append(pair_sentence(list(result.fitted.values()), result.live, True))
    by_pair: dict[tuple[str, str], list[PairVerdict]] = {}
    for comp in result.comparisons.values():
        for pair in comp.pairs:
            by_pair.setdefault((pair.a, pair.b), []).append(pair)
    for pairs in by_pair.values():
        line = pair_sentence(pairs, result.live, False, str(result.protocol["name"]))
        conflict = disagreements(result, pairs)
        if conflict:
            line = line[:-1] + (f" (the protocol's fixed-step view; it names another learner "
                                f"than the verdict at {layer_ranges(conflict)}).")
        out.append(line)
    spec = result.spectral
    if spec is not None:
        kinds: dict[str, list[int]] = {}
        for layer, reading in enumerate(spec.reading):
            if result.live[layer]:
                kinds.setdefault(reading, []).append(layer)
        if kinds:
            out.append(f"spectral view (t >= {spec.t_min}; not a ground of the verdict): "
                       + "; ".join(f"{r} at {layer_ranges(ls)}" for r, ls in kinds.items())
                       + ".")
    return out


LEGEND = {"prefers": "prefers X = closer to X beyond the {level} interval, and than the other learner "
          "comes to X",
          "leans": "leans X = closer to X, but within the learners' own resemblance",
          "indistinguishable": "indistinguishable = no difference beyond the interval"}
VIEWS = {"answer": "answer = the candidate the layer runs (≈: cannot tell among them)",
         "verdict": "verdict = the fitted view's metrics combined",
         "fitted": "fitted view = learners matched over their step sizes too",
         "spectral": "order p = spectral filter order (GD 1, Newton 2)",
         "protocol": "protocol view = at the protocol's step sizes"}


def legend(result: AlignResult, views: Sequence[str]) -> list[str]:
    """What the views shown and the verdict words of live layers mean."""
    pairs = [*result.fitted.values(), *(p for c in result.comparisons.values() for p in c.pairs)]
    labels = {p.verdicts[i] for p in pairs for i, alive in enumerate(result.live) if alive}
    labels |= {v for v, alive in zip(result.verdict, result.live) if alive}
    used = [text.format(level=level(result)) for word, text in LEGEND.items()
            if any(v.startswith(word) for v in labels)]
    views = [VIEWS[v] for v in dict.fromkeys(views) if v in VIEWS]
    return ["; ".join(views) + "." if views else "", "; ".join(used) + "." if used else ""]


def growth(result: AlignResult, metric: str) -> list[str]:
    """Per main learner: the linear and log₂ step-vs-layer fits and the better one.

    Learners without a fit for the same reason share one line.
    """
    lines: list[str] = []
    undefined: dict[str, list[str]] = {}
    by = short_metric(metric)
    for run in dict.fromkeys([*MAIN_PAIR, *display_runs(result)]):
        m = result.matches.get(run, {}).get(metric)
        if m is None:
            continue
        lin, log = m.fits["linear"], m.fits["log2"]
        if not lin.defined and not log.defined:
            undefined.setdefault(lin.reason or "", []).append(run)
            continue
        fits = [f for f in (lin, log) if f.defined]
        parts = [f"{'log₂ step' if f.log2 else 'step'} slope {f.slope:.2f} R² {f.r2:.2f}"
                 for f in fits]
        verdict = GROWTH_WORDS.get(growth_verdict(lin, log, m.grid_bias), "")
        lines.append(f"{run} ({by}, layers {layer_ranges(fits[0].layers)}): " + ", ".join(parts)
                     + (f" → {verdict}" if verdict else ""))
    lines += [f"{', '.join(runs)} ({by}): no step-growth fit ({why})"
              for why, runs in undefined.items()]
    return lines


def header(result: AlignResult) -> list[str]:
    """Model, protocol, data, window and readout."""
    task = result.task
    cov = task.get("cov") if isinstance(task.get("cov"), str) else "given"
    return [f"{result.name}: protocol {result.protocol['name']}, data d = {task['n_dims']}, "
            f"{task['n_points']} points, {cov} Σ; {where(result)}",
            f"layers read by {result.readout}"]


def screen(result: AlignResult, reserve: int = 0) -> str:
    """What ``iclprobe align`` prints by default for one model (see the module doc).

    Within `MAX_LINES` (less ``reserve``: lines the caller prints right after it, such as a
    PQ model's note on its A_l), the other metrics' growth lines, the legend, the notes
    (then counted on the last line) and the first metric's growth lines go first, then the
    last sentences.
    """
    limit = MAX_LINES - reserve
    head = wrap(header(result))
    more = "--verbose shows the full tables: the answer by metric, learners, calibration"
    if result.meaningless:  # no tables to show: --verbose prints this line too
        return "\n".join(head + wrap([f"no alignment: {result.meaningless}"]))
    metrics = list(result.comparisons)
    table, columns = layer_table(result)
    parts = {"table": table, "legend": wrap(legend(result, [c.view for c in columns])),
             "steps": wrap([f"{line}." for line in step_legend(result)]),
             "sentences": wrap(sentences(result)),
             "growth": wrap(growth(result, metrics[0])) if metrics else [],
             "growth_more": wrap([g for m in metrics[1:] for g in growth(result, m)]),
             "notes": wrap([f"note: {n}" for n in result.notes])}
    for drop in ("growth_more", "steps", "legend", "notes", "growth", None):
        paragraphs = [parts["table"], parts["steps"] + parts["legend"] + parts["sentences"],
                      parts["growth"] + parts["growth_more"] + parts["notes"]]
        lines = head + [x for p in paragraphs if p for x in ["", *p]] + ["", more]
        if len(lines) <= limit or drop is None:
            break
        if drop == "notes" and parts["notes"]:
            more += f" (and {len(result.notes)} note{'s' if len(result.notes) != 1 else ''})"
        parts[drop] = []
    if len(lines) > limit:
        lines = lines[:limit - 2] + ["…", more]
    return "\n".join(lines)


def screens(results: Sequence[AlignResult]) -> str:
    """`screen` of each model, one after the other."""
    return "\n\n".join(screen(r) for r in results)
