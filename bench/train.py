"""Training steps/s of `training.train` against a plain loop over Garg's HF construction.

Same size on both sides (8 layers x 64 wide, 4 heads, d = 8, 24 points, batch 64, Adam);
our side includes everything the trainer does per step (seeded data per step, the lr
schedule, constraints, the progress bar off). Prints the median over alternating repeats of
plain-loop time / trainer time (target >= 1.0).

    python bench/train.py [--repeats 7 --steps 40]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import alternate, median_ratio
from garg import Garg

from iclprobe import models, tasks, training
from iclprobe.cli import positive_int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=7)
    parser.add_argument("--steps", type=positive_int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(2)
    d, n, width, layers, heads, batch = 8, 24, 64, 8, 4, 64
    task = tasks.RegressionTask(n_dims=d, n_points=n)
    ours = models.GPTRegressor(models.GPTConfig(n_dims=d, n_positions=n, n_layers=layers,
                                                d_model=width, n_heads=heads))
    cfg = training.TrainConfig(steps=args.steps, batch_size=batch, log_every=10**6,
                             checkpoint_every=0)
    torch.manual_seed(0)
    garg = Garg(d, n, width, layers, heads).train()
    opt = torch.optim.Adam(garg.parameters(), lr=1e-3)

    def plain_loop() -> None:
        for _ in range(args.steps):
            xs = torch.randn(batch, n, d)
            ws = torch.randn(batch, d, 1)
            ys = (xs @ ws)[..., 0]
            loss = (garg(xs, ys) - ys).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    def trainer() -> None:
        training.train(ours, task, cfg, progress=False)

    times = alternate({"plain": plain_loop, "trainer": trainer}, repeats=args.repeats, warmup=1)
    for name, values in times.items():
        print(f"{name:8s} {args.steps / statistics.median(values):6.2f} steps/s (median)")
    print(f"speed ratio plain-loop time / trainer time (median of alternating runs): "
          f"{median_ratio(times, 'plain', 'trainer'):.3f}  (target >= 1.0)")


if __name__ == "__main__":
    main()
