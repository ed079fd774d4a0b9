"""Known-answer benchmark: the confusion matrix of `align`'s Newton-vs-GD verdicts.

    python bench/known_answers.py [--setting main|held-out|fresh|all] [--out DIR]
                                  [--n-sequences 256] [--n-boot 100]

Models whose algorithm is known by construction (iclprobe.constructions): GD and Newton
oracles (the learner's iterates as layers, behind a rotation with distractor channels) at
½, 1 and 2 × each protocol's step rule, and the GD (PQ, Eq. 8) and Newton–Schulz
(linear attention) constructions at 0.3, 0.6 and 0.9 × their stability bound on the
evaluation batch; × protocols iclprobe and fu2024 × isotropic and ill-conditioned (κ = 100)
evaluation data × exact and probe readout; each cell counted for error and weight cosine.
Views: the protocol's learner table; the fitted view (Newton and GD matched over step
sizes as well as steps), per metric; the spectral view's reading; and **the verdict**
`align` reports (the fitted view's metrics combined, `AlignResult.verdict`), which the
targets are held to. Per cell and view: live layers with the true learner preferred, the
other preferred (a false attribution), or no attribution, and the separable layers.
Sizes: d = 5, n = 21, 8 layers (Newton construction: 12), 256 sequences, 100 bootstrap
resamples; held-out settings (d = 4, n = 17, seed 7, κ = 50, multipliers 0.7 and 1.5,
fractions 0.45 and 0.75; and "fresh": d = 6, n = 19, seed 11, κ = 30, multipliers 0.6 and
1.3, fractions 0.4 and 0.8) are run too. Exits 1 while the verdict makes any false
attribution, or prefers the true learner at fewer than 80% of the separable live layers
of a setting. --out writes known_answers.json/.csv.
"""

from __future__ import annotations

import argparse
import csv
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
from iclprobe.cli import OneLineParser
from iclprobe.constructions import benchmark as B
from iclprobe.storage import write_text_atomic


def _one_thread() -> None:
    torch.set_num_threads(1)


def run_cells(cells: list[B.Cell], cfg: AlignConfig, jobs: int) -> list[B.CellResult]:
    """Every cell's result, in the cells' order (seeded: the same in any process)."""
    if jobs == 1:
        return [B.run_cell(cell, cfg) for cell in tqdm(cells, desc="cells")]
    with ProcessPoolExecutor(jobs, initializer=_one_thread) as pool:
        futures = [pool.submit(B.run_cell, cell, cfg) for cell in cells]
        for _ in tqdm(as_completed(futures), total=len(futures), desc="cells"):
            pass
        return [f.result() for f in futures]


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, its counts checked (a bad one is one line, exit status 2)."""
    parser = OneLineParser(prog="known_answers.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--n-sequences", type=int, default=256)
    parser.add_argument("--n-boot", type=int, default=100)
    parser.add_argument("--setting", choices=[*B.SETTINGS, "all"], default="all",
                        help="main: the slice views are chosen on; held-out, fresh: other "
                             "seed, d, n, κ and step multipliers (fresh: used for no choice)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="worker processes, one torch thread each (cells are independent)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    try:
        B.bench_config(args.n_sequences, args.n_boot)
    except ConfigError as err:  # the config's check, named by the flag that set the field
        flag = {"n_sequences": "--n-sequences", "n_boot": "--n-boot"}.get(err.field)
        parser.error(f"{flag + ': ' if flag else ''}{err}")
    return args


def cell_rows(results: list[B.CellResult]) -> tuple[list[str], list[list[str]]]:
    """The per-cell table: one row per cell and view."""
    header = ["setting", "model", "protocol", "data", "readout", "mult", "view", "true",
              "false", "none", "separable", "true@sep"]
    rows = []
    for r in results:
        c = r.cell
        base = [c.setting, c.kind, c.protocol, c.data, c.readout, f"{c.multiplier:g}"]
        if r.diverges:
            rows.append(base + ["all", "diverges", "", "", "", ""])
            continue
        for view, counts in r.counts.items():
            rows.append(base + [view, str(counts["true"]), str(counts["false"]),
                                str(counts["none"]), str(counts.get("separable", "")),
                                str(counts.get("true_separable", ""))])
    return header, rows


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for row in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def print_totals(by_view: dict[str, dict[str, int]]) -> None:
    for key, tot in by_view.items():
        share = tot["true_separable"] / tot["separable"] if tot["separable"] else float("nan")
        sep = (f"; separable layers {tot['separable']}, true preferred at "
               f"{tot['true_separable']} ({share:.0%})") if tot["separable"] else ""
        print(f"{key} view, live layers: true preferred {tot['true']}, false attributions "
              f"{tot['false']}, no attribution {tot['none']}; cells that diverge "
              f"(not counted) {tot['diverges']}{sep}")


def print_probe_power(power: list[B.ProbePower], view: str = B.JUDGED,
                      per_cell: bool = True) -> list[B.ProbePower]:
    """Per cell, ``view`` through probes where the exact readout names the truth."""
    print(f"\n{view} through probes, at the layers where the exact readout names the true "
          "learner" + (" (per cell; * = below 80%):" if per_cell else ":"))
    short = [p for p in power if p.short]
    for p in power if per_cell else []:
        print(f"{'*' if p.short else ' '} {p.key}: {p.named_by_probe}/{p.named_exactly}"
              + (f" ({p.named_by_probe / p.named_exactly:.0%})" if p.named_exactly else ""))
    for setting in dict.fromkeys(p.cell.setting for p in power):
        here = [p for p in power if p.cell.setting == setting]
        hit, of = sum(p.named_by_probe for p in here), sum(p.named_exactly for p in here)
        share = f" ({hit / of:.0%})" if of else ""
        print(f"{setting}: through probes {hit}/{of}{share} of the exactly named layers; "
              f"{sum(p.short for p in here)} cell(s) below 80%")
    return short


def write_outputs(out: Path, by_view: dict[str, Any], results: list[B.CellResult],
                  power: list[B.ProbePower], header: list[str], rows: list[list[str]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "known_answers.json", json.dumps(
        {"totals": by_view, "probe_power": [p.to_dict() for p in power],
         "cells": [r.to_dict() for r in results]}, indent=1))
    buf = io.StringIO()
    csv.writer(buf).writerows([header, *rows])
    write_text_atomic(out / "known_answers.csv", buf.getvalue())


def judge(by_view: dict[str, dict[str, int]], short_power: list[B.ProbePower]) -> int:
    """0 where the verdict meets its targets, else 1 (and why)."""
    judged = [tot for key, tot in by_view.items() if key.endswith(" " + B.JUDGED)]
    false = sum(tot["false"] for tot in judged)
    short = [tot for tot in judged
             if tot["separable"] and tot["true_separable"] < 0.8 * tot["separable"]]
    if false or short or short_power:
        print(f"FAIL: {B.JUDGED}: {false} false attributions (target 0); true learner "
              f"preferred at < 80% of the separable live layers in {len(short)} setting(s); "
              f"{len(short_power)} cell(s) where probes name the true learner at < 80% of "
              "the layers the exact readout names it at")
        return 1
    print(f"PASS: {B.JUDGED}: no false attribution, true learner preferred at >= 80% of the "
          "separable live layers in every setting, and through probes at >= 80% of the "
          "layers the exact readout names it at, in every cell")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cfg = B.bench_config(args.n_sequences, args.n_boot)
    settings = list(B.SETTINGS) if args.setting == "all" else [args.setting]
    started = time.perf_counter()
    cells = [cell for name in settings for cell in B.grid(setting=name)]
    results = run_cells(cells, cfg, args.jobs)
    header, rows = cell_rows(results)
    print_table(header, rows)
    by_view = {f"{name} {view}": B.totals([r for r in results if r.cell.setting == name], view)
               for name in settings for view in B.VIEWS}
    print(f"sizes: {cfg.n_sequences} sequences, {cfg.n_boot} bootstrap resamples, metrics "
          f"{', '.join(cfg.metrics)}; {len(cells)} cells in {time.perf_counter() - started:.0f} s")
    print_totals(by_view)
    print_probe_power(B.probe_power(results, B.DEFAULT_VIEW), B.DEFAULT_VIEW, per_cell=False)
    power = B.probe_power(results)
    short_power = print_probe_power(power)
    if args.out is not None:
        write_outputs(args.out, by_view, results, power, header, rows)
    return judge(by_view, short_power)


if __name__ == "__main__":
    sys.exit(main())
