"""What ``iclprobe align`` does, with the Python API, in a page.

python scripts/align_layers.py [CHECKPOINT]   (default: the shipped gpt-softmax)
"""

from __future__ import annotations

import sys

import torch

from iclprobe import algorithms, alignment, models, probes
from iclprobe.alignment.evaluation import trained_positions
from iclprobe.cli import OneLineParser
from iclprobe.errors import InputError


def main(checkpoint: str = "gpt-softmax") -> None:
    torch.set_num_threads(2)
    model = models.load(checkpoint)
    task = model.task
    g = torch.Generator().manual_seed(0)

    # 1. Read each layer's prediction: exactly where the model exposes it (a known-answer
    #    model), else with ridge probes fitted on fresh sequences.
    if model.exact_layer_readout:
        batch = task.sample(512, generator=g)
        layer_preds = probes.readout_predictions(model, batch.xs, batch.ys)  # [L+1, B, n]
    else:
        lp = probes.LayerProbes().fit(model, task, n_sequences=2000, generator=g)
        batch = task.sample(512, generator=g)
        layer_preds = lp.predict(batch.xs, batch.ys)  # [L+1, B, n]

    # 2. The reference learners on the same data, sharing one eigendecomposition.
    xs, ys = batch.xs.double(), batch.ys.double()
    stats = algorithms.prefix_stats(xs, ys)
    newton = algorithms.newton(xs, ys, steps=range(25), stats=stats)
    gd = algorithms.gd(xs, ys, steps=[2**i for i in range(13)], lr="max", stats=stats)

    # 3. Similarity of errors per (layer, step), best step per layer and the fit, where the
    #    model was trained: every prefix, or for a model trained on the last position alone
    #    (Ahn et al.'s), that position, the error cosine taken across sequences.
    last, where = task.n_points - 1, {}
    if trained_positions(model) == "last":
        where = {"t_min": last, "t_max": last, "over": "sequences"}
        # such a model is valid at its trained length only: elsewhere (never read here) its
        # layers may blow up, as ka-newton-pq's do at t = 1 on a sequence in a few hundred
        layer_preds = torch.where(torch.arange(task.n_points) == last, layer_preds, 0.0)
    for it in (newton, gd):
        sim = alignment.similarity(layer_preds, it, ys, metric="error_cosine", **where)
        match = alignment.match_steps(sim)
        print(f"{it.name}: best step per layer {match.best_step}")
        print(f"  similarity {[round(v, 3) for v in match.best_value]}")
        print(f"  zero predictor at those steps "
              f"{[round(float(sim.zero[sim.steps.index(s)]), 3) for s in match.best_step]}")
        print(f"  {match.fit.describe()}")  # the step-vs-layer line, or why there is none


def cli(argv: list[str] | None = None) -> int:
    """The command line: a bad argument or checkpoint is one line and exit status 2."""
    parser = OneLineParser(prog="align_layers.py", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default="gpt-softmax",
                        help="a shipped model's name or a checkpoint directory")
    args = parser.parse_args(argv)
    try:
        main(args.checkpoint)
    except (InputError, OSError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
