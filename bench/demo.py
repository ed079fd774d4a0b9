"""Wall time of the user-facing commands, and a profile of ``align`` at Garg size.

1. ``iclprobe demo`` on the shipped models (target: under 60 s on 2 CPU cores), as a fresh
   subprocess (start-up and imports included).
2. ``align`` on a Garg-size model (12 layers x 256 wide, d = 20, 41 points; random weights,
   every stage runs as for a trained model) with the default `AlignConfig`: the time and
   share of each stage, the report's figures and tables, and the ratio to the floor — one
   forward pass over the evaluation sequences plus the query tokens the induced weights
   need, both as medians of warm repeats run alternately (target: align ≤ 1.5 × that
   floor, ≤ 20 s; peak memory ≤ 2 GB).
3. ``iclprobe models`` and ``iclprobe --help`` (target: each < 1 s).
4. With ``--profile``: one more ``align`` at Garg size under cProfile, and the seconds of
   the parts docs/performance.md names (the forward work, the candidates' families, the
   probe targets' ranking, the probes, the tables; checked to run none inside another;
   cProfile's own overhead inflates the parts made of many small operations, the families
   most).

    python bench/demo.py [--skip-demo] [--skip-align] [--repeats 3] [--profile]

Each target is printed PASS or FAIL; the exit status is 1 when one is missed.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from iclprobe import models, tasks
from iclprobe.alignment import AlignConfig, align, write_report
from iclprobe.alignment.measuring.layers import QUERY_SEED_OFFSET
from iclprobe.cli import positive_int
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
    """Seconds of the forward work align cannot avoid (one run).

    That is the evaluation sequences' residuals and every layer's residuals at the
    induced-weight queries (as many as align draws).
    """
    batch = task.sample(cfg.n_sequences, generator=0)
    n_w, d = cfg.n_weight_sequences, task.n_dims
    queries = sample_queries((n_w, task.n_points, cfg.queries_for(d), d), None,
                             cfg.seed + QUERY_SEED_OFFSET).float()  # as align draws them
    start = time.perf_counter()
    with torch.no_grad():
        collect_residuals(model, batch.xs, batch.ys)  # as align runs it, in batches
        model.query_residuals(batch.xs[:n_w], batch.ys[:n_w], queries,
                              reduce=lambda r: r[..., 0])
    return time.perf_counter() - start


def check(failed: list[str], what: str, value: float, limit: float, unit: str = "") -> str:
    """``value`` against its target, as text; a miss is added to ``failed``."""
    ok = value <= limit
    if not ok:
        failed.append(what)
    return f"{value:.2f}{unit} (target ≤ {limit:g}{unit}: {'PASS' if ok else 'FAIL'})"


def garg_size() -> tuple[models.GPTRegressor, tasks.RegressionTask]:
    """A Garg-size GPT (random weights: every stage runs as for a trained one) and its task."""
    torch.set_num_threads(2)
    model = models.GPTRegressor(models.GPTConfig(n_dims=20, n_positions=41, n_layers=12,
                                                 d_model=256, n_heads=8))
    task = tasks.RegressionTask(n_dims=20, n_points=41)
    model.task = task
    return model, task


def profile_align(failed: list[str], repeats: int) -> None:
    """Align at Garg size against its forward floor: medians of alternating warm repeats."""
    model, task = garg_size()
    cfg = AlignConfig()
    forward_floor(model, cfg, task)  # warm-up: allocator, thread pool, lazy imports
    aligns, floors, res, peak = [], [], None, 0.0
    for _ in range(repeats):
        res = None  # one result held at a time, as a user's align holds it
        start = time.perf_counter()
        res = align(model, cfg, name="garg-size")
        aligns.append(time.perf_counter() - start)
        if not peak:  # the first align's: later ones start from a heap the floors left
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        floors.append(forward_floor(model, cfg, task))
    assert res is not None
    total, floor = statistics.median(aligns), statistics.median(floors)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_report(Path(tmp) / "report", [res])
        report = time.perf_counter() - start
    print(f"align at Garg size ({cfg.n_sequences} sequences, induced weights on "
          f"{cfg.n_weight_sequences}; median of {repeats}, alternating with the floor): "
          f"{check(failed, 'align time', total, 20, ' s')}")
    print(f"  forward floor (evaluation sequences + query tokens): {floor:.2f} s; align / floor "
          f"= {check(failed, 'align / floor', total / floor, 1.5)}")
    print(f"  peak memory {check(failed, 'peak memory', peak, 2, ' GB')}")
    rows = sorted(res.timings.items(), key=lambda kv: -kv[1])
    last = aligns[-1]
    rows.append(("other (sampling, checks, curves)", last - sum(res.timings.values())))
    print("  stages of the last run:")
    for stage, seconds in rows:
        print(f"  {stage:45s} {seconds:6.2f} s  {100 * seconds / last:5.1f}%")
    print(f"  {'report: tables and figures (write_report)':45s} {report:6.2f} s  (after align)")


#: the parts of an align `profile_parts` reports: (file, function) -> what it is
PARTS = {
    ("hooks/residuals.py", "collect_residuals"): "forward pass, evaluation sequences (floor)",
    ("models/gpt.py", "query_residuals"): "query tokens of the induced weights (floor)",
    ("algorithms/prefix.py", "prefix_stats"): "prefix statistics (every call)",
    ("alignment/measuring/candidates.py", "family_iterates"):
        "candidates' families: grid, fine and fitted",
    ("probes/decode.py", "held_shares"): "probe targets: ranking and shortlists",
    ("probes/crossfit.py", "fold_features"): "probes: each fold's Gram matrices",
    ("probes/crossfit.py", "cross_fit"): "probes: the cross-fit",
    ("probes/crossfit.py", "readout_noise"): "probes: their readout noise",
    ("alignment/measuring/reading.py", "reread"): "columns re-read as the probes read",
    ("alignment/measuring/candidates.py", "candidate_tables"): "the candidates' tables",
}


def profile_parts() -> None:
    """One align at Garg size under cProfile: the cumulative seconds of each of `PARTS`."""
    model, _ = garg_size()
    cfg = AlignConfig()
    align(model, cfg, name="warm-up")
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.runcall(align, model, cfg, name="garg-size")
    total = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    found: dict[str, float] = {}
    part_of: dict[tuple[str, int, str], str] = {}
    for key, (_, _, _, cumulative, _) in stats.items():
        for (suffix, name), what in PARTS.items():
            if key[2] == name and key[0].endswith(suffix):
                found[what] = found.get(what, 0.0) + cumulative
                part_of[key] = what
    for key, what in part_of.items():  # the parts add up only if none runs inside another
        inside = {part_of[c] for c in _callers_closure(stats, key) if c in part_of} - {what}
        if inside:
            sys.exit(f"bench/demo.py --profile: {what!r} runs inside {sorted(inside)}: the "
                     "parts would count it twice")
    missing = [what for what in PARTS.values() if what not in found]
    if missing:  # a function renamed or moved: say so rather than print 0 s
        sys.exit(f"bench/demo.py --profile: no call of {missing} (PARTS names a function "
                 "that align no longer calls)")
    print(f"align under cProfile: {total:.2f} s; its parts (cumulative seconds, no part holds "
          f"another):")
    for what in PARTS.values():
        seconds = found[what]
        print(f"  {what:45s} {seconds:6.2f} s  {100 * seconds / total:5.1f}%")
    rest = total - sum(found.values())
    print(f"  {'the rest (learners, matching, the answer, ...)':45s} {rest:6.2f} s  "
          f"{100 * rest / total:5.1f}%")


def _callers_closure(stats: dict[Any, Any], key: Any) -> set[Any]:
    """Every function above ``key`` in the profile's call graph (its callers, theirs, ...)."""
    seen: set[Any] = set()
    todo = list(stats[key][4])
    while todo:
        caller = todo.pop()
        if caller not in seen and caller in stats:
            seen.add(caller)
            todo.extend(stats[caller][4])
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-align", action="store_true")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="one more align under cProfile: the seconds of its parts")
    args = parser.parse_args()
    failed: list[str] = []
    cli = [sys.executable, "-m", "iclprobe"]
    for argv in (["models"], ["--help"], ["align", "--help"]):
        wall, _ = timed([*cli, *argv])
        print(f"iclprobe {' '.join(argv)}: {check(failed, ' '.join(argv), wall, 1, ' s')}")
    if not args.skip_demo:
        with tempfile.TemporaryDirectory() as tmp:
            wall, peak = timed([*cli, "demo", "--out", str(Path(tmp) / "report")])
        print(f"iclprobe demo: {check(failed, 'demo', wall, 60, ' s')}, peak memory "
              f"{peak:.2f} GB")
    if not args.skip_align:
        profile_align(failed, args.repeats)
    if args.profile:
        profile_parts()
    if failed:
        print(f"targets missed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
