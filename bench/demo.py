"""Wall time of the user-facing commands (a user's wait, not a ratio).

1. ``iclprobe demo`` on the shipped models (target: under 2 minutes on 2 CPU cores).
2. ``iclprobe align`` on a random Garg-size model (12 layers x 256 wide, d = 20, 41 points)
   with 512 evaluation sequences and induced weights on 64 of them (target: under 60 s,
   peak memory under 4 GB).

Each runs as a fresh subprocess (start-up and imports included); peak memory is the
child's maximum resident set size.

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

from iclprobe import models, tasks


def timed(argv: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in GB) of a subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-align", action="store_true")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "iclprobe"]
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_demo:
            wall, peak = timed([*cli, "demo", "--out", str(Path(tmp) / "report")])
            print(f"iclprobe demo: {wall:.1f} s (target < 120 s), peak memory {peak:.2f} GB")
        if not args.skip_align:
            model = models.GPTRegressor(models.GPTConfig(n_dims=20, n_positions=41, n_layers=12,
                                                         d_model=256, n_heads=8))
            model.save(Path(tmp) / "garg", task=tasks.RegressionTask(n_dims=20, n_points=41))
            wall, peak = timed([*cli, "align", str(Path(tmp) / "garg"), "--n-sequences", "512"])
            print(f"iclprobe align (random Garg-size model, 512 sequences, induced weights on "
                  f"64): {wall:.1f} s (target < 60 s), peak memory {peak:.2f} GB (target < 4 GB)")


if __name__ == "__main__":
    main()
