"""Write the shipped known-answer models into ``models/pretrained/`` (no training).

    python scripts/export_known_answers.py [--dest models/pretrained]

Each is built by its constructor in ``iclprobe.constructions.SHIPPED`` (the PQ
constructions and the oracles) with the task d = 5, n = 21, isotropic, and saved with a
one-line summary and its error curve (2,000 sequences of seed 12345, as the trained models'
curves: ``train_pretrained.error_curve``). An oracle has no weights: its checkpoint's
``model.safetensors`` is empty (its rotation and distractors are rebuilt from its seed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from train_pretrained import error_curve, write_curve_files  # the sibling script

from iclprobe import models, tasks
from iclprobe._shipped import PRETRAINED_DIR
from iclprobe.constructions import SHIPPED
from iclprobe.storage import write_text_atomic


def _same_model(a: models.Regressor, b: models.Regressor) -> bool:
    """The same class, config and weights (an oracle's weights are empty)."""
    sa, sb = a.state_dict(), b.state_dict()
    return (type(a) is type(b) and a.cfg == b.cfg and sa.keys() == sb.keys()
            and all(torch.equal(sa[k], sb[k]) for k in sa))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=PRETRAINED_DIR)
    args = parser.parse_args()
    task = tasks.RegressionTask(n_dims=5, n_points=21)
    for name, (summary, build) in SHIPPED.items():
        model = build()
        dest = args.dest / name
        if not dest.exists():
            models.save(model, dest, task=task)
        elif not _same_model(models.load(dest), model):
            raise SystemExit(f"{dest} holds another model than {name}'s constructor: move it "
                             "away to export it anew")
        curve = error_curve(model, task)
        meta = json.loads((dest / "config.json").read_text())
        meta["summary"] = f"{summary}; normalized error {curve[-1]:.4f} at t = 20"
        write_text_atomic(dest / "config.json", json.dumps(meta, indent=2))
        write_curve_files(dest, curve, curve[-1], "t = 20", 0)
        print(f"{name}: {meta['summary']} -> {dest}")


if __name__ == "__main__":
    main()
