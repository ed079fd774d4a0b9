"""The public API refuses bad input by name, and never returns NaN/Inf silently.

Each case was found by calling the function as a user might (a review of the API's
inputs); before, each crashed deep inside torch, returned NaN/Inf, or kept going wrongly.
"""

import math

import pytest
import torch
from helpers import small_batch, tiny_gpt

from iclprobe import algorithms, alignment, hooks, models, probes, tasks, training
from iclprobe.algorithms.numerics import Diverged, finish
from iclprobe.alignment import AlignConfig, align, align_layers, compare
from iclprobe.errors import NonFinite


def _data(scale_x: float = 1.0, scale_y: float = 1.0, n: int = 10):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(4, n, 3, generator=g, dtype=torch.float64)
    ys = xs @ torch.randn(3, generator=g, dtype=torch.float64)
    return xs * scale_x, ys * scale_y


def test_compare_refuses_probes_for_fewer_models_than_given():
    # zip() dropped the second model: one result came back for two models
    with pytest.raises(ValueError, match="layer_probes must hold one entry per model .* got 1 "
                                         "for 2 models"):
        compare([tiny_gpt(), tiny_gpt()], AlignConfig(n_sequences=16), names=["a", "b"],
                layer_probes=[None])


@pytest.mark.parametrize(("kw", "says"), [
    ({"positions": "x"}, "align_layers.positions must be one of ('all', 'last'), got 'x'"),
    ({"probe_t_min": 100}, "align_layers.probe_t_min must be an integer in [0, 8), got 100"),
    ({"probe_t_min": -5}, "got -5"),
])
def test_align_layers_checks_positions_and_probe_t_min(kw, says):
    batch = small_batch(batch=16)
    preds = batch.ys.double()[None].expand(3, -1, -1)
    with pytest.raises(ValueError) as err:
        align_layers(preds, batch, AlignConfig(n_boot=10), **kw)
    assert says in str(err.value)


def test_a_task_keeps_its_own_copy_of_sigma():
    cov = torch.eye(3, dtype=torch.float64)
    task = tasks.RegressionTask(n_dims=3, n_points=5, cov=cov)
    cov[0, 0] = 100.0  # the caller's tensor, changed after
    assert float(task.covariance[0, 0]) == 1.0
    assert float(tasks.RegressionTask.from_json(task.to_json()).covariance[0, 0]) == 1.0


def test_pgd_schedule_refuses_iterates_that_overflow():
    xs, ys = _data(n=3)
    with pytest.raises(Diverged, match="pgd_schedule: the preconditioned steps make "
                                                  "the iterates grow without bound"):
        algorithms.pgd_schedule(xs, ys, steps=[3],
                                preconds=torch.eye(3, dtype=torch.float64).expand(3, 3, 3) * 1e300)


def test_online_gd_on_data_scaled_far_apart_is_the_scaled_answer():
    # the zero start times s_x/s_y = inf was NaN: "the predictions overflow float64"
    xs, ys = _data()
    plain = algorithms.online_gd(xs, ys, steps=[1, 2]).preds
    far = algorithms.online_gd(xs * 1e160, ys * 1e-160, steps=[1, 2]).preds
    torch.testing.assert_close(far * 1e160, plain, rtol=1e-12, atol=1e-12)


def test_online_gd_past_its_relaxation_bound_is_refused_not_returned():
    xs, ys = _data()
    with pytest.raises(Diverged, match="lr_scale=2.5 with lr='normalized'"):
        algorithms.online_gd(xs, ys, steps=[30], lr_scale=2.5)
    algorithms.online_gd(xs, ys, steps=[30], lr_scale=1.9)  # below the bound: an answer


def test_save_refuses_what_load_would_refuse(tmp_path):
    model = tiny_gpt()
    with pytest.raises(ValueError, match="task.n_dims=2 but the model has n_dims=3"):
        model.save(tmp_path / "a", task=tasks.RegressionTask(n_dims=2, n_points=5))
    with pytest.raises(ValueError, match="task.n_points=20 is more than the model's "
                                         "n_positions=8"):
        model.save(tmp_path / "b", task=tasks.RegressionTask(n_dims=3, n_points=20))
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(ValueError, match=r"hold NaN or inf: not saved"):
        model.save(tmp_path / "c")
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_model_refuses_non_finite_or_empty_inputs():
    model, batch = tiny_gpt(), small_batch()
    with pytest.raises(ValueError, match="xs must be finite, found NaN or Inf"):
        hooks.collect_residuals(model, batch.xs * float("nan"), batch.ys)
    with pytest.raises(ValueError, match="xs must hold at least one sequence"):
        hooks.collect_residuals(model, batch.xs[:0], batch.ys[:0])
    with pytest.raises(ValueError, match=r"queries must have shape \[4, 8, T, 3\] \(T >= 1\)"):
        model.predict_queries(batch.xs, batch.ys, torch.randn(4, 8, 0, 3))


@pytest.mark.parametrize(("cov", "error", "says"), [
    (torch.tensor([[1.0, 5.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), ValueError,
     "cov must be symmetric"),  # Cholesky read its lower triangle: the queries of I
    (torch.diag(torch.tensor([1.0, -1.0, 1.0])), ValueError, "cov must be positive definite"),
    (torch.eye(4), ValueError, r"cov has shape \(4, 4\), expected \(3, 3\) or \(2, 3, 3\)"),
    (torch.eye(3) * float("nan"), ValueError, "cov contains NaN or Inf"),
    ([[1.0, 0.0, 0.0]] * 3, TypeError, "cov must be a torch.Tensor"),
])
def test_induced_weights_check_the_queries_covariance(cov, error, says):
    with pytest.raises(error, match=says):
        probes.sample_queries((2, 4, 5, 3), cov, 0)


def test_induced_weights_are_not_finite_only_where_the_predictions_are_not():
    xs, ys = _data()

    def nan_early(xs, ys, q):  # a model valid only from prefix 5 on
        out = (q * torch.arange(1.0, 4.0, dtype=q.dtype)).sum(-1)
        out[:, :5] = float("nan")
        return out

    weights = probes.induced_weights(nan_early, xs, ys, 4)
    assert bool(weights[:, :5].isnan().all())
    torch.testing.assert_close(weights[:, 5:], torch.arange(1.0, 4.0, dtype=xs.dtype)
                               .expand_as(weights[:, 5:]))
    with pytest.raises(ValueError, match=r"xs must be a \[batch, pos, n_dims\] tensor"):
        probes.induced_weights(nan_early, xs[0], ys[0], 4)


def test_cross_fit_names_residuals_of_the_wrong_shape():
    model = tiny_gpt()
    batch = small_batch(batch=16)
    resid = hooks.collect_residuals(model, batch.xs, batch.ys).double()
    with pytest.raises(ValueError, match=r"resid must be a \[layer, batch, pos, d_model\]"):
        probes.cross_fit(model, resid[0], batch.ys.double())  # a raw unpacking error before
    resid[:, :, 0] = float("nan")  # t = 0 < t_min: predicted there only, never fitted
    fit = probes.cross_fit(model, resid, batch.ys.double(), t_min=1)
    assert bool(fit.preds[:, :, 0].isnan().all()) and bool(fit.preds[:, :, 1:].isfinite().all())


@pytest.mark.parametrize(("column", "value", "says"), [
    (3, float("nan"), r"ys \(the targets\) at the positions t >= 1 must be finite: found 1 "
                      r"NaN or infinite value\(s\)"),
    (3, 1e200, r"ys \(the targets\) at the positions t >= 1 reaches 1e\+200: the ridge fit "
               r"squares it"),
])
def test_cross_fit_names_ys_not_the_residuals_for_targets_it_cannot_fit(column, value, says):
    """NaN in ys was reported as "the residuals at the fitted positions are not finite"
    (the fits' sums, where y and the residuals meet); ys at t < t_min is never fitted."""
    model = tiny_gpt()
    batch = small_batch(batch=16)
    resid = hooks.collect_residuals(model, batch.xs, batch.ys).double()
    ys = batch.ys.double().clone()
    ys[2, column] = value
    with pytest.raises(NonFinite, match=says):  # what the designed evaluation catches
        probes.cross_fit(model, resid, ys, t_min=1)
    ys = batch.ys.double().clone()
    ys[2, 0] = value  # before t_min: neither fitted nor scored
    assert bool(probes.cross_fit(model, resid, ys, t_min=1).preds.isfinite().all())
    with pytest.raises(TypeError, match="ys must be a torch tensor, got ndarray"):
        probes.cross_fit(model, resid, batch.ys.numpy())


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32", None])
def test_sample_refuses_a_dtype_that_is_no_float(dtype):
    # int64 truncated xs to integers silently; "float32" was torch's "Invalid device string"
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        tasks.RegressionTask(n_dims=3, n_points=5).sample(4, generator=0, dtype=dtype)


@pytest.mark.parametrize(("kw", "says"), [
    ({"grid": []}, "grid must hold at least one learning-rate multiplier, got []"),
    ({"tune_on": "x"}, "tune_on must be a pair (xs, ys), got 'x'"),
    ({"tune_on": _data(n=1)}, "tune_on's data give no curvature to tune the rate on"),
    ({"tune_on": (torch.zeros(4, 5, 3), torch.zeros(4, 5))}, "median λ_max 0.0"),
])
def test_tuned_gd_checks_its_tuning_data_and_grid(kw, says):
    xs, ys = _data()
    with pytest.raises(ValueError) as err:
        algorithms.gd(xs, ys, steps=[1, 2], lr="tuned", **kw)
    assert says in str(err.value)


def test_learner_messages_say_what_is_allowed():
    xs, ys = _data()
    with pytest.raises(ValueError, match=r"lr must be a number > 0 or 'max' \(gd also takes "
                                         r"'tuned'\), got 'tuned'"):
        algorithms.momentum(xs, ys, steps=[1], lr="tuned")
    # a float32 learner whose float64 answer is beyond float32 said "pass float32 or float64"
    big = torch.full((1, 1, 2), 1e50, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"reach 1e\+50, beyond the range of torch.float32, "
                                         r"the dtype of xs .*: pass float64 xs$"):
        finish("x", torch.tensor([1]), big, None, {}, torch.float32)
    with pytest.raises(ValueError, match=r"steps must be below 2\*\*63, got 9223372036854775808"):
        algorithms.gd(xs, ys, steps=[2**63])


def test_align_checks_its_arguments_and_restores_the_training_mode():
    with pytest.raises(TypeError, match="model must be an iclprobe model"):
        align(None)
    model = tiny_gpt().train()
    with pytest.raises(TypeError, match="align: cfg must be an AlignConfig"):
        align(model, {"n_sequences": 16})
    align(model, AlignConfig(n_sequences=16, n_boot=10, separation=False, fitted=False,
                             data="isotropic"))
    assert model.training
    assert isinstance(model, models.GPTRegressor)


@pytest.mark.parametrize(("field", "value"), [("algorithms", ("gd", "newton", "gd")),
                                              ("metrics", ("error_cosine", "error_cosine"))])
def test_align_config_refuses_a_name_given_twice(field, value):
    # it was accepted, then quietly counted once
    with pytest.raises(ValueError, match=rf"AlignConfig.{field} names \['\w+'\] more than once"):
        AlignConfig(**{field: value})


@pytest.mark.parametrize(("args", "error", "says"), [
    ((torch.randn(40, 8), torch.randn(40)), ValueError,
     r"x must be a \[layer, row, feature\] tensor, got shape \(40, 8\)"),  # blamed y before
    ((torch.randn(2, 40, 8), torch.randn(40), float("inf")), ValueError,
     r"alphas must be finite and >= 0, got \[inf\]"),
    ((torch.randn(2, 40, 8), torch.randn(40), []), ValueError,
     r"alphas must hold at least one α \(the grid GCV picks from; None: the default grid\), "
     r"got \[\]"),
    ((torch.randn(2, 40, 8), torch.randn(40), "x"), TypeError,
     "alphas must be a number or a tensor of numbers, got 'x'"),
])
def test_ridge_gcv_names_its_bad_argument(args, error, says):
    with pytest.raises(error, match=says):
        probes.ridge_gcv(*args)


def test_cg_past_d_steps_is_ols_without_running_those_steps():
    # each step reorthogonalizes against every earlier one: steps=[10**9] asked for a
    # basis of 10**9 residuals (an allocation error), 1000 took seconds at d = 2
    xs, ys = _data()
    run = algorithms.cg(xs, ys, steps=[3, 4, 1000, 10**9])
    ols = algorithms.ols(xs, ys).preds[0]
    for k in range(4):
        torch.testing.assert_close(run.preds[k], ols, rtol=1e-9, atol=1e-9)
        assert torch.equal(run.preds[k], run.preds[0])  # step d's iterate, not rerun


@pytest.mark.parametrize(("learner", "kw"), [
    ("gd", {}), ("momentum", {}), ("pgd", {"precond": torch.eye(3, dtype=torch.float64)}),
    ("pgd_schedule", {"preconds": torch.eye(3, dtype=torch.float64).expand(2, 3, 3)})])
def test_normalize_must_be_a_bool(learner, kw):
    # "no" is truthy: it ran the mean loss's gradient where the caller asked for the sum's
    xs, ys = _data()
    with pytest.raises(TypeError, match=rf"{learner}\.normalize must be a bool, got 'no'"):
        algorithms.LEARNERS[learner].fn(xs, ys, steps=[1, 2], normalize="no", **kw)


def test_complex_preconditioners_and_starts_are_refused():
    # torch's cast to float64 dropped the imaginary part with a warning, and the run went on
    xs, ys = _data()
    with pytest.raises(TypeError, match="preconds must hold real numbers .* got torch.complex128"):
        algorithms.pgd_schedule(xs, ys, steps=[1], preconds=torch.eye(3, dtype=torch.complex128)
                                .expand(1, 3, 3))
    with pytest.raises(TypeError, match="init must hold real numbers .* got torch.complex64"):
        algorithms.online_gd(xs, ys, steps=[1], init=torch.ones(4, 10, 3, dtype=torch.complex64))
    with pytest.raises(TypeError, match="precond must hold real numbers .* got torch.bool"):
        algorithms.pgd(xs, ys, steps=[1], precond=torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("learner", ["gd", "newton", "ridge", "momentum", "cg", "ols"])
def test_stats_of_other_data_are_refused(learner):
    # stats were matched by shape alone: another batch's ran silently as these data's
    info = algorithms.LEARNERS[learner]
    kw = {"steps": [1, 2]} if info.steps is not None else {}

    def fn(x, y, **more):
        return info.fn(x, y, **kw, **more)

    xs, ys = _data()
    big_x, big_y = _data(1e-150, 1e150)  # scaled moments: accepted for their own data
    for x, y in ((xs, ys), (big_x, big_y)):
        own = fn(x, y, stats=algorithms.prefix_stats(x, y))
        torch.testing.assert_close(own.preds, fn(x, y).preds, rtol=0, atol=0)
    other = rf"{learner}: stats were computed from other data than these xs and ys: their "
    with pytest.raises(ValueError, match=other + "first example's b_1 = x_0 y_0 differs by"):
        fn(xs, ys, stats=algorithms.prefix_stats(xs.flip(1), ys.flip(1)))
    with pytest.raises(ValueError, match=other + "first example's .* at sequence 0"):
        fn(xs, ys + 1.0, stats=algorithms.prefix_stats(xs, ys))
    last = xs.clone()
    last[2, -1] *= 2.0  # only the last query differs
    with pytest.raises(ValueError, match=other + r"last query's norm .* at sequence 2 "):
        fn(xs, ys, stats=algorithms.prefix_stats(last, ys))
    nan = xs.clone()
    nan[1, -1, 0] = float("nan")  # named as NaN, not as other data (nor a crash in allclose)
    with pytest.raises(ValueError, match="xs and ys must be finite"):
        fn(nan, ys, stats=algorithms.prefix_stats(xs, ys))
    with pytest.raises(TypeError, match="xs must hold real numbers .* got torch.complex128"):
        fn(xs.to(torch.complex128), ys, stats=algorithms.prefix_stats(xs, ys))


@pytest.mark.slow
def test_a_float64_model_is_read_in_float64():
    # align sampled float32 sequences, which a model converted with .double() refused
    pq = models.load("pq-rotated-3layer")
    cfg = AlignConfig(n_sequences=128, n_boot=50)
    r32, r64 = align(pq, cfg), align(models.load("pq-rotated-3layer").double(), cfg)
    assert r64.answer.labels == r32.answer.labels
    for learner in ("newton", "gd"):  # the same readings but for float32's round-off
        a, b = (r.matches[learner]["error_cosine"].best_value for r in (r32, r64))
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=0, atol=1e-6)  # 4e-8
    for fit in ("crossfit", "fresh"):  # probes fitted on float64 sequences too
        cfg = AlignConfig(n_sequences=64, n_boot=20, probe_fit=fit, n_probe_sequences=64,
                          separation=False, data="isotropic")
        r32, r64 = align(tiny_gpt(), cfg), align(tiny_gpt().double(), cfg)
        assert r64.answer.labels == r32.answer.labels, fit
        a, b = (r.matches["newton"]["error_cosine"].best_value for r in (r32, r64))
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=0, atol=1e-6)  # 3e-9


def test_align_names_a_bad_name_task_or_probes_before_any_work():
    """A wrong type, or a task of another dimension, is refused by name; before, a string
    task or probes failed on a missing attribute and a d = 3 task beside a d = 5 model in
    torch's broadcasting."""
    model, cfg = tiny_gpt(), AlignConfig(n_sequences=16, n_boot=10, separation=False)
    with pytest.raises(TypeError, match="align: eval_task must be a RegressionTask .*got str"):
        align(model, cfg, eval_task="isotropic")
    with pytest.raises(ValueError, match="align: eval_task does not fit model: task.n_dims=5 "
                                         "but the model has n_dims=3"):
        align(model, cfg, eval_task=tasks.RegressionTask(n_dims=5, n_points=8))
    with pytest.raises(ValueError, match="eval_task does not fit m: task.n_points=9 is more"):
        align(model, cfg, name="m", eval_task=tasks.RegressionTask(n_dims=3, n_points=9))
    with pytest.raises(TypeError, match="align: layer_probes must be a LayerProbes .*got str"):
        align(model, cfg, layer_probes="x")
    with pytest.raises(TypeError, match="align: name must be a string, got int 3"):
        align(model, cfg, name=3)


def test_api_calls_name_their_bad_argument():
    xs, ys = _data()
    with pytest.raises(TypeError, match=r"steps must be a sequence of integers >= 0 \(e.g. "
                                        r"\[3\] for one\), got int 3"):
        algorithms.iterates("gd", xs, ys, steps=3)
    with pytest.raises(TypeError, match="match_steps: sim must be a Similarity table"):
        alignment.match_steps("x")
    with pytest.raises(TypeError, match="load: path_or_name must be a path or a shipped "
                                        "model's name .*got NoneType None"):
        models.load(None)
    with pytest.raises(TypeError, match="LayerProbes.fit: task must be a RegressionTask"):
        probes.LayerProbes().fit(tiny_gpt(), "isotropic", n_sequences=8)
    with pytest.raises(TypeError, match="model must have PQ matrices"):
        probes.analyze_preconditioners(tiny_gpt())
    with pytest.raises(ValueError, match="train.progress must be a bool, got 'x'"):
        training.train(tiny_gpt(), tasks.RegressionTask(n_dims=3, n_points=8),
                       training.TrainConfig(steps=1), progress="x")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e39])
def test_pq_matrices_must_be_finite_in_float32(bad):
    """NaN, infinite or past float32's range (1e39 rounds to inf): refused by name, not a
    model whose every output is NaN."""
    a = torch.eye(3).repeat(2, 1, 1).double()
    a[1, 0, 2] = bad
    with pytest.raises(ValueError, match="A must be finite \\(in float32\\), found NaN or Inf"):
        models.PQTransformer.from_matrices(A=a)
    with pytest.raises(ValueError, match="B must be finite"):
        models.PQTransformer.from_matrices(A=torch.eye(3)[None], B=a[1:])
    with pytest.raises(ValueError, match="P must be finite"):
        models.PQTransformer.from_matrices(P=[[[bad] * 4] * 4], Q=torch.zeros(1, 4, 4))


def test_a_numpy_integer_count_is_refused_saying_which_int_is_wanted():
    """Counts are Python ints (a bool is not one): a numpy integer is told how to pass it."""
    import numpy as np

    with pytest.raises(TypeError, match=r"AlignConfig.n_sequences must be an integer >= 2 "
                                        r"\(a Python int: pass int\(value\)\), got np.int64\(64\)"):
        AlignConfig(n_sequences=np.int64(64))
    with pytest.raises(TypeError, match=r"must be an integer >= 2, got True$"):
        AlignConfig(n_sequences=True)


def test_a_numpy_float_is_refused_saying_how_to_pass_it():
    """``TrainConfig(lr=np.float32(0.01))`` was refused with no word of why (a float32 is no
    Python float; numpy's float64 is one, and passes)."""
    import numpy as np

    with pytest.raises(TypeError, match=r"TrainConfig.lr must be a number in \(0, 1e20\] "
                                        r"\(a Python float: pass float\(value\)\), got "
                                        r"np.float32\(0.01\)"):
        training.TrainConfig(lr=np.float32(0.01))
    with pytest.raises(TypeError, match=r"TrainConfig.betas must be two numbers in \[0, 1\) "
                                        r"\(Python floats: pass float\(b\) for each\), got "):
        training.TrainConfig(betas=(np.float32(0.9), 0.999))
    with pytest.raises(TypeError, match=r"TrainConfig.lr must be a number in \(0, 1e20\], "
                                        r"got 'x'$"):
        training.TrainConfig(lr="x")  # no hint where none helps
    assert training.TrainConfig(lr=np.float64(0.01)).lr == 0.01


def test_compare_refuses_a_model_that_cannot_take_the_data_before_aligning_any():
    """Checked for every model up front, by the model's own `check_task`: another dimension
    or more points than a model's positions, naming that model."""
    cfg = AlignConfig(n_sequences=16, n_boot=10, separation=False)
    with pytest.raises(ValueError, match=r"compare: b cannot take the data \(task.n_dims=3 but "
                                         r"the model has n_dims=4\): compare models that take"):
        compare([tiny_gpt(), tiny_gpt(n_dims=4)], cfg, names=["a", "b"],
                eval_task=tasks.RegressionTask(n_dims=3, n_points=8))
    with pytest.raises(ValueError, match=r"compare: b cannot take the data \(task.n_points=8 is "
                                         r"more than the model's n_positions=6\)"):
        compare([tiny_gpt(), tiny_gpt(n_positions=6)], cfg, names=["a", "b"],
                eval_task=tasks.RegressionTask(n_dims=3, n_points=8))


@pytest.mark.parametrize("dtype,eps", [(torch.bfloat16, "8e-03"), (torch.float16, "1e-03")])
def test_a_half_precision_model_is_refused_by_name_before_any_work(dtype, eps):
    """align sampled a bfloat16 model's sequences in bfloat16, ran some 35 s and stopped in
    a cache key's ``numpy()``; the answer's 1e-5 is finer than either format's round-off."""
    cfg = AlignConfig(n_sequences=16, n_boot=10, separation=False, data="isotropic")
    half = tiny_gpt().to(dtype)
    with pytest.raises(ValueError, match=f"align: m has {str(dtype)[6:]} weights \\(round-off "
                                         f"{eps}\\); align reads a model in float32 or "
                                         "float64.*convert it with .float\\(\\)"):
        align(half, cfg, name="m")
    with pytest.raises(ValueError, match=f"compare: b has {str(dtype)[6:]} weights"):
        compare([tiny_gpt(), half], cfg, names=["a", "b"])
    assert align(half.float(), cfg, name="m").answer is not None  # read once converted


def test_compare_notes_a_model_aligned_on_another_task_than_its_own():
    """compare aligns every model on one task (the first model's): a model trained on other
    data (pq-isotropic-1layer beside pq-rotated-3layer) read 0.467 where its own data read
    0.230, with nothing said but the header's data."""
    cfg = AlignConfig(n_sequences=16, n_boot=10, separation=False, data="isotropic")
    rotated = tasks.RegressionTask(n_dims=3, n_points=8, cov="rotated")
    a, b = tiny_gpt(), tiny_gpt()
    a.task, b.task = tasks.RegressionTask(n_dims=3, n_points=8), rotated
    first, second = compare([a, b], cfg, names=["a", "b"])
    said = "aligned on other data than its own task's"
    assert not any(said in n for n in first.notes)
    assert f"{said}: cov 'isotropic', not its own 'rotated'" in second.notes
    same = compare([b, b], cfg, names=["a", "b"], eval_task=rotated)
    assert not any(said in n for r in same for n in r.notes)


@pytest.mark.parametrize("kw, says", [
    ({"task": tasks.RegressionTask(n_dims=5, n_points=8)},
     r"align_layers: task has n_dims=5, n_points=8, but the batch has n_dims=3, n_points=8"),
    ({"notes": "hello"}, r"align_layers: notes must be a list of strings \(one line each\), "
                         r"got str 'hello'"),
    ({"extra_runs": {"x": 3}}, r"align_layers: extra_runs\['x'\] must be a RunSpec, got int 3"),
    ({"name": None}, r"align_layers: name must be a string, got NoneType None"),
])
def test_align_layers_checks_what_its_result_records(kw, says):
    """A task of another dimension was printed as the data ("d = 5"), notes="hello" became
    five notes, a non-RunSpec extra run was dropped silently, and name=None was kept."""
    batch = tasks.RegressionTask(n_dims=3, n_points=8).sample(16, generator=0)
    preds = batch.ys.expand(2, -1, -1) * 0.5
    with pytest.raises((ValueError, TypeError), match=says):
        align_layers(preds, batch, AlignConfig(n_boot=10, separation=False), **kw)


_PREDS = torch.zeros(2, 16, 8)


@pytest.mark.parametrize("kw, says", [
    ({"readout_noise": (torch.full_like(_PREDS, math.nan), None)},
     r"align: the draws of the readout noise in the layer predictions are not finite"),
    ({"readout_noise": (torch.zeros(2, 2), None)},
     r"align_layers: readout_noise\[0\] is the noise in layer_preds and must have its shape "
     r"\(2, 16, 8\), got \(2, 2\)"),
    ({"readout_noise": [torch.zeros_like(_PREDS), None]},
     r"align_layers: readout_noise must be a pair .* got a list of 2"),
    ({"readout_noise": (torch.zeros_like(_PREDS), torch.zeros(3))},
     r"readout_noise\[1\] is the noise in layer_weights, which is None: give None for it"),
    ({"readout_noise": (torch.zeros_like(_PREDS).numpy(), None)},
     r"align_layers: readout_noise\[0\] must be a torch tensor"),
    ({"layer_weights": torch.zeros(2, 4, 8, 3).numpy()},
     r"align_layers: layer_weights must be a torch tensor"),
])
def test_align_layers_checks_the_readout_noise_and_weights(kw, says):
    """NaN noise was set to 0 (the result equal to a noise-free one's), noise of another
    shape ended in torch's broadcasting error, numpy weights in an AttributeError."""
    batch = tasks.RegressionTask(n_dims=3, n_points=8).sample(16, generator=0)
    preds = batch.ys.expand(2, -1, -1) * 0.5
    cfg = AlignConfig(n_boot=10, separation=False, metrics=("error_cosine",))
    with pytest.raises((ValueError, TypeError), match=says):
        align_layers(preds, batch, cfg, **kw)


@pytest.mark.parametrize("device, says", [
    ("meta", r"load: device 'meta' holds no weights"),
    ("bogus", r"load: device 'bogus' is not a torch device"),
    (3, r"load: device must be a string or a torch.device, got int 3"),
] + ([] if torch.cuda.is_available() else [
    ("cuda", r"load: device 'cuda': no CUDA device is available to torch")]))
def test_load_refuses_a_device_that_cannot_hold_the_weights(device, says):
    """A meta model loaded fine and failed later in torch ("Cannot copy out of meta
    tensor"); "bogus" and "cuda" on a CPU build were torch's RuntimeError and AssertionError."""
    with pytest.raises((ValueError, TypeError), match=says):
        models.load("pq-isotropic-1layer", device=device)


def test_align_refuses_a_model_without_values():
    meta = tiny_gpt().to("meta")
    with pytest.raises(ValueError, match=r"model has parameters on the meta device \(shapes "
                                         r"without values\)"):
        align(meta, AlignConfig(n_sequences=16))


@pytest.mark.parametrize("name", ["odd/name\n", "a,b", "", "two words", 3])
def test_a_learner_or_metric_name_that_cannot_name_a_file_is_refused(name):
    """``register("odd/name\\n", ...)`` ran a whole align, then the report could not write
    ``similarity_odd/name\\n_error_cosine.csv``; "a,b" could never be chosen with
    --algorithms."""
    from iclprobe.alignment.metrics import register_metric

    with pytest.raises(ValueError, match=r"learner name must be a non-empty string of "
                                         r"letters, digits and _ \. \+ - \(it names files and "
                                         r"--algorithms entries\), got "):
        algorithms.register(name, steps=(1, 2))(lambda xs, ys, steps: None)
    with pytest.raises(ValueError, match=r"metric name must be .* --metric entries"):
        register_metric(name, on="preds", higher_is_better=True)(lambda a, b, ys, t0, t1: a)
    assert name not in algorithms.LEARNERS


@pytest.mark.parametrize("kw, says", [
    ({"steps": [0.5, 1.7, 2.2]}, r"match_steps: steps must be step counts, integers >= 0, got "
                                 r"\[0.5, 1.7, 2.2\]"),
    ({"steps": [0, 1, float("nan")]}, r"steps must be step counts"),
    ({"log2": "yes"}, r"match_steps: log2 must be a bool or None, got 'yes'"),
    ({"live": [1, 0, 1]}, r"match_steps: live must hold a bool per layer, got \[1, 0, 1\]"),
    ({"layers": [1.5]}, r"layers \[1.5\] out of range"),
])
def test_match_steps_refuses_what_it_would_read_wrong(kw, says):
    """Fractional steps were truncated (0.5, 1.7, 2.2 -> 0, 1, 2) and NaN raised Python's own
    error; log2="yes" and live=[1, 0, 1] were taken as they came."""
    xs, ys = _data()
    gd = algorithms.iterates("gd", xs, ys, steps=[0, 1, 2])
    sim = alignment.similarity(gd.preds, gd, ys, n_boot=10)
    with pytest.raises((ValueError, TypeError), match=says):
        alignment.match_steps(sim, **kw)
    assert alignment.match_steps(sim, live=[True, False, True]).above_zero == [True, False, True]


def test_numpy_arrays_are_named_where_a_tensor_is_wanted():
    """Each raised numpy's AttributeError from deep inside; held_shares with one sequence
    spoke of "decodability"."""
    batch = tasks.RegressionTask(n_dims=3, n_points=8).sample(8, generator=0)
    gd = algorithms.iterates("gd", batch.xs, batch.ys, steps=[1])
    resid = torch.randn(2, 8, 8, 4, generator=torch.Generator().manual_seed(0))
    cases = [
        (lambda: alignment.similarity(gd.preds.numpy(), gd, batch.ys),
         r"similarity: layer_values must be a torch.Tensor, got ndarray"),
        (lambda: alignment.align_layers(batch.ys.expand(2, -1, -1).numpy(), batch),
         r"align_layers: layer_preds must be a torch.Tensor \[L\+1, B, n\], got ndarray"),
        (lambda: probes.decodability(resid.numpy(), gd.preds),
         r"decodability: resid must be a torch tensor, got ndarray"),
        (lambda: probes.held_shares(resid, gd.preds, features="x"),
         r"held_shares: features must be a FeatureSums .* got str"),
        (lambda: probes.held_shares(resid[:, :1], gd.preds[:, :1]),
         r"held_shares needs at least 2 sequences")]
    for call, says in cases:
        with pytest.raises((ValueError, TypeError), match=says):
            call()


def test_train_refuses_a_model_that_is_not_float32():
    """``train(model.double(), ...)`` said "pass xs.to(torch.float64)", though a user of
    train passes no xs (the task's batches are float32)."""
    with pytest.raises(ValueError, match=r"train: the model's weights are torch.float64; train "
                                         r"takes a float32 model .* model.float\(\) converts"):
        training.train(tiny_gpt().double(), tasks.RegressionTask(n_dims=3, n_points=8),
                       training.TrainConfig(steps=2), progress=False)


@pytest.mark.parametrize("bad", ["a\nb", "tab\there", "cr\r", "esc\x1b[31m", "line\u2028sep"])
def test_a_model_name_or_new_checkpoint_with_a_control_character_is_refused(bad, tmp_path):
    """A name (or the checkpoint or run a CLI name comes from) with a newline broke every
    one-line output that names it; spaces, slashes and accents stay allowed."""
    model = tiny_gpt()
    cfg = AlignConfig(n_sequences=16)
    says = r"must not hold a control character such as a newline or tab \(it is printed on one "
    with pytest.raises(ValueError, match=r"align: name " + says):
        align(model, cfg, name=bad)
    with pytest.raises(ValueError, match=r"compare: names\[1\] " + says):
        compare([model, model], cfg, names=["a", bad])
    with pytest.raises(ValueError, match=r"save: path " + says):
        model.save(tmp_path / bad)
    with pytest.raises(ValueError, match=r"train: out " + says):
        training.train(model, tasks.RegressionTask(n_dims=3, n_points=8),
                       training.TrainConfig(steps=1), out=tmp_path / bad, progress=False)
    assert list(tmp_path.iterdir()) == []
    model.save(tmp_path / "with space" / "é-model")  # ordinary characters


def test_compare_names_a_dict_of_models():
    # compare({"a": m, "b": m}) ended in KeyError: 0
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)])
    with pytest.raises(TypeError, match="compare: models must be a list of models .*got dict"):
        alignment.compare({"a": model, "b": model})
    cfg = alignment.AlignConfig(n_sequences=32, n_boot=10, metrics=("error_cosine",),
                                fitted=False, separation=False)
    model.task = tasks.RegressionTask(n_dims=3, n_points=6)
    both = alignment.compare(torch.nn.ModuleList([model, model]), cfg, names=["a", "b"])
    assert [r.name for r in both] == ["a", "b"]  # a ModuleList is a list of models


def test_the_other_data_note_names_kappa_only_where_both_tasks_use_it():
    """align --data ill-conditioned on an isotropic model said its own κ was 100.0 (an
    unused default) and called the data "the data compare shares"."""
    from iclprobe.alignment.pipeline import _other_task

    model = tiny_gpt()
    model.task = tasks.RegressionTask(n_dims=3, n_points=8)
    ill = tasks.RegressionTask(n_dims=3, n_points=8, cov="ill-conditioned",
                               condition_number=1e3)
    assert _other_task(model, ill) == [
        "aligned on other data than its own task's: cov 'ill-conditioned', not its own "
        "'isotropic'"]
    model.task = tasks.RegressionTask(n_dims=3, n_points=8, cov="ill-conditioned")
    assert _other_task(model, ill) == [
        "aligned on other data than its own task's: condition_number 1000.0, not its own 100.0"]


def test_probes_read_integer_residuals_in_floating_point():
    """apply cast the fitted coefficients (|c| ~ 0.002) to the residuals' int64: all 0."""
    model, task = tiny_gpt(), tasks.RegressionTask(n_dims=3, n_points=8)
    lp = probes.LayerProbes().fit(model, task, n_sequences=40, n_heldout=10, generator=0)
    b = task.sample(4, generator=1)
    resid = (hooks.collect_residuals(model, b.xs, b.ys) * 1000).round()
    as_float, as_int = lp.apply(resid.double()), lp.apply(resid.long())
    assert as_int.is_floating_point()
    torch.testing.assert_close(as_int, as_float, rtol=1e-12, atol=1e-9)


def test_an_oracles_step_function_is_checked_not_truncated():
    """step_of_layer = l + 0.5 gave steps 0, 1, 2 (int() truncated them), silently."""
    import numpy as np

    from iclprobe import constructions

    with pytest.raises(ValueError, match=r"OracleConfig.steps must be .* integers >= 0 .* got "
                                         r"\(0.5, 1.5, 2.5\)"):
        constructions.oracle("gd", 3, 2, lambda layer: layer + 0.5, lr=0.1)
    numpy_steps = constructions.oracle("gd", 3, 2, lambda layer: np.int64(2 * layer), lr=0.1)
    assert numpy_steps.cfg.steps == (0, 2, 4)


def test_probes_fitted_on_residuals_are_not_saved_without_a_model(tmp_path):
    """save ended in AttributeError 'model_hash_' (load checks the model they were fitted on)."""
    g = torch.Generator().manual_seed(0)
    lp = probes.LayerProbes().fit_residuals(torch.randn(3, 20, 5, 4, generator=g),
                                            torch.randn(20, 5, generator=g))
    with pytest.raises(ValueError, match=r"fitted on residuals \(fit_residuals\), not on a "
                                         r"model"):
        lp.save(tmp_path / "probes")
    assert not (tmp_path / "probes").exists()


def test_complex_inputs_are_refused_where_a_cast_dropped_their_imaginary_part():
    """pgd_transformer((1 + 2j) I) built A = I, ridge_gcv of an imaginary y fitted 0, and
    decodability read complex residuals: torch's cast only warned."""
    from iclprobe import constructions

    with pytest.raises(TypeError, match=r"preconds must hold real numbers"):
        constructions.pgd_transformer((torch.eye(3) * (1 + 2j)).expand(2, 3, 3))
    with pytest.raises(TypeError, match=r"preconds\[0\] must hold real numbers"):
        constructions.pgd_transformer([torch.eye(3) * (1 + 2j)])
    x, y = torch.randn(2, 20, 3), torch.randn(20)
    with pytest.raises(TypeError, match=r"y must hold real numbers .* got torch.complex64"):
        probes.ridge_gcv(x, y.cfloat() * 1j)
    resid, targets = torch.randn(3, 6, 5, 4), torch.randn(2, 6, 5)
    with pytest.raises(TypeError, match=r"decodability: resid must hold real numbers"):
        probes.decodability(resid.cfloat() * 1j, targets)
    with pytest.raises(TypeError, match=r"held_shares: resid must hold real numbers"):
        probes.held_shares(resid > 0, targets)


@pytest.mark.parametrize("t_min", [-3, 99, True])
def test_fold_sums_checks_its_window_as_fold_features_does(t_min):
    """t_min = -3 summed the last 3 positions, 99 none, True position 1 on."""
    resid, ys = torch.randn(3, 4, 6, 5), torch.randn(4, 6)
    with pytest.raises(ValueError, match=rf"t_min must be in \[0, 5\], got {t_min!r}"):
        probes.fold_sums(resid, ys, t_min)
    with pytest.raises(ValueError, match=rf"t_min must be in \[0, 5\], got {t_min!r}"):
        probes.fold_features(resid, 2, t_min)
    assert probes.fold_sums(resid, ys, 1).n == 4 * 5
