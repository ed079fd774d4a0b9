"""A tiny end-to-end run: sample a task, train a small GPT, save, reload, read residuals.

Runs in under a minute on 2 CPU cores: ``python scripts/quickstart.py``.
"""

from __future__ import annotations

import sys
import tempfile

import torch
from tqdm import trange

from iclprobe import models, tasks
from iclprobe.cli import OneLineParser, positive_int


def main(steps: int = 1500) -> None:
    torch.set_num_threads(2)
    task = tasks.RegressionTask(n_dims=3, n_points=12)
    cfg = models.GPTConfig(n_dims=3, n_positions=12, n_layers=2, d_model=32, n_heads=2,
                           attention="linear", layout="paired", seed=0)
    model = models.GPTRegressor(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in (bar := trange(steps, desc="training")):
        batch = task.sample(64, generator=gen)
        loss = (model(batch.xs, batch.ys) - batch.ys).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")

    test = task.sample(512, generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        model.save(f"{tmp}/quickstart", task=task)
        model = models.load(f"{tmp}/quickstart")
    with torch.no_grad():
        preds, cache = model.run_with_cache(test.xs, test.ys)
    err = (preds - test.ys).pow(2).mean(0) / task.n_dims  # Garg's normalized error, per t
    print("normalized error by number of examples t (the zero predictor scores 1.0):")
    print("  " + " ".join(f"{t}:{e:.2f}" for t, e in enumerate(err.tolist())))
    resid = cache.accumulated_resid()
    print(f"residual stream per layer: {tuple(resid.shape)}  [layer, batch, token, d_model]")


def cli(argv: list[str] | None = None) -> int:
    """The command line: ``--steps N`` (a bad value is one line and exit status 2)."""
    parser = OneLineParser(prog="quickstart.py", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=1500,
                        help="Adam steps of the small GPT's training (default 1500)")
    main(parser.parse_args(argv).steps)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
