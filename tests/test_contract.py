"""The extension contract is checked where it is made: at registration, or on each call.

Every bad learner, metric or family here is refused with an error that names what is
missing; what a learner or metric returns is checked (or, a ``steps`` list, converted).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import small_batch

from iclprobe import algorithms, hooks
from iclprobe.alignment import similarity
from iclprobe.alignment.metrics import METRIC_INFO, register_metric
from iclprobe.models import registry
from iclprobe.models.base import Regressor
from iclprobe.models.config import ConfigMixin, LSTMConfig
from iclprobe.models.lstm import LSTMRegressor


@pytest.fixture
def scratch():
    """Names registered by a test, removed from every registry afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        algorithms.LEARNERS.pop(name, None)
        METRIC_INFO.pop(name, None)
        registry.FAMILIES.pop(name, None)


def _gd_iterates(xs, ys, steps):
    return algorithms.gd(xs, ys, steps=steps, lr="max")


# ------------------------------------------------------------------ learners
@pytest.mark.parametrize(("kwargs", "fn", "error", "match"), [
    ({}, lambda xs, ys, steps=None: None, TypeError, r"no parameter\(s\) \['weights'\]"),
    ({"steps": (1, 2)}, lambda xs, ys, weights=True: None, TypeError,
     r"\['steps'\] .*registered with steps=\(1, 2\)"),
    ({"align_hyper": {"lr": 0.1}}, lambda xs, ys, weights=True: None, TypeError,
     r"\['lr'\] \('lr' is in align_hyper\)"),
    ({}, lambda xs, weights=True: None, TypeError, r"first two arguments, \(xs, ys"),
    ({"steps": "cgg"}, lambda xs, ys, steps, weights=True: None, ValueError,
     r"steps must be step counts, None or one of \('cg', 'layers'\), got 'cgg'"),
    ({"steps": (1, -2)}, lambda xs, ys, steps, weights=True: None, ValueError,
     r"steps must be integers >= 0, got -2"),
    ({"align": "yes"}, lambda xs, ys, weights=True: None, TypeError, "align must be a bool"),
    ({"step_scale": "log"}, lambda xs, ys, weights=True: None, ValueError, "step_scale"),
])
def test_a_learner_is_checked_when_registered(scratch, kwargs, fn, error, match):
    scratch.append("bad_learner")
    with pytest.raises(error, match=match):
        algorithms.register("bad_learner", **kwargs)(fn)
    assert "bad_learner" not in algorithms.LEARNERS


def test_a_learner_with_kwargs_takes_any_hyperparameter(scratch):
    scratch.append("kw_learner")

    @algorithms.register("kw_learner", steps=(1, 2), align_hyper={"lr": "max"})
    def kw_learner(xs, ys, **kw):
        return _gd_iterates(xs, ys, kw["steps"])

    b = small_batch()
    it = algorithms.iterates("kw_learner", b.xs, b.ys, steps=[1, 2], lr="max", weights=True)
    assert it.name == "kw_learner" and it.steps.tolist() == [1, 2]


def test_a_learners_output_is_checked_on_every_call(scratch):
    scratch.append("shapes")
    returned = {}

    @algorithms.register("shapes", steps=(1, 2))
    def shapes(xs, ys, steps=None, weights=True):
        return returned["value"]

    b = small_batch(batch=4, n_points=8)
    gd = _gd_iterates(b.xs, b.ys, [1, 2])
    returned["value"] = (gd.preds, gd.weights)
    with pytest.raises(TypeError, match="learner 'shapes' must return algorithms.Iterates, "
                                        "got tuple"):
        algorithms.iterates("shapes", b.xs, b.ys, steps=[1, 2])
    returned["value"] = dataclasses.replace(gd, preds=gd.preds[:, :, :-1])
    with pytest.raises(ValueError, match=r"preds must have shape \[K=2 steps, 4, 8\], got "
                                         r"\(2, 4, 7\)"):
        algorithms.iterates("shapes", b.xs, b.ys, steps=[1, 2])
    returned["value"] = dataclasses.replace(gd, weights=gd.weights[:1])
    with pytest.raises(ValueError, match=r"weights must be None or of shape \[K=2 steps, 4, "
                                         r"8, 3\], got \(1, 4, 8, 3\)"):
        algorithms.iterates("shapes", b.xs, b.ys, steps=[1, 2])
    # a NaN passed through to the tables before
    nan = gd.preds.clone().index_fill_(2, torch.tensor([3]), math.nan)
    returned["value"] = dataclasses.replace(gd, preds=nan)
    with pytest.raises(ValueError, match=r"learner 'shapes' returned predictions that are not "
                                         r"finite \(NaN or Inf\)"):
        algorithms.iterates("shapes", b.xs, b.ys, steps=[1, 2])
    returned["value"] = dataclasses.replace(gd, weights=gd.weights * math.inf)
    with pytest.raises(ValueError, match=r"returned weights that are not finite"):
        algorithms.iterates("shapes", b.xs, b.ys, steps=[1, 2])
    returned["value"] = algorithms.Iterates([1, 2], gd.preds, None, {})  # the steps list
    it = algorithms.iterates("shapes", b.xs, b.ys, steps=[1, 2])
    assert it.steps.dtype == torch.int64 and it.steps.tolist() == [1, 2]
    assert it.name == "shapes"


def test_iterates_steps_are_converted_or_refused():
    preds = torch.zeros(2, 1, 3)
    assert algorithms.Iterates((0, 3), preds, None, {}).steps.dtype == torch.int64
    assert algorithms.Iterates(torch.tensor([0, 3]), preds, None, {}).steps.tolist() == [0, 3]
    with pytest.raises(ValueError, match="steps must be integers >= 0, got 1.5"):
        algorithms.Iterates([1.5, 2], preds, None, {})
    with pytest.raises(ValueError, match="steps must be a 1-D integer tensor"):
        algorithms.Iterates(torch.tensor([1.0, 2.0]), preds, None, {})


def test_the_learner_registry_is_one_dict_of_registrations():
    info = algorithms.LEARNERS["gd"]
    assert isinstance(info, algorithms.LearnerInfo) and info.fn is algorithms.gd
    assert algorithms.learner_info("gd") is info
    assert not hasattr(algorithms, "LEARNER_INFO")
    assert [i.name for i in algorithms.aligned_learners()][:2] == ["newton", "gd"]


# ------------------------------------------------------------------ metrics
def test_a_metric_is_checked_when_registered(scratch):
    scratch.append("bad_metric")
    def two(a, b):
        return a

    with pytest.raises(TypeError, match=r"metric 'bad_metric': the metric two\(a, b\) must "
                                        r"take \(a, b, ys, t_min, t_max\)"):
        register_metric("bad_metric", on="preds", higher_is_better=True)(two)
    with pytest.raises(TypeError, match="across must be None or a function"):
        register_metric("bad_metric", on="preds", higher_is_better=True, across=True)
    with pytest.raises(TypeError, match="higher_is_better must be a bool"):
        register_metric("bad_metric", on="preds", higher_is_better="yes")
    with pytest.raises(ValueError, match=r"on must be one of \('preds', 'weights'\)"):
        register_metric("bad_metric", on="errors", higher_is_better=True)
    assert "bad_metric" not in METRIC_INFO


def _tables(seed=0):
    b = small_batch(batch=12, n_points=8, seed=seed)
    gd = _gd_iterates(b.xs, b.ys, [1, 2, 4])
    layers = torch.stack([torch.zeros_like(b.ys), 0.5 * b.ys, b.ys + 0.1 * b.xs[..., 0]])
    return layers, gd, b.ys


def test_a_metrics_output_is_checked(scratch):
    """When registered, on random data; on every call, on the data (which may differ)."""
    scratch.extend(["scalar", "sized"])

    def scalar(a, b, ys, t_min, t_max):
        return (a - b).abs().mean()

    with pytest.raises(ValueError, match=r"metric 'scalar', registered with on='preds' .*: "
                                         r"the metric must return one value per sequence, "
                                         r"shape \(2, 3, 5\), got \(\)"):
        register_metric("scalar", on="preds", higher_is_better=False)(scalar)

    @register_metric("sized", on="preds", higher_is_better=False)
    def sized(a, b, ys, t_min, t_max):  # one value per sequence only for short sequences
        out = (a - b)[..., t_min:t_max + 1].abs().mean(-1)
        return out if a.shape[-1] < 8 else out.mean(-1)

    layers, gd, ys = _tables()
    with pytest.raises(ValueError, match=r"metric 'sized' must return one value per "
                                         r"sequence, shape \(3, 3, 12\) here .* as registered "
                                         r"with on='preds'\), got \(3, 3\)"):
        similarity(layers, gd, ys, "sized", n_boot=4)


def test_a_metric_without_an_across_form_is_refused_across_sequences(scratch):
    scratch.append("error_l1_c")

    @register_metric("error_l1_c", on="preds", higher_is_better=False)
    def error_l1_c(a, b, ys, t_min, t_max):
        return (a - b)[..., t_min:t_max + 1].abs().mean(-1)

    layers, gd, ys = _tables()
    with pytest.raises(ValueError, match=r"'sequences' only for \['error_cosine'\]\), got "
                                         r"'sequences' with metric 'error_l1_c'"):
        similarity(layers, gd, ys, "error_l1_c", over="sequences", n_boot=4)


def test_a_metrics_across_form_is_its_own(scratch):
    """A metric's cosine across sequences comes from its products, not the error cosine's."""
    scratch.append("pred_cos")

    def products(a, b, ys, t_min, t_max):
        u, v = a[..., t_min:t_max + 1], b[..., t_min:t_max + 1]  # the predictions themselves
        return torch.stack(torch.broadcast_tensors(u * v, u * u, v * v), dim=-1)

    @register_metric("pred_cos", on="preds", higher_is_better=True, across=products)
    def pred_cos(a, b, ys, t_min, t_max):
        u, v = a[..., t_min:t_max + 1], b[..., t_min:t_max + 1]
        return torch.nn.functional.cosine_similarity(u, v, dim=-1)

    layers, gd, ys = _tables()
    sim = similarity(layers, gd, ys, "pred_cos", t_min=3, t_max=5, over="sequences", n_boot=4)
    for layer in (1, 2):
        for k in range(3):  # per position, the cosine over sequences, then the mean over t
            want = torch.stack([torch.nn.functional.cosine_similarity(
                layers[layer, :, t].double(), gd.preds[k, :, t].double(), dim=0)
                for t in range(3, 6)]).mean()
            torch.testing.assert_close(sim.values[layer, k], want)
    err = similarity(layers, gd, ys, "error_cosine", t_min=3, t_max=5, over="sequences",
                     n_boot=4)
    assert not torch.allclose(sim.values[1:], err.values[1:])


# ------------------------------------------------------------------ families
@dataclasses.dataclass(frozen=True)
class MiniConfig(ConfigMixin):
    n_dims: int = 3
    n_layers: int = 1
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class NoDict:  # no ConfigMixin: nothing to write config.json with
    n_dims: int = 3
    n_layers: int = 1
    seed: int = 0


@dataclasses.dataclass
class Thawed(ConfigMixin):
    n_dims: int = 3
    n_layers: int = 1
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class NoSeed:
    n_dims: int = 3
    n_layers: int = 1


class Half(Regressor):  # nothing implemented
    pass


@pytest.mark.parametrize(("config", "model", "error", "match"), [
    (NoDict, LSTMRegressor, TypeError,
     r"NoDict lacks method\(s\) \['to_dict', 'from_dict'\]: to_dict: config.json is written"),
    (NoSeed, LSTMRegressor, TypeError, r"NoSeed has no field\(s\) \['seed'\]"),
    (Thawed, LSTMRegressor, TypeError, "Thawed must be a frozen dataclass"),
    (MiniConfig(), LSTMRegressor, TypeError, "config must be a dataclass class"),
    (MiniConfig, dict, TypeError, "must be a subclass of iclprobe.models.base.Regressor"),
    (MiniConfig, Half, TypeError, r"Half does not implement \['forward', "),
    (MiniConfig, "iclprobe.models.lstm.LSTMRegressor", ValueError, "model must be a class or "
                                                                   "'module:Class'"),
])
def test_a_family_is_checked_when_registered(scratch, config, model, error, match):
    scratch.append("mini")
    with pytest.raises(error, match=match):
        registry.register_family("mini", config, model, "a mini family")
    assert "mini" not in registry.FAMILIES


def test_a_family_registered_by_path_is_checked_when_imported(scratch):
    scratch.append("mini")
    registry.register_family("mini", MiniConfig, "iclprobe.models.lstm:NoSuchClass", "mini")
    with pytest.raises(ValueError, match=r"family 'mini': cannot import its model class "
                                         r"'iclprobe.models.lstm:NoSuchClass'"):
        registry.get_family("mini").model_class()
    registry.register_family("mini", MiniConfig, "iclprobe.models.lstm:LSTMBlock", "mini",
                             replace=True)
    with pytest.raises(TypeError, match="must be a subclass of iclprobe.models.base.Regressor"):
        registry.get_family("mini").model_class()


def test_a_registered_class_of_another_family_keeps_its_name(scratch):
    scratch.append("lstm_again")
    registry.register_family("lstm_again", LSTMConfig, "iclprobe.models.lstm:LSTMRegressor",
                             "the LSTM under a second name")
    assert registry.get_family("lstm_again").model_class() is LSTMRegressor
    assert LSTMRegressor.family == "lstm"
    model = LSTMRegressor(LSTMConfig(n_dims=2, n_positions=4, n_layers=1, d_model=4))
    assert registry.family_of(model) == "lstm"


def test_ablate_refuses_block_output_hooks_the_model_lacks(monkeypatch):
    model = LSTMRegressor(LSTMConfig(n_dims=2, n_positions=4, n_layers=2, d_model=4))
    monkeypatch.setattr(LSTMRegressor, "block_output_hooks", ("hook_attn_out",))
    with pytest.raises(ValueError, match=r"LSTMRegressor.block_output_hooks names hooks it "
                                         r"does not have: \['blocks.0.hook_attn_out'\]; its "
                                         r"hooks of block 0: \['blocks.0.hook_resid_pre'"):
        with hooks.ablate(model, block=0):
            pass  # pragma: no cover


def test_a_broken_plugin_is_skipped_with_a_warning(tmp_path):
    info = tmp_path / "broken-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[iclprobe.plugins]\nbroken = no_such_module_x\n")
    code = "from iclprobe.plugins import load_plugins\nprint(load_plugins())"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True)
    assert "iclprobe plugin 'broken' (no_such_module_x) failed to load, skipped: " \
           "ModuleNotFoundError" in proc.stderr
    assert "'broken': \"failed: ModuleNotFoundError: No module named" in proc.stdout
