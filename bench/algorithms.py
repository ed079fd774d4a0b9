"""All-prefix learners against a per-prefix loop batched over sequences.

Newton–Schulz (steps 1–24) and GD (Fu et al.'s grid 2⁰…2¹², lr 0.01 on the summed loss) at
d = 20, n = 41, B = 512. The baseline (`iclprobe.algorithms.reference`) loops over prefixes
and iterates the matrices directly, batched over sequences — stronger than Fu et al.'s code,
which also loops over sequences — in float64, the precision ours computes in. Prints the
speed-up (median of alternating repeats; target >= 10x) for each learner alone and for the
two sharing one eigendecomposition (as `iclprobe align` runs them), and the largest
relative difference of the predictions (target < 1e-4).

    python bench/algorithms.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import alternate, median_ratio

from iclprobe import algorithms, tasks
from iclprobe.algorithms.reference import gd_direct, newton_direct
from iclprobe.cli import positive_int

NEWTON_STEPS = list(range(1, 25))
GD_STEPS = [2**i for i in range(13)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    batch = tasks.RegressionTask(n_dims=20, n_points=41).sample(512, generator=0)
    xs, ys = batch.xs.double(), batch.ys.double()

    def newton(stats=None):
        return algorithms.newton(xs, ys, NEWTON_STEPS, weights=False, stats=stats).preds

    def gd(stats=None):
        return algorithms.gd(xs, ys, GD_STEPS, lr=0.01, normalize=False, weights=False,
                             stats=stats).preds

    def both():
        stats = algorithms.prefix_stats(xs, ys)
        return newton(stats), gd(stats)

    def newton_loop():
        return newton_direct(xs, ys, NEWTON_STEPS)

    def gd_loop():
        return gd_direct(xs, ys, GD_STEPS, 0.01, normalize=False)

    for label, a, b in (("newton", newton(), newton_loop()), ("gd", gd(), gd_loop())):
        rel = ((a - b).abs().amax((1, 2)) / b.abs().amax((1, 2))).max().item()
        print(f"{label}: max relative difference of the predictions {rel:.1e} (target < 1e-4)")
    float32_err = (newton_direct(batch.xs, batch.ys, NEWTON_STEPS).double() - newton_loop())
    print(f"(for scale: the same Newton loop in float32 is off by "
          f"{(float32_err.abs().max() / newton_loop().abs().max()).item():.1e})")
    times = alternate({"newton_loop": newton_loop, "newton": newton, "gd_loop": gd_loop,
                       "gd": gd, "both": both}, repeats=args.repeats, warmup=0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"newton steps 1-24: ours {med['newton']:.3f} s, loop {med['newton_loop']:.3f} s, "
          f"speed-up {median_ratio(times, 'newton_loop', 'newton'):.1f}x")
    print(f"gd steps 2^0..2^12: ours {med['gd']:.3f} s, loop {med['gd_loop']:.3f} s, "
          f"speed-up {median_ratio(times, 'gd_loop', 'gd'):.1f}x")
    pairs = [(nl + gl) / b for nl, gl, b in zip(times["newton_loop"], times["gd_loop"],
                                                times["both"])]
    print(f"newton + gd sharing one decomposition: ours {med['both']:.3f} s, loops "
          f"{med['newton_loop'] + med['gd_loop']:.3f} s, speed-up {statistics.median(pairs):.1f}x "
          f"(target >= 10x)")


if __name__ == "__main__":
    main()
