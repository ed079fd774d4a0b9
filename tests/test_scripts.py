"""The paper-reproduction scripts' claim tables read the results they are given."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from iclprobe import models, tasks
from iclprobe.alignment import AlignConfig, align
from iclprobe.alignment.comparison import layer_ranges
from iclprobe.alignment.design import DesignFamily, align_designed

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_fu2024_claims_quote_the_verdict_and_the_filter_orders():
    fu = _script("reproduce_fu2024")
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 3)
    model.task = tasks.RegressionTask(n_dims=3, n_points=9)
    results = []
    for data in ("task", "ill-conditioned"):
        cfg = AlignConfig(algorithms=("newton", "gd", "online_gd", "ols"), data=data,
                          n_sequences=64, n_boot=20, positions="all", separation=False)
        results.append(align(model, cfg, name=f"gd3-{data}"))
    own_cfg = dataclasses.replace(cfg, data="task")  # the first result's
    done = align_designed(model, own_cfg, "gd3", own=results[0],
                          family=DesignFamily(condition_numbers=(1.0, 100.0), n_sequences=16))
    rows = dict(fu.claims(*results, done))
    designed = next(v for k, v in rows.items() if k.startswith("... on data designed"))
    assert designed.startswith(done.design.chosen.text + ": ")
    if done.designed is not None and not done.out_of_distribution:  # read as the headline
        alone, both = designed.split(" over both evaluations: ")
        assert alone.endswith(done.designed.answer.sentence(done.designed.live)
                              .split(": ", 1)[1].rstrip(".") + ";")
        assert both == done.both_sentence().split(": ", 1)[1].rstrip(".")
    headline = next(v for k, v in rows.items() if k.startswith("Headline"))
    answer = results[0].answer.sentence(results[0].live).split(": ", 1)[1].rstrip(".")
    assert headline.startswith(answer + "; κ=100: ")  # what each layer runs, the answer
    verdict = next(v for k, v in rows.items() if k.startswith("... and not GD"))
    iso = results[0].verdict
    first = iso[0]
    assert f"{first} at {layer_ranges([i for i, v in enumerate(iso) if v == first])}" in verdict
    orders = next(v for k, v in rows.items() if k.startswith("Filter order"))
    spec = results[0].spectral
    live = [i for i, r in enumerate(spec.reading) if r != "computes nothing"
            and spec.order[i] is not None]
    assert all(f"L{i} {spec.order[i]:.2f}" in orders for i in live)


def test_same_outputs_masks_timestamps_and_names_the_first_differing_line():
    same = _script("same_outputs")
    before = {"stdout": b'{"fitted_at": "2024-05-01T12:00:00.5+00:00", "r2": 0.5}\n',
              "report/a.png": b"\x89PNG\x00\xff", "report/only.csv": b"x\n"}
    after = {"stdout": b'{"fitted_at": "2025-01-02T03:04:05.1+00:00", "r2": 0.6}\n',
             "report/a.png": b"\x89PNG\x00\xfe"}
    verdicts = dict(same.compare(before, after))
    assert verdicts["report/only.csv"] == "differs: only before"
    assert verdicts["report/a.png"] == "differs: binary, 6 and 6 bytes"
    # the one-line JSON is indented, so the line names the field; the timestamps are masked
    assert verdicts["stdout"] == ('differs: line 3:\n    before:  "r2": 0.5\n'
                                  '    after:   "r2": 0.6')
    earlier = {**before, "stdout": before["stdout"].replace(b"2024", b"2023")}
    assert dict(same.compare(before, earlier))["stdout"] == "identical (timestamps masked)"
