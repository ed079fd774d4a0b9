"""How far the design family can separate a known-answer cell's contending learners, per layer.

`--design` searches its family by coordinate ascent (`alignment.design.design_evaluation`).
This script scores every distribution of the family instead (every spectrum × noise ×
query at the cell's own n, as the benchmark's designed runs hold n), on one cell of
`bench/known_answers.py`, and prints per distribution each live layer's separation: 1 −
the best imitation of its contending pair's matched columns by the other learner's family
(the search's objective per layer, `alignment.design.separation`). A layer whose
separation stays under the answer's resolution (`PRECISION`, 1e-5) on every distribution
cannot be made separable by the family: there no designed data can name the truth.

    python bench/design_reach.py --setting held-out --data isotropic --multiplier 1.5

(GD at 1.5 × its rule, whose late layers heavy ball imitates on the own task.) Rows
marked ``*`` hold a separation above the resolution at a layer where the chosen design
(``--design``'s) has none; the last line counts them.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Sequence

import torch

from iclprobe.algorithms.numerics import check_positive
from iclprobe.alignment import align
from iclprobe.alignment.design import search as D
from iclprobe.alignment.design.family import DesignFamily, nearest_distribution
from iclprobe.alignment.evaluation import evaluation_task
from iclprobe.alignment.views.answer_rule import PRECISION
from iclprobe.cli import OneLineParser
from iclprobe.constructions import benchmark as B
from iclprobe.errors import InputError


def multiplier(text: str) -> float:
    """An argparse type: a finite number > 0 (the library's `check_positive`), else one line."""
    try:
        return check_positive(float(text), "--multiplier")
    except ValueError:  # not a number, or not finite and > 0 (an InputError is a ValueError)
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}"
                                         ) from None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="design_reach.py", description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(B.SETTINGS), default="held-out",
                        help="the benchmark's setting the cell is taken from (its d, n, seed "
                        "and κ) (default: %(default)s)")
    parser.add_argument("--kind", choices=sorted(B.TRUTH), default="gd oracle",
                        help="the cell's kind of model: an oracle or a construction of "
                        "bench/known_answers.py (default: %(default)s)")
    parser.add_argument("--data", choices=("isotropic", "ill-conditioned"), default="isotropic",
                        help="the cell's evaluation data (default: %(default)s)")
    parser.add_argument("--readout", choices=("exact", "probe"), default="exact",
                        help="how the layers are read: exactly, or through fitted probes "
                        "(default: %(default)s)")
    parser.add_argument("--multiplier", type=multiplier, default=1.5,
                        help="the cell's multiplier of its kind's rule (an oracle's step size, "
                        "a construction's fraction of the stability bound, λ, CG's steps): a "
                        "finite number > 0 (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        run(args)
    except (InputError, OSError) as err:  # a cell the kind cannot build, say
        parser.exit(2, f"{parser.prog}: error: {err}\n")


def run(args: argparse.Namespace) -> None:
    """Score every distribution of the design family on the cell; print a row each."""
    torch.set_num_threads(1)
    cell = B.Cell(args.kind, "iclprobe", args.data, args.readout, args.multiplier, args.setting)
    built = B.build(cell, B.bench_config())
    if built.diverges:
        raise SystemExit(f"{cell}: the model diverges on its own data")
    model, cfg = built.model, built.cfg
    res = align(model, cfg)
    assert res.answer is not None
    pairs, places = D.contending_pairs(res), res.answer.places
    print("own task:", "; ".join(f"{i} {a.text}" for i, a in enumerate(res.answer.layers)))
    own_task = evaluation_task(model, cfg)
    chosen = D.design_evaluation(model, res, cfg, DesignFamily(examples=())).chosen
    mine = D.own_curvature(model, cfg, res.positions)
    designed_cfg = dataclasses.replace(cfg, t_max=None)
    layers = sorted(pairs)
    print(f"{'distribution':52s} " + " ".join(f"{f'layer {i}':>8s}" for i in layers))
    rows = {}
    family = DesignFamily(examples=())
    start = nearest_distribution(own_task, family)  # the own n and Σ's top
    for (k, shape), noise, query in itertools.product(family.spectra(), family.noise,
                                                      family.queries):
        if k == 1 and query == "low-variance":
            continue  # isotropic data have no low-variance directions: not in the family
        option = dataclasses.replace(start, condition_number=k, shape=shape, noise_std=noise,
                                     query=query)
        at = dataclasses.replace(option, scale=D.matched_scale(model, cfg, res.positions,
                                                               option, cfg.seed, mine))
        task = at.task(own_task.n_dims, cfg.seed)
        positions = D.designed_positions(task, res.positions)
        rows[option] = [D.separation(task, {i: pairs[i]}, places, res.n_layers, designed_cfg,
                                     positions, family.n_sequences, cfg.seed, model)
                        for i in layers]
    chosen = dataclasses.replace(chosen, scale=start.scale)  # as the rows are keyed
    base = rows.get(chosen, [0.0] * len(layers))
    better = 0
    for option, seps in rows.items():
        gain = any(s > PRECISION >= b for s, b in zip(seps, base))
        better += gain
        mark = "<- chosen" if option == chosen else \
            "*" if gain else ""
        shape = option.shape if option.condition_number > 1 else ""
        label = (f"κ {option.condition_number:g} {shape}, noise {option.noise_std:g}, "
                 f"{option.query} queries")
        print(f"{label:52s} " + " ".join(f"{s:8.1e}" for s in seps), mark)
    print(f"{better} of {len(rows)} distributions separate, beyond {PRECISION:g}, a layer the "
          "chosen design does not")


if __name__ == "__main__":
    main()
