"""docs/architecture.md's three recipes, followed verbatim in a package outside iclprobe.

The package (tests/recipe_package.py) holds the learner and metric recipes' code as the
docs print it and a family written from the family recipe's steps; it is driven through
train, save, load, align, compare, report and the CLI, in this process and, installed as
a plugin (a ``.dist-info`` with an ``iclprobe.plugins`` entry point), in a subprocess.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
import torch
from recipe_package import PACKAGE, write_package

from iclprobe import algorithms, hooks, models, tasks
from iclprobe.alignment import AlignConfig, align, compare, similarity
from iclprobe.alignment.measuring.runs import run_spec
from iclprobe.alignment.metrics import METRIC_INFO
from iclprobe.alignment.protocols import get_protocol
from iclprobe.cli import main
from iclprobe.models import registry
from iclprobe.training import TrainConfig, train

ALIGN = dict(n_sequences=48, n_weight_sequences=12, n_boot=20, separation=False)
TRAIN_FLAGS = ["--family", "tinymean", "--n-dims", "3", "--n-points", "9", "--steps", "20",
               "--batch-size", "16", "--log-every", "10"]


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    """``tinyext`` imported from a directory outside iclprobe; its registrations undone after."""
    root = write_package(tmp_path_factory.mktemp("site"))
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    module = importlib.import_module(PACKAGE)
    yield root, module
    sys.path.remove(str(root))
    algorithms.LEARNERS.pop("heavy_ball")
    METRIC_INFO.pop("error_l1")
    registry.FAMILIES.pop("tinymean")
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def run(ext, tmp_path_factory):
    """A tiny model trained from Python into a run directory (enough to predict: aligned)."""
    family = registry.get_family("tinymean")
    model = family.model_class()(family.config(n_dims=3, n_layers=2))
    task = tasks.RegressionTask(n_dims=3, n_points=9)
    out = tmp_path_factory.mktemp("runs") / "tiny"
    recipe = TrainConfig(steps=200, batch_size=32, lr=1e-2, log_every=50)
    result = train(model, task, recipe, out=out, progress=False)
    assert result.final["step"] == 200
    return out


@pytest.mark.slow
def test_the_learner_recipe_returns_its_steps_list_and_joins_align(ext, run):
    batch = tasks.RegressionTask(n_dims=3, n_points=9).sample(8, generator=0)
    it = algorithms.iterates("heavy_ball", batch.xs, batch.ys, steps=[1, 2, 4])
    assert it.steps.dtype == torch.int64 and it.steps.tolist() == [1, 2, 4]
    assert it.name == "heavy_ball"  # the recipe leaves the name empty: the registry's
    ref = algorithms.momentum(batch.xs, batch.ys, steps=[1, 2, 4], lr="max", beta=0.5)
    torch.testing.assert_close(it.preds, ref.preds, rtol=0, atol=0)
    cfg = AlignConfig(**ALIGN, metrics=("error_cosine", "weight_cosine"))
    res = align(models.load(run), cfg, name="tiny")  # weights: the family's query_residuals
    assert res.meaningless is None
    assert res.similarities["heavy_ball"]["weight_cosine"].values.shape == (3, 5)
    assert res.similarities["heavy_ball"]["error_cosine"].steps == [1, 2, 4, 8, 16]
    assert res.run_labels["heavy_ball"] == "heavy ball"
    assert res.matches["heavy_ball"]["error_cosine"].fit.log2


def test_the_metric_recipe_through_similarity_and_align(ext, run):
    error_l1 = ext[1].error_l1
    batch = tasks.RegressionTask(n_dims=3, n_points=9).sample(16, generator=1)
    gd = algorithms.gd(batch.xs, batch.ys, steps=[1, 4], lr="max")
    layers = torch.stack([torch.zeros_like(batch.ys), batch.ys])  # [layer, batch, pos]
    sim = similarity(layers, gd, batch.ys, "error_l1", n_boot=10)  # t_max: the default
    want = error_l1(layers.double()[:, None], gd.preds.double()[None], batch.ys, 1, 8)
    torch.testing.assert_close(sim.values, want.mean(-1), rtol=1e-12, atol=1e-12)
    assert not sim.higher_is_better
    cfg = AlignConfig(**ALIGN, metrics=("error_cosine", "error_l1"),
                      algorithms=("newton", "heavy_ball"))
    res = align(models.load(run), cfg, name="tiny")
    assert res.similarities["heavy_ball"]["error_l1"].metric == "error_l1"
    assert "error_l1" in res.comparisons


def test_the_family_recipe_trains_saves_loads_ablates_and_compares(ext, run, tmp_path):
    model = models.load(run)
    assert type(model).__name__ == "TinyRegressor" and type(model).family == "tinymean"
    assert json.loads((run / "checkpoint" / "config.json").read_text())["family"] == "tinymean"
    copy = model.save(tmp_path / "copy")  # a class imported by its path still saves
    torch.testing.assert_close(dict(models.load(copy).state_dict()), dict(model.state_dict()))
    batch = model.task.sample(4, generator=2)
    with torch.no_grad(), hooks.ablate(model, block=1):  # the default: block 1's update
        ablated = model(batch.xs, batch.ys)
        _, cache = model.run_with_cache(batch.xs, batch.ys)
    torch.testing.assert_close(cache["blocks.1.hook_resid_post"],
                               cache["blocks.1.hook_resid_pre"])
    with torch.no_grad():
        torch.testing.assert_close(ablated, model.readout_residual(
            cache["blocks.1.hook_resid_pre"]))
        assert (ablated - model(batch.xs, batch.ys)).abs().max() > 1e-6
    cfg = AlignConfig(**ALIGN, metrics=("error_cosine", "error_l1"))
    results = compare([model, models.load(copy)], cfg, names=["tiny", "copy"])
    torch.testing.assert_close(results[0].similarities["gd"]["error_l1"].values,
                               results[1].similarities["gd"]["error_l1"].values)
    spec = get_protocol("iclprobe").runs["heavy_ball"]
    assert run_spec(spec, model.task.sample(4, generator=0), 2, True).weights is not None


@pytest.mark.slow  # the recipes' CLI runs; the recipes themselves: the tests above
def test_the_recipes_through_the_cli(ext, run, tmp_path, capsys):
    out = tmp_path / "cli-run"
    assert main(["train", *TRAIN_FLAGS, "--out", str(out)]) == 0
    assert json.loads((out / "checkpoint" / "config.json").read_text())["family"] == "tinymean"
    capsys.readouterr()
    assert main(["align", str(out), "--n-sequences", "32", "--algorithms", "heavy_ball,gd",
                 "--metrics", "error_cosine,error_l1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["cli-run"]
    assert sorted(printed["similarities"]) == ["gd", "heavy_ball"]
    assert "error_l1" in printed["similarities"]["heavy_ball"]
    assert main(["compare", str(run), str(out), "--n-sequences", "48", "--metrics",
                 "error_cosine,error_l1", "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    section = report.split("## tiny")[1].split("## cli-run")[0]  # the trained model's
    assert "### By mean |error difference|" in section and "heavy_ball (step)" in section


def _child_env(root):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.mark.slow  # an installed distribution and a subprocess
def test_an_installed_plugin_reaches_the_cli_in_a_subprocess(ext, run):
    root, _ = ext
    env = _child_env(root)
    code = ("import sys\nfrom iclprobe.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            f"print('torch' in sys.modules, {PACKAGE!r} in sys.modules)")
    quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True)
    assert quiet.stdout.splitlines()[-1] == "False False"  # --help loads no plugin
    # a fresh process: models.load finds the checkpoint's family among the plugins, and
    # `iclprobe align` and `train --help` know the plugin's learner, metric and family
    code = (f"from iclprobe import models\nm = models.load({str(run)!r})\n"
            "print(type(m).__name__, type(m).family)\n"
            "from iclprobe.cli import main\n"
            f"rc = main(['align', {str(run)!r}, '--n-sequences', '32', '--algorithms', "
            "'heavy_ball', '--metrics', 'error_l1', '--json'])\n"
            "print('rc', rc)\nmain(['train', '--help'])")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["TinyRegressor", "tinymean"]
    end = lines.index("rc 0")
    printed = json.loads("\n".join(lines[1:end]))["tiny"]
    assert list(printed["similarities"]) == ["heavy_ball"]
    assert list(printed["similarities"]["heavy_ball"]) == ["error_l1"]
    assert "{gpt,lstm,oracle,pq,tinymean}" in "".join(lines[end:]).replace(" ", "")
