"""The mistakes a newcomer makes extending iclprobe, each caught early with what to fix.

Written as a newcomer would: the family is docs/architecture.md's recipe (its two code
blocks, `recipe_package.family_blocks`) in a package of its own in ``tmp_path``, with one
line changed the way a first attempt gets it wrong; the learner and the metric are the
recipes' shape, defined here, outside the package. Each mistake is refused at registration,
at construction, or at the first call that can show it, naming what to fix.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from recipe_package import family_blocks

from iclprobe import algorithms, hooks, models, tasks
from iclprobe.alignment import AlignConfig, align, register_metric
from iclprobe.alignment.metrics import METRIC_INFO
from iclprobe.cli import main
from iclprobe.models import registry

TASK = tasks.RegressionTask(n_dims=3, n_points=9)


@pytest.fixture
def family(tmp_path, monkeypatch):
    """``build(change)``: the recipe's family, with ``(old, new)`` text changes, imported."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []

    def build(*changes):
        name = f"newcomer{len(made)}"
        config, model = family_blocks()
        for old, new in changes:
            assert old in model, old
            model = model.replace(old, new)
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        (pkg / "config.py").write_text(config)
        (pkg / "model.py").write_text(model)
        importlib.invalidate_caches()
        made.append(name)
        return (importlib.import_module(f"{name}.config").TinyConfig,
                importlib.import_module(f"{name}.model").TinyRegressor)

    yield build
    for name in [m for m in sys.modules if m.startswith("newcomer")]:
        del sys.modules[name]


def test_a_learner_that_ignores_steps_is_refused_at_its_first_call():
    @algorithms.register("ignores_steps_test", steps=(1, 2))
    def ignores_steps_test(xs, ys, steps=None, weights=True):
        return algorithms.gd(xs, ys, steps=[1, 2], weights=weights)  # not the steps asked

    b = TASK.sample(4, generator=0)
    try:
        with pytest.raises(ValueError, match=r"learner 'ignores_steps_test' was asked for "
                                             r"steps \[0, 1, 2, 3, 4, 5, 6, 7, 8\] and "
                                             r"returned iterates of steps \[1, 2\]: run the "
                                             "`steps` it receives"):
            algorithms.iterates("ignores_steps_test", b.xs, b.ys, steps=range(9))
    finally:
        algorithms.LEARNERS.pop("ignores_steps_test")


def test_iterates_of_a_list_name_the_field_and_the_fix():
    preds = [torch.zeros(2, 3), torch.zeros(2, 3)]
    with pytest.raises(TypeError, match=r"Iterates.preds must be a torch.Tensor \[K steps, "
                                        r"batch, pos\], got a list \(stack a list of per-step "
                                        r"tensors with torch.stack\)"):
        algorithms.Iterates([1, 2], preds, None, {})
    with pytest.raises(TypeError, match="Iterates.hyper must be a dict"):
        algorithms.Iterates([1, 2], torch.zeros(2, 2, 3), None, None)


@pytest.mark.parametrize(("on", "other"), [("weights", "preds"), ("preds", "weights")])
def test_a_metric_with_the_wrong_on_is_refused_when_registered(on, other):
    def on_preds(a, b, ys, t_min, t_max):  # written for predictions [..., batch, pos]
        return (a - b)[..., t_min:t_max + 1].abs().mean(-1)

    def on_weights(a, b, ys, t_min, t_max):  # written for weights [..., batch, pos, d]
        u, v = a[..., t_min:t_max + 1, :], b[..., t_min:t_max + 1, :]
        return torch.nn.functional.cosine_similarity(u, v, dim=-1).mean(-1)

    fn = on_preds if on == "weights" else on_weights
    with pytest.raises(ValueError, match=rf"metric 'wrong_on_test', registered with "
                                         rf"on='{on}' .* must return one value per sequence, "
                                         rf"shape \(2, 3, 5\), got .*; if it compares .*, "
                                         rf"register it with on='{other}'"):
        register_metric("wrong_on_test", on=on, higher_is_better=False)(fn)
    assert "wrong_on_test" not in METRIC_INFO


def test_hook_names_that_are_not_the_modules_are_refused_when_built(family):
    config, model = family(("self.blocks = nn.ModuleList", "self.layers = nn.ModuleList"),
                           ("for block in self.blocks:", "for block in self.layers:"))
    with pytest.raises(ValueError, match=r"TinyRegressor: the residual hook\(s\) "
                                         r"\['blocks.0.hook_resid_pre', .*\] "
                                         r"\(resid_hook_name\) are not among its hook points "
                                         r"\['layers.0.hook_resid_post', .*name the HookPoint "
                                         r"attributes after the layers"):
        model(config(n_dims=3))
    with pytest.raises(ValueError, match="are not among its hook points"):
        with torch.device("meta"):  # as models.size builds it: refused there too
            model(config(n_dims=3))


def test_a_family_without_setup_is_named_at_its_first_residuals(family):
    config, model = family(("self.setup()", "pass  # self.setup()"))
    b = TASK.sample(2, generator=0)
    with pytest.raises(ValueError, match=r"TinyRegressor has no hook points: its __init__ "
                                         r"must build its HookPoint modules and call "
                                         r"self.setup\(\) last"):
        hooks.collect_residuals(model(config(n_dims=3)), b.xs, b.ys)


def test_a_query_residuals_that_is_not_the_substitution_is_refused(family):
    # every prefix's queries see the last prefix's context: the later examples leak in
    config, model = family(("self._context(xs, ys)[:, :, None]",
                            "self._context(xs, ys)[:, -1:, None]"))
    registry.register_family("newcomer_leaky", config, model, "a leaky family")
    try:
        m = model(config(n_dims=3))
        m.task = TASK
        cfg = AlignConfig(n_sequences=32, n_weight_sequences=8, n_boot=10, separation=False)
        with pytest.raises(ValueError, match=r"TinyRegressor.query_residuals is not the "
                                             r"substitution: with each prefix's own x_t as "
                                             r"its query it must give the forward pass's "
                                             r"residuals"):
            align(m, cfg)
    finally:
        registry.FAMILIES.pop("newcomer_leaky")


def test_probe_on_a_checkpoint_without_a_task_is_one_line(family, tmp_path, capsys):
    config, model = family()
    registry.register_family("newcomer_taskless", config, model, "the recipe's family")
    try:
        m = model(config(n_dims=3))
        assert m.task is None  # the recipe never sets it: Regressor's default
        ckpt = models.save(m, tmp_path / "m")  # no task: no task.json
        assert main(["probe", str(ckpt), "--n-sequences", "16"]) == 2
    finally:
        registry.FAMILIES.pop("newcomer_taskless")
    err = capsys.readouterr().err.strip()
    assert err == f"iclprobe probe: error: {ckpt} has no task.json to draw probe data from"
