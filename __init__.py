"""iclprobe: which learning algorithm does each layer of an in-context regressor run?

Transformers trained on in-context linear regression (Garg et al. 2022) predict each y from
the examples before it. iclprobe reads a prediction out of every layer of such a model and
matches the layers with reference learners (gradient descent, preconditioned GD, iterative
Newton, conjugate gradient, ...) by the similarity of their errors and of their induced
weights (Fu et al. 2024); for Ahn et al.'s linear transformers it also reads the
preconditioner each layer applies.

Where to start:

- The command line: ``iclprobe demo`` runs the whole pipeline on the shipped models and
  writes a report folder; ``iclprobe models`` lists those models; ``iclprobe train``,
  ``probe``, ``align`` and ``compare`` do one step each (``--help`` on each).
- The modules, in the order the data flow through them:

  - `iclprobe.tasks`: regression tasks and batches (``RegressionTask(...).sample(64)``).
  - `iclprobe.models`: the hooked families `GPTRegressor` and `PQTransformer`,
    checkpoints (``models.load(path or shipped name)``, ``model.save``).
  - `iclprobe.training`: ``training.train(model, task, training.TrainConfig(...))``.
  - `iclprobe.hooks`: every layer's residual stream, ablations, patching.
  - `iclprobe.probes`: per-layer readout probes, induced weights, PQ preconditioners.
  - `iclprobe.algorithms`: the reference learners, as iterates over every prefix.
  - `iclprobe.alignment`: layer-by-step similarities, the best step per layer, reports.

Example (the Newton step each layer of a shipped GPT matches; some seconds on a CPU)::

    from iclprobe import algorithms, alignment, models, probes
    model = models.load("gpt-softmax")  # a shipped model: see `iclprobe models`
    probe = probes.LayerProbes().fit(model, n_sequences=500, generator=0)  # one per layer
    b = model.task.sample(256, generator=1)  # fresh sequences of the model's own task
    newton = algorithms.iterates("newton", b.xs.double(), b.ys.double(), steps=range(25))
    steps = alignment.match_steps(alignment.similarity(probe.predict(b.xs, b.ys), newton,
                                                       b.ys)).best_step

Shapes: ``xs [batch, pos, n_dims]``, ``ys [batch, pos]``; ``preds[:, t]`` predicts
``ys[:, t]`` from the t examples before it; per-layer results are ``[n_layers + 1, ...]``
(layer 0: the embedded input).

Subpackages are imported lazily (``from iclprobe import models`` works as usual), so that
``import iclprobe`` and the ``iclprobe --help`` command stay fast: the models pull in
TransformerLens, which imports Hugging Face transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["algorithms", "alignment", "hooks", "models", "probes", "tasks", "training"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
