"""Do align's 95% intervals hold the population value 95% of the time? Coverage per cell.

For a shipped model read exactly (default ka-gd-oracle: no probe is fitted on the data, so
every similarity has a population value), the similarity tables of Newton and GD by error
cosine and weight cosine (every layer × step) and the Newton − GD differences:

1. the population value: the same tables from ``--pop-chunks`` × ``--pop-sequences``
   sequences (weight cosine on all of them), averaged over the chunks;
2. ``--seeds`` aligns at the default sizes (512 sequences, 16 weight sequences, 200
   replicates), each cell's 95% interval holding the population value or not.

Every interval is computed twice from the same replicates: as align computes it (the
expanded percentile interval, `iclprobe.alignment.measuring.bootstrap`) and as
``torch.quantile``'s plain 2.5% and 97.5% percentiles (the baseline). Printed per group:
the mean coverage and the cells whose coverage is clearly under 90% (Wilson upper bound
< 0.9). Cells whose population value is within 1e-9 of a perfect match are left out (an
interval around 1 cannot miss it from above). docs/protocols.md ("How far the intervals
hold") reports a larger run of the same measurement, on four models.

    python bench/ci_coverage.py [--model ka-gd-oracle] [--seeds 100] [--pop-chunks 4]

Measured (2026-12-06, defaults; 6 min on one core beside other work), mean coverage,
align's (expanded) against torch.quantile's, and the cells clearly under 90%:

    newton table, error_cosine       225  0.950,   0 under 90%  0.938,   0 under 90%
    gd table, error_cosine           117  0.950,   0 under 90%  0.939,   0 under 90%
    newton − gd, error_cosine          9  0.928,   0 under 90%  0.910,   0 under 90%
    newton table, weight_cosine      225  0.926,   0 under 90%  0.889,   4 under 90%
    gd table, weight_cosine          117  0.926,   0 under 90%  0.896,   0 under 90%
    newton − gd, weight_cosine         9  0.882,   1 under 90%  0.833,   5 under 90%
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

import torch
from tqdm import tqdm

from iclprobe import models
from iclprobe.alignment import AlignConfig, align, comparison
from iclprobe.alignment.measuring.bootstrap import interval
from iclprobe.cli import positive_int

RUNS = ("newton", "gd")
METRICS = ("error_cosine", "weight_cosine")


def cells(res, plain: bool) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(value, lower, upper) per group, each flattened over its cells.

    ``plain``: the same replicates read by torch.quantile's 2.5% and 97.5% percentiles.
    """
    out = {}
    for metric in METRICS:
        sims = {run: res.similarities[run][metric] for run in RUNS}
        for run, sim in sims.items():
            lower, upper = _ends(sim.boots, sim, plain)
            out[f"{run} table, {metric}"] = (sim.values.flatten(), lower.flatten(),
                                            upper.flatten())
        a, b = sims["newton"], sims["gd"]
        diff = comparison.difference(a, b)  # the learner table's Newton − GD, as align has it
        lower, upper = _ends(comparison.best_boot(a) - comparison.best_boot(b), a, plain)
        out[f"newton − gd, {metric}"] = (torch.tensor(diff.value), lower, upper)
    return out


def _ends(boot: torch.Tensor, sim, plain: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not plain:
        return interval(boot, sim.confidence, sim.n_sequences)
    q = torch.tensor([(1 - sim.confidence) / 2, (1 + sim.confidence) / 2], dtype=boot.dtype)
    lower, upper = torch.quantile(boot, q, dim=-1)
    return lower, upper


def wilson_high(k: int, n: int, z: float = 1.959964) -> float:
    """The upper end of the Wilson 95% interval of a proportion k / n."""
    p, den = k / n, 1 + z * z / n
    return (p + z * z / (2 * n) + z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / den


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ka-gd-oracle")
    parser.add_argument("--seeds", type=positive_int, default=100)
    parser.add_argument("--pop-chunks", type=positive_int, default=4)
    parser.add_argument("--pop-sequences", type=positive_int, default=5000)
    args = parser.parse_args()
    model = models.load(args.model)
    base = dict(algorithms=RUNS, fitted=False, separation=False)
    pops = [cells(align(model, AlignConfig(n_sequences=args.pop_sequences,
                                           n_weight_sequences=args.pop_sequences,
                                           seed=100_000 + i, **base), name=args.model), False)
            for i in tqdm(range(args.pop_chunks), desc="population")]
    population = {g: torch.stack([p[g][0] for p in pops]).mean(0) for g in pops[0]}
    hits: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for seed in tqdm(range(args.seeds), desc="seeds"):
        res = align(model, AlignConfig(seed=seed, **base), name=args.model)
        for how, plain in (("align's", False), ("torch.quantile's", True)):
            for group, (_, lower, upper) in cells(res, plain).items():
                pop = population[group]
                held = ((lower <= pop) & (pop <= upper)).long()
                hits[how][group] = hits[how].get(group, 0) + held
    print(f"{args.model}: coverage of the 95% intervals over {args.seeds} seeds (512 sequences,"
          f" 16 weight sequences, 200 replicates), population from {args.pop_chunks} x "
          f"{args.pop_sequences} sequences")
    print(f"{'group':30s} {'cells':>5s}  {'align (expanded)':>22s}  {'torch.quantile':>22s}")
    for group, pop in population.items():
        keep = (pop - 1).abs() > 1e-9
        row = f"{group:30s} {int(keep.sum()):5d}"
        for how in ("align's", "torch.quantile's"):
            k = hits[how][group][keep]
            under = sum(wilson_high(int(c), args.seeds) < 0.9 for c in k.tolist())
            row += f"  {float(k.double().mean()) / args.seeds:.3f}, {under:3d} under 90%"
        print(row)


if __name__ == "__main__":
    main()
