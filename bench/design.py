"""The design step's cost against one ``align`` of the same model (target: at most 1×).

``iclprobe align MODEL --design`` aligns the model on its own task, searches the family of
evaluation distributions for the one where the candidates' matched columns differ most
(`alignment.design.design_evaluation`, from the learners alone), then aligns the model
there. The search is the step this benchmark times: per shipped model, the median of
alternating repeats of the search and of an align on the model's own task (the baseline),
and their ratio.

    python bench/design.py [--models lstm gpt-softmax] [--repeats 3]

The exit status is 1 when a model's search takes longer than its align.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from iclprobe import models
from iclprobe.alignment import AlignConfig, align
from iclprobe.alignment.design import design_evaluation
from iclprobe.cli import OneLineParser, positive_int
from iclprobe.errors import InputError


def main() -> None:
    parser = OneLineParser(prog="design.py", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lstm", "gpt-softmax"])
    parser.add_argument("--repeats", type=positive_int, default=3)
    args = parser.parse_args()
    loaded = {}
    for name in dict.fromkeys(args.models):  # every name before any benchmark runs
        try:
            loaded[name] = models.load(name)
        except (InputError, OSError) as err:
            parser.error(f"--models: {err}")
    torch.set_num_threads(2)
    cfg = AlignConfig()
    failed = []
    for name, model in loaded.items():
        own = align(model, cfg, name=name)  # warm-up: lazy imports, allocator
        aligns, searches = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            own = align(model, cfg, name=name)
            aligns.append(time.perf_counter() - start)
            start = time.perf_counter()
            design_evaluation(model, own, cfg)
            searches.append(time.perf_counter() - start)
        a, s = statistics.median(aligns), statistics.median(searches)
        ok = s <= a
        if not ok:
            failed.append(name)
        print(f"{name}: design search {s:.2f} s, align on its own task {a:.2f} s; search / "
              f"align = {s / a:.2f} (target ≤ 1: {'PASS' if ok else 'FAIL'})")
    if failed:
        print(f"targets missed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
