"""Tables and the report folder: report.md, summary.json, one CSV per table, PNG plots."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iclprobe.alignment import plots
from iclprobe.alignment.pipeline import AlignResult
from iclprobe.models.io import write_text_atomic

COLUMNS = [("layer", "layer"), ("normalized_error", "norm. error"),
           ("newton_step", "Newton step"), ("newton_sim", "sim"), ("newton_ties", "ties"),
           ("gd_step", "GD step"), ("gd_sim", "sim"), ("gd_ties", "ties"),
           ("newton_zero_sim", "zero-pred. sim (Newton)")]


def _cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key, "")
    if isinstance(value, float):
        return plots.nice_float(value)
    if isinstance(value, list):
        return " ".join(map(str, value)) if len(value) <= 4 else \
            f"{value[0]}..{value[-1]} ({len(value)})"
    return str(value)


def table_rows(result: AlignResult, metric: str) -> tuple[list[str], list[list[str]]]:
    """Header and formatted rows of the per-layer table."""
    rows = result.table(metric)
    cols = [(k, h) for k, h in COLUMNS if any(k in r for r in rows)]
    body = []
    for r in rows:
        cells = [_cell(r, k) for k, _ in cols]
        for learner in ("newton", "gd"):
            key = f"{learner}_step"
            if key in r and not r.get(f"{learner}_above_zero", True):
                cells[[k for k, _ in cols].index(key)] += "†"  # no better than predicting 0
        body.append(cells)
    return [h for _, h in cols], body


def text_table(result: AlignResult, metric: str = "error_cosine") -> str:
    """The per-layer table as aligned plain text (what ``iclprobe align`` prints)."""
    header, body = table_rows(result, metric)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    lines = [f"{result.name} ({metric}; † = not above the zero predictor)",
             "  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in body]
    for learner in ("newton", "gd"):
        fit = result.matches.get(learner, {}).get(metric)
        if fit is not None and fit.fit is not None:
            f = fit.fit
            lines.append(f"{learner} step vs layer over layers {f.layers[0]}..{f.layers[-1]}: "
                         f"slope {f.slope:.2f}{' in log2(step)' if f.log2 else ''}, "
                         f"R² {f.r2:.2f}")
    return "\n".join(lines)


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(out)


def _csv(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(body)
    return buf.getvalue()


def comparison_rows(results: Sequence[AlignResult], metric: str = "error_cosine",
                    learner: str = "newton") -> tuple[list[str], list[list[str]]]:
    """Side by side: each model's best step per layer; differing layers marked with *."""
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
            cells.append(f"{m.best_step[layer]} ({plots.nice_float(m.best_value[layer])})")
        if len(steps) > 1:
            cells[0] += " *"
        body.append(cells)
    fits = ["fit"]
    for r in results:
        fit = r.matches.get(learner, {}).get(metric)
        fits.append("-" if fit is None or fit.fit is None else
                    f"slope {fit.fit.slope:.2f}, R² {fit.fit.r2:.2f}")
    return header, body + [fits]


def write_report(out: str | os.PathLike[str], results: Sequence[AlignResult],
                 pq: Sequence[tuple[str, Any]] = (), title: str = "iclprobe report",
                 command: str = "") -> Path:
    """Write the report folder and return the path of report.md."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = [f"# {title}", ""]
    if command:
        md += [f"Produced by `{command}`.", ""]
    md += ["Each layer's prediction is read out by a ridge probe fitted on fresh sequences "
           "(layer 0 is the embedded input). Similarities compare a layer with every step "
           "count of a reference learner; † marks a best match that is no better than the "
           "zero predictor's similarity with that step (a layer that computes nothing looks "
           "like any learner's first tiny step).", ""]
    summary: dict[str, Any] = {"title": title, "command": command, "models": {}, "pq": {}}
    for res in results:
        slug = res.name.replace("/", "_")
        summary["models"][res.name] = res.to_dict()
        cov = res.task["cov"] if isinstance(res.task["cov"], str) else "given"
        md += [f"## {res.name}", "", f"Task: d = {res.task['n_dims']}, {res.task['n_points']} "
               f"points, covariance {cov}.", ""]
        for metric in next(iter(res.matches.values())):
            header, body = table_rows(res, metric)
            write_text_atomic(out / f"table_{slug}_{metric}.csv", _csv(header, body))
            md += [f"Per-layer alignment by {metric.replace('_', ' ')} "
                   f"([CSV](table_{slug}_{metric}.csv)):", "", markdown_table(header, body), ""]
        png = plots.error_curves(res, out / f"error_{slug}.png")
        md += [f"![error curves]({png.name})", "",
               "Normalized error against the number of in-context examples, one curve per "
               "layer, with OLS and the best step of each learner for reference.", ""]
        for learner, by_metric in res.similarities.items():
            for metric, sim in by_metric.items():
                write_text_atomic(out / f"similarity_{slug}_{learner}_{metric}.csv",
                                  sim.to_csv())
                if learner not in ("newton", "gd"):
                    continue
                png = plots.similarity_heatmap(
                    sim, res.matches[learner][metric],
                    out / f"heatmap_{slug}_{learner}_{metric}.png",
                    f"{res.name}: {metric} with {learner} (★ best step, x: not above zero)")
                md += [f"![{learner} {metric}]({png.name})", "",
                       f"{metric.replace('_', ' ').capitalize()} between each layer and each "
                       f"{learner} step; stars mark each layer's best match.", ""]
    metric = "error_cosine"  # the comparison figure and table use the error cosine
    pairs = [(r.name, r.matches["newton"][metric]) for r in results
             if "newton" in r.matches and metric in r.matches["newton"]]
    if pairs:
        png = plots.matched_steps(pairs, out / "matched_newton_steps.png")
        md += ["## Matched Newton step against depth", "", f"![matched steps]({png.name})",
               "", "The best-matching Newton step per layer with a least-squares line "
               "over layers 1..L (Fu et al. Fig. 3a): a slope near 1 means one Newton "
               "step per layer.", ""]
    if len(results) > 1:
        header, body = comparison_rows(results, metric)
        write_text_atomic(out / "comparison_newton.csv", _csv(header, body))
        md += ["Side by side (* marks layers whose best Newton step differs):", "",
               markdown_table(header, body), ""]
    if pq:
        rows = []
        for name, analysis in pq:
            summary["pq"][name] = analysis.to_dict()
            for layer, (ds, a, di) in enumerate(zip(analysis.dist_to_inv_cov, analysis.scale,
                                                    analysis.dist_to_identity)):
                rows.append([name, str(layer), plots.nice_float(ds), plots.nice_float(a),
                             plots.nice_float(di)])
        header = ["model", "layer", "dist(A, Σ⁻¹)", "a_l", "dist(A, I)"]
        write_text_atomic(out / "pq_preconditioners.csv", _csv(header, rows))
        png = plots.preconditioner_distances(pq, out / "pq_preconditioners.png")
        md += ["## PQ transformers: the learned preconditioners", "", markdown_table(header, rows),
               "", f"![preconditioners]({png.name})", "",
               "Left: how far each layer's A_l is from a multiple of Σ⁻¹ and of I "
               "(0 = exactly proportional); right: the fitted scales a_l.", ""]
        for name, analysis in pq:
            if analysis.dist_to_optimum is not None:
                md += [f"{name}: distance of A to Ahn et al.'s optimum (n = "
                       f"{analysis.n_context}) {analysis.dist_to_optimum:.4f}, relative error "
                       f"‖A − A*‖/‖A*‖ = {analysis.rel_error_to_optimum:.4f}.", ""]
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1))
    write_text_atomic(out / "report.md", "\n".join(md))
    return out / "report.md"
