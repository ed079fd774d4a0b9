"""Ahn et al. 2023's reviewers, answered on a CPU: one study, a number per question.

    python scripts/ahn_reviewers.py [--out ahn-reviewers-report] [--threads 2] [--overwrite]
    python scripts/ahn_reviewers.py --small      # the test suite's version, in seconds

Q1 is each trained A_l positive definite? Q2 the factored A_l = W_Kᵀ W_Q (d_k = d, d_k < d).
Q3 w ~ N(0, I) and w ~ N(0, Σ_w) with x ~ N(0, Σ). Q4 softmax attention under Eq. 8's
sparsity. Q5 dense P and Q. Q6 the scalars a_l over restarts per optimizer. Q7 layers x d x κ
against GD with its best step size and OLS. Q8 the in-context curve per layer. Sizes:
`ahn_study.Sizes`; each question prints its time against its budget. The report folder
(report.md, results.json, figures, CSV) is written whole at the end, and only where
iclprobe may write a report (never over files it did not write).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ahn_questions as Q  # noqa: E402
import ahn_study as S  # noqa: E402
import torch  # noqa: E402

from iclprobe import models  # noqa: E402
from iclprobe.atomic import atomic_directory  # noqa: E402
from iclprobe.cli import OneLineParser, out_dir, thread_count  # noqa: E402
from iclprobe.errors import InputError  # noqa: E402
from iclprobe.storage import check_output, write_text_atomic  # noqa: E402

TITLES = {
    "Q1": "Is each trained A_l positive definite?",
    "Q2": "Factored A_l = W_Kᵀ W_Q: do the stationary points survive, and how fast?",
    "Q3": "x ~ N(0, Σ) with w ~ N(0, I) or N(0, Σ_w): what do the A_l converge to?",
    "Q4": "Softmax attention (softmax-ahn) under Eq. 8: does it reach the linear loss?",
    "Q5": "Dense P, Q: do the layers still run preconditioned GD, and what is B?",
    "Q6": "The scalars a_l over restarts, per optimizer",
    "Q7": "Layers 1–4 x d x κ: the last layer against GD (best step size) and OLS",
    "Q8": "The in-context curve per layer beside GD, pGD(Σ⁻¹) and OLS",
}
#: Seconds per question at the default sizes on 2 CPU cores (measured, with margin).
BUDGETS = {"Q6": 420, "Q2": 200, "Q3": 330, "Q4": 260, "Q5": 200, "Q7": 300, "Q8": 30,
           "Q1": 10}
SHIPPED = ("pq-rotated-3layer", "pq-isotropic-1layer")


def run(sizes: S.Sizes) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """Every question in dependency order; returns (results, times) by question.

    A time is ``{"wall", "cpu"}`` seconds: the process's CPU time is what the question
    takes on idle cores (``--threads 1``: on one), whatever else the machine runs.
    """
    trained: Q.Models = {}
    results: dict[str, Any] = {}
    shipped = {name: models.load(name) for name in SHIPPED}
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("Q6", lambda: Q.scales_per_optimizer(sizes, trained)),
        ("Q2", lambda: Q.factored(sizes, trained, results["Q6"])),
        ("Q3", lambda: Q.other_priors(sizes, trained)),
        ("Q4", lambda: Q.softmax(sizes, trained, results["Q6"])),
        ("Q5", lambda: Q.dense(sizes, trained)),
        ("Q7", lambda: Q.grid(sizes)),
        ("Q8", lambda: Q.curve(sizes, trained)),
        ("Q1", lambda: Q.definiteness(trained, shipped)),
    ]
    seconds = {}
    for key, fn in steps:
        print(f"{key} (budget {BUDGETS[key]} s): {TITLES[key]}", flush=True)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            results[key] = fn()
        except Exception as err:  # one question failing leaves the others' answers
            if sizes == S.Sizes.small():
                raise  # the test suite's version: a failure is a failure
            results[key] = {"answer": f"FAILED: {type(err).__name__}: {err}"}
            logging.getLogger(__name__).exception("%s failed", key)
        seconds[key] = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
        over = " — over budget" if seconds[key]["cpu"] > BUDGETS[key] else ""
        print(f"{key} took {seconds[key]['cpu']:.0f} s of CPU ({seconds[key]['wall']:.0f} s "
              f"wall){over}: {results[key]['answer']}", flush=True)
    return results, seconds


def report_text(results: dict[str, Any], seconds: dict[str, dict[str, float]],
                sizes: S.Sizes, figures: dict[str, str]) -> str:
    lines = ["# Ahn et al. 2023: the reviewers' questions, measured", ""]
    lines += [f"- **{k}** {TITLES[k]} {results[k]['answer']}." for k in sorted(results)]
    lines += ["", "| question | budget (s) | CPU time (s) | wall time (s) |", "|---|---|---|---|"]
    lines += [f"| {k} | {BUDGETS[k]} | {seconds[k]['cpu']:.0f} | {seconds[k]['wall']:.0f} |"
              for k in sorted(seconds)]
    total = {k: sum(v[k] for v in seconds.values()) for k in ("cpu", "wall")}
    lines += [f"| all | {sum(BUDGETS.values())} | {total['cpu']:.0f} | {total['wall']:.0f} |",
              "", f"Threads: {torch.get_num_threads()}; the CPU time is the process's (what "
              "the study takes on idle cores), the wall time what it took here.", "",
              f"Sizes: `{sizes}`.", "",
              "Setting: Ahn et al.'s 3-layer experiment unless a question says otherwise: "
              f"d = {S.D}, N = {S.N_CONTEXT} context examples and a query, rotated Σ "
              "(eigenvalues 1, 1, 1/4, 1/16, 1; seed 0), w ~ N(0, Σ⁻¹), B = 0, the loss at "
              "the query. Errors are the query's mean squared error over the mean y² (the "
              "zero predictor: 1), on 2000 fixed test sequences per task.", "",
              "Q3's one-layer optimum, for x ~ N(0, Σ), w ~ N(0, Σ_w), noise σ²: "
              "A* = (((n+1)/n) Σ + ((tr(Σ Σ_w) + σ²)/n) Σ_w⁻¹)⁻¹ (derived in "
              "docs/ahn-reviewers.md; Σ_w = I gives Ahn et al.'s Γ⁻¹, Σ_w = Σ⁻¹ gives "
              "n/(n+d+1) Σ⁻¹). For three layers no closed form is known to us: the "
              "reference is the numerical optimum.", ""]
    lines += [f"![{name}]({file})" for name, file in figures.items()]
    lines += ["", "Everything measured is in results.json; tables in the CSV files.", ""]
    return "\n".join(lines)


def _csv(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    flat = [[json.dumps(r[k]) if isinstance(r[k], (dict, list)) else str(r[k]) for k in keys]
            for r in rows]
    return "\n".join([",".join(keys), *(",".join(f) for f in flat)]) + "\n"


def write_report(out: Path, results: dict[str, Any], seconds: dict[str, dict[str, float]],
                 sizes: S.Sizes, overwrite: bool) -> Path:
    done = {k for k, v in results.items() if not v["answer"].startswith("FAILED")}
    with atomic_directory(out, "report", overwrite) as tmp:
        figures = plot_all(results, tmp) if {"Q2", "Q6", "Q7", "Q8"} <= done else {}
        write_text_atomic(tmp / "results.json", json.dumps(
            {"results": results, "seconds": seconds, "budgets": BUDGETS,
             "sizes": sizes.__dict__}, indent=1, default=str))
        if "Q1" in done:
            write_text_atomic(tmp / "q1_definiteness.csv", _csv(results["Q1"]["rows"]))
        if "Q7" in done:
            write_text_atomic(tmp / "q7_grid.csv", _csv(_grid_rows(results["Q7"])))
        if "Q8" in done:
            write_text_atomic(tmp / "q8_curve.csv", _csv(_curve_rows(results["Q8"])))
        write_text_atomic(tmp / "report.md", report_text(results, seconds, sizes, figures))
    return out / "report.md"


def _grid_rows(q7: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**{k: r[k] for k in ("layers", "d", "kappa", "gd_best", "gd_lr", "ols")},
             "model_mean": r["model"]["mean"], "model_min": r["model"]["min"],
             "model_max": r["model"]["max"]} for r in q7["rows"]]


def _curve_rows(q8: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"t": t, **{f"layer_{i + 1}": q8["layers_mean"][i][t]
                        for i in range(len(q8["layers_mean"]))},
             **{f"{name} step {k + 1}": v[k][t] for name, v in q8["references"].items()
                for k in range(len(v))}} for t in q8["t"]]


def plot_all(results: dict[str, Any], out: Path) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    _plot_scales(axes[0], results["Q6"])
    _plot_trajectories(axes[1], results["Q2"])
    _plot_grid(axes[2], results["Q7"])
    _plot_curve(axes[3], results["Q8"])
    fig.tight_layout()
    fig.savefig(out / "ahn_reviewers.png", dpi=100)
    plt.close(fig)
    return {"Q6, Q2, Q7, Q8": "ahn_reviewers.png"}


def _plot_scales(ax: Any, q6: dict[str, Any]) -> None:
    for i, (name, runs) in enumerate(q6["runs"].items()):
        for r, run in enumerate(runs):
            ax.plot([x + 0.08 * (i - 1) for x in range(1, 4)], run["scale"], "o", alpha=0.7,
                    color=f"C{i}", label=name if r == 0 else None)
    ax.set(xlabel="layer l", ylabel="a_l (A_l ≈ a_l Σ⁻¹)", xticks=[1, 2, 3],
           title="Q6: a_l, one dot per restart")
    ax.legend(fontsize=7)


def _plot_trajectories(ax: Any, q2: dict[str, Any]) -> None:
    for i, (key, runs) in enumerate(q2["runs"].items()):
        for r, run in enumerate(runs):
            steps = [p["step"] for p in run["trajectory"]]
            ax.plot(steps, [p["dist"] for p in run["trajectory"]], "o-", color=f"C{i}",
                    alpha=0.6, label=key if r == 0 else None)
    ax.axhline(q2["threshold"], color="k", ls=":", lw=1)
    ax.set(xlabel="L-BFGS outer step (20 iterations)", ylabel="max_l dist(A_l, Σ⁻¹)",
           yscale="log", title="Q2: factored vs unfactored")
    ax.legend(fontsize=7)


def _plot_grid(ax: Any, q7: dict[str, Any]) -> None:
    rows = q7["rows"]
    labels = [f"L{r['layers']} d{r['d']} κ{r['kappa']:g}" for r in rows]
    x = range(len(rows))
    ax.plot(x, [r["model"]["mean"] for r in rows], "o", label="trained, last layer")
    ax.plot(x, [r["gd_best"] for r in rows], "s", mfc="none", label="GD, best step size")
    ax.plot(x, [max(r["ols"], 1e-8) for r in rows], "k.", label="OLS (floor 1e-8)")
    ax.set_xticks(list(x), labels, rotation=90, fontsize=5)
    ax.set(yscale="log", ylabel="error at the query", title="Q7: layers x d x κ")
    ax.legend(fontsize=7)


def _plot_curve(ax: Any, q8: dict[str, Any]) -> None:
    t = q8["t"]
    for i, mean in enumerate(q8["layers_mean"]):
        ax.plot(t, mean, "-", color=f"C{i}", label=f"layer {i + 1}")
        ax.fill_between(t, q8["layers_min"][i], q8["layers_max"][i], color=f"C{i}", alpha=0.2)
    for j, (name, values) in enumerate(q8["references"].items()):
        ax.plot(t, values[-1], ["--", ":", "-."][j % 3], color="k", lw=1,
                label=name + (" (3 steps)" if name != "ols" else ""))
    ax.set(xlabel="in-context examples t", ylabel="error", yscale="log",
           title="Q8: the in-context curve")
    ax.legend(fontsize=7)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="ahn_reviewers.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_dir, default=Path("ahn-reviewers-report"),
                        help="the report folder (report.md, results.json, the figure and "
                        "CSV tables), written whole at the end (default: %(default)s, in the "
                        "current directory)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier report of this script's")
    parser.add_argument("--threads", type=thread_count, default=2,
                        help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--small", action="store_true", help="the test suite's sizes")
    args = parser.parse_args(argv)
    try:
        check_output(args.out, "report", args.overwrite)  # before the work, not after
        torch.set_num_threads(args.threads)
        sizes = S.Sizes.small() if args.small else S.Sizes()
        results, seconds = run(sizes)
        path = write_report(args.out, results, seconds, sizes, args.overwrite)
    except (InputError, OSError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    cpu, wall = (sum(v[k] for v in seconds.values()) for k in ("cpu", "wall"))
    print(f"total {cpu:.0f} s of CPU ({wall:.0f} s wall); report: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
