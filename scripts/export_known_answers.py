"""Write the shipped known-answer models into ``models/pretrained/`` (no training).

    python scripts/export_known_answers.py [--dest models/pretrained]

Each is built by its constructor in ``iclprobe.constructions.pq.SHIPPED`` with the task
d = 5, n = 21, isotropic, and saved with a one-line summary and its error curve (2,000
sequences of seed 12345, as the trained models' curves).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import torch

from iclprobe import models, tasks
from iclprobe.constructions.pq import SHIPPED
from iclprobe.models.checkpoint import PRETRAINED_DIR
from iclprobe.storage import write_text_atomic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=PRETRAINED_DIR)
    args = parser.parse_args()
    task = tasks.RegressionTask(n_dims=5, n_points=21)
    for name, (summary, build) in SHIPPED.items():
        model = build()
        dest = args.dest / name
        models.save(model, dest, task=task, overwrite=True)
        batch = task.sample(2000, generator=torch.Generator().manual_seed(12345))
        with torch.no_grad():
            curve = ((model(batch.xs, batch.ys) - batch.ys).pow(2).mean(0) / task.n_dims)
        curve_list = curve.tolist()
        meta = json.loads((dest / "config.json").read_text())
        meta["summary"] = f"{summary}; normalized error {curve_list[-1]:.4f} at t = 20"
        write_text_atomic(dest / "config.json", json.dumps(meta, indent=2))
        write_text_atomic(dest / "error_curve.json", json.dumps(
            {"normalized_error_by_t": curve_list, "worst_normalized_error": curve_list[-1],
             "worst_over": "t = 20", "steps": 0}, indent=2))
        rows = io.StringIO()
        writer = csv.writer(rows)
        writer.writerow(["t", "normalized_error"])
        writer.writerows(enumerate(curve_list))
        write_text_atomic(dest / "error_curve.csv", rows.getvalue())
        print(f"{name}: {meta['summary']} -> {dest}")


if __name__ == "__main__":
    main()
