"""One model's part of the report: its section of report.md and the files of its folder.

A model's folder (``REPORT/<model>/``) holds its CSV tables, PNG figures and
``result.json`` (everything `AlignResult.to_dict` holds); the section links into it.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclprobe.alignment.metrics import metric_info
from iclprobe.alignment.output import plots
from iclprobe.alignment.output import tables as T
from iclprobe.alignment.output.drawing import Figures
from iclprobe.storage import write_text_atomic

if TYPE_CHECKING:
    from iclprobe.alignment.result import AlignResult

#: Names at the top of a report that no model's folder may take.
TOP_NAMES = ("report.md", "summary.json", "matched_newton_steps.png", "comparison_newton.csv",
             "pq_preconditioners.csv", "pq_preconditioners.png")


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in body]
    return "\n".join(out)


def csv_text(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """Rows as CSV text."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(body)
    return buf.getvalue()


def folder_names(names: Sequence[str]) -> list[str]:
    """One folder name per model: its name in safe characters, unique, never hidden.

    ``[^A-Za-z0-9._-]`` becomes ``_``; a name that would start with a dot, or take a name
    of the report's own top-level files, gets a ``model-`` prefix; repeats get ``-2``, ….
    """
    out: list[str] = []
    for name in names:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "model"
        if slug.startswith(".") or slug in TOP_NAMES:
            slug = f"model-{slug}"
        base, k = slug, 1
        while slug in out:
            k += 1
            slug = f"{base}-{k}"
        out.append(slug)
    return out


def model_section(top: Path, res: AlignResult, folder: str, figures: Figures,
                  designed: dict[str, Any] | None = None) -> list[str]:
    """Write ``res``'s tables into ``top / folder`` and return its section of report.md.

    Its figures are added to ``figures`` (drawn when the report's text is written).
    ``designed``: its alignment on designed data (`Designed.to_dict`), kept in result.json
    beside its own, as ``align --json`` prints it.
    """
    out = top / folder
    out.mkdir()
    record = {**res.to_dict(), **({"designed": designed} if designed is not None else {})}
    write_text_atomic(out / "result.json", json.dumps(record, indent=1))
    cov = res.task["cov"] if isinstance(res.task["cov"], str) else "given"
    md = [f"## {res.name}", "",
          f"Task: d = {res.task['n_dims']}, {res.task['n_points']} points, covariance {cov}. "
          f"Protocol **{res.protocol['name']}** ({res.protocol['summary']}); positions "
          f"{T.where(res)}; layers read by {res.readout}. Files: [{folder}/]({folder}/) "
          f"(tables as CSV, figures, [result.json]({folder}/result.json)).", ""]
    md += [f"- {n}" for n in res.notes] + ([""] if res.notes else [])
    if res.meaningless:
        png = out / "error.png"
        figures.add(png, partial(plots.error_curves, res, png))
        return md + [f"**No alignment:** {res.meaningless}.", "",
                     f"![error curves]({folder}/{png.name})", ""]
    for metric in res.comparisons:
        md += _metric_part(out, res, folder, metric, figures)
    png = out / "error.png"
    figures.add(png, partial(plots.error_curves, res, png))
    md += [f"![error curves]({folder}/{png.name})", "",
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
            write_text_atomic(out / f"similarity_{sim.learner}_{metric}.csv", sim.to_csv())
    return md


def _metric_part(out: Path, res: AlignResult, folder: str, metric: str, figures: Figures
                 ) -> list[str]:
    """The tables and figures of one metric."""
    words = metric_info(metric).label
    write_text_atomic(out / f"table_{metric}.csv", csv_text(*T.matched_csv(res, metric)))
    write_text_atomic(out / f"learners_{metric}.csv", csv_text(*T.learner_csv(res, metric)))
    md = [f"### By {words}", "",
          f"Best step per layer ([CSV]({folder}/table_{metric}.csv)):", "",
          markdown_table(*T.matched_rows(res, metric)), "",
          f"Learner table ([CSV]({folder}/learners_{metric}.csv)):", "",
          markdown_table(*T.learner_rows(res, metric)), ""]
    for pair in res.comparisons[metric].pairs:
        md += [f"Calibration, {pair.a} vs {pair.b}:", "",
               markdown_table(*T.calibration_rows(res, pair)), "", f"**{pair.sentence}**", ""]
    if metric in res.fitted:
        md += [T.FITTED_TITLE[0].upper() + T.FITTED_TITLE[1:] + ":", "",
               markdown_table(*T.fitted_rows(res, metric)), "",
               f"**{res.fitted[metric].sentence}**", ""]
    md += ["Step growth over live layers:", ""]
    md += [f"- {g}" for g in T.growth_lines(res, metric)] + [""]
    png = out / f"learners_{metric}.png"
    figures.add(png, partial(plots.learner_comparison, res, metric, png))
    md += [f"![learner comparison]({folder}/{png.name})", "",
           f"Left: each learner's best similarity per layer with its {T.level(res)} interval; "
           "right: the paired differences with intervals (0 = indistinguishable). "
           "Hollow markers: layers not above the zero predictor.", ""]
    panels = [(res.similarities[run][metric], res.matches[run][metric],
               res.run_labels.get(run, run)) for run in res.step_runs]
    png = out / f"heatmaps_{metric}.png"
    figures.add(png, partial(plots.similarity_heatmaps, panels, png,
                             f"{res.name}: {words} with each learner"))
    md += [f"![{metric} heatmaps]({folder}/{png.name})", "",
           f"{words.capitalize()} between each layer and each step of "
           + ", ".join(res.step_runs) + " (one panel each); ★ marks each layer's best "
           "match, ✕ a best match no better than the zero predictor's.", ""]
    return md
