"""The report folder: report.md, summary.json, one CSV per table, PNG plots.

`write_report` writes into the folder it is given (callers that replace an old report
write into a temporary folder and swap it in whole).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iclprobe.alignment import plots
from iclprobe.alignment import tables as T
from iclprobe.alignment.metrics import metric_info
from iclprobe.alignment.pipeline import AlignResult
from iclprobe.alignment.tables import nice_float
from iclprobe.storage import write_text_atomic

__all__ = ["markdown_table", "write_report"]

GLOSSARY = """\
How to read the tables:

- **layer**: 0 is the embedded input, l the output of block l.
- **norm. error**: the layer's mean squared error against the true y, divided by d, over
  the positions in the window (the zero predictor scores about 1 on standard data).
- **step**: the learner step whose predictions (error cosine) or induced weights (weight
  cosine) are most similar to the layer's — the first maximum; **ties** lists steps within
  the protocol's tolerance of it.
- **sim** / **error cosine**: per sequence, the cosine between the layer's residuals
  (prediction − y) and the learner's over the window, averaged over sequences (Fu et
  al.'s Def. 3.1). For a model evaluated at one context length it is the cosine across
  sequences at that t. **weight cosine**: the cosine between the induced weight vectors
  (least squares on fresh queries), averaged over sequences and t (Def. 3.2).
- **†** / **live**: a best match whose bootstrap bound does not beat the zero predictor's
  similarity with the same step is marked † — a layer that computes nothing resembles any
  learner's first tiny step. A layer is live when some learner's match clears the zero
  predictor; fits use only a learner's live matches. Tables of other metrics (weight
  cosine, ...) take † from the error cosine: their zero reference (a cosine with the zero
  vector is 0) says nothing of a layer.
- **zero-pred. sim**: the similarity of the zero predictor with the matched step.
- **learner table**: each learner's best similarity over its steps with a 95% bootstrap
  interval over sequences (the best step re-picked in every replicate), and paired
  differences A − B with intervals.
- **calibration**: "B ~ that A step" is the best similarity any step of B reaches with
  the A step matched at that layer. If B imitates the A step at least as well as the
  layer does, the metric cannot attribute the layer to A ("closer to A but within the
  learners' own resemblance"); "prefers A" needs both a difference above 0 beyond its
  interval and a layer closer to its A step than any B step is. "Computes nothing": no
  learner run beats the zero predictor and neither does the layer's own error; "predicts,
  but no learner run matches it": its error is below 0.9 × the zero predictor's, yet none
  of the learners chosen matches it better than the zero predictor does.
"""


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in body]
    return "\n".join(out)


def _csv(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(body)
    return buf.getvalue()


def _model_section(out: Path, res: AlignResult, slug: str) -> list[str]:
    cov = res.task["cov"] if isinstance(res.task["cov"], str) else "given"
    md = [f"## {res.name}", "",
          f"Task: d = {res.task['n_dims']}, {res.task['n_points']} points, covariance {cov}. "
          f"Protocol **{res.protocol['name']}** ({res.protocol['summary']}); positions "
          f"{T.where(res)}; layers read by {res.readout}.", ""]
    md += [f"- {n}" for n in res.notes] + ([""] if res.notes else [])
    if res.meaningless:
        png = plots.error_curves(res, out / f"error_{slug}.png")
        return md + [f"**No alignment:** {res.meaningless}.", "",
                     f"![error curves]({png.name})", ""]
    for metric in res.comparisons:
        words = metric_info(metric).label
        head, rows = T.matched_csv(res, metric)
        write_text_atomic(out / f"table_{slug}_{metric}.csv", _csv(head, rows))
        head, rows = T.learner_csv(res, metric)
        write_text_atomic(out / f"learners_{slug}_{metric}.csv", _csv(head, rows))
        md += [f"### By {words}", "", f"Best step per layer ([CSV](table_{slug}_{metric}.csv)):",
               "", markdown_table(*T.matched_rows(res, metric)), "",
               f"Learner table ([CSV](learners_{slug}_{metric}.csv)):", "",
               markdown_table(*T.learner_rows(res, metric)), ""]
        for pair in res.comparisons[metric].pairs:
            md += [f"Calibration, {pair.a} vs {pair.b}:", "",
                   markdown_table(*T.calibration_rows(res, pair)), "", f"**{pair.sentence}**",
                   ""]
        if metric in res.fitted:
            md += [T.FITTED_TITLE[0].upper() + T.FITTED_TITLE[1:] + ":", "",
                   markdown_table(*T.fitted_rows(res, metric)), "",
                   f"**{res.fitted[metric].sentence}**", ""]
        md += ["Step growth over live layers:", ""]
        md += [f"- {g}" for g in T.growth_lines(res, metric)] + [""]
        png = plots.learner_comparison(res, metric, out / f"learners_{slug}_{metric}.png")
        md += [f"![learner comparison]({png.name})", "",
               "Left: each learner's best similarity per layer with its 95% interval; "
               "right: the paired differences with intervals (0 = indistinguishable). "
               "Hollow markers: layers not above the zero predictor.", ""]
        panels = [(res.similarities[run][metric], res.matches[run][metric],
                   res.run_labels.get(run, run)) for run in res.step_runs]
        png = plots.similarity_heatmaps(panels, out / f"heatmaps_{slug}_{metric}.png",
                                        f"{res.name}: {words} with each learner")
        md += [f"![{metric} heatmaps]({png.name})", "",
               f"{words.capitalize()} between each layer and each step of "
               + ", ".join(res.step_runs) + " (one panel each); ★ marks each layer's best "
               "match, ✕ a best match no better than the zero predictor's.", ""]
    png = plots.error_curves(res, out / f"error_{slug}.png")
    md += [f"![error curves]({png.name})", "",
           "Normalized error against the number of in-context examples t, one curve per "
           "layer (colour bar), with OLS and each learner at the step that best matches the "
           "last layer. The dotted vertical line marks t = d, where OLS first interpolates.",
           ""]
    if res.separation:
        md += ["Which views separate Newton from GD (the best similarity any GD step reaches "
               "with Newton steps " + ", ".join(map(str, res.separation.views[0].newton_steps))
               + "; lower = better separated):", "",
               markdown_table(["view", "separation (1 − mean)", "GD's resemblance per step"],
                              [[v.view, f"{v.separation:.4f}",
                                ", ".join(f"{x:.3f}" for x in v.resemblance)]
                               for v in res.separation.views]), ""]
    for by in res.similarities.values():
        for metric, sim in by.items():
            write_text_atomic(out / f"similarity_{slug}_{sim.learner}_{metric}.csv", sim.to_csv())
    return md


def write_report(out: str | os.PathLike[str], results: Sequence[AlignResult],
                 pq: Sequence[tuple[str, Any]] = (), title: str = "iclprobe report",
                 command: str = "") -> Path:
    """Write the report folder and return the path of report.md."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = [f"# {title}", ""] + ([f"Produced by `{command}`.", ""] if command else [])
    md += [GLOSSARY, ""]
    summary: dict[str, Any] = {"title": title, "command": command, "models": {}, "pq": {}}
    slugs = [re.sub(r"[^A-Za-z0-9._-]+", "_", r.name) for r in results]
    for res, slug in zip(results, slugs):
        summary["models"][res.name] = res.to_dict()
        md += _model_section(out, res, slug)
    pairs = [(r.name, r.matches["newton"]["error_cosine"]) for r in results
             if not r.meaningless and "error_cosine" in r.matches.get("newton", {})]
    if pairs:
        png = plots.matched_steps(pairs, out / "matched_newton_steps.png")
        md += ["## Matched Newton step against depth", "", f"![matched steps]({png.name})", "",
               "The best-matching Newton step per layer (hollow: not above the zero "
               "predictor) with the least-squares line over the live layers where it is "
               "defined (Fu et al. Fig. 3a): a slope near 1 means one Newton step per layer.",
               ""]
    if len(results) > 1:
        header, body = T.comparison_rows(results)
        write_text_atomic(out / "comparison_newton.csv", _csv(header, body))
        md += ["Side by side (* marks layers whose best Newton step differs):", "",
               markdown_table(header, body), ""]
    if pq:
        md += _pq_section(out, pq, summary)
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1))
    write_text_atomic(out / "report.md", "\n".join(md))
    return out / "report.md"


def _pq_section(out: Path, pq: Sequence[tuple[str, Any]], summary: dict[str, Any]) -> list[str]:
    rows = []
    for name, analysis in pq:
        summary["pq"][name] = analysis.to_dict()
        for layer, (ds, a, di) in enumerate(zip(analysis.dist_to_inv_cov, analysis.scale,
                                                analysis.dist_to_identity)):
            rows.append([name, str(layer + 1), nice_float(ds), nice_float(a), nice_float(di)])
    header = ["model", "layer", "dist(A, Σ⁻¹)", "a_l", "dist(A, I)"]
    write_text_atomic(out / "pq_preconditioners.csv",
                      _csv(["model", "layer", "dist_to_inv_cov", "scale", "dist_to_identity"],
                           rows))
    png = plots.preconditioner_distances(pq, out / "pq_preconditioners.png")
    md = ["## PQ transformers: the learned preconditioners", "", markdown_table(header, rows),
          "", f"![preconditioners]({png.name})", "",
          "Left: how far each layer's A_l is from a multiple of Σ⁻¹ and of I "
          "(min_a ‖A − aM‖_F / ‖A‖_F; 0 = exactly proportional); right: the fitted scales "
          "a_l.", ""]
    for name, analysis in pq:
        if analysis.dist_to_optimum is not None:
            md += [f"{name}: distance of A to Ahn et al.'s optimum (n = "
                   f"{analysis.n_context}) {analysis.dist_to_optimum:.4f}, relative error "
                   f"‖A − A*‖/‖A*‖ = {analysis.rel_error_to_optimum:.4f}.", ""]
    return md
