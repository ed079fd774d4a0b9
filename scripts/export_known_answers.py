"""Write the shipped known-answer models into ``models/pretrained/`` (no training).

    python scripts/export_known_answers.py [NAME ...] [--dest models/pretrained]
                                           [--overwrite] [--curves-only]

Each is built by its constructor in ``iclprobe.constructions.SHIPPED`` (the PQ
constructions and the oracles) with the task d = 5, n = 21, isotropic, and saved with a
one-line summary and its error curve (2,000 sequences of seed 12345, as the trained models'
curves: ``train_pretrained.error_curve``). An oracle has no weights: its checkpoint's
``model.safetensors`` is empty (its rotation and distractors are rebuilt from its seed).

Each model is written as one atomic folder, and a folder already there is refused before
anything is written (``--overwrite``: an iclprobe checkpoint there is replaced, never a
folder holding files iclprobe did not write). ``--curves-only`` instead recomputes the
error curve and the summary of folders already there that hold the same model (as
``train_pretrained.py --curves-only`` does for the trained models), e.g. after a change to
how data are drawn.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from train_pretrained import error_curve, refresh  # the sibling script

from iclprobe import models, tasks
from iclprobe._shipped import PRETRAINED_DIR
from iclprobe.atomic import atomic_directory
from iclprobe.cli import OneLineParser
from iclprobe.constructions import SHIPPED
from iclprobe.errors import InputError
from iclprobe.models.files import write_checkpoint_files
from iclprobe.storage import check_output

TASK = tasks.RegressionTask(n_dims=5, n_points=21)


def _same_model(a: models.Regressor, b: models.Regressor) -> bool:
    """The same class, config and weights (an oracle's weights are empty)."""
    sa, sb = a.state_dict(), b.state_dict()
    return (type(a) is type(b) and a.cfg == b.cfg and sa.keys() == sb.keys()
            and all(torch.equal(sa[k], sb[k]) for k in sa))


def export(name: str, dest: Path, overwrite: bool = False) -> str:
    """Write model ``name`` with its summary and error curve as the folder ``dest``, at once.

    ``overwrite`` replaces an iclprobe checkpoint there (never a folder holding files
    iclprobe did not write).
    """
    summary, build = SHIPPED[name]
    model = build()
    with atomic_directory(dest, "checkpoint", overwrite) as tmp:
        write_checkpoint_files(model, tmp, TASK)
        return _write_curve(tmp, summary, error_curve(model, TASK))


def recurve(name: str, dest: Path) -> str:
    """Recompute the error curve and summary in ``dest``, which must hold model ``name``."""
    summary, build = SHIPPED[name]
    model = build()
    if not (dest / "config.json").is_file():
        raise InputError(f"{dest}: no exported model to recompute the curve of (no "
                         "config.json); export it first (without --curves-only)")
    if not _same_model(models.load(dest), model):
        raise InputError(f"{dest} holds another model than {name}'s constructor: move it "
                         "away and export it anew")
    return _write_curve(dest, summary, error_curve(model, TASK))


def _write_curve(dest: Path, summary: str, curve: list[float]) -> str:
    summary = f"{summary}; normalized error {curve[-1]:.4f} at t = 20"
    refresh(dest, {"summary": summary}, curve, curve[-1], "t = 20", 0)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Export (or recompute the curves of) the named models; bad input is one line, exit 2."""
    parser = OneLineParser(prog="export_known_answers.py",
                           description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="models to export (default: all)")
    parser.add_argument("--dest", type=Path, default=PRETRAINED_DIR)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an iclprobe checkpoint at the destination (never a "
                             "folder holding files iclprobe did not write)")
    parser.add_argument("--curves-only", action="store_true",
                        help="recompute the curves and summaries of exported models")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SHIPPED]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {sorted(SHIPPED)}")
    names = list(dict.fromkeys(args.names)) or list(SHIPPED)
    try:
        if not args.curves_only:  # every destination before any is written
            for name in names:
                check_output(args.dest / name, "checkpoint", args.overwrite)
        for name in names:
            dest = args.dest / name
            said = recurve(name, dest) if args.curves_only else \
                export(name, dest, args.overwrite)
            print(f"{name}: {said} -> {dest}")
    except (InputError, OSError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
