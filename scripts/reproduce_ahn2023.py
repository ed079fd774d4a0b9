"""Ahn et al. 2023 on a CPU: Theorem 1, the 3-layer rotated-Σ experiment, and growing n.

    python scripts/reproduce_ahn2023.py [--restarts 3] [--steps 8000] [--out ahn2023-report]
    python scripts/reproduce_ahn2023.py --paper      # their batch 20,000 and 30,000 steps

1. Theorem 1: one layer, x ~ N(0, Σ), w ~ N(0, I), n = 20: A against Γ⁻¹.
2. Three layers, rotated Σ, w ~ N(0, Σ⁻¹) (their code's prior), sparse: distance of each
   A_l to Σ⁻¹ and the scales a_l over restarts, for Adam, SGD and L-BFGS (does the optimizer
   matter? do the a_l repeat?), with B = 0 and with B free (does longer training reach the
   stationary point A_l = a_l Σ⁻¹, B_l = b_l I?).
3. One layer as n grows: distance of A to Σ⁻¹ (the inverse of the data's Gram matrix in
   the limit) and to the finite-n optimum n/(n+d+1) Σ⁻¹.

The questions their reviewers left open (definiteness, the factored parametrization, other
priors, softmax, dense P and Q, depth x d x κ, the in-context curve): scripts/ahn_reviewers.py.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch

from iclprobe import models, probes, tasks, training
from iclprobe.atomic import atomic_directory
from iclprobe.cli import OneLineParser, out_dir, positive_int, thread_count
from iclprobe.errors import InputError
from iclprobe.storage import check_output, write_text_atomic

D = 5
OPTIMIZERS = {  # recipes scaled to a CPU; L-BFGS trains on one fixed dataset (Ahn et al.)
    "adam": dict(optimizer="adam", lr=0.01, betas=(0.9, 0.9), schedule="step", step_every=2000),
    "sgd": dict(optimizer="sgd", lr=0.02, momentum=0.9, schedule="step", step_every=2000,
                clip="per-matrix", clip_norm=0.5),
    "lbfgs": dict(optimizer="lbfgs", lr=1.0, resample_every=0, max_iter=20, history_size=50),
}


def train_pq(task: tasks.RegressionTask, n_layers: int, recipe: dict[str, Any], steps: int,
             batch: int, seed: int, zero_b: bool) -> models.PQTransformer:
    model = models.PQTransformer(models.PQConfig(n_dims=D, n_layers=n_layers, seed=seed,
                                                 init_std=0.01))
    lbfgs = recipe["optimizer"] == "lbfgs"
    cfg = training.TrainConfig(**{**recipe, "steps": max(1, steps // 40) if lbfgs else steps,
                                "batch_size": batch * (5 if lbfgs else 1), "loss": "last",
                                "zero_b": zero_b, "seed": seed, "log_every": 10**6,
                                "checkpoint_every": 0})
    training.train(model, task, cfg, progress=False)
    return model


def theorem1(steps: int, batch: int) -> dict[str, Any]:
    out = {}
    for cov in ("isotropic", "rotated"):
        task = tasks.RegressionTask(n_dims=D, n_points=21, cov=cov, w_prior="standard")
        model = train_pq(task, 1, OPTIMIZERS["adam"], steps, batch, 0, zero_b=True)
        a = probes.preconditioners(model).A[0].double()
        opt = probes.ahn_optimum(task.covariance, 20)
        out[cov] = {"distance": float(probes.distance(a, opt)[0]),
                    "relative_error": float((a - opt).norm() / opt.norm())}
        print(f"Theorem 1, {cov} Σ: distance(A, Γ⁻¹) {out[cov]['distance']:.4f}, "
              f"‖A − Γ⁻¹‖/‖Γ⁻¹‖ {out[cov]['relative_error']:.4f}")
    return out


def three_layers(restarts: int, steps: int, batch: int) -> dict[str, Any]:
    task = tasks.RegressionTask(n_dims=D, n_points=21, cov="rotated", w_prior="inverse-cov")
    inv = torch.linalg.inv(task.covariance)
    out: dict[str, Any] = {}
    for zero_b in (True, False):
        for name, recipe in OPTIMIZERS.items():
            runs = []
            for seed in range(restarts):
                model = train_pq(task, 3, recipe, steps, batch, seed, zero_b)
                dist, scale = probes.distance(probes.preconditioners(model).A, inv)
                b_dist = probes.distance(probes.preconditioners(model).B,
                                         torch.eye(D))[0] if not zero_b else None
                runs.append({"dist": dist.tolist(), "scale": scale.tolist(),
                             "b_dist_to_identity": None if b_dist is None else b_dist.tolist()})
            key = f"{name}, B {'= 0' if zero_b else 'free'}"
            out[key] = runs
            mean = [statistics.mean(r["dist"][layer] for r in runs) for layer in range(3)]
            scales = [[round(r["scale"][layer], 2) for r in runs] for layer in range(3)]
            print(f"3 layers, {key}: distance(A_l, Σ⁻¹) mean over {restarts} restarts "
                  f"{[round(m, 3) for m in mean]}; a_l per restart {scales}")
    return out


def b_free_long(steps: int, batch: int) -> dict[str, Any]:
    """Does longer training with B free reach A_l ∝ Σ⁻¹, B_l ∝ I (the stationary point)?"""
    task = tasks.RegressionTask(n_dims=D, n_points=21, cov="rotated", w_prior="inverse-cov")
    model = train_pq(task, 3, OPTIMIZERS["adam"], steps, batch, 0, zero_b=False)
    pre = probes.preconditioners(model)
    dist, scale = probes.distance(pre.A, torch.linalg.inv(task.covariance))
    b_dist, b_scale = probes.distance(pre.B, torch.eye(D))
    print(f"3 layers, adam, B free, {steps} steps: distance(A_l, Σ⁻¹) "
          f"{[round(v, 3) for v in dist.tolist()]}, distance(B_l, I) "
          f"{[round(v, 3) for v in b_dist.tolist()]}, b_l {[round(v, 3) for v in b_scale.tolist()]}")
    return {"steps": steps, "dist": dist.tolist(), "scale": scale.tolist(),
            "b_dist_to_identity": b_dist.tolist(), "b_scale": b_scale.tolist()}


def growing_n(ns: list[int], steps: int, batch: int) -> dict[str, Any]:
    out = {}
    cov = tasks.RegressionTask(n_dims=D, n_points=2, cov="rotated").covariance
    for n in ns:
        task = tasks.RegressionTask(n_dims=D, n_points=n + 1, cov=cov, w_prior="inverse-cov")
        model = train_pq(task, 1, OPTIMIZERS["adam"], steps, batch, 0, zero_b=True)
        a = probes.preconditioners(model).A[0].double()
        to_inv = float(probes.distance(a, torch.linalg.inv(cov))[0])
        opt = probes.ahn_optimum(cov, n, "inverse-cov")
        out[n] = {"dist_to_inv_cov": to_inv, "rel_error_to_optimum":
                  float((a - opt).norm() / opt.norm()), "scale": float(
                      probes.distance(a, torch.linalg.inv(cov))[1]), "optimal_scale": n / (n + D + 1)}
        print(f"n = {n}: distance(A, Σ⁻¹) {to_inv:.4f}, scale {out[n]['scale']:.3f} "
              f"(optimum n/(n+d+1) = {n / (n + D + 1):.3f})")
    return out


def plot(results: dict[str, Any], out: Path) -> Path:
    """Distances of A_l to Σ⁻¹ per optimizer (mean, min-max over restarts) and the scales."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    runs = results["three_layers"]
    for i, (key, restarts) in enumerate(runs.items()):
        dist = torch.tensor([r["dist"] for r in restarts])  # [restart, layer]
        x = torch.arange(3) + (i - len(runs) / 2) * 0.12
        axes[0].errorbar(x, dist.mean(0), yerr=[dist.mean(0) - dist.min(0).values,
                                                 dist.max(0).values - dist.mean(0)],
                         fmt="o", capsize=3, label=key)
        for r, run in enumerate(restarts):
            axes[1].plot(range(3), run["scale"], "o-" if "= 0" in key else "s--",
                         color=f"C{i}", alpha=0.7, label=key if r == 0 else None)
    axes[0].set_xticks(range(3))
    axes[0].set_xlabel("layer")
    axes[0].set_ylabel("distance(A_l, Σ⁻¹)")
    axes[0].set_title("3 layers, rotated Σ: mean and range over restarts", fontsize=9)
    axes[0].legend(fontsize=6)
    axes[1].set_xticks(range(3))
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel("a_l (A_l ≈ a_l Σ⁻¹)")
    axes[1].set_title("Scales a_l, one line per restart", fontsize=9)
    axes[1].legend(fontsize=6)
    ns = sorted(int(n) for n in results["growing_n"])
    grow = [results["growing_n"][str(n)] if str(n) in results["growing_n"]
            else results["growing_n"][n] for n in ns]
    axes[2].plot(ns, [g["scale"] for g in grow], "o-", label="learned a (A ≈ a Σ⁻¹)")
    axes[2].plot(ns, [g["optimal_scale"] for g in grow], "k--", label="n/(n+d+1)")
    axes[2].plot(ns, [g["dist_to_inv_cov"] for g in grow], "s-", label="distance(A, Σ⁻¹)")
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("context examples n")
    axes[2].set_title("One layer as n grows", fontsize=9)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    path = out / "ahn2023.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, results: dict[str, Any], overwrite: bool) -> Path:
    """``results.json`` and the figure written as one new report at ``out`` (atomically).

    ``out`` may not hold anything this script did not write (`check_output`); its own
    earlier report is replaced only with ``overwrite``.
    """
    with atomic_directory(out, "report", overwrite) as tmp:
        write_text_atomic(tmp / "results.json", json.dumps(results, indent=1))
        plot(results, tmp)
    return out / "ahn2023.png"


def read_results(out: Path) -> dict[str, Any]:
    """The results of an earlier run at ``out``, refused by name where there are none."""
    path = out / "results.json"
    try:
        results = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"--plot-only: no {path}: run without --plot-only first") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"--plot-only: {path} is not this script's JSON: {err}") from None
    missing = [k for k in RESULT_KEYS if not isinstance(results, dict) or k not in results]
    if missing:
        raise InputError(f"--plot-only: {path} has no {', '.join(missing)}: not written by "
                         "this script")
    return results


#: what a run writes to results.json (besides its settings)
RESULT_KEYS = ("theorem1", "three_layers", "b_free_long", "growing_n")


def main() -> None:
    parser = OneLineParser(prog="reproduce_ahn2023.py", description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=positive_int, default=3,
                        help="seeds per optimizer in the 3-layer experiment "
                        "(default: %(default)s)")
    parser.add_argument("--steps", type=positive_int, default=8000,
                        help="training steps of each model, L-BFGS a 40th of them; --paper "
                        "sets 30,000 (default: %(default)s)")
    parser.add_argument("--batch", type=positive_int, default=2000,
                        help="sequences per training batch, L-BFGS's fixed dataset 5 times "
                        "as many; --paper sets 20,000 (default: %(default)s)")
    parser.add_argument("--long-steps", type=positive_int, default=None,
                        help="steps of the extra long Adam run with B free (default 4x steps)")
    parser.add_argument("--paper", action="store_true", help="batch 20,000, 30,000 steps")
    parser.add_argument("--threads", type=thread_count, default=2,
                        help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--out", type=out_dir, default=Path("ahn2023-report"),
                        help="the report folder (results.json and ahn2023.png) "
                        "(default: %(default)s, in the current directory)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace this script's own earlier report at OUT")
    parser.add_argument("--plot-only", action="store_true",
                        help="redraw the figure of this script's report at OUT")
    args = parser.parse_args()
    try:
        if args.plot_only:
            print(f"figure: {write_report(args.out, read_results(args.out), True)}")
            return
        check_output(args.out, "report", args.overwrite)  # before the work, not after
        if args.paper:
            args.batch, args.steps = 20_000, 30_000
        torch.set_num_threads(args.threads)
        results = {"theorem1": theorem1(args.steps, args.batch),
                   "three_layers": three_layers(args.restarts, args.steps, args.batch),
                   "b_free_long": b_free_long(args.long_steps or 4 * args.steps, args.batch),
                   "growing_n": growing_n([5, 10, 20, 40], args.steps, args.batch),
                   "settings": vars(args) | {"out": str(args.out)}}
        figure = write_report(args.out, results, args.overwrite)
    except (InputError, OSError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(f"results: {args.out / 'results.json'}; figure: {figure}")


if __name__ == "__main__":
    main()
