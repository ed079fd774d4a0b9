"""Fu et al. 2024 at CPU scale: do a softmax GPT's layers run iterative Newton or GD?

    python scripts/reproduce_fu2024.py [--out fu2024-report] [--checkpoint gpt-softmax]
    python scripts/reproduce_fu2024.py --garg-size --device cuda   # their 12x256, d=20, n=41

On the shipped ``gpt-softmax`` (8 layers x 64 wide, d = 8, 24 points) it aligns every layer
with Newton–Schulz and GD on isotropic and on ill-conditioned data (κ = 100), by error
cosine and induced-weight cosine, and prints each of the paper's qualitative claims next to
what we measure. ``--garg-size`` first trains their configuration (a GPU job: days on 2
CPU cores) with Garg's curriculum, then runs the same analysis.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from iclprobe import models, tasks
from iclprobe.alignment.pipeline import AlignConfig, align
from iclprobe.alignment.report import text_table, write_report


def garg_size_model(out: Path, device: str, steps: int) -> str:
    """Train (or resume) Garg et al.'s 12-layer, 256-wide model at d = 20, 41 points."""
    task = tasks.RegressionTask(n_dims=20, n_points=41)
    if (out / "checkpoint").exists():
        model = models.load(out)
        models.train(model, model.task, models.read_train_config(out), out=out, resume=True)
        return str(out)
    model = models.GPTRegressor(models.GPTConfig(n_dims=20, n_positions=41, n_layers=12,
                                                 d_model=256, n_heads=8))
    cfg = models.TrainConfig(steps=steps, lr=1e-4, batch_size=64, curriculum_every=2000,
                             curriculum_dims=(5, 1), curriculum_points=(11, 2), device=device,
                             checkpoint_every=1000, log_every=500)
    models.train(model, task, cfg, out=out)
    return str(out)


def claims(iso, ill) -> list[tuple[str, str]]:
    """The paper's qualitative claims next to our measurements."""
    def fit(res, learner):
        f = res.matches[learner]["error_cosine"].fit
        return f"slope {f.slope:.2f}, R² {f.r2:.2f}" if f else "n/a"

    def last(res, learner, metric="error_cosine"):
        return res.matches[learner][metric].best_value[-1]

    rows = [
        ("Newton step grows linearly with layer (Fig. 3a)", f"isotropic: {fit(iso, 'newton')}"),
        ("GD needs exponentially many steps (linear in log2 step)",
         f"isotropic: {fit(iso, 'gd')} in log2(step); best GD step at the last layer "
         f"{iso.matches['gd']['error_cosine'].best_step[-1]}"),
        ("Late layers: Newton at least as similar as GD",
         f"last layer error cosine: Newton {last(iso, 'newton'):.3f}, GD {last(iso, 'gd'):.3f}"),
        ("Induced weights agree with Newton's (Def. 3.2)",
         f"last layer weight cosine: Newton {last(iso, 'newton', 'weight_cosine'):.3f}, "
         f"GD {last(iso, 'gd', 'weight_cosine'):.3f}"),
        ("Ill-conditioned data: Newton still matches, GD needs more steps",
         f"κ=100: Newton {fit(ill, 'newton')}, last-layer sim {last(ill, 'newton'):.3f}; "
         f"GD best step {ill.matches['gd']['error_cosine'].best_step[-1]}, "
         f"sim {last(ill, 'gd'):.3f}"),
        ("The model approaches OLS with more examples (Fig. 2)",
         f"last-layer normalized error at t = n-1: {iso.layer_error_by_t[-1][-1]:.4f} "
         f"(OLS {iso.learner_error_by_t['ols'][-1]:.1e})"),
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="gpt-softmax")
    parser.add_argument("--out", type=Path, default=Path("fu2024-report"))
    parser.add_argument("--n-sequences", type=int, default=512)
    parser.add_argument("--garg-size", action="store_true")
    parser.add_argument("--garg-steps", type=int, default=500_000)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(2)
    checkpoint = (garg_size_model(args.out / "garg-run", args.device, args.garg_steps)
                  if args.garg_size else args.checkpoint)
    model = models.load(checkpoint, device=args.device)
    results = []
    for data in ("task", "ill-conditioned"):
        cfg = AlignConfig(algorithms=("newton", "gd", "ols"), data=data,
                          n_sequences=args.n_sequences, device=args.device)
        res = align(model, cfg, name=f"{Path(checkpoint).name} ({data})")
        print(text_table(res), end="\n\n")
        results.append(res)
    write_report(args.out, results, title="Fu et al. 2024 at CPU scale",
                 command="python scripts/reproduce_fu2024.py")
    print(f"{'paper':58s}  measured")
    for claim, measured in claims(*results):
        print(f"{claim:58s}  {measured}")
    print(f"report: {args.out / 'report.md'}")


if __name__ == "__main__":
    main()
