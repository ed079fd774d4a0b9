"""Known-answer benchmark: what `align` says of models whose algorithm is known.

    python bench/known_answers.py [--setting main|held-out|fresh|hard-d10|hard-d3|all]
                                  [--out DIR] [--n-sequences 256] [--n-boot 100] [--jobs 2]
                                  [--design] [--probe-folds K] [--probe-target column|y]
                                  [--probe-extra-sequences N]
                                  [--probe-fit fresh --n-probe-sequences N]

Models whose algorithm is known by construction (`iclprobe.constructions`): oracles of GD,
Newton, ridge, CG, heavy ball and online GD, the GD and Newton PQ constructions, and two
models that run no candidate (the average of GD's and Newton's predictions, and GD
preconditioned by a fixed random SPD matrix), over step sizes, protocols, isotropic and
ill-conditioned data and exact and probe readouts (`constructions.benchmark`). Printed:

- the answer's confusion matrix per setting, truth and readout (`constructions.scoring`):
  live layers answered right (the truth named; where the truth's iterate has converged to
  OLS's, also OLS, or "cannot tell" among learners converged with it), falsely named,
  "cannot tell", "none of them", and the separable layers with the right answers among
  them; then per metric;
- the Newton-vs-GD verdict's totals (the view of earlier rounds), for GD and Newton truths;
- per cell, the answer through probes at the layers the exact readout names the truth, and
  without those probes miss where the truth is not separable as a probe reads a layer (a
  probe reads a column up to a scale and a part linear in x_t: where a rival reproduces
  the truth's column up to those, "cannot tell" is the right answer through probes).

Exits 1 while a target is missed: any false attribution by the answer (or the verdict);
fewer than 90% of a setting's separable layers named right read exactly, 80% through
probes; fewer than 30 separable layers of a truth in the main setting; a cell where probes
name the truth at fewer than 80% of those layers (judged as above). --out writes
known_answers.json and .csv (every cell and view). The probe flags set how the probe cells'
layer probes are fitted (align's flags of the same names; default: cross-fitted on the
evaluation sequences in 4 folds, as align fits them); a model whose probes' fresh draw
makes it diverge is counted with the diverging cells.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import io
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from iclprobe._checks import ConfigError
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.measuring.kept import reusing_families
from iclprobe.atomic import atomic_directory
from iclprobe.cli import OneLineParser, out_dir
from iclprobe.constructions import benchmark as B
from iclprobe.constructions import evaluations as E
from iclprobe.constructions import power as P
from iclprobe.constructions import scoring as S
from iclprobe.errors import InputError
from iclprobe.storage import check_output, write_text_atomic

#: what --out holds (its marker's kind), and the most worker processes --jobs starts
KIND = "known answers"
MAX_JOBS = 256

COLUMNS = ("true", "false", "cannot tell", "none", "separable", "true_separable")


#: a worker's reuse of the candidates' families: the cells share a few evaluation batches
_WORKER = contextlib.ExitStack()


def _worker() -> None:
    torch.set_num_threads(1)
    _WORKER.enter_context(reusing_families(256))  # the grids, and the readouts' fine asks


def run_cells(cells: list[B.Cell], cfg: AlignConfig, jobs: int, design: bool = False
              ) -> list[B.CellResult]:
    """Every cell's result, in the cells' order (seeded: the same in any process)."""
    groups: dict[B.Cell, list[int]] = {}  # a cell's readouts together: they share the
    for i, cell in enumerate(cells):      # truth's reach (`scoring.truth_reach`), and the
        groups.setdefault(dataclasses.replace(cell, readout="exact"), []).append(i)
    for at in groups.values():            # probe cell reads its exact twin's answer
        at.sort(key=lambda i: cells[i].readout != "exact")
    out: list[B.CellResult | None] = [None] * len(cells)
    if jobs == 1:
        with reusing_families(), tqdm(total=len(cells), desc="cells") as bar:
            for at in groups.values():
                for i, result in zip(at, _run_group([cells[i] for i in at], cfg, design)):
                    out[i] = result
                bar.update(len(at))
        return out  # type: ignore[return-value]
    with ProcessPoolExecutor(jobs, initializer=_worker) as pool:
        futures = {pool.submit(_run_group, [cells[i] for i in at], cfg, design): at
                   for at in groups.values()}
        with tqdm(total=len(cells), desc="cells") as bar:
            for future in as_completed(futures):
                for i, result in zip(futures[future], future.result()):
                    out[i] = result
                bar.update(len(futures[future]))
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


def _run_group(cells: list[B.Cell], cfg: AlignConfig, design: bool) -> list[B.CellResult]:
    """One model's cells, its exact readout's first: the probe cells read its answer."""
    out: list[B.CellResult] = []
    for cell in cells:
        twin = [r for r in out if r.cell == dataclasses.replace(cell, readout="exact")]
        named = B.named_layers(twin[0]) if twin and cell.readout != "exact" else None
        out.append(B.run_cell(cell, cfg, design, named))
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, its counts checked (a bad one is one line, exit status 2)."""
    parser = OneLineParser(prog="known_answers.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_dir, default=None,
                        help="a folder for known_answers.json and .csv (written at once, at "
                             "the end; refused before the run if it holds anything else)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the benchmark's own earlier output in --out")
    parser.add_argument("--n-sequences", type=int, default=256)  # checked by the config
    parser.add_argument("--n-boot", type=int, default=100)
    parser.add_argument("--setting", choices=[*B.SETTINGS, "all"], default="all",
                        help="main: the slice choices are made on; held-out, fresh, hard-*: "
                             "other seeds, d, n, κ, step sizes and cells found off the grid")
    parser.add_argument("--design", action="store_true",
                        help="count each cell's answer on its designed data (alignment.design: "
                             "the distribution where the candidates disagree most), n kept")
    parser.add_argument("--probe-fit", choices=("crossfit", "fresh"), default="crossfit",
                        help="how the probe cells' layer probes are fitted (align's --probe-fit)")
    parser.add_argument("--n-probe-sequences", type=int, default=None,
                        help="fresh probes' sequences (align's --n-probe-sequences)")
    parser.add_argument("--probe-folds", type=int, default=None,
                        help="cross-fitted probes' folds (align's --probe-folds; default 4)")
    parser.add_argument("--probe-target", choices=("column", "y"), default="column",
                        help="what the cross-fitted probes are fitted to (align's "
                             "--probe-target): each layer's best-held candidate column, or y")
    parser.add_argument("--probe-extra-sequences", type=int, default=None,
                        help="further sequences the cross-fitted probes are fitted on "
                             "(align's --probe-extra-sequences)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="worker processes, one torch thread each (cells are independent)")
    args = parser.parse_args(argv)
    if not 1 <= args.jobs <= MAX_JOBS:  # each job is a process, started at once
        parser.error(f"--jobs must be >= 1 and <= {MAX_JOBS}, got {args.jobs}")
    if args.out is not None:  # before the run, not after it
        try:
            check_output(args.out, KIND, args.overwrite)
        except OSError as err:
            parser.error(f"--out: {err}")
    fresh = args.probe_fit == "fresh"
    if args.n_probe_sequences is not None and not fresh:
        parser.error(f"--n-probe-sequences {args.n_probe_sequences} needs --probe-fit fresh "
                     "(cross-fitted probes read the evaluation sequences)")
    if args.probe_folds is not None and fresh:
        parser.error(f"--probe-folds {args.probe_folds} applies to cross-fitted probes, not "
                     "to --probe-fit fresh")
    try:
        config(args)
    except ConfigError as err:  # the config's check, named by the flag that set the field
        flag = {"n_sequences": "--n-sequences", "n_boot": "--n-boot",
                "n_probe_sequences": "--n-probe-sequences",
                "probe_extra_sequences": "--probe-extra-sequences",
                "probe_folds": "--probe-folds", "probe_target": "--probe-target"}.get(err.field)
        parser.error(f"{flag + ': ' if flag else ''}{err}")
    return args


def config(args: argparse.Namespace) -> AlignConfig:
    """The benchmark's AlignConfig with the command line's sizes and probe fit (checked)."""
    cfg = B.bench_config(args.n_sequences, args.n_boot, args.probe_target)
    folds = cfg.probe_folds if args.probe_folds is None else args.probe_folds
    extra = args.probe_extra_sequences
    if extra is None:  # the benchmark's own, where probes are cross-fitted
        extra = cfg.probe_extra_sequences if args.probe_fit == "crossfit" else 0
    return dataclasses.replace(cfg, probe_fit=args.probe_fit, probe_folds=folds,
                               n_probe_sequences=args.n_probe_sequences,
                               probe_extra_sequences=extra)


def _probes(cfg: AlignConfig) -> str:
    if cfg.probe_fit == "crossfit":
        also = f", fitted on {cfg.probe_extra_sequences} more sequences" \
            if cfg.probe_extra_sequences else ""
        return f"cross-fitted, {cfg.probe_folds} folds, fitted to {cfg.probe_target}{also}"
    return f"fitted on {cfg.fresh_probe_sequences} fresh sequences"


def _share(hit: int, of: int) -> str:
    return f"{hit}/{of} ({hit / of:.0%})" if of else "—"


def confusion(results: list[B.CellResult], view: str = S.ANSWER
              ) -> dict[tuple[str, str, str], dict[str, int]]:
    """``(setting, truth, readout) -> counts`` of ``view`` (truth "none": no learner)."""
    out: dict[tuple[str, str, str], dict[str, int]] = {}
    for r in results:
        if r.diverges or view not in r.counts:
            continue
        key = (r.cell.setting, r.cell.truth or "none", r.cell.readout)
        tot = out.setdefault(key, dict.fromkeys(COLUMNS, 0))
        for k, v in r.counts[view].items():
            tot[k] += v
    return out


def print_confusion(table: dict[tuple[str, str, str], dict[str, int]], title: str) -> None:
    print(f"\n{title}: live layers right (the truth named; at a converged iterate also OLS, "
          "or 'cannot tell' among converged learners) / falsely named / cannot tell / none "
          "of them; separable layers right")
    print(f"{'setting':9} {'truth':10} {'readout':7} {'right':>6} {'false':>6} {'cannot':>7} "
          f"{'none':>6}  right at separable")
    for (setting, truth, readout), c in table.items():
        sep = _share(c["true_separable"], c["separable"]) if truth != "none" else "—"
        print(f"{setting:9} {truth:10} {readout:7} {c['true']:6} {c['false']:6} "
              f"{c['cannot tell']:7} {c['none']:6}  {sep}")


def print_shares(views: dict[str, dict[tuple[str, str, str], dict[str, int]]]) -> None:
    """Per setting and readout, each view's separable and right shares of the live layers.

    Over the cells whose truth is a learner; a view's live layers are those it answers.
    """
    print("\nshares of the live layers of the learner truths: separable / right / right at "
          "separable")
    first = next(iter(views.values()))
    for setting, readout in dict.fromkeys((s, r) for s, _, r in first):
        parts = []
        for view, table in views.items():
            here = [c for (s, t, r), c in table.items()
                    if s == setting and r == readout and t != "none"]
            live = sum(c["true"] + c["false"] + c["cannot tell"] + c["none"] for c in here)
            sep, right = (sum(c[k] for c in here) for k in ("separable", "true"))
            parts.append(f"{view}: {_share(sep, live)} / {_share(right, live)} / "
                         f"{_share(sum(c['true_separable'] for c in here), sep)}")
        print(f"{setting} {readout}: " + "; ".join(parts))


def verdict_totals(results: list[B.CellResult], settings: list[str]) -> dict[str, Any]:
    """The Newton-vs-GD verdict's totals per setting (GD and Newton truths)."""
    out = {}
    for name in settings:
        here = [r for r in results if r.cell.setting == name]
        for view in ("verdict", S.DEFAULT_VIEW):
            tot = S.totals(here, view)
            out[f"{name} {view}"] = tot
            print(f"{name} {view}: true {tot['true']}, false {tot['false']}, no attribution "
                  f"{tot['none']}; separable {_share(tot['true_separable'], tot['separable'])}; "
                  f"diverging cells {tot['diverges']}")
    return out


def print_power(power: list[P.ProbePower]) -> list[P.ProbePower]:
    """The answer through probes at the layers the exact readout names the truth at.

    Judged without the layers probes miss where the truth is not separable as a probe reads
    the layer: a rival that reproduces the truth's column up to a probe's scale leaves
    "cannot tell" right there.
    """
    print(f"\n{S.JUDGED} through probes at the layers the exact readout names the truth at, "
          "without those probes miss where the truth is not separable as a probe reads a "
          "layer; per cell where probes miss one (every other cell: all of them; < 80% "
          "marked):")
    for p in power:
        if p.named_by_probe < p.named_exactly:
            print(f"{'* ' if p.short else '  '}{p.key}: {_share(p.named_within, p.within)} "
                  f"(at every exactly named layer {_share(p.named_by_probe, p.named_exactly)})")
    for setting in dict.fromkeys(p.cell.setting for p in power):
        here = [p for p in power if p.cell.setting == setting]
        hit, of = sum(p.named_by_probe for p in here), sum(p.named_exactly for p in here)
        hit_in, within = sum(p.named_within for p in here), sum(p.within for p in here)
        raw = sum(p.named_by_probe < 0.8 * p.named_exactly for p in here)
        print(f"{setting}: {_share(hit_in, within)} where probes can separate the truth, "
              f"{sum(p.short for p in here)} of {len(here)} cells below 80%; at every "
              f"exactly named layer {_share(hit, of)}, {raw} cells below 80%")
    return [p for p in power if p.short]


def write_outputs(out: Path, summary: dict[str, Any], results: list[B.CellResult],
                  overwrite: bool = False) -> None:
    """known_answers.json and .csv as the folder ``out``, at once (`atomic_directory`)."""
    with atomic_directory(out, KIND, overwrite) as tmp:
        _write_tables(tmp, summary, results)


def _write_tables(out: Path, summary: dict[str, Any], results: list[B.CellResult]) -> None:
    write_text_atomic(out / "known_answers.json", json.dumps(
        {**summary, "cells": [r.to_dict() for r in results]}, indent=1))
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["setting", "kind", "truth", "protocol", "data", "readout", "mult", "beta",
                     "view", *COLUMNS])
    for r in results:
        c = r.cell
        for view, counts in r.counts.items():
            writer.writerow([c.setting, c.kind, c.truth or "none", c.protocol, c.data,
                             c.readout, c.multiplier, c.beta or "", view,
                             *(counts.get(k, "") for k in COLUMNS)])
    write_text_atomic(out / "known_answers.csv", buf.getvalue())


def judge(table: dict[tuple[str, str, str], dict[str, int]], verdicts: dict[str, Any],
          short_power: list[P.ProbePower], view: str = S.JUDGED) -> int:
    """0 where every target of ``view``'s ``table`` is met, else 1 (and which)."""
    missed = []
    for setting in dict.fromkeys(k[0] for k in table):
        for readout, floor in (("exact", 0.9), ("probe", 0.8)):
            here = [c for (s, t, r), c in table.items() if s == setting and r == readout]
            false = sum(c["false"] for c in here)
            sep = sum(c["separable"] for c in here)
            hit = sum(c["true_separable"] for c in here)
            if false:
                missed.append(f"{setting} {readout}: {false} false attributions")
            if sep and hit < floor * sep:
                missed.append(f"{setting} {readout}: right at {hit}/{sep} separable < {floor:.0%}")
    thin = [t for (s, t, r), c in table.items() if s == "main" and r == "exact" and t != "none"
            and c["separable"] < 30]
    missed += [f"main: {t} has fewer than 30 separable layers" for t in thin]
    missed += [f"{k}: {v['false']} false attributions" for k, v in verdicts.items() if v["false"]]
    if short_power:
        missed.append(f"{len(short_power)} cell(s) where probes name the truth at < 80% of the "
                      "layers the exact readout names it at (judged where probes can separate it)")
    print(f"\n{view}: " + ("FAIL: " + "; ".join(missed) if missed else
                  "PASS: no false attribution; right at >= 90% (exact) and >= 80% (probes) of "
                  "the separable layers; >= 30 separable layers per truth; probe power >= 80% "
                  "in every cell"))
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cfg = config(args)
    settings = list(B.SETTINGS) if args.setting == "all" else [args.setting]
    started = time.perf_counter()
    cells = [cell for name in settings for cell in B.grid(setting=name)]
    try:
        results = run_cells(cells, cfg, args.jobs, args.design)
    except InputError as err:  # a size align refuses (memory), met in the first cells
        print(f"known_answers.py: error: {err}", file=sys.stderr)
        return 2
    print(f"{len(cells)} cells{' on their designed data' if args.design else ''} in "
          f"{time.perf_counter() - started:.0f} s ({args.jobs} jobs; "
          f"{cfg.n_sequences} sequences, {cfg.n_boot} bootstrap resamples; probes: "
          f"{_probes(cfg)})")
    table = confusion(results)
    print_confusion(table, "the answer (every candidate; error cosine, weight cosine and spd)"
                    + (" on the designed data" if args.design else ""))
    for metric in ("error_cosine", "weight_cosine", "spd"):
        print_confusion(confusion(results, f"{S.ANSWER} {metric}"), f"the answer by {metric}")
    both = {}
    if args.design:  # the own task's answer, and the answer over both evaluations
        both = {view: confusion(results, view) for view in (E.OWN_VIEW, E.BOTH_VIEW)}
        print_confusion(both[E.BOTH_VIEW], f"{E.BOTH_VIEW} (alignment.design.both)")
        print_shares({E.OWN_VIEW: both[E.OWN_VIEW], "designed data": table,
                      E.BOTH_VIEW: both[E.BOTH_VIEW]})
    print()
    verdicts = verdict_totals(results, settings)
    power = P.probe_power(results)
    short = print_power(power)
    if args.out is not None:
        summary = {"answer": {" ".join(k): v for k, v in table.items()}, "verdict": verdicts,
                   "probe_power": [p.to_dict() for p in power]}
        write_outputs(args.out, summary, results, args.overwrite)
    return exit_code(table, verdicts, short, both.get(E.BOTH_VIEW))


def exit_code(table: dict[tuple[str, str, str], dict[str, int]], verdicts: dict[str, Any],
              short_power: list[P.ProbePower],
              both: dict[tuple[str, str, str], dict[str, int]] | None = None) -> int:
    """1 where a target of the answer (or of the answer over both evaluations) is missed."""
    codes = [judge(table, verdicts, short_power)]
    if both is not None:
        codes.append(judge(both, {}, [], E.BOTH_VIEW))
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
