"""How many sequences does ``align`` need? CI half-widths against the sequence counts.

For a shipped model, the 95% bootstrap half-width of the quantities a verdict rests on —
the last layer's best error cosine with Newton, and the paired difference Newton − GD, by
error cosine (evaluation sequences) and by weight cosine (weight sequences) — measured at
several counts. The defaults of `AlignConfig` are chosen where the half-widths fall below
the differences the report has to resolve (the learners' own separation, ~0.002-0.02).

    python bench/ci_widths.py [--model gpt-softmax] [--counts 512:16 1024:128 ...]

Measured on gpt-softmax (2 CPU cores, 2026-12-06, with the expanded percentile intervals
of `iclprobe.alignment.measuring.bootstrap`), at the last layer: the half-width of
Newton's best error cosine, and Newton − GD with its half-width, value and whether its
interval excludes 0:

     sequences weight seqs  Newton err-cos               N−GD err-cos                 N−GD w-cos
           128          16          0.0021 ±0.00076 of -0.00154 resolved ±0.00020 of -0.00017     open
           256          16          0.0021 ±0.00075 of -0.00190 resolved ±0.00019 of -0.00016     open
           512          16          0.0018 ±0.00050 of -0.00222 resolved ±0.00022 of -0.00018     open
           512          64          0.0018 ±0.00050 of -0.00222 resolved ±0.00009 of -0.00018 resolved
          1024         128          0.0011 ±0.00033 of -0.00194 resolved ±0.00010 of -0.00024 resolved

The verdicts rest on the paired differences: Newton − GD by error cosine is resolved from
128 evaluation sequences on (512: ±0.0005 of −0.0022), and `AlignConfig` uses 512. By
weight cosine the difference itself is ~0.0002, 10-100 times below the learners' own
resemblance gap (1 − 0.99 … 1 − 0.999), so no sequence count turns it into a
preference; 16 weight sequences (±0.0002, its sign open) keep the induced-weight pass
cheap, and 64 resolve its sign. Fewer queries per prefix than 1.5 d would bias the weight
cosine down, so the query count stays. (The run of 2026-12-01, with torch.quantile's
narrower percentile intervals and the code of then, had 512:16 at ±0.00058 of −0.00134 and
±0.00015 of −0.00013.)
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from iclprobe import models
from iclprobe.alignment import AlignConfig, align

#: (evaluation sequences, weight sequences), the `AlignConfig` defaults (512, 16) among them.
DEFAULT_COUNTS = [(128, 16), (256, 16), (512, 16), (512, 64), (1024, 128)]


def half_width(lower: float, upper: float) -> float:
    return (upper - lower) / 2


def pairs(text: str) -> tuple[int, int]:
    """``"512:16"`` -> (512, 16): evaluation sequences and weight sequences."""
    n, _, w = text.partition(":")
    return int(n), int(w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-softmax")
    parser.add_argument("--counts", type=pairs, nargs="+", default=DEFAULT_COUNTS,
                        help="SEQUENCES:WEIGHT_SEQUENCES pairs (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = models.load(args.model)
    base = AlignConfig(algorithms=("newton", "gd"), separation=False)
    print(f"{args.model}: 95% half-widths at the last layer; Newton − GD with its value and "
          "whether its interval excludes 0 (resolved)")
    print(f"{'sequences':>10} {'weight seqs':>11} {'Newton err-cos':>15} "
          f"{'N−GD err-cos':>26} {'N−GD w-cos':>26}")
    for n, w in args.counts:
        cfg = dataclasses.replace(base, n_sequences=n, n_weight_sequences=w)
        res = align(model, cfg, name=args.model)
        last = res.n_layers
        err, wcos = res.comparisons["error_cosine"], res.comparisons["weight_cosine"]
        s = err.scores["newton"].score
        cells = []
        for diff in (err.pairs[0].difference, wcos.pairs[0].difference):
            lo, hi, value = diff.lower[last], diff.upper[last], diff.value[last]
            resolved = "resolved" if lo > 0 or hi < 0 else "open"
            cells.append(f"±{half_width(lo, hi):.5f} of {value:+.5f} {resolved:>8}")
        print(f"{n:>10} {w:>11} {half_width(s.lower[last], s.upper[last]):>15.4f} "
              f"{cells[0]:>26} {cells[1]:>26}")


if __name__ == "__main__":
    main()
