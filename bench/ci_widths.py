"""How many sequences does ``align`` need? CI half-widths against the sequence counts.

For a shipped model, the 95% bootstrap half-width of the quantities a verdict rests on —
the last layer's best error cosine with Newton, and the paired difference Newton − GD, by
error cosine (evaluation sequences) and by weight cosine (weight sequences) — measured at
several counts. The defaults of `AlignConfig` are chosen where the half-widths fall below
the differences the report has to resolve (the learners' own separation, ~0.002-0.02).

    python bench/ci_widths.py [--model gpt-softmax]

Measured on gpt-softmax (2 CPU cores, 2026-12-01), half-widths at the last layer:

    sequences  weight seqs  Newton err-cos  N−GD err-cos  N−GD w-cos
          128           16          0.0041        0.0008      0.0002
          256           32          0.0034        0.0007      0.0001
          512           64          0.0022        0.0006      0.0001
         1024          128          0.0016        0.0004      0.0001

The verdicts rest on the paired differences: 512 evaluation sequences resolve Newton − GD
to ±0.0006 (the learners' own separation is 0.003-0.02), and the weight-cosine difference
is already ±0.0001 on 16-32 weight sequences, so `AlignConfig` uses 512 and 16 (the
weight-cosine value itself is then known to ±0.0035; fewer queries per prefix than 1.5 d
would bias it down, so the query count stays).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from iclprobe import models
from iclprobe.alignment import AlignConfig, align


def half_width(lower: float, upper: float) -> float:
    return (upper - lower) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-softmax")
    parser.add_argument("--counts", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--weight-counts", type=int, nargs="+", default=[16, 32, 64, 128])
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = models.load(args.model)
    base = AlignConfig(algorithms=("newton", "gd"), separation=False)
    print(f"{args.model}: 95% half-widths at the last layer")
    print(f"{'sequences':>10} {'weight seqs':>11} {'Newton err-cos':>15} {'N−GD err-cos':>13} "
          f"{'N−GD w-cos':>11}")
    for n, w in zip(args.counts, [*args.weight_counts, *[args.weight_counts[-1]] * 9]):
        cfg = dataclasses.replace(base, n_sequences=n, n_weight_sequences=min(w, n))
        res = align(model, cfg, name=args.model)
        last = res.n_layers
        err, wcos = res.comparisons["error_cosine"], res.comparisons["weight_cosine"]
        s = err.scores["newton"].score
        de, dw = err.pairs[0].difference, wcos.pairs[0].difference
        print(f"{n:>10} {min(w, n):>11} {half_width(s.lower[last], s.upper[last]):>15.4f} "
              f"{half_width(de.lower[last], de.upper[last]):>13.4f} "
              f"{half_width(dw.lower[last], dw.upper[last]):>11.4f}")


if __name__ == "__main__":
    main()
