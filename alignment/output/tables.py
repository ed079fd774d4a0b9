"""Tables of an `AlignResult`: what ``iclprobe align`` prints and what the report holds.

Display tables (aligned text, markdown) mark a best match that does not beat the zero
predictor with †; the CSV tables carry the same facts in machine-readable columns with
unique names (steps numeric, liveness in its own column).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from iclprobe._text import aligned, grid_text, percent, wrap
from iclprobe.algorithms.base import REFERENCE_PAIR
from iclprobe.alignment.comparison import Interval, PairVerdict, combined
from iclprobe.alignment.measuring.matching import growth_verdict
from iclprobe.alignment.metrics import metric_info

if TYPE_CHECKING:
    from iclprobe.alignment.result import AlignResult


def nice_float(x: float) -> str:
    """Compact formatting for tables (0 as its neighbours' 0.000, not "0.0")."""
    if x == 0:
        return "0.000"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3f}" if abs(x) >= 1e-2 else f"{x:.1e}"


def _ci(iv: Interval, layer: int) -> str:
    return f"{iv.value[layer]:.3f} [{iv.lower[layer]:.3f}, {iv.upper[layer]:.3f}]"


def display_runs(result: AlignResult, k: int = 2) -> list[str]:
    """The step learners shown in the per-layer match table (the first ``k``)."""
    return result.step_runs[:k]


def level(result: AlignResult) -> str:
    """The bootstrap intervals' confidence as printed ("95%": ``AlignConfig.confidence``)."""
    conf = next((s.confidence for by in result.similarities.values() for s in by.values()), 0.95)
    return percent(conf)


def step_legend(result: AlignResult) -> list[str]:
    """What the matched-step columns read: each learner at its protocol rule, on its grid."""
    grids = [f"{run} {grid_text(next(iter(result.similarities[run].values())).steps)}"
             for run in display_runs(result) if result.similarities.get(run)]
    return [f"matched step = each learner at the protocol's step size, on its step grid "
            f"({'; '.join(grids)}), not the answer's fitted column"] if grids else []


def where(result: AlignResult, metric: str = "error_cosine") -> str:
    """Which positions enter ``metric``'s tables, in words."""
    lo, hi = result.window
    if result.positions == "last":
        across = " (error cosine across sequences)" if metric == "error_cosine" else ""
        return f"t = {hi} only, the trained context length{across}"
    if metric_info(metric).on == "weights":  # the induced weights from the protocol's t on
        lo = max(lo, int(result.protocol.get("weight_t_min", lo)))
    return f"t = {lo}..{hi}" if lo < hi else f"t = {lo}"


def header_line(result: AlignResult, metric: str) -> str:
    """The first line of a table: model, metric, protocol, positions."""
    return (f"{result.name} — {metric_info(metric).label}, protocol "
            f"{result.protocol['name']}, {where(result, metric)}")


def dagger_legend(metric: str) -> str:
    """What † means in the best-step table of ``metric``."""
    if metric == "error_cosine":
        return "† = no better than the zero predictor's similarity"
    return ("† = a layer not live by the error cosine (this metric's zero reference says "
            "nothing of a layer)")


def matched_rows(result: AlignResult, metric: str) -> tuple[list[str], list[list[str]]]:
    """Per layer: error and, for the displayed learners, best step (†: not live), value, ties."""
    runs = display_runs(result)
    label = {r: result.run_labels.get(r, r) for r in runs}
    header = ["layer", "norm. error"]
    for r in runs:
        header += [f"{label[r]} step", "sim", "ties"]
    if runs:
        header.append(f"zero-pred. sim ({label[runs[0]]})")
    body = []
    for row in result.table(metric):
        cells = [str(row["layer"]), nice_float(row["normalized_error"])]
        for r in runs:
            ties = row[f"{r}_ties"]
            shown = " ".join(map(str, ties)) if len(ties) <= 4 else \
                f"{ties[0]}..{ties[-1]} ({len(ties)})"
            mark = "" if row[f"{r}_above_zero"] else "†"
            cells += [f"{row[f'{r}_column']}{mark}", nice_float(row[f"{r}_sim"]), shown]
        if runs:
            cells.append(nice_float(row[f"{runs[0]}_zero_sim"]))
        body.append(cells)
    return header, body


def matched_csv(result: AlignResult, metric: str) -> tuple[list[str], list[list[Any]]]:
    """The per-layer match table with unique machine-readable columns."""
    rows = result.table(metric)
    keys = ["protocol", "layer", "normalized_error", "live"]
    for r in result.step_runs:
        keys += [f"{r}_step", f"{r}_column", f"{r}_sim", f"{r}_ties", f"{r}_above_zero",
                 f"{r}_zero_sim"]
    body = []
    for row in rows:
        row = {**row, "live": result.live[row["layer"]], "protocol": result.protocol["name"]}
        body.append([" ".join(map(str, row[k])) if isinstance(row.get(k), list) else
                     row.get(k, "") for k in keys])
    return keys, body


def _pm(iv: Interval, layer: int) -> str:
    """``value±half`` of the interval, or the bounds where the value lies outside them.

    A best-over-steps estimate need not lie inside its own bootstrap interval (the best
    step is re-picked in every replicate); ``±`` would then claim an interval around it.
    """
    value, lo, hi = iv.value[layer], iv.lower[layer], iv.upper[layer]
    if lo <= value <= hi:
        return f"{value:.3f}±{(hi - lo) / 2:.3f}"
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def learner_rows(result: AlignResult, metric: str, compact: bool = False
                 ) -> tuple[list[str], list[list[str]]]:
    """Fu et al.'s table per layer: each learner's best similarity [CI], and A − B [CI].

    ``compact``: intervals as ± half-widths and the step after @ (for a terminal).
    """
    comp = result.comparisons[metric]
    header = ["layer", "live"] + [f"{r} @step" if compact else f"{r} (step)"
                                  for r in comp.scores]
    header += [f"{p.a} − {p.b}" for p in comp.pairs]
    body = []
    for layer in range(result.n_layers + 1):
        cells = [str(layer), "yes" if comp.live[layer] else "no"]
        for s in comp.scores.values():
            cells.append(f"{_pm(s.score, layer)} @{s.best_label[layer]}" if compact else
                         f"{_ci(s.score, layer)} ({s.best_label[layer]})")
        cells += [_ci(p.difference, layer) for p in comp.pairs]
        body.append(cells)
    return header, body


def learner_csv(result: AlignResult, metric: str) -> tuple[list[str], list[list[Any]]]:
    """The learner table with one column per number."""
    comp = result.comparisons[metric]
    keys = ["protocol", "layer", "live"]
    for r in comp.scores:
        keys += [f"{r}_best", f"{r}_lower", f"{r}_upper", f"{r}_step", f"{r}_column"]
    for p in comp.pairs:
        stem = f"{p.a}_minus_{p.b}"
        keys += [stem, f"{stem}_lower", f"{stem}_upper", f"{p.b}_imitates_{p.a}",
                 f"{p.a}_imitates_{p.b}", f"verdict_{p.a}_vs_{p.b}"]
    body = []
    for layer in range(result.n_layers + 1):
        row: list[Any] = [result.protocol["name"], layer, comp.live[layer]]
        for s in comp.scores.values():
            iv = s.score
            row += [iv.value[layer], iv.lower[layer], iv.upper[layer], s.best_step[layer],
                    s.best_label[layer]]
        for p in comp.pairs:
            iv, cal = p.difference, p.calibration
            row += [iv.value[layer], iv.lower[layer], iv.upper[layer], cal.a_by_b[layer],
                    cal.b_by_a[layer], p.verdicts[layer]]
        body.append(row)
    return keys, body


def calibration_rows(result: AlignResult, pair: PairVerdict
                     ) -> tuple[list[str], list[list[str]]]:
    """Per layer: the model's best similarity with A and B beside the learners' own."""
    comp = result.comparisons[pair.metric]
    sa, sb, cal = comp.scores[pair.a], comp.scores[pair.b], pair.calibration
    header = ["layer", f"layer ~ {pair.a}", f"{pair.b} ~ that {pair.a} step",
              f"layer ~ {pair.b}", f"{pair.a} ~ that {pair.b} step", "verdict"]
    body = []
    for layer in range(result.n_layers + 1):
        body.append([str(layer), f"{sa.score.value[layer]:.3f} ({sa.best_label[layer]})",
                     f"{cal.a_by_b[layer]:.3f} ({cal.b_step_for_a[layer]})",
                     f"{sb.score.value[layer]:.3f} ({sb.best_label[layer]})",
                     f"{cal.b_by_a[layer]:.3f} ({cal.a_step_for_b[layer]})",
                     pair.verdicts[layer]])
    return header, body


def growth_lines(result: AlignResult, metric: str) -> list[str]:
    """For each displayed step learner: both fits and which explains the steps better."""
    lines = []
    for run in result.step_runs:
        if run not in MAIN_PAIR and run not in display_runs(result):
            continue
        fits = result.matches[run][metric].fits
        lin, log = fits["linear"], fits["log2"]
        verdict = growth_verdict(lin, log, result.matches[run][metric].grid_bias)
        lines.append(f"{run}: {lin.describe()}; {log.describe()}"
                     + (f" → {verdict}" if verdict else ""))
    return lines


def answer_table(result: AlignResult) -> str:
    """``--verbose``'s first table: what each layer runs, combined and by each metric."""
    said = result.answer
    if said is None or result.meaningless:
        return ""
    metrics = [m for m in said.metrics if m in said.by_metric]
    header = ["layer", "what it runs (metrics combined)", "similarity", "runner-up's",
              *(f"by {metric_info(m).label}" for m in metrics)]
    body = [[str(layer), a.text, *("" if v is None else nice_float(v) for v in (a.value,
                                                                             a.resemblance)),
             *(said.by_metric[m][layer].short for m in metrics)]
            for layer, a in enumerate(said.layers)]
    title = (f"{result.name} — what each layer runs, among {', '.join(said.candidates)} (each "
             "over its fitted family); similarity: the layer's to the learner named or nearest (by "
             "the metric that said it), runner-up's: the runner-up's match's to that learner")
    return "\n".join([*wrap([title]), *aligned(header, body, right=False, narrow=True)])


def text_table(result: AlignResult, metric: str = "error_cosine") -> str:
    """Everything ``iclprobe align`` prints for one model and metric."""
    lines = wrap([header_line(result, metric) + f"; layers: {result.readout}"])
    if result.meaningless:
        return "\n".join(lines + wrap([f"no alignment: {result.meaningless}"]))
    lines += wrap([f"best step per layer ({dagger_legend(metric)})"])
    lines += aligned(*matched_rows(result, metric), narrow=True)
    lines += ["", *wrap([f"learner table: best similarity over steps ± half the {level(result)} "
                         f"bootstrap interval, @ the best step; differences with their "
                         f"{level(result)} intervals"])]
    lines += aligned(*learner_rows(result, metric, compact=True), right=False, narrow=True)
    for pair in result.comparisons[metric].pairs:
        lines += ["", *wrap([f"calibration, {pair.a} vs {pair.b}: the learners' own "
                             "resemblance at each layer's matched steps"])]
        lines += aligned(*calibration_rows(result, pair), right=False, narrow=True)
        lines += wrap([pair.sentence])
    if metric in result.fitted:
        lines += ["", *wrap([FITTED_TITLE])]
        lines += aligned(*fitted_rows(result, metric), right=False, narrow=True)
        lines += wrap([result.fitted[metric].sentence])
    lines += ["", "step growth over live layers:"]
    lines += wrap(["  " + g for g in growth_lines(result, metric)], indent="    ")
    lines += wrap([f"note: {n}" for n in result.notes])
    return "\n".join(lines)


FITTED_TITLE = ("step sizes fitted: Newton and GD each matched over its family of step sizes "
                "x step counts, probed layers against learners read the same way (the view "
                "the verdict comes from: no false attribution on bench/known_answers.py)")


def fitted_lines(results: Sequence[AlignResult]) -> list[str]:
    """Per model, the verdict in words (or why there is none)."""
    return [f"{res.name} [{res.protocol['name']}]: "
            + (res.verdict_sentence or "no verdict (the fitted view needs newton and gd)")
            for res in results]


def fitted_rows(result: AlignResult, metric: str) -> tuple[list[str], list[list[str]]]:
    """Per layer of the fitted view: Newton − GD, the learners' resemblance, the verdict.

    The resemblance columns are each learner's best imitation of the other's matched column.
    """
    pair = result.fitted[metric]
    cal = pair.calibration
    header = ["layer", "newton − gd", "gd imitates newton's", "newton imitates gd's", "verdict"]
    body = [[str(layer), _ci(pair.difference, layer), f"{cal.a_by_b[layer]:.3f}",
             f"{cal.b_by_a[layer]:.3f}", pair.verdicts[layer]]
            for layer in range(len(pair.verdicts))]
    return header, body


def headline_lines(results: Sequence[AlignResult], metric: str = "error_cosine",
                   a: str = "newton", b: str = "gd") -> list[str]:
    """Per model: A and B at the last layer with intervals, A − B, and the verdict there."""
    lines = []
    for res in results:
        comp = res.comparisons.get(metric)
        pair = next((p for p in comp.pairs if (p.a, p.b) == (a, b)), None) if comp else None
        if res.meaningless or comp is None or pair is None:
            lines.append(f"{res.name}: no {a}/{b} comparison"
                         + (f" ({res.meaningless})" if res.meaningless else ""))
            continue
        last = res.n_layers
        sa, sb = comp.scores[a], comp.scores[b]
        lines.append(f"{res.name} [{res.protocol['name']}], layer {last}: {a} "
                     f"{_pm(sa.score, last)} @{sa.best_label[last]}, {b} "
                     f"{_pm(sb.score, last)} @{sb.best_label[last]}; {a} − {b} "
                     f"{_ci(pair.difference, last)} → {pair.verdicts[last]}")
    return lines


def spectral_lines(result: AlignResult) -> list[str]:
    """The spectral view per live layer: filter order, interval, reading, learners' orders."""
    spec = result.spectral
    if spec is None:
        return []

    def show(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f}"

    header = ["layer", "order p", "interval" if spec.noisy_readings else f"{level(result)} interval",
              *(f"{k}'s p" for k in spec.reference), "reads as"]
    def interval(lo: float | None, hi: float | None) -> str:  # none where too few directions
        return "none" if lo is None and hi is None else f"[{show(lo)}, {show(hi)}]"

    body = [[str(i), show(p), interval(lo, hi),
             *(show(v[i]) for v in spec.reference.values()), r]
            for i, (p, lo, hi, r) in enumerate(zip(spec.order, spec.lower, spec.upper,
                                                   spec.reading))
            if r != "computes nothing"]
    title = [f"spectral view, t >= {spec.t_min}: the order p of each layer's filter, "
             "−log(1 − φ) ∝ λ^p (GD 1,",
             "Newton 2 at small steps), beside each learner's best fitted match; not a "
             "ground of the verdict"]
    if spec.noisy_readings:
        title.append(f"(interval: the union of the {level(result)} intervals of the layer and of "
                     "it read with the probes' noise ±)")
    return [*title, *aligned(header, body, right=False)] if body else [*title, "no live layer"]
MAIN_PAIR = REFERENCE_PAIR  # the Newton-vs-GD views' pair, from its one home


def main_pair(result: AlignResult, metric: str) -> PairVerdict | None:
    """The protocol's pair shown beside the fitted view: Newton vs GD, else the first."""
    comp = result.comparisons.get(metric)
    if comp is None or not comp.pairs:
        return None
    return next((p for p in comp.pairs if (p.a, p.b) == MAIN_PAIR), comp.pairs[0])


def verdict_runs(labels: Sequence[str]) -> str:
    """Runs of layers with one verdict: "0–2 computes nothing; 3–8 leans gd"."""
    runs: list[list[Any]] = []
    for layer, label in enumerate(labels):
        if runs and runs[-1][2] == label:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer, label])
    return "; ".join(f"{a} {label}" if a == b else f"{a}–{b} {label}" for a, b, label in runs)


def protocol_verdict(result: AlignResult) -> tuple[str, str, list[str]] | None:
    """The protocol view's pair and its verdict per layer (None without a learner pair).

    Its metrics are combined as the verdict's are (`comparison.combined`).
    """
    pairs = [p for m in result.comparisons if (p := main_pair(result, m)) is not None]
    pairs = [p for p in pairs if metric_info(p.metric).verdict] or pairs  # as the verdict's
    pairs = [p for p in pairs if (p.a, p.b) == (pairs[0].a, pairs[0].b)] if pairs else []
    return (pairs[0].a, pairs[0].b, combined(pairs)[0]) if pairs else None


def answer_lines(results: Sequence[AlignResult]) -> list[str]:
    """One line per model: its layers' answers, in runs ("0 computes nothing; 1–8 gd")."""
    width = max((len(r.name) for r in results), default=0)
    return [f"{r.name.ljust(width)}  " + (f"no alignment: {r.meaningless}" if r.meaningless
                                          else verdict_runs(r.answer.labels if r.answer else [])
                                          or "no answer")
            for r in results]


def findings_rows(results: Sequence[AlignResult]) -> tuple[list[str], list[list[str]]]:
    """Per model: what each layer runs, the Newton-vs-GD verdict and the protocol view's."""
    header = ["model", "protocol", "what each layer runs (every candidate)",
              "newton vs gd, the verdict (fitted view)", "protocol view"]
    body = []
    for res in results:
        if res.meaningless:
            body.append([res.name, res.protocol["name"], f"no alignment: {res.meaningless}",
                         "", ""])
            continue
        proto = protocol_verdict(res)
        shown = "" if proto is None or proto[:2] == MAIN_PAIR else f"{proto[0]} vs {proto[1]}: "
        answer = res.answer.labels if res.answer is not None else []
        body.append([res.name, res.protocol["name"],
                     verdict_runs(answer) if answer else "no fitted families",
                     verdict_runs(res.verdict) if res.verdict else "no fitted view",
                     shown + verdict_runs(proto[2]) if proto else "no learner pair"])
    return header, body
