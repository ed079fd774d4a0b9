"""The default learner set of ``align`` against one batched eigendecomposition.

Garg size: B = 512 sequences, n = 41 positions, d = 20, isotropic x. The floor is one
``torch.linalg.eigh`` of the [512, 41, 20, 20] float64 prefix matrices. The learner set is
what ``align_layers`` runs: ``prefix_stats`` once, then every learner of
``algorithms.aligned_learners()`` with its registered steps and hyperparameters (through
``alignment.measuring.runs.run_spec``, as align calls them) on all 512 sequences without weights and
on the first ``AlignConfig().n_weight_sequences`` with weights. Prints, from medians of
alternating repeats:

1. the eigendecomposition, the learner set and their ratio (target <= 2, printed PASS or
   FAIL; the exit status is 1 when a target is missed), and where the
   time goes (prefix_stats, each learner's predictions and weights);
2. the marginal cost of one more step count of GD and of Newton (predictions on 512
   sequences and weights on that subset), as a share of the eigendecomposition (target <= 2%);
3. accuracy of what changed the float64 numerics against the straightforward computation
   (GD's powers as exp(k log1p(−x)), online GD by pass maps), and of float32 eigh (evaluated,
   not used) against float64.

The machine's load average is printed before and after the timings, and the ratio is also
given in CPU time: on a loaded machine two torch threads wait on each other, and the many
small operations of the learners suffer far more than eigh (one LAPACK call per matrix, one
thread); with ``--threads 1`` the CPU-time ratio is the work ratio, whatever else runs.

    python bench/learners.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np
import torch

from iclprobe import algorithms, tasks
from iclprobe.algorithms.learners import gd_coefficients
from iclprobe.algorithms.reference import online_gd_direct
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.measuring.runs import run_spec
from iclprobe.alignment.protocols import get_protocol
from iclprobe.cli import OneLineParser, positive_int, thread_count

SUB = slice(0, AlignConfig().n_weight_sequences)  # the weight-metric subset align uses
GD_FURTHER = [3 * 2**j for j in range(13)]  # between the grid's counts


def learner_set(batch: tasks.RegressionBatch) -> None:
    """What align_layers runs: shared stats, predictions on all, weights on the subset."""
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    for spec in get_protocol("iclprobe").runs.values():
        run_spec(spec, batch, 12, False, stats)
        run_spec(spec, batch, 12, True, stats, sequences=SUB)


def per_learner(batch: tasks.RegressionBatch, stats: algorithms.PrefixStats) -> dict:
    """One timing function per learner and part (predictions, weights), sharing ``stats``."""
    fns = {}
    for key, spec in get_protocol("iclprobe").runs.items():
        fns[f"{key} preds"] = lambda spec=spec: run_spec(spec, batch, 12, False, stats)
        fns[f"{key} weights"] = lambda spec=spec: run_spec(spec, batch, 12, True, stats,
                                                           sequences=SUB)
    return fns


def with_steps(name: str, steps: list[int], batch: tasks.RegressionBatch,
               stats: algorithms.PrefixStats, **hyper: object):
    """A learner's align-style call (predictions on all, weights on the subset) at ``steps``."""
    xs, ys = batch.xs.double(), batch.ys.double()
    sub = algorithms.PrefixStats(*(v[SUB] if torch.is_tensor(v) and k != "counts" else v
                                   for k, v in stats._asdict().items()))

    def run() -> None:
        algorithms.iterates(name, xs, ys, steps, weights=False, stats=stats, **hyper)
        algorithms.iterates(name, xs[SUB], ys[SUB], steps, weights=True, stats=sub, **hyper)
    return run


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference relative to the largest value, max|a − b| / max|b|."""
    return ((a - b).abs().max() / b.abs().max()).item()


def gd_accuracy(stats: algorithms.PrefixStats) -> tuple[float, float]:
    """GD (lr "max", 2^0…2^12): ``(1 − x)**k`` as before and now, against 80-bit arithmetic.

    The reference evaluates ``(β/λ)(1 − (1 − x)^k)·q`` from the same float64 x = η c λ,
    β/λ and q: what differs is only how the powers are taken.
    """
    sub = algorithms.PrefixStats(*(v[:32] if torch.is_tensor(v) and k != "counts" else v
                                   for k, v in stats._asdict().items()))
    c = algorithms.learners._scale(sub, True)
    rate = algorithms.learners._lr("max", sub, c)
    steps = list(algorithms.learners.GD_LOG_GRID)
    x = rate * c * sub.eigvals
    r = 1 - x.numpy().astype(np.longdouble)
    base = (sub.xty_eig * algorithms.prefix.safe_inverse(sub.eigvals)).numpy()
    q = sub.query_eig.numpy().astype(np.longdouble)
    exact = np.stack([(base.astype(np.longdouble) * (1 - r**k) * q).sum(-1) for k in steps])
    exact_t = torch.from_numpy(exact.astype(np.float64))
    by_pow = torch.stack([(gd_coefficients(sub, c, rate, k) * sub.query_eig).sum(-1)
                          for k in steps])
    by_exp = algorithms.learners.spectral_iterates(
        sub, lambda block: algorithms.learners.power_decays(
            rate * c * block.eigvals, [float(k) for k in steps]), False)[0]
    return relative(by_pow, exact_t), relative(by_exp, exact_t)


def float32_eigh_accuracy(batch: tasks.RegressionBatch, stats: algorithms.PrefixStats) -> float:
    """OLS predictions from a float32 eigendecomposition, relative to float64's (t >= d)."""
    lam, vecs = torch.linalg.eigh(stats.gram.float())
    lam, vecs = lam.double(), vecs.double()
    b = (vecs.transpose(-1, -2) @ stats.xty[..., None])[..., 0]
    q = (vecs.transpose(-1, -2) @ batch.xs.double()[..., None])[..., 0]
    ols32 = (b / lam * q).sum(-1)
    ols64 = algorithms.ols(batch.xs.double(), batch.ys.double(), weights=False).preds[0]
    d = batch.xs.shape[-1]
    return relative(ols32[:, d:], ols64[:, d:])


def alternate_clocks(fns: dict, repeats: int) -> tuple[dict, dict]:
    """Wall and CPU seconds per call (lists), alternating between the functions.

    With one torch thread CPU time is the work done, whatever else runs on the machine.
    """
    for fn in fns.values():  # warm-up
        fn()
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return wall, cpu


def timing_functions(batch: tasks.RegressionBatch, stats: algorithms.PrefixStats) -> dict:
    """Everything timed, by name."""
    xs, ys = batch.xs.double(), batch.ys.double()
    grid = list(algorithms.learners.GD_LOG_GRID)
    return {"eigh": lambda: torch.linalg.eigh(stats.gram), "set": lambda: learner_set(batch),
            "eigh float32": lambda: torch.linalg.eigh(stats.gram.float()),
            "prefix_stats": lambda: algorithms.prefix_stats(xs, ys),
            **per_learner(batch, stats),
            "gd": with_steps("gd", grid, batch, stats, lr="max"),
            "gd further": with_steps("gd", [*grid, *GD_FURTHER], batch, stats, lr="max"),
            "newton": with_steps("newton", list(range(25)), batch, stats),
            "newton further": with_steps("newton", list(range(50)), batch, stats)}


def verdict(ok: bool, failed: list[str], what: str) -> str:
    """PASS or FAIL; a miss is added to ``failed``."""
    if not ok:
        failed.append(what)
    return "PASS" if ok else "FAIL"


def report_times(wall: dict, cpu: dict, failed: list[str]) -> None:
    """The ratio to eigh, where the time goes, and the marginal step counts."""
    med = {k: statistics.median(v) for k, v in wall.items()}
    ratio = statistics.median(s / e for s, e in zip(wall["set"], wall["eigh"]))
    cpu_ratio = statistics.median(s / e for s, e in zip(cpu["set"], cpu["eigh"]))
    print(f"eigh of the [512, 41, 20, 20] float64 prefix matrices: {med['eigh']:.3f} s")
    print(f"default learner set (prefix_stats + {len(get_protocol('iclprobe').runs)} learners,"
          f" weights on {SUB.stop}): {med['set']:.3f} s = {ratio:.2f} x eigh (target <= 2: "
          f"{verdict(ratio <= 2, failed, 'learner set / eigh')}); "
          f"in CPU time {cpu_ratio:.2f} x")
    print(f"  prefix_stats {med['prefix_stats']:.3f} s (eigh included)")
    for key in get_protocol("iclprobe").runs:
        print(f"  {key:10s} predictions {med[f'{key} preds']:.3f} s, "
              f"weights {med[f'{key} weights']:.3f} s")
    for name, extra in (("gd", len(GD_FURTHER)), ("newton", 25)):
        each = (med[f"{name} further"] - med[name]) / extra
        print(f"one more {name} step count: {1e3 * each:.2f} ms = "
              f"{100 * each / med['eigh']:.2f}% of eigh (target <= 2%: "
              f"{verdict(each <= 0.02 * med['eigh'], failed, f'one more {name} step')})")
    print(f"float32 eigh (not used): {med['eigh float32']:.3f} s vs float64 {med['eigh']:.3f} s")


def report_accuracy(batch: tasks.RegressionBatch, stats: algorithms.PrefixStats) -> None:
    """What changed the float64 numerics, and float32 eigh, against references."""
    by_pow, by_exp = gd_accuracy(stats)
    print(f"GD 2^0..2^12, lr max, against 80-bit arithmetic: (1 - x)**k (before) {by_pow:.1e}, "
          f"exp(k log1p(-x)) (now) {by_exp:.1e} (relative to max |pred|)")
    xs, ys, passes = batch.xs.double()[SUB], batch.ys.double()[SUB], list(range(1, 9))
    maps = algorithms.online_gd(xs, ys, passes).weights
    print(f"online GD weights, pass maps vs example by example: "
          f"{relative(maps, online_gd_direct(xs, ys, passes)):.1e}")
    print(f"float32 eigh: its OLS predictions are off by "
          f"{float32_eigh_accuracy(batch, stats):.1e} (t >= d, relative to max |pred|)")


def main() -> None:
    parser = OneLineParser(prog="learners.py", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--threads", type=thread_count, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores, "
          f"{args.threads} torch threads)")
    batch = tasks.RegressionTask(n_dims=20, n_points=41).sample(512, generator=0)
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    failed: list[str] = []
    report_times(*alternate_clocks(timing_functions(batch, stats), args.repeats), failed)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    report_accuracy(batch, stats)
    if failed:
        print(f"targets missed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
