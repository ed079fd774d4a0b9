"""A new user's friction: sampling without a generator, float64 inputs, sklearn shapes."""

import numpy as np
import pytest
import torch
from helpers import small_batch, tiny_gpt
from sklearn.linear_model import Ridge

from iclprobe import models
from iclprobe.probes.readout import ReadoutProbe
from iclprobe.tasks import RegressionTask


def test_sample_without_a_generator_draws_the_tasks_own_stream():
    task = RegressionTask(n_dims=3, n_points=5, cov="rotated", seed=11)
    state = torch.get_rng_state()
    first, second = task.sample(4), task.sample(4)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is left alone
    assert not torch.equal(first.xs, second.xs)  # the stream advances
    replay = RegressionTask(n_dims=3, n_points=5, cov="rotated", seed=11)
    for a, b in ((first, replay.sample(4)), (second, replay.sample(4))):
        assert torch.equal(a.xs, b.xs) and torch.equal(a.ys, b.ys) and torch.equal(a.ws, b.ws)
    # documented: a generator seeded with seed + 1, advanced by each call
    gen = torch.Generator().manual_seed(12)
    for batch in (first, second):
        assert torch.equal(batch.xs, task.sample(4, generator=gen).xs)
    # an explicit generator neither uses nor advances the task's stream
    third = task.sample(4)
    assert torch.equal(third.xs, replay.sample(4).xs)


@pytest.mark.parametrize("family", ["gpt", "pq"])
def test_float64_input_is_a_clear_type_error_and_double_models_take_it(family):
    if family == "gpt":
        model = tiny_gpt()
    else:
        model = models.PQTransformer(models.PQConfig(n_dims=3, n_layers=2, init_std=0.2))
    b = small_batch()
    xs, ys = b.xs.double(), b.ys.double()
    queries = torch.randn(4, 8, 2, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with pytest.raises(TypeError, match=r"xs has dtype torch.float64, but the model's weights "
                                            r"are torch.float32: pass xs.to\(torch.float32\)"):
            model(xs, b.ys)
        with pytest.raises(TypeError, match="ys has dtype torch.float64"):
            model(b.xs, ys)
        with pytest.raises(TypeError, match="queries has dtype torch.float64"):
            model.predict_queries(b.xs, b.ys, queries.double())
        with pytest.raises(TypeError, match="xs has dtype torch.int64"):
            model(b.xs.long(), b.ys)
        with pytest.raises(TypeError, match="xs has dtype torch.float64"):
            model(xs, b.ys, last_only=True)
        expected = model(b.xs, b.ys)
        double = model.double()
        torch.testing.assert_close(double(xs, ys).float(), expected, atol=1e-5, rtol=1e-5)
        with pytest.raises(TypeError, match="xs has dtype torch.float32, but the model's "
                                            "weights are torch.float64"):
            double(b.xs, b.ys)


def test_readout_probe_with_a_column_y_predicts_like_sklearn_ridge():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 5)), rng.normal(size=(40, 1))  # noqa: N806
    for fit_intercept in (True, False):
        ours = ReadoutProbe(alpha=0.3, fit_intercept=fit_intercept).fit(X, y)
        ref = Ridge(alpha=0.3, fit_intercept=fit_intercept).fit(X, y)
        assert ours.predict(X).shape == ref.predict(X).shape == (40,)
        assert ours.coef_.shape == ref.coef_.shape == (5,)
        assert np.shape(ours.intercept_) == np.shape(ref.intercept_)
        np.testing.assert_allclose(ours.predict(X), ref.predict(X), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-10, atol=1e-12)
    two = rng.normal(size=(40, 2))
    assert ReadoutProbe().fit(X, two).predict(X).shape == Ridge().fit(X, two).predict(X).shape


@pytest.mark.parametrize(("alpha", "error"), [(float("inf"), ValueError), (float("nan"), ValueError),
                                              (-1.0, ValueError), ("1", ValueError),
                                              (True, ValueError)])
def test_readout_probe_refuses_alphas_ridge_refuses(alpha, error):
    X, y = np.ones((5, 2)), np.arange(5.0)  # noqa: N806
    with pytest.raises(error, match=f"alpha must be a number >= 0, got {alpha!r}"):
        ReadoutProbe(alpha=alpha).fit(X, y)
