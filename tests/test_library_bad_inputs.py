"""The library API on bad inputs: every bad input named, nothing non-finite or undefined returned
silently, memory refused before it is allocated, one model's probes never another's."""

import math

import numpy as np
import pytest
import torch
from helpers import tiny_gpt
from torch import nn

import iclprobe.constructions  # noqa: F401  (registers gd_newton_blend, a learner below)
from iclprobe import algorithms, alignment, models, probes, tasks
from iclprobe.alignment.measuring.similarities import similarity
from iclprobe.hooks import collect_residuals

TASK = tasks.RegressionTask(n_dims=3, n_points=8)
NO_MEMORY = 2**30  # bytes "available" in the memory checks below: 1 GiB


# ---------------------------------------------------------------- learners
def test_gd_that_diverges_before_it_overflows_is_refused_naming_the_stable_lr():
    hard = tasks.RegressionTask(n_dims=8, n_points=24, cov="ill-conditioned",
                                condition_number=1e6).sample(64, generator=0)
    with pytest.raises(ValueError, match=r"gd: lr=0.1 diverges on these data.*largest stable "
                                         r"lr here is .*squared error is .* times the zero"):
        algorithms.iterates("gd", hard.xs, hard.ys, steps=[1, 16, 128])
    fine = algorithms.iterates("gd", hard.xs, hard.ys, steps=[1, 16, 128], lr="max")
    assert fine.preds.abs().max() < 1e3 * hard.ys.abs().max()


@pytest.mark.parametrize("name, scale, hyper", [
    ("gd_plus_plus", 1e30, {}), ("online_gd", 1.0, {"lr": 1.0}), ("momentum", 1.0, {"lr": 1.0}),
    ("pgd", 1.0, {"precond": 3 * torch.eye(4), "lr": 1.0}), ("newton", 1.0, {"alpha": 1.0})])
def test_every_learner_refuses_iterates_that_grow_without_bound(name, scale, hyper):
    batch = tasks.RegressionTask(n_dims=4, n_points=12).sample(8, generator=0)
    with pytest.raises(ValueError, match=rf"{name}: .*diverge"):
        algorithms.iterates(name, batch.xs * scale, batch.ys, steps=[1, 2, 4, 8], **hyper)


def test_gd_plus_plus_on_extreme_data_says_which_lr_is_stable():
    batch = tasks.RegressionTask(n_dims=4, n_points=12).sample(8, generator=0)
    with pytest.raises(ValueError, match=r"gd_plus_plus: lr=0.1, gamma=0.01 make the iterates "
                                         r"diverge.*stable for lr < "):
        algorithms.iterates("gd_plus_plus", batch.xs.double() * 1e150, batch.ys, steps=[1, 2])


HYPER = {"pgd": {"precond": torch.eye(3, dtype=torch.float64)},
         "pgd_schedule": {"preconds": torch.eye(3, dtype=torch.float64).expand(4, 3, 3)}}


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. a scalar taken of a grad tensor
@pytest.mark.parametrize("name", sorted(algorithms.LEARNERS))
def test_every_learner_takes_inputs_that_require_grad(name):
    batch = tasks.RegressionTask(n_dims=3, n_points=8).sample(4, generator=0)
    xs, ys = batch.xs.double(), batch.ys.double()
    plain = algorithms.iterates(name, xs, ys, steps=[1, 2], **HYPER.get(name, {}))
    it = algorithms.iterates(name, xs.clone().requires_grad_(True),
                             ys.clone().requires_grad_(True), steps=[1, 2], **HYPER.get(name, {}))
    assert not it.preds.requires_grad
    torch.testing.assert_close(it.preds, plain.preds, rtol=0, atol=0)


# ---------------------------------------------------------------- probes
def test_model_hash_takes_a_learned_scalar_and_tells_parameter_free_models_apart(tmp_path):
    model = tiny_gpt()
    model.register_parameter("temperature", nn.Parameter(torch.tensor(1.5)))  # 0-dim
    first = probes.model_hash(model)
    with torch.no_grad():
        model.temperature.fill_(2.0)
    assert probes.model_hash(model) != first  # the scalar's value counts
    lp = probes.LayerProbes().fit(model, TASK, n_sequences=64, n_heldout=8)
    lp.save(tmp_path / "p")
    assert probes.LayerProbes.load(tmp_path / "p", model).model_hash_ == lp.model_hash_
    model.register_buffer("mask", torch.ones(3), persistent=False)  # buffers count too
    with pytest.raises(ValueError, match="fitted on another model"):
        probes.LayerProbes.load(tmp_path / "p", model)

    class Zero(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg

    class Mean(Zero):
        pass

    a, b = models.PQConfig(n_dims=3, n_layers=1), models.PQConfig(n_dims=4, n_layers=1)
    hashes = {probes.model_hash(m) for m in (Zero(a), Zero(b), Mean(a))}
    assert len(hashes) == 3
    assert probes.model_hash(Zero(a)) == probes.model_hash(Zero(a))


def test_align_of_a_model_with_a_learned_scalar(tmp_path):
    model = tiny_gpt("linear", "paired")
    model.register_parameter("temperature", nn.Parameter(torch.tensor(1.0)))
    model.task = TASK
    res = alignment.align(model, alignment.AlignConfig(n_sequences=32, n_boot=10,
                                                       algorithms=("gd",)))
    assert res.n_layers == 2


@pytest.fixture(scope="module")
def fitted():
    model = tiny_gpt()
    return model, probes.LayerProbes().fit(model, TASK, n_sequences=64, n_heldout=8)


def test_layer_probes_refuse_non_finite_or_huge_fits(fitted):
    model, _ = fitted
    batch = TASK.sample(32, generator=0)
    resid = collect_residuals(model, batch.xs, batch.ys)
    bad_y = batch.ys.clone()
    bad_y[0, 3] = math.nan
    with pytest.raises(ValueError, match="targets must be finite: found 1 NaN"):
        probes.LayerProbes().fit_residuals(resid, bad_y)
    for value, says in ((math.nan, "resid must be finite"), (math.inf, "resid must be finite"),
                        (1e200, "resid reaches 1e\\+200.*rescale")):
        bad = resid.double().clone()
        bad[1, 0, 2, 0] = value
        with pytest.raises(ValueError, match=says):
            probes.LayerProbes().fit_residuals(bad, batch.ys)
    with pytest.raises(TypeError, match="resid must be a torch tensor, got ndarray: convert with "):
        probes.LayerProbes().fit_residuals(resid.numpy(), batch.ys)


@pytest.mark.parametrize("kw, says", [
    ({"alpha": math.inf}, "alpha must be 'gcv' or a finite number >= 0, got inf"),
    ({"alpha": True}, "alpha must be 'gcv' or a finite number >= 0, got True"),
    ({"solver": "adam", "max_steps": 0}, r"LayerProbes.max_steps must be a positive integer"),
    ({"solver": "adam", "batch_rows": 0}, r"LayerProbes.batch_rows must be a positive integer"),
    ({"solver": "adam", "lr": -1.0}, r"LayerProbes.lr must be a number > 0"),
    ({"alphas": []}, r"alphas must hold at least one α \(the grid GCV picks from; None: the "
                     r"default grid\), got \[\]"),  # "alpha must be finite", at the fit
    ({"alphas": torch.tensor([1.0, -1.0])}, r"alphas must be finite and >= 0, got \[1.0, -1.0\]")])
def test_layer_probes_refuse_settings_that_fit_nothing(kw, says):
    with pytest.raises(ValueError, match=says):
        probes.LayerProbes(**kw)


def test_layer_probes_predict_and_fit_name_bad_arguments(fitted):
    model, lp = fitted
    batch = TASK.sample(4, generator=1)
    nan = batch.xs.clone()
    nan[0, 0, 0] = math.nan
    with pytest.raises(ValueError, match="xs must be finite"):
        lp.predict(nan, batch.ys)
    with pytest.raises(ValueError, match=r"xs must hold at least one sequence, got shape "
                                         r"\(0, 8, 3\)"):
        lp.predict(batch.xs[:0], batch.ys[:0])
    with pytest.raises(TypeError, match="xs must be a torch tensor, got ndarray: convert with "):
        lp.predict(np.asarray(batch.xs), batch.ys)
    with pytest.raises(ValueError, match="LayerProbes.fit.n_heldout must be a positive integer, "
                                         "got 0"):
        probes.LayerProbes().fit(model, TASK, n_sequences=64, n_heldout=0)
    with pytest.raises(ValueError, match=r"fitting probes on n_sequences=1000000000 .* needs at "
                                         r"least .* GiB of memory"):
        probes.LayerProbes().fit(model, TASK, n_sequences=10**9)


def test_probes_and_reports_name_a_path_of_the_wrong_type(fitted, tmp_path):
    """``write_report(results, out)`` (swapped) and ``save(None)`` ended in Python's own
    AttributeError ('str' object has no attribute 'name') and TypeError."""
    _, lp = fitted
    with pytest.raises(TypeError, match=r"write_report: out must be a folder path \(str or "
                                        r"os.PathLike; the folder comes first: "
                                        r"write_report\(out, results\)\), got list \[\]"):
        alignment.write_report([], tmp_path / "r")
    with pytest.raises(TypeError, match=r"write_report: results must be a list of AlignResult, "
                                        r"got str 'x'"):
        alignment.write_report(tmp_path / "r", "x")
    with pytest.raises(TypeError, match=r"write_report: results\[0\] must be an AlignResult"):
        alignment.write_report(tmp_path / "r", [lp])
    with pytest.raises(TypeError, match=r"LayerProbes.save: path must be a directory path "
                                        r"\(str or os.PathLike\), got NoneType None"):
        lp.save(None)
    with pytest.raises(TypeError, match=r"LayerProbes.load: path must be a directory path"):
        probes.LayerProbes.load(None, fitted[0])
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- memory before allocation
@pytest.mark.parametrize("kw, field", [
    ({"n_sequences": 10**9}, "n_sequences"), ({"n_boot": 10**9}, "n_boot"),
    ({"n_queries": 10**9, "metrics": ("weight_cosine",)}, "n_queries")])
def test_align_refuses_counts_that_cannot_fit_before_allocating(kw, field):
    from iclprobe.alignment.measuring.memory import check_align_fits

    model = tiny_gpt()
    cfg = alignment.AlignConfig(**kw)
    with pytest.raises(ValueError, match=rf"AlignConfig.{field}=1000000000: aligning m needs at "
                                         r"least [\d,.e+]+ GiB of memory, but 1 GiB"):
        check_align_fits(model, TASK, cfg, True, "m", available=NO_MEMORY)
    check_align_fits(model, TASK, alignment.AlignConfig(), True, "m", available=NO_MEMORY)
    model.task = TASK
    with pytest.raises(ValueError, match=rf"AlignConfig.{field}=1000000000: aligning model "):
        alignment.align(model, cfg)  # against the machine's memory: 10**9 never fits


# ---------------------------------------------------------------- similarity
def _iterates(batch, name="gd"):
    return algorithms.iterates(name, batch.xs, batch.ys, steps=[0, 1, 2])


def test_similarity_on_all_zero_data_is_undefined_not_zero():
    zero = tasks.RegressionBatch(xs=torch.zeros(8, 6, 3), ys=torch.zeros(8, 6),
                                 ws=torch.zeros(8, 3), cov=torch.eye(3))
    it = _iterates(zero)
    layers = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"error cosine is undefined: the residuals .* of "
                                         r"the learner gd are 0"):
        similarity(layers, it, zero.ys)
    batch = TASK.sample(8, generator=0)  # layers that predict every y exactly
    with pytest.raises(ValueError, match=r"error cosine is undefined: the residuals .* of "
                                         r"the layers are 0"):
        similarity(batch.ys.expand(2, 8, 8), _iterates(batch), batch.ys)


@pytest.mark.parametrize("kw, says", [
    ({"chunk": 0}, "chunk must be a positive integer, got 0"),
    ({"chunk": -1}, "chunk must be a positive integer, got -1"),
    ({"chunk": 2.5}, "chunk must be a positive integer, got 2.5"),
    ({"seed": -1}, r"seed must be an integer seed in \[0, 2\*\*63\), got -1")])
def test_similarity_names_a_bad_argument(kw, says):
    batch = TASK.sample(8, generator=0)
    with pytest.raises((ValueError, TypeError), match=says):
        similarity(torch.zeros(2, 8, 8), _iterates(batch), batch.ys, **kw)


def _whole_sequence_error(a, b, ys, t_min, t_max):
    """A metric that reads every position (its window's t_min/t_max ignored)."""
    return ((a - b) ** 2).mean(-1)


@pytest.mark.parametrize("metric", ["error_cosine", "spd", "weight_cosine", "ilwd",
                                    "whole_sequence_test"])
def test_similarity_reads_its_window_alone_for_finiteness(metric):
    """Values that blow up outside ``t_min..t_max`` (a layer valid at its trained length only)
    are not refused: they are 0 to every metric, as in align's pipeline (a metric that
    reads every position, registered here, sees 0 there, not NaN), so the table equals
    that of the same values with 0 there; one NaN inside the window is refused."""
    from iclprobe.alignment.metrics import METRIC_INFO, register_metric

    if metric == "whole_sequence_test":
        register_metric(metric, on="preds", higher_is_better=False)(_whole_sequence_error)
    try:
        batch = TASK.sample(8, generator=0)
        it = algorithms.iterates("gd", batch.xs, batch.ys, steps=[0, 1, 2])
        on_w = metric in ("weight_cosine", "ilwd")
        layers = torch.randn(2, 8, 8, *((3,) if on_w else ()),
                             generator=torch.Generator().manual_seed(1))
        clean = layers.clone()
        clean[:, :, :2] = 0
        blown = clean.clone()
        blown[:, 3, 0] = float("nan")
        blown[:, 5, 1] = float("inf")
        want = similarity(clean, it, batch.ys, metric, t_min=2, n_boot=20)
        got = similarity(blown, it, batch.ys, metric, t_min=2, n_boot=20)
        assert want.values.isfinite().all()
        for field in ("values", "lower", "upper"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
        with pytest.raises(ValueError, match=r"similarity: the layer values are not finite "
                                             r"\(found NaN or Inf\) at positions t = 1..7, "
                                             r"the window compared"):
            similarity(blown, it, batch.ys, metric, t_min=1, n_boot=20)
    finally:
        METRIC_INFO.pop("whole_sequence_test", None)


def test_similarity_of_an_empty_batch_is_named():
    batch = TASK.sample(8, generator=0)
    empty = algorithms.Iterates(torch.tensor([0, 1]), torch.zeros(2, 0, 8), None, {}, "gd")
    with pytest.raises(ValueError, match=r"at least one sequence.*\(0, 8\)"):
        similarity(torch.zeros(2, 0, 8), empty, batch.ys[:0])


def test_similarity_by_weight_cosine_on_all_zero_ys_is_undefined():
    zero = tasks.RegressionBatch(xs=torch.randn(8, 6, 3), ys=torch.zeros(8, 6),
                                 ws=torch.zeros(8, 3), cov=torch.eye(3))
    it = algorithms.iterates("gd", zero.xs, zero.ys, steps=[0, 1, 2])
    with pytest.raises(ValueError, match="weight cosine is undefined: every y is 0"):
        similarity(torch.randn(2, 8, 6, 3), it, zero.ys, "weight_cosine")
    step0 = algorithms.Iterates(it.steps[:1], it.preds[:1], it.weights[:1], {}, "gd")
    batch = TASK.sample(8, generator=0)  # one all-zero column (step 0) is a measurement: 0
    real = algorithms.iterates("gd", batch.xs, batch.ys, steps=[0])
    assert similarity(torch.randn(2, 8, 8, 3), real, batch.ys, "weight_cosine").values.eq(0).all()
    assert step0.weights.eq(0).all()


def test_readout_probe_takes_tensors_that_require_grad():
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    plain = probes.ReadoutProbe(alpha=0.1).fit(x, y)
    grad = probes.ReadoutProbe(alpha=0.1).fit(x.clone().requires_grad_(True),
                                              y.clone().requires_grad_(True))
    np.testing.assert_array_equal(grad.coef_, plain.coef_)
    np.testing.assert_array_equal(grad.predict(x.clone().requires_grad_(True)), plain.predict(x))


def _plain_cosine(a, b, ys, t_min, t_max):
    """A cosine of the predictions that is 0/0 = NaN where either is all zero."""
    a, b = a[..., t_min:t_max + 1], b[..., t_min:t_max + 1]
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def test_a_registered_metric_that_returns_nan_is_refused_not_read_as_no_match():
    """A user's cosine that is NaN against an all-zero column (a learner's step 0, the zero
    predictor's reference) made every layer read "matches no learner", silently."""
    from iclprobe.alignment.metrics import METRIC_INFO, cosine, register_metric

    register_metric("plain_cosine_test", on="preds", higher_is_better=True)(_plain_cosine)
    try:
        batch = TASK.sample(16, generator=0)
        gd = algorithms.iterates("gd", batch.xs, batch.ys, steps=[0, 1, 2])
        with pytest.raises(ValueError, match=r"metric 'plain_cosine_test' returned values that "
                                             r"are not finite \(NaN or Inf\) on finite inputs"):
            similarity(gd.preds[1:], gd, batch.ys, "plain_cosine_test", n_boot=20)
        register_metric("plain_cosine_test", on="preds", higher_is_better=True, replace=True)(
            lambda a, b, ys, t0, t1: cosine(a[..., t0:t1 + 1], b[..., t0:t1 + 1]))  # 0 at 0
        table = similarity(gd.preds[1:], gd, batch.ys, "plain_cosine_test", n_boot=20)
        assert torch.allclose(table.values[:, 1:].diagonal(), torch.ones(2, dtype=torch.float64))
        assert table.values[:, 0].eq(0).all()  # step 0 predicts 0: a cosine of 0
    finally:
        METRIC_INFO.pop("plain_cosine_test", None)


@pytest.mark.parametrize("call, says", [
    (lambda p, w, ys: alignment.error_cosine(p.numpy(), p, ys),
     r"error_cosine: a must be a torch.Tensor, got ndarray"),
    (lambda p, w, ys: alignment.error_cosine(p[:1], p, ys),
     r"error_cosine: the inputs must agree on their last 2 axes, with at least one sequence; "
     r"got \{'a': \(1, 8\), 'b': \(8, 8\), 'ys': \(8, 8\)\}"),
    (lambda p, w, ys: alignment.error_cosine(p[:0], p[:0], ys[:0]),
     r"at least one sequence; got \{'a': \(0, 8\)"),
    (lambda p, w, ys: alignment.weight_cosine(w, w[..., :1]),
     r"weight_cosine: the inputs must agree on their last 3 axes"),
    (lambda p, w, ys: alignment.spd(p.clone().fill_(float("nan")), p),
     r"spd: a is not finite \(NaN or Inf\) at t = 1..7, the window compared"),
    (lambda p, w, ys: alignment.ilwd(w, w.clone().fill_(float("inf"))),
     r"ilwd: b is not finite"),
    (lambda p, w, ys: alignment.error_cosine(p, p, ys[0]),
     r"error_cosine: ys must have at least 2 axes"),
])
def test_the_public_metrics_refuse_what_they_cannot_compare(call, says):
    """They broadcast a single sequence against a batch, or a weight's last axis, into a
    number, and turned NaN into a cosine of 0."""
    batch = TASK.sample(8, generator=0)
    gd = algorithms.iterates("gd", batch.xs, batch.ys, steps=[1])
    with pytest.raises((ValueError, TypeError), match=says):
        call(gd.preds[0], gd.weights[0], batch.ys)


def test_the_public_metrics_broadcast_a_stack_of_predictors():
    """Leading axes broadcast (a stack of learners' columns against one predictor), each
    entry the metric of its pair."""
    batch = TASK.sample(8, generator=0)
    gd = algorithms.iterates("gd", batch.xs, batch.ys, steps=[1, 2, 3])
    stacked = alignment.error_cosine(gd.preds[:1], gd.preds, batch.ys)
    one = [alignment.error_cosine(gd.preds[0], gd.preds[k], batch.ys) for k in range(3)]
    assert torch.allclose(stacked, torch.stack(one))
    assert float(stacked[0]) == pytest.approx(1.0)
