"""The candidates' families at Garg size: step counts' decays in stacks against one at a time.

Garg size: 512 sequences, 41 positions, d = 20, isotropic x, as ``align`` reads them. Each
candidate's grid family (every variant × step count, `family_iterates`, predictions on all
sequences) is run with the step counts' decays in stacks (`iclprobe.algorithms.spectral`,
``STACK_BYTES``: the default) and with one decay per stack (``STACK_BYTES`` = 1: one
exponential and one product per step count, as before the stacks, but through the
stacks' handling, so somewhat slower than the code before them), alternately; prints
the medians per family, their ratio, and whether the two give the same numbers bit for
bit. The stacks change GD's and Newton's families (their decays are powers); heavy
ball's and the rest are the control (no change expected: their differences are noise).

    python bench/families.py [--repeats 5]
"""

from __future__ import annotations

import statistics
import time

import torch

from iclprobe import algorithms, tasks
from iclprobe.algorithms import spectral
from iclprobe.alignment.measuring.candidates import family_iterates
from iclprobe.cli import OneLineParser, positive_int

KEYS = ("gd", "newton", "momentum", "online_gd", "cg", "gd_plus_plus", "ridge")


def run_families(batch: tasks.RegressionBatch, stats: algorithms.PrefixStats,
                 stack_bytes: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Seconds and predictions of each family with ``STACK_BYTES`` = ``stack_bytes``."""
    saved, spectral.STACK_BYTES = spectral.STACK_BYTES, stack_bytes
    try:
        seconds, preds = {}, {}
        for key in KEYS:
            start = time.perf_counter()
            it, _, _ = family_iterates(key, batch, stats, (1, batch.xs.shape[1] - 1), 12, False)
            seconds[key] = time.perf_counter() - start
            preds[key] = it.preds
        return seconds, preds
    finally:
        spectral.STACK_BYTES = saved


def main() -> None:
    parser = OneLineParser(prog="families.py", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    task = tasks.RegressionTask(n_dims=20, n_points=41)
    batch = task.sample(512, generator=0, dtype=torch.float64)
    stats = algorithms.prefix_stats(batch.xs, batch.ys)
    modes = {"in stacks": spectral.STACK_BYTES, "one per stack": 1}
    times: dict[str, dict[str, list[float]]] = {m: {k: [] for k in KEYS} for m in modes}
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    for mode, size in modes.items():  # warm-up, and the numbers compared
        outputs[mode] = run_families(batch, stats, size)[1]
    for _ in range(args.repeats):
        for mode, size in modes.items():
            for key, seconds in run_families(batch, stats, size)[0].items():
                times[mode][key].append(seconds)
    print(f"candidates' grid families at Garg size (512 x 41, d = 20), medians of "
          f"{args.repeats} alternating repeats:")
    print(f"  {'family':12s} {'in stacks':>10s} {'one per stack':>14s} {'ratio':>6s}  same numbers")
    total = dict.fromkeys(modes, 0.0)
    for key in KEYS:
        med = {mode: statistics.median(times[mode][key]) for mode in modes}
        for mode in modes:
            total[mode] += med[mode]
        same = torch.equal(outputs["in stacks"][key], outputs["one per stack"][key])
        print(f"  {key:12s} {med['in stacks']:9.3f}s {med['one per stack']:13.3f}s "
              f"{med['in stacks'] / med['one per stack']:6.2f}  {'yes' if same else 'NO'}")
    print(f"  {'all':12s} {total['in stacks']:9.3f}s {total['one per stack']:13.3f}s "
          f"{total['in stacks'] / total['one per stack']:6.2f}")


if __name__ == "__main__":
    main()
