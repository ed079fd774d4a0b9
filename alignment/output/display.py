"""An `AlignResult` in a notebook: a short repr, an HTML table, a pandas DataFrame.

The HTML table is the one ``iclprobe align`` prints (`alignment.output.screen`), every layer and
every verdict column shown; the DataFrame has one row per layer.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from iclprobe.alignment.comparison import layer_ranges
from iclprobe.alignment.metrics import metric_info
from iclprobe.alignment.output.screen import (
    header,
    layer_rows,
    screen,
    sentences,
    step_columns,
    verdict_columns,
)
from iclprobe.alignment.output.tables import main_pair, verdict_runs

if TYPE_CHECKING:
    from iclprobe.alignment.result import AlignResult

__all__ = ["screen", "short_repr", "to_frame", "to_html"]

PANDAS_HINT = ("AlignResult.to_frame needs pandas, which is not installed: pip install pandas "
               "(or pip install 'iclprobe[notebook]')")


def short_repr(result: AlignResult) -> str:
    """One line: the model, its depth, the protocol, the live layers and the verdict."""
    live = [i for i, alive in enumerate(result.live) if alive]
    parts = [f"{result.name!r}", f"{result.n_layers} layers", f"protocol {result.protocol['name']!r}",
             f"metrics {list(result.comparisons)}",
             f"live layers {layer_ranges(live)}" if live else "no live layer"]
    if result.meaningless:
        parts.append("no alignment")
    elif result.verdict:
        parts.append(f"verdict newton vs gd: {verdict_runs(result.verdict)}")
    return f"AlignResult({', '.join(parts)})"


def to_html(result: AlignResult) -> str:
    """The per-layer table (matched steps, verdicts) with the header and the sentences."""
    esc = html.escape
    head = "".join(f"<div>{esc(line)}</div>" for line in header(result))
    if result.meaningless:
        return f"<div>{head}<p><b>No alignment:</b> {esc(result.meaningless)}</p></div>"
    columns = step_columns(result) + verdict_columns(result)
    steps_by = "/".join(metric_info(m).label for m in result.comparisons)
    heads = ["layer", "normalized error"] + [
        f"{c.head} step ({steps_by})" if not c.view else f"{c.group}: {c.head}" for c in columns]
    rows = []
    for row in layer_rows(result, columns, collapse=False):
        cells = [f"<td>{esc(layer_ranges(row.layers))}</td>"]
        if row.span is not None:
            cells.append(f'<td colspan="{len(heads) - 1}">{esc(row.span)}</td>')
        else:
            cells += [f"<td>{esc(c)}</td>" for c in row.cells]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    table = ("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in heads)
             + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    words = "".join(f"<li>{esc(s)}</li>" for s in sentences(result))
    return f"<div>{head}{table}<ul>{words}</ul></div>"


def to_frame(result: AlignResult) -> Any:
    """One row per layer: error, liveness, matched steps and similarities, verdicts.

    Columns: ``normalized_error``, ``live``; what the layer runs among the candidates
    (``answer``: in words, ``answer_kind``, ``answer_learner``: the learner named, the best
    one it cannot be told from, or the nearest; ``answer_column``: its fitted
    hyperparameters and step) and the Newton-vs-GD ``verdict`` (step sizes fitted, metrics
    combined), where computed; per metric M, for each step learner R of the protocol
    ``R_step_M`` and ``R_sim_M``, the fitted view's ``verdict_fitted_M`` and each pair's
    ``verdict_A_vs_B_M``. Index: ``layer``.

    Raises:
        ModuleNotFoundError: pandas is not installed (the message says how to install it).
    """
    try:
        import pandas as pd
    except ImportError as err:
        raise ModuleNotFoundError(PANDAS_HINT, name="pandas") from err
    data: dict[str, list[Any]] = {"normalized_error": list(result.layer_error),
                                  "live": list(result.live)}
    if result.answer is not None:
        said = result.answer.layers
        data.update(answer=[a.text for a in said], answer_kind=[a.kind for a in said],
                    answer_learner=[a.learner for a in said],
                    answer_column=[a.column for a in said])
    if result.verdict:
        data["verdict"] = list(result.verdict)
    for metric, comp in result.comparisons.items():
        for run in result.step_runs:
            match = result.matches[run].get(metric)
            if match is not None:
                data[f"{run}_step_{metric}"] = list(match.best_step)
                data[f"{run}_sim_{metric}"] = list(match.best_value)
        if metric in result.fitted:
            data[f"verdict_fitted_{metric}"] = list(result.fitted[metric].verdicts)
        for pair in comp.pairs:
            data[f"verdict_{pair.a}_vs_{pair.b}_{metric}"] = list(pair.verdicts)
    frame = pd.DataFrame(data, index=pd.RangeIndex(result.n_layers + 1, name="layer"))
    frame.attrs.update(name=result.name, protocol=result.protocol["name"],
                       main_pair={m: (p.a, p.b) for m in result.comparisons
                                  if (p := main_pair(result, m)) is not None})
    return frame
