"""Known-answer benchmark: the confusion matrix of `align`'s Newton-vs-GD verdicts.

    python bench/known_answers.py [--out DIR] [--n-sequences 256] [--n-boot 100]

Models whose algorithm is known by construction (iclprobe.constructions): GD and Newton
oracles (the learner's iterates as layers, behind a rotation with distractor channels) at
½, 1 and 2 × each protocol's step rule, and the GD (PQ, Eq. 8) and Newton–Schulz
(linear attention) constructions at 0.3, 0.6 and 0.9 × their stability bound on the
evaluation batch; × protocols iclprobe and fu2024 × isotropic and ill-conditioned (κ = 100)
evaluation data × exact and probe readout; each cell counted for error and weight cosine.
Per cell and metric: live layers with the true learner preferred, the other preferred (a
false attribution), or no attribution. Sizes: d = 5, n = 21, 8 layers (Newton
construction: 12), 256 sequences, 100 bootstrap resamples (about 3 minutes on 2 cores).
Exits 1 while any false attribution remains. --out writes known_answers.json/.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from tqdm import tqdm

from iclprobe.constructions import benchmark as B


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--n-sequences", type=int, default=256)
    parser.add_argument("--n-boot", type=int, default=100)
    args = parser.parse_args(argv)
    cfg = B.bench_config(args.n_sequences, args.n_boot)
    cells = list(B.grid())
    results = [B.run_cell(cell, cfg) for cell in tqdm(cells, desc="cells")]
    header = ["model", "protocol", "data", "readout", "mult", "metric", "true", "false", "none"]
    rows = []
    for r in results:
        c = r.cell
        base = [c.kind, c.protocol, c.data, c.readout, f"{c.multiplier:g}"]
        if r.diverges:
            rows.append(base + ["both", "diverges", "", ""])
            continue
        for metric, counts in r.counts.items():
            rows.append(base + [metric, str(counts["true"]), str(counts["false"]),
                                str(counts["none"])])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for row in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    tot = B.totals(results)
    print(f"totals over counted live layers: true preferred {tot['true']}, false attributions "
          f"{tot['false']}, no attribution {tot['none']}; cells that diverge {tot['diverges']} "
          f"(sizes: {cfg.n_sequences} sequences, {cfg.n_boot} bootstrap resamples)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "known_answers.json").write_text(json.dumps(
            {"totals": tot, "cells": [r.to_dict() for r in results]}, indent=1))
        with open(args.out / "known_answers.csv", "w", newline="") as fh:
            csv.writer(fh).writerows([header, *rows])
    if tot["false"]:
        print(f"FAIL: {tot['false']} false attributions (target 0)")
        return 1
    print("PASS: no false attribution")
    return 0


if __name__ == "__main__":
    sys.exit(main())
