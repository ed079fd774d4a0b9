"""Wall time of the user-facing commands, and a profile of ``align`` at Garg size.

1. ``iclprobe demo`` on the shipped models (target: under 60 s on 2 CPU cores), as a fresh
   subprocess (start-up and imports included).
2. ``align`` on a Garg-size model (12 layers x 256 wide, d = 20, 41 points; random weights,
   every stage runs as for a trained model) with the default `AlignConfig`: the time and
   share of each stage, the report's figures and tables, and the ratio to the floor — one
   forward pass over the evaluation sequences plus the query tokens the induced weights
   need (target: align ≤ 1.5 × that floor, ≤ 20 s; peak memory ≤ 2 GB).
3. ``iclprobe models`` and ``iclprobe --help`` (target: each < 1 s).

    python bench/demo.py [--skip-demo] [--skip-align]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from iclprobe import models, tasks
from iclprobe.alignment import AlignConfig, align, write_report
from iclprobe.hooks import collect_residuals
from iclprobe.probes import sample_queries


def timed(argv: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in GB) of a subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 2**20


def forward_floor(model: models.GPTRegressor, cfg: AlignConfig, task: tasks.RegressionTask
                  ) -> float:
    """Seconds of the forward work align cannot avoid.

    That is the evaluation sequences' residuals and every layer's residuals at the
    induced-weight queries, the faster of two warm runs.
    """
    batch = task.sample(cfg.n_sequences, generator=0)
    n_w, d = cfg.n_weight_sequences, task.n_dims
    queries = sample_queries((n_w, task.n_points, d + max(2, d // 2), d), None, 0).float()
    times = []
    for _ in range(2):
        start = time.perf_counter()
        with torch.no_grad():
            collect_residuals(model, batch.xs, batch.ys)  # as align runs it, in batches
            model.query_residuals(batch.xs[:n_w], batch.ys[:n_w], queries,
                                  reduce=lambda r: r[..., 0])
        times.append(time.perf_counter() - start)
    return min(times)


def profile_align() -> None:
    torch.set_num_threads(2)
    model = models.GPTRegressor(models.GPTConfig(n_dims=20, n_positions=41, n_layers=12,
                                                 d_model=256, n_heads=8))
    task = tasks.RegressionTask(n_dims=20, n_points=41)
    model.task = task
    cfg = AlignConfig()
    start = time.perf_counter()
    res = align(model, cfg, name="garg-size")
    total = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # align's own peak
    floor = forward_floor(model, cfg, task)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_report(Path(tmp) / "report", [res])
        report = time.perf_counter() - start
    print(f"align at Garg size ({cfg.n_sequences} sequences, induced weights on "
          f"{cfg.n_weight_sequences}): {total:.1f} s (target ≤ 20 s), peak memory "
          f"{peak:.3f} GB (target ≤ 2 GB)")
    print(f"  forward floor (evaluation sequences + query tokens): {floor:.1f} s; "
          f"align / floor = {total / floor:.2f} (target ≤ 1.5)")
    rows = sorted(res.timings.items(), key=lambda kv: -kv[1])
    rows.append(("other (sampling, checks, curves)", total - sum(res.timings.values())))
    for stage, seconds in rows:
        print(f"  {stage:45s} {seconds:6.2f} s  {100 * seconds / total:5.1f}%")
    print(f"  {'report: tables and figures (write_report)':45s} {report:6.2f} s  (after align)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-align", action="store_true")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "iclprobe"]
    for argv in (["models"], ["--help"], ["align", "--help"]):
        wall, _ = timed([*cli, *argv])
        print(f"iclprobe {' '.join(argv)}: {wall:.2f} s (target < 1 s)")
    if not args.skip_demo:
        with tempfile.TemporaryDirectory() as tmp:
            wall, peak = timed([*cli, "demo", "--out", str(Path(tmp) / "report")])
        print(f"iclprobe demo: {wall:.1f} s (target < 60 s), peak memory {peak:.2f} GB")
    if not args.skip_align:
        profile_align()


if __name__ == "__main__":
    main()
