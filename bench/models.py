"""Forward+backward throughput of GPTRegressor against Garg's Hugging Face construction.

Both models hold the same weights (ours imported from the HF state dict through
``convert_garg_state``). Prints, per size, the median over alternating repeats of
HF time / our time (target >= 1.0), and the cost of the hook points themselves: our model
against the same model with every HookPoint replaced by a plain function (target < 5%).

    python bench/models.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import alternate, median_ratio
from garg import Garg

from iclprobe import models, tasks
from iclprobe.cli import positive_int
from iclprobe.models._tl import HookPoint

SIZES = {"garg (12x256, d=20, 41 pts)": (20, 41, 256, 12, 8),
         "small (8x64, d=8, 24 pts)": (8, 24, 64, 8, 4)}


class _Identity:
    """A plain callable standing in for a HookPoint: no module call, never observed."""

    _forward_hooks: dict = {}
    _backward_hooks: dict = {}

    def __call__(self, x):
        return x


def strip_hooks(model: torch.nn.Module) -> torch.nn.Module:
    """The same computation with every HookPoint module replaced by a plain identity."""
    for name, module in list(model.named_modules()):
        if isinstance(module, HookPoint):
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            del parent._modules[attr]
            object.__setattr__(parent, attr, _Identity())
    return model


def step_fn(model, batch):
    def step():
        model.zero_grad(set_to_none=True)
        loss = (model(batch.xs, batch.ys) - batch.ys).pow(2).mean()
        loss.backward()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=15)
    parser.add_argument("--batch", type=positive_int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(2)
    for label, (d, n, width, layers, heads) in SIZES.items():
        torch.manual_seed(0)
        garg = Garg(d, n, width, layers, heads).train()
        state = {f"_backbone.{k}": v for k, v in garg._backbone.state_dict().items()}
        state.update({f"_read_in.{k}": v for k, v in garg._read_in.state_dict().items()})
        state.update({f"_read_out.{k}": v for k, v in garg._read_out.state_dict().items()})
        cfg = models.GPTConfig(n_dims=d, n_positions=n, n_layers=layers, d_model=width,
                               n_heads=heads)
        ours = models.GPTRegressor(cfg)
        ours.load_state_dict(models.convert_garg_state(state, cfg))
        bare = models.GPTRegressor(cfg)
        bare.load_state_dict(ours.state_dict())
        bare = strip_hooks(bare)
        batch = tasks.RegressionTask(n_dims=d, n_points=n).sample(args.batch, generator=0)
        with torch.no_grad():
            diff = (ours(batch.xs, batch.ys) - garg(batch.xs, batch.ys)).abs().max().item()
        times = alternate({"hf": step_fn(garg, batch), "ours": step_fn(ours, batch),
                           "bare": step_fn(bare, batch)}, repeats=args.repeats)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{label}: batch {args.batch}, max |pred diff| {diff:.1e}")
        print(f"  ms per forward+backward (median): HF {med['hf']:.1f}, ours {med['ours']:.1f}, "
              f"ours without hook points {med['bare']:.1f}")
        print(f"  speed ratio HF/ours (median of alternating runs): "
              f"{median_ratio(times, 'hf', 'ours'):.3f}  (target >= 1.0)")
        overhead = 1 / median_ratio(times, "bare", "ours") - 1
        print(f"  hook-point overhead (ours vs bare): {100 * overhead:+.1f}%  (target < 5%)")


if __name__ == "__main__":
    main()
