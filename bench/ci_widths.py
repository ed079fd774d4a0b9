"""How many sequences does ``align`` need? CI half-widths against the sequence counts.

For a shipped model, the 95% bootstrap half-width of the quantities a verdict rests on —
the last layer's best error cosine with Newton, and the paired difference Newton − GD, by
error cosine (evaluation sequences) and by weight cosine (weight sequences) — measured at
several counts. The defaults of `AlignConfig` are chosen where the half-widths fall below
the differences the report has to resolve (the learners' own separation, ~0.002-0.02).

    python bench/ci_widths.py [--model gpt-softmax] [--counts 512:16 1024:128 ...]

A bad flag (a model that is not there, a count that is not a pair of integers >= 2 or has
more weight sequences than sequences, a count too large for the memory) is refused in one
line, exit status 2, before any align.

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
from collections.abc import Sequence

import torch

from iclprobe import models
from iclprobe.alignment import AlignConfig, align
from iclprobe.alignment.evaluation import evaluation_task
from iclprobe.alignment.measuring.layers import needs_probes
from iclprobe.alignment.measuring.memory import check_align_fits
from iclprobe.cli import CHECKPOINT_HELP, OneLineParser, sequence_count
from iclprobe.errors import InputError

#: (evaluation sequences, weight sequences), the `AlignConfig` defaults (512, 16) among them.
DEFAULT_COUNTS = [(128, 16), (256, 16), (512, 16), (512, 64), (1024, 128)]


def half_width(lower: float, upper: float) -> float:
    return (upper - lower) / 2


def pairs(text: str) -> tuple[int, int]:
    """``"512:16"`` -> (512, 16): evaluation sequences and weight sequences, each >= 2."""
    n, sep, w = text.partition(":")
    try:
        if not sep:
            raise argparse.ArgumentTypeError
        counts = sequence_count(n), sequence_count(w)  # AlignConfig's bound on both
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected N:W, evaluation and weight sequences, integers >= 2 (such as 512:16), "
            f"got {text!r}") from None
    if counts[1] > counts[0]:  # align would use SEQUENCES of them: the row would misname it
        raise argparse.ArgumentTypeError(
            f"expected N:W with W <= N (the induced weights are read on W of the N "
            f"evaluation sequences), got {text!r}")
    return counts


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ci_widths.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-softmax",
                        help=f"the model measured: {CHECKPOINT_HELP} (default: %(default)s)")
    parser.add_argument("--counts", type=pairs, nargs="+", default=DEFAULT_COUNTS,
                        metavar="N:W",
                        help="the counts measured, one align each: N evaluation sequences, W "
                        "of them for the induced weights; integers >= 2, W <= N (default: "
                        + " ".join(f"{n}:{w}" for n, w in DEFAULT_COUNTS) + ")")
    return parser


def checked(parser: argparse.ArgumentParser, args: argparse.Namespace
            ) -> tuple[models.Regressor, list[AlignConfig]]:
    """The model and one config per count, or a one-line refusal (status 2) before any align.

    A name that is neither a checkpoint nor a shipped model, a checkpoint that does not
    load, and a count whose align cannot fit in memory are refused here, not after the
    counts before them have run.
    """
    try:
        model = models.load(args.model)
    except (InputError, OSError) as err:  # FileNotFoundError names the shipped models
        parser.error(f"--model: {err}")
    base = AlignConfig(algorithms=("newton", "gd"), separation=False)
    configs = []
    for n, w in args.counts:
        cfg = dataclasses.replace(base, n_sequences=n, n_weight_sequences=w)
        try:
            check_align_fits(model, evaluation_task(model, cfg), cfg, needs_probes(model),
                             args.model)
        except InputError as err:
            parser.error(f"--counts {n}:{w}: {err}")
        configs.append(cfg)
    return model, configs


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, configs = checked(parser, args)
    print(f"{args.model}: 95% half-widths at the last layer; Newton − GD with its value and "
          "whether its interval excludes 0 (resolved)")
    print(f"{'sequences':>10} {'weight seqs':>11} {'Newton err-cos':>15} "
          f"{'N−GD err-cos':>26} {'N−GD w-cos':>26}")
    for cfg in configs:
        try:
            res = align(model, cfg, name=args.model)
        except (InputError, OSError) as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        n, w, last = cfg.n_sequences, cfg.n_weight_sequences, res.n_layers
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
