"""The report folder: report.md and summary.json at the top, a folder per model.

report.md opens with the findings — every model's verdict per layer (the fitted view and
the protocol's), and models compared on the same data side by side — then has a section
per model, the comparisons across models, and the glossary last. Each model's CSV tables,
figures and ``result.json`` lie in its own folder (`report_model`); summary.json holds
every model's full result and the findings.

`write_report` writes into the folder it is given (callers that replace an old report
write into a temporary folder and swap it in whole).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclprobe._checks import check_type
from iclprobe.alignment.output import plots, side_by_side
from iclprobe.alignment.output import tables as T
from iclprobe.alignment.output.drawing import Figures
from iclprobe.alignment.output.report_model import csv_text, folder_names, markdown_table, model_section
from iclprobe.alignment.output.tables import nice_float
from iclprobe.atomic import atomic_directory, writing_here
from iclprobe.errors import InputError, InputTypeError
from iclprobe.storage import write_text_atomic

if TYPE_CHECKING:
    from iclprobe.alignment.result import AlignResult

__all__ = ["markdown_table", "write_report"]

GLOSSARY = """\
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
- **learner table**: each learner's best similarity over its steps with a bootstrap
  interval over sequences (95% unless `--confidence` says otherwise; the best step
  re-picked in every replicate), and paired differences A − B with intervals.
- **calibration**: "B ~ that A step" is the best similarity any step of B reaches with
  the A step matched at that layer. If B imitates the A step at least as well as the
  layer does, the metric cannot attribute the layer to A ("closer to A but within the
  learners' own resemblance"); "prefers A" needs both a difference above 0 beyond its
  interval and a layer closer to its A step than any B step is. "Computes nothing": the
  layer is not live — its normalized error is not below the zero predictor's beyond its
  interval (the one liveness rule of every view); "computes, but no learner run
  matches it": the layer is live, yet none of the learners chosen matches it better than
  the zero predictor does.
"""

FINDINGS = ("What each layer runs (0 = the embedded input, l = block l's output), among "
            "every candidate learner, each matched over its fitted family of step sizes (or "
            "λ, β, ...) and steps: the learner named, \"≈ X, Y\" where the data cannot tell "
            "them apart, \"none (nearest X)\" where the layer is farther from every candidate "
            "than the candidates are from each other (no false attribution on the known-answer "
            "benchmark). Then Newton vs GD: **the verdict** from the fitted view, both learners "
            "over their step sizes, its metrics combined; the **protocol view** matches each "
            "learner at the protocol's step sizes. \"prefers X\": attributable to X; \"leans "
            "X\": closer to X, but within the learners' own resemblance; each model's section "
            "has every metric's tables, and the glossary at the end says more.")


def write_report(out: str | os.PathLike[str], results: Sequence[AlignResult],
                 pq: Sequence[tuple[str, Any]] = (), title: str = "iclprobe report",
                 command: str = "", side_by_side: Sequence[Sequence[str]] = (),
                 overwrite: bool = False, designed: Mapping[str, Any] | None = None) -> Path:
    """Write the report folder and return the path of report.md.

    The folder is written whole or not at all, as ``iclprobe align --out`` writes it: a
    path that holds anything but a report iclprobe wrote is refused, and a report of
    iclprobe's is replaced only with ``overwrite=True`` (`iclprobe.atomic.atomic_directory`).

    Args:
        out: the folder; or the temporary folder an `atomic_directory` of kind "report" of
            this process yields, written into directly (the CLI's).
        results: one per model (unique names).
        pq: ``(name, PreconditionerAnalysis)`` of PQ transformers.
        title: report.md's title.
        command: the command line that made it (quoted in report.md).
        side_by_side: groups of model names shown layer by layer beside each other (e.g.
            softmax against linear attention on the same data).
        overwrite: replace a report iclprobe wrote at ``out``.
        designed: model name -> its `alignment.design.Designed` (``iclprobe align
            --design``): both answers in the findings, the design in summary.json.

    Raises:
        OutputExistsError: ``out`` holds anything that is not a report iclprobe wrote, or
            a report and ``overwrite`` is False.
    """
    _check_out_and_results(out, results)
    by_name = {r.name: r for r in results}
    unknown = [n for group in side_by_side for n in group if n not in by_name]
    if unknown:
        raise InputError(f"side_by_side names models not among the results: {unknown}; "
                         f"the results are {list(by_name)}")
    designed = dict(designed or {})
    if writing_here(out, "report"):
        return _write_files(Path(out), results, pq, title, command, side_by_side, designed)
    with atomic_directory(out, "report", overwrite) as tmp:
        _write_files(tmp, results, pq, title, command, side_by_side, designed)
    return Path(out) / "report.md"


def _check_out_and_results(out: Any, results: Any) -> None:
    """``out`` a path and ``results`` a sequence of `AlignResult` (the order swapped: named).

    An AlignResult is known by the fields a report reads (output/ imports no result at run
    time: its rooms lie below it).
    """
    path = (str, os.PathLike)
    swapped = "; the folder comes first: write_report(out, results)" if isinstance(
        results, path) else ""
    check_type("write_report", "out", out, path, f"a folder path (str or os.PathLike{swapped})")
    if isinstance(results, (str, bytes)) or not isinstance(results, Sequence):
        check_type("write_report", "results", results, list, "a list of AlignResult")
    for i, res in enumerate(results):
        if not all(hasattr(res, field) for field in ("name", "similarities", "answer", "live")):
            raise InputTypeError(f"write_report: results[{i}] must be an AlignResult (one per "
                                 f"model, from align or compare), got {type(res).__name__}")


def _write_files(out: Path, results: Sequence[AlignResult], pq: Sequence[tuple[str, Any]],
                 title: str, command: str, side_by_side: Sequence[Sequence[str]],
                 designed: Mapping[str, Any]) -> Path:
    """The report's files, in ``out``."""
    by_name = {r.name: r for r in results}
    figures = Figures()
    folders = folder_names([r.name for r in results])
    md = [f"# {title}", ""] + ([f"Produced by `{command}`.", ""] if command else [])
    md += _findings(results, [[by_name[n] for n in group] for group in side_by_side])
    for name, done in designed.items():
        md += [f"### {name} on designed data", "", "```text", *done.lines(), "```", ""]
    summary: dict[str, Any] = {"title": title, "command": command,
                               "findings": _findings_json(results, folders), "models": {},
                               "pq": {}}
    records = {name: done.to_dict() for name, done in designed.items()}
    if records:
        summary["designed"] = records
    for res, folder in zip(results, folders):
        summary["models"][res.name] = res.to_dict()
        md += model_section(out, res, folder, figures, records.get(res.name))
    md += _across_models(out, results, figures)
    if pq:
        md += _pq_section(out, pq, summary, figures)
    md += ["## How to read the tables", "", GLOSSARY]
    figures.draw()
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1))
    write_text_atomic(out / "report.md", "\n".join(md))
    return out / "report.md"


def _findings(results: Sequence[AlignResult], groups: Sequence[Sequence[AlignResult]]
              ) -> list[str]:
    md = ["## Findings", "", FINDINGS, "", markdown_table(*T.findings_rows(results)), ""]
    for group in groups:
        md += [f"### Side by side: {', '.join(r.name for r in group)}", "",
               "The verdict at each layer / the protocol view's:", "",
               markdown_table(*side_by_side.side_by_side_rows(group)), ""]
    return md


def _findings_json(results: Sequence[AlignResult], folders: Sequence[str]) -> dict[str, Any]:
    """Per model: its folder and, per metric, the verdicts per layer of both views."""
    out: dict[str, Any] = {}
    for res, folder in zip(results, folders):
        views: dict[str, Any] = {}
        for metric in res.comparisons:
            pair = T.main_pair(res, metric)
            views[metric] = {
                "fitted": res.fitted[metric].verdicts if metric in res.fitted else None,
                "protocol": None if pair is None else
                {"a": pair.a, "b": pair.b, "verdicts": pair.verdicts}}
        proto = T.protocol_verdict(res)
        out[res.name] = {"folder": folder, "meaningless": res.meaningless,
                         "answer": res.answer.texts if res.answer is not None else None,
                         "verdict": res.verdict, "protocol_view": None if proto is None else
                         {"a": proto[0], "b": proto[1], "verdicts": proto[2]},
                         "by_metric": views}
    return out


def _across_models(out: Path, results: Sequence[AlignResult], figures: Figures) -> list[str]:
    md = []
    pairs = [(r.name, r.matches["newton"]["error_cosine"]) for r in results
             if not r.meaningless and "error_cosine" in r.matches.get("newton", {})]
    if pairs:
        png = out / "matched_newton_steps.png"
        figures.add(png, partial(plots.matched_steps, pairs, png))
        md += ["## Matched Newton step against depth", "", f"![matched steps]({png.name})", "",
               "The best-matching Newton step per layer (hollow: not above the zero "
               "predictor) with the least-squares line over the live layers where it is "
               "defined (Fu et al. Fig. 3a): a slope near 1 means one Newton step per layer.",
               ""]
    if len(results) > 1:
        header, body = side_by_side.comparison_rows(results)
        write_text_atomic(out / "comparison_newton.csv", csv_text(header, body))
        md += ["Side by side (* marks layers whose best Newton step differs):", "",
               markdown_table(header, body), ""]
    return md


def _pq_section(out: Path, pq: Sequence[tuple[str, Any]], summary: dict[str, Any],
                figures: Figures) -> list[str]:
    rows = []
    for name, analysis in pq:
        summary["pq"][name] = analysis.to_dict()
        for layer, values in enumerate(zip(analysis.dist_to_inv_cov, analysis.scale,
                                           analysis.dist_to_identity,
                                           analysis.min_sym_eigenvalue, analysis.skew_ratio)):
            rows.append([name, str(layer + 1), *map(nice_float, values)])
    header = ["model", "layer", "dist(A, Σ⁻¹)", "a_l", "dist(A, I)", "λ_min(sym A)",
              "‖skew‖/‖A‖"]
    write_text_atomic(out / "pq_preconditioners.csv",
                      csv_text(["model", "layer", "dist_to_inv_cov", "scale", "dist_to_identity",
                                "min_sym_eigenvalue", "skew_ratio"], rows))
    png = out / "pq_preconditioners.png"
    figures.add(png, partial(plots.preconditioner_distances, pq, png))
    md = ["## PQ transformers: the learned preconditioners", "", markdown_table(header, rows),
          "", f"![preconditioners]({png.name})", "",
          "Left: how far each layer's A_l is from a multiple of Σ⁻¹ and of I "
          "(min_a ‖A − aM‖_F / ‖A‖_F; 0 = exactly proportional); right: the fitted scales "
          "a_l. λ_min(sym A) > 0 means A_l is positive definite (xᵀA_l x > 0 for x ≠ 0).", ""]
    for name, analysis in pq:
        if analysis.dist_to_optimum is not None:
            md += [f"{name}: distance of A to Ahn et al.'s optimum (n = "
                   f"{analysis.n_context}) {analysis.dist_to_optimum:.4f}, relative error "
                   f"‖A − A*‖/‖A*‖ = {analysis.rel_error_to_optimum:.4f}.", ""]
    return md
