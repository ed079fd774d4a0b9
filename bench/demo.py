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
4. With ``--profile``: one more ``align`` at Garg size with the parts docs/performance.md
   names timed by the wall clock (the forward work, the candidates' families, the probe
   targets' ranking, the probes, the tables; checked to run none inside another), and
   what it takes above its own floor parts against what 1.5 × allows, with and without
   the candidates' families.

    python bench/demo.py [--skip-demo] [--skip-align] [--repeats 7] [--profile]

Each target is printed PASS or FAIL; the exit status is 1 when one is missed.
"""

from __future__ import annotations

import functools
import importlib
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
from iclprobe.cli import OneLineParser, positive_int
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
    pairs = ", ".join(f"{a:.1f}/{f:.1f} s = {a / f:.2f}" for a, f in zip(aligns, floors))
    print(f"  each align against the floor run after it (the machine's drift): {pairs}")
    print(f"  peak memory {check(failed, 'peak memory', peak, 2, ' GB')}")
    rows = sorted(res.timings.items(), key=lambda kv: -kv[1])
    last = aligns[-1]
    rows.append(("other (sampling, checks, curves)", last - sum(res.timings.values())))
    print("  stages of the last run:")
    for stage, seconds in rows:
        print(f"  {stage:45s} {seconds:6.2f} s  {100 * seconds / last:5.1f}%")
    print(f"  {'report: tables and figures (write_report)':45s} {report:6.2f} s  (after align)")


#: the parts of an align `profile_parts` times: (module, function or Class.method) -> what
#: it is
PARTS = {
    ("iclprobe.hooks.residuals", "collect_residuals"):
        "forward pass, evaluation sequences (floor)",
    ("iclprobe.models.gpt", "GPTRegressor.query_residuals"):
        "query tokens of the induced weights (floor)",
    ("iclprobe.algorithms.prefix", "prefix_stats"): "prefix statistics (every call)",
    ("iclprobe.alignment.measuring.candidates", "family_iterates"):
        "candidates' families: grid, fine and fitted",
    ("iclprobe.probes.decode", "held_shares"): "probe targets: ranking and shortlists",
    ("iclprobe.probes.crossfit", "fold_features"): "probes: each fold's Gram matrices",
    ("iclprobe.probes.crossfit", "cross_fit"): "probes: the cross-fit",
    ("iclprobe.probes.crossfit", "readout_noise"): "probes: their readout noise",
    ("iclprobe.alignment.measuring.reading", "reread"): "columns re-read as the probes read",
    ("iclprobe.alignment.measuring.candidates", "candidate_tables"): "the candidates' tables",
}
FLOOR_PARTS = [what for what in PARTS.values() if what.endswith("(floor)")]
FAMILIES = "candidates' families: grid, fine and fitted"


class PartClock:
    """Wall-clock seconds of each of `PARTS` while installed (no profiler's overhead).

    Each part's function is replaced, in its module, in every module of its package that
    imported it and on its class, by a timed call, and put back on leaving (also where
    installing failed half way); a part called inside another is recorded in ``nested``
    (the parts would then count it twice), a part inside itself counts once.
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS.values(), 0.0)
        self.nested: set[tuple[str, str]] = set()
        self._active: list[str] = []
        self._undo: list[tuple[Any, str, Any, bool]] = []

    def __enter__(self) -> PartClock:
        try:
            self._install()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _install(self) -> None:
        for (module, name), what in PARTS.items():
            owner: Any = importlib.import_module(module)
            for attr in name.split(".")[:-1]:
                owner = getattr(owner, attr)
            attr = name.split(".")[-1]
            real = getattr(owner, attr)
            timed = self._timed(real, what)
            package = module.split(".")[0] + "."  # its from-imports are in its package
            places = [(owner, attr)] + [
                (m, attr) for name_, m in list(sys.modules.items())
                if name_.startswith(package) and m is not owner
                and getattr(m, attr, None) is real]
            for place, key in places:  # an inherited method is the base class's to keep
                self._undo.append((place, key, real, key in vars(place)))
                setattr(place, key, timed)

    def __exit__(self, *exc: object) -> None:
        for place, key, real, own in reversed(self._undo):
            if own:
                setattr(place, key, real)
            else:
                delattr(place, key)
        self._undo.clear()

    def _timed(self, real: Any, what: str) -> Any:
        @functools.wraps(real)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if what in self._active:  # inside itself: the outer call counts
                return real(*args, **kwargs)
            self.nested.update((outer, what) for outer in self._active)
            self._active.append(what)
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[what] += time.perf_counter() - start
                self._active.pop()
        return timed


def profile_parts() -> None:
    """One align at Garg size with each of `PARTS` timed, and the budget above the floor."""
    model, _ = garg_size()
    cfg = AlignConfig()
    align(model, cfg, name="warm-up")
    with PartClock() as clock:
        start = time.perf_counter()
        align(model, cfg, name="garg-size")
        total = time.perf_counter() - start
    if clock.nested:
        sys.exit(f"bench/demo.py --profile: parts run inside others {sorted(clock.nested)}: "
                 "they would count twice")
    missing = [what for what, seconds in clock.seconds.items() if not seconds]
    if missing:  # a function renamed or no longer called: say so rather than print 0 s
        sys.exit(f"bench/demo.py --profile: no call of {missing} (PARTS names a function "
                 "that align no longer calls)")
    print(f"align with its parts timed: {total:.2f} s; their wall-clock seconds (no part "
          f"holds another):")
    for what, seconds in clock.seconds.items():
        print(f"  {what:45s} {seconds:6.2f} s  {100 * seconds / total:5.1f}%")
    rest = total - sum(clock.seconds.values())
    print(f"  {'the rest (learners, matching, the answer, ...)':45s} {rest:6.2f} s  "
          f"{100 * rest / total:5.1f}%")
    floor = sum(clock.seconds[what] for what in FLOOR_PARTS)
    above = total - floor
    print(f"  above its own floor parts: {above:.2f} s; within 1.5 x it may take "
          f"{0.5 * floor:.2f} s; without the candidates' families it takes "
          f"{above - clock.seconds[FAMILIES]:.2f} s")


def main() -> None:
    parser = OneLineParser(prog="demo.py", description=__doc__.splitlines()[0])
    parser.add_argument("--skip-demo", action="store_true",
                        help="do not time `iclprobe demo` (step 1)")
    parser.add_argument("--skip-align", action="store_true",
                        help="do not time align at Garg size against its floor (step 2)")
    # 7 pairs: on this machine the floor alone drifts 10-17 s within minutes, and 3 pairs
    # read 1.49 x where 7 read 1.97 x a few minutes later (docs/performance.md)
    parser.add_argument("--repeats", type=positive_int, default=7,
                        help="warm aligns at Garg size, each followed by a run of its forward "
                        "floor; their medians are compared (default: %(default)s)")
    parser.add_argument("--profile", action="store_true",
                        help="one more align with its parts timed: their seconds")
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
