"""Known-answer benchmark: the confusion matrix of `align`'s Newton-vs-GD verdicts.

    python bench/known_answers.py [--out DIR] [--n-sequences 256] [--n-boot 100]

Models whose algorithm is known by construction (iclprobe.constructions): GD and Newton
oracles (the learner's iterates as layers, behind a rotation with distractor channels) at
½, 1 and 2 × each protocol's step rule, and the GD (PQ, Eq. 8) and Newton–Schulz
(linear attention) constructions at 0.3, 0.6 and 0.9 × their stability bound on the
evaluation batch; × protocols iclprobe and fu2024 × isotropic and ill-conditioned (κ = 100)
evaluation data × exact and probe readout; each cell counted for error and weight cosine.
Per cell, view (the protocol's learner table; the fitted view, Newton and GD matched over
step sizes as well as steps, which verdicts come from) and metric: live layers with the
true learner preferred, the other preferred (a false attribution), or no attribution.
Sizes: d = 5, n = 21, 8 layers (Newton construction: 12), 256 sequences, 100 bootstrap
resamples; a held-out setting (d = 4, n = 17, seed 7, κ = 50, multipliers 0.7 and 1.5,
fractions 0.45 and 0.75) is run too. Exits 1 while the fitted view makes any false
attribution. --out writes known_answers.json/.csv.
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
    parser.add_argument("--setting", choices=[*B.SETTINGS, "both"], default="both",
                        help="main: the slice views are chosen on; held-out: other seed, d, "
                             "n, κ and step multipliers")
    args = parser.parse_args(argv)
    cfg = B.bench_config(args.n_sequences, args.n_boot)
    settings = list(B.SETTINGS) if args.setting == "both" else [args.setting]
    cells = [cell for name in settings for cell in B.grid(setting=name)]
    results = [B.run_cell(cell, cfg) for cell in tqdm(cells, desc="cells")]
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
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for row in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    by_view = {f"{name} {view}": B.totals([r for r in results if r.cell.setting == name], view)
               for name in settings for view in B.VIEWS}
    print(f"sizes: {cfg.n_sequences} sequences, {cfg.n_boot} bootstrap resamples")
    for key, tot in by_view.items():
        share = tot["true_separable"] / tot["separable"] if tot["separable"] else float("nan")
        sep = (f"; separable layers {tot['separable']}, true preferred at "
               f"{tot['true_separable']} ({share:.0%})") if key.endswith("fitted") else ""
        print(f"{key} view, live layers: true preferred {tot['true']}, false attributions "
              f"{tot['false']}, no attribution {tot['none']}; cells that diverge "
              f"(not counted) {tot['diverges']}{sep}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "known_answers.json").write_text(json.dumps(
            {"totals": by_view, "cells": [r.to_dict() for r in results]}, indent=1))
        with open(args.out / "known_answers.csv", "w", newline="") as fh:
            csv.writer(fh).writerows([header, *rows])
    fitted = [tot for key, tot in by_view.items() if key.endswith(" fitted")]
    false = sum(tot["false"] for tot in fitted)
    short = [tot for tot in fitted
             if tot["separable"] and tot["true_separable"] < 0.8 * tot["separable"]]
    if false or short:
        print(f"FAIL: fitted view: {false} false attributions (target 0); true learner "
              f"preferred at < 80% of the separable live layers in {len(short)} setting(s)")
        return 1
    print("PASS: fitted view: no false attribution, true learner preferred at >= 80% of the "
          "separable live layers in every setting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
