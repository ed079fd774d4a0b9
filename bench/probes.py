"""`LayerProbes` fitting against scikit-learn `RidgeCV` fitted layer by layer.

Residuals already collected: 13 layers (12 blocks + embedding) x 256 wide, 2,000 sequences
x 41 points (positions t >= 1 fitted). Ours: one batched closed-form solve with GCV over the
same α grid for every layer; sklearn: `RidgeCV(alphas=grid)` per layer (its efficient
leave-one-out CV). Prints the speed-up (median of alternating repeats; target >= 3x), how
often the two choose the same α, and the largest coefficient difference at sklearn's α.

    python bench/probes.py [--repeats 3 --sequences 2000]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
from common import alternate, median_ratio
from sklearn.linear_model import RidgeCV

from iclprobe import probes
from iclprobe.cli import positive_int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--sequences", type=positive_int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(2)
    n_layers, width, n_points = 13, 256, 41
    gen = torch.Generator().manual_seed(0)
    # Residual-like features: a shared random basis plus noise; y read out linearly.
    basis = torch.randn(n_layers, 24, width, generator=gen)
    latent = torch.randn(args.sequences, n_points, 24, generator=gen)
    resid = torch.einsum("bnk,lkw->lbnw", latent, basis)
    resid += 0.3 * torch.randn(resid.shape, generator=gen)
    ys = latent[..., 0] + 0.1 * torch.randn(args.sequences, n_points, generator=gen)
    grid = torch.logspace(-3, 3, 13, dtype=torch.float64)
    rows = resid[:, :, 1:].flatten(1, 2)  # [layer, rows, width]
    target = ys[:, 1:].flatten()

    def ours():
        return probes.LayerProbes(alphas=grid).fit_residuals(resid, ys)

    def sklearn_cv():
        return [RidgeCV(alphas=grid.numpy()).fit(rows[layer].numpy(), target.numpy())
                for layer in range(n_layers)]

    times = alternate({"sklearn": sklearn_cv, "ours": ours}, repeats=args.repeats, warmup=0)
    fitted, refs = ours(), sklearn_cv()
    sk_alpha = torch.tensor([r.alpha_ for r in refs], dtype=torch.float64)
    same = int((sk_alpha == fitted.alpha_).sum())
    diffs = []
    for layer, ref in enumerate(refs):
        fit = probes.ridge_gcv(rows[layer:layer + 1], target, alphas=float(ref.alpha_))
        diffs.append(np.abs(fit.coef[0].numpy() - ref.coef_).max())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{n_layers} layers x {width} wide, {rows.shape[1]} rows per layer")
    print(f"LayerProbes (batched, GCV) {med['ours']:.2f} s; RidgeCV per layer "
          f"{med['sklearn']:.2f} s; speed-up {median_ratio(times, 'sklearn', 'ours'):.1f}x "
          f"(target >= 3x)")
    print(f"same alpha chosen on {same}/{n_layers} layers; largest coefficient difference "
          f"at sklearn's alpha {max(diffs):.1e}")


if __name__ == "__main__":
    main()
