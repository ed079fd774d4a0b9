import dataclasses

import numpy as np
import pytest
import torch
from helpers import tiny_gpt
from sklearn.linear_model import Ridge
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

from iclprobe import algorithms, hooks, models, probes, tasks

TASK = tasks.RegressionTask(n_dims=4, n_points=12)


def gd_construction(k=3, lr=0.1):
    model = models.PQTransformer.from_matrices(A=[lr * torch.eye(4)] * k)
    model.task = TASK
    return model


def test_readout_probe_equals_sklearn_ridge():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6)) + 3.0
    y = x @ rng.normal(size=6) + 1.5 + 0.1 * rng.normal(size=200)
    for alpha, intercept in [(0.0, True), (2.5, True), (2.5, False)]:
        ours = probes.ReadoutProbe(alpha=alpha, fit_intercept=intercept).fit(x, y)
        ref = Ridge(alpha=alpha, fit_intercept=intercept, solver="svd").fit(x, y)
        np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
        np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=1e-6)
        np.testing.assert_allclose(ours.predict(x), ref.predict(x), atol=1e-6)
    y2 = np.c_[y, -y]
    ours = probes.ReadoutProbe(alpha=1.0).fit(x, y2)
    np.testing.assert_allclose(ours.coef_, Ridge(alpha=1.0).fit(x, y2).coef_, atol=1e-6)


@pytest.mark.filterwarnings("ignore:Skipping check check_array_api_input")  # asserted below
def test_readout_probe_is_a_scikit_learn_estimator():
    results = check_estimator(probes.ReadoutProbe(), on_fail=None)
    status = {r["check_name"]: r["status"] for r in results}
    assert [name for name, said in status.items() if said == "failed"] == []
    # the probe is numpy-only: sklearn's array-API check runs only under SCIPY_ARRAY_API=1
    assert [name for name, said in status.items() if said == "skipped"] in (
        [], ["check_array_api_input"])
    rng = np.random.default_rng(1)
    x = rng.normal(size=(120, 5))
    y = x @ np.arange(5.0)
    pipe = make_pipeline(StandardScaler(), probes.ReadoutProbe(alpha=0.1))
    scores = cross_val_score(pipe, x, y, cv=3)
    assert scores.min() > 0.99
    with pytest.raises(ValueError, match="alpha must be a number >= 0, got -1"):
        probes.ReadoutProbe(alpha=-1).fit(x, y)


def test_ridge_gcv_picks_the_brute_force_gcv_minimum():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 60, 8))
    y = rng.normal(size=(2, 60))
    grid = np.logspace(-3, 3, 13)
    fit = probes.ridge_gcv(torch.tensor(x), torch.tensor(y), alphas=torch.tensor(grid))
    for layer in range(2):
        xc = x[layer] - x[layer].mean(0)
        yc = y[layer] - y[layer].mean()
        scores = []
        for a in grid:
            hat = xc @ np.linalg.solve(xc.T @ xc + a * np.eye(8), xc.T)
            resid = yc - hat @ yc
            df = np.trace(hat) + 1
            scores.append((resid @ resid / 60) / (1 - df / 60) ** 2)
        best = grid[int(np.argmin(scores))]
        assert fit.alpha[layer].item() == pytest.approx(best)
        ref = Ridge(alpha=best).fit(x[layer], y[layer])
        np.testing.assert_allclose(fit.coef[layer].numpy(), ref.coef_, atol=1e-8)
        assert fit.intercept[layer].item() == pytest.approx(ref.intercept_)


def test_no_training_readout_of_pq_gd_construction_is_gd():
    model = gd_construction()
    b = TASK.sample(32, generator=0)
    layer_preds = probes.readout_predictions(model, b.xs, b.ys)
    it = algorithms.gd(b.xs, b.ys, steps=[0, 1, 2, 3], lr=0.1)
    torch.testing.assert_close(layer_preds, it.preds, atol=1e-5, rtol=0)
    # a ridge probe fitted to layer l's GD predictions recovers them
    resid = hooks.collect_residuals(model, b.xs, b.ys)
    for layer in (1, 2, 3):
        lp = probes.LayerProbes(alpha=1e-8).fit_residuals(resid, it.preds[layer])
        pred = lp.apply(resid)[layer][:, 1:]
        target = it.preds[layer][:, 1:]
        r2 = 1 - (pred - target).pow(2).sum() / (target - target.mean()).pow(2).sum()
        assert r2 > 0.999


def test_layer_probes_fit_predict_save_load(tmp_path):
    model = tiny_gpt(n_dims=4, n_positions=12)
    model.task = TASK
    lp = probes.LayerProbes().fit(model, n_sequences=200, generator=0, n_heldout=100)
    b = TASK.sample(5, generator=9)
    preds = lp.predict(b.xs, b.ys)
    assert preds.shape == (3, 5, 12)
    assert len(lp.metrics_.r2) == 3 and all(np.isfinite(lp.metrics_.normalized_error))
    lp.save(tmp_path / "probes")
    back = probes.LayerProbes.load(tmp_path / "probes", model)
    torch.testing.assert_close(back.predict(b.xs, b.ys), preds)
    assert back.metrics_ == lp.metrics_
    other = tiny_gpt(n_dims=4, n_positions=12, seed=3)
    with pytest.raises(ValueError, match="fitted on another model"):
        probes.LayerProbes.load(tmp_path / "probes", other)
    # per-layer predictions at queries equal substituting the query (layer by layer)
    q = torch.randn(5, 12, 2, 4, generator=torch.Generator().manual_seed(0))
    by_query = lp.predict_queries(b.xs, b.ys, q)
    xs = b.xs.clone()
    xs[:, 7] = q[:, 7, 1]
    torch.testing.assert_close(by_query[:, :, 7, 1], lp.predict(xs, b.ys)[:, :, 7], atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("make", [lambda: tiny_gpt(n_dims=4, n_positions=12),
                                  lambda: tiny_gpt("linear", "paired", n_dims=4, n_positions=12),
                                  lambda: gd_construction(k=2)])
def test_last_layer_readout_is_the_models_prediction(make):
    """target="model" reads the prediction off the last residual instead of a 2nd forward."""
    model = make()
    b = TASK.sample(6, generator=4)
    with torch.no_grad():
        torch.testing.assert_close(probes.readout_predictions(model, b.xs, b.ys)[-1],
                                   model(b.xs, b.ys), atol=1e-5, rtol=0)


def test_target_model_and_adam_solver():
    model = gd_construction(k=2)
    b = TASK.sample(256, generator=1)
    resid = hooks.collect_residuals(model, b.xs, b.ys)
    closed = probes.LayerProbes(target="model", alpha=1e-6).fit(model, n_sequences=400,
                                                                 n_heldout=200)
    assert closed.metrics_.r2[-1] > 0.999  # the last layer's readout is the model's output
    adam = probes.LayerProbes(solver="adam", max_steps=300).fit_residuals(resid, b.ys)
    ridge = probes.LayerProbes().fit_residuals(resid, b.ys)

    def mse(lp):
        return (lp.apply(resid)[:, :, 1:] - b.ys[:, 1:]).pow(2).mean((1, 2))
    assert torch.all(mse(ridge) <= mse(adam) + 1e-6)  # closed form is the optimum


def test_induced_weights_recover_exact_weights():
    b = TASK.sample(8, generator=2, dtype=torch.float64)
    for it in (algorithms.ols(b.xs, b.ys), algorithms.gd(b.xs, b.ys, steps=[3], lr=0.1)):
        w = it.weights[0]

        def predict(xs, ys, queries, w=w):
            return torch.einsum("bntd,bnd->bnt", queries, w)
        got, r2 = probes.induced_weights(predict, b.xs, b.ys, n_queries=6, generator=0,
                                         return_r2=True)
        torch.testing.assert_close(got, w, atol=1e-6, rtol=0)
        assert torch.all(r2[:, 1:] > 1 - 1e-9)
    model = gd_construction(k=2).double()
    expected = algorithms.gd(b.xs, b.ys, steps=[2], lr=0.1).weights[0]
    got = probes.induced_weights(model.predict_queries, b.xs, b.ys, n_queries=4,
                                 cov=TASK.covariance, generator=1)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    grad = probes.gradient_weights(model.predict_queries, b.xs, b.ys)
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=0)
    # leading axes (per-layer predictors) come back per layer
    two = probes.induced_weights(lambda xs, ys, q: torch.stack([model.predict_queries(xs, ys, q)] * 2),
                                 b.xs, b.ys, n_queries=5, generator=1)
    assert two.shape == (2, 8, 12, 4)
    with pytest.raises(ValueError, match="n_queries must be an integer >= n_dims=4, got 3"):
        probes.induced_weights(model.predict_queries, b.xs, b.ys, n_queries=3)


def test_preconditioners_distance_and_optimum():
    a = torch.randn(2, 2, 3, 3, generator=torch.Generator().manual_seed(0))
    b = torch.randn(2, 2, 3, 3, generator=torch.Generator().manual_seed(1))
    model = models.PQTransformer.from_matrices(A=a, B=b)
    pre = probes.preconditioners(model)
    torch.testing.assert_close(pre.A_heads, a)
    torch.testing.assert_close(pre.A, a.sum(1))
    torch.testing.assert_close(pre.B, b.sum(1))
    m = torch.tensor([[2.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 3.0]])
    dist, alpha = probes.distance(-0.7 * m, m)
    assert dist.item() == pytest.approx(0.0, abs=1e-7) and alpha.item() == pytest.approx(-0.7)
    dist, alpha = probes.distance(torch.diag(torch.tensor([1.0, 2.0, 3.0])), torch.eye(3))
    assert alpha.item() == pytest.approx(2.0)
    assert dist.item() == pytest.approx(np.sqrt(2) / np.sqrt(14))
    sigma = torch.eye(5)
    torch.testing.assert_close(probes.ahn_optimum(sigma, 20), 20 / 26 * torch.eye(5,
                               dtype=torch.float64))
    torch.testing.assert_close(probes.ahn_optimum(sigma, 20, "inverse-cov"),
                               probes.ahn_optimum(sigma, 20))
    cov = torch.diag(torch.tensor([1.0, 0.25], dtype=torch.float64))
    gamma = 21 / 20 * cov + 1.25 / 20 * torch.eye(2, dtype=torch.float64)
    torch.testing.assert_close(probes.ahn_optimum(cov, 20), torch.linalg.inv(gamma))
    with pytest.raises(ValueError, match="prior must be one of"):
        probes.ahn_optimum(cov, 20, prior="flat")
    with pytest.raises(TypeError, match=r"model must have PQ matrices \(a PQTransformer\)"):
        probes.preconditioners(tiny_gpt())


@pytest.mark.slow
def test_one_layer_optimum_is_the_population_minimizer():
    """Γ⁻¹ minimizes the expected one-layer loss: perturbing it raises the Monte-Carlo loss."""
    cov = torch.diag(torch.tensor([2.0, 1.0, 0.5], dtype=torch.float64))
    task = tasks.RegressionTask(n_dims=3, n_points=11, cov=cov)
    b = task.sample(100_000, generator=3, dtype=torch.float64)

    def loss(a):
        model = models.PQTransformer.from_matrices(A=a[None]).double()
        return (model(b.xs, b.ys, last_only=True)[:, 0] - b.ys[:, -1]).pow(2).mean().item()
    opt = probes.ahn_optimum(cov, 10)
    base = loss(opt)
    for scale in (0.9, 1.1):
        assert loss(opt * scale) > base
    assert loss(opt + 0.05 * torch.eye(3, dtype=torch.float64)[[1, 0, 2]]) > base


def test_cross_fitted_probes_equal_fitting_on_the_other_folds():
    from iclprobe.hooks import collect_residuals

    model = tiny_gpt()
    b = tasks.RegressionTask(n_dims=3, n_points=8).sample(40, generator=2)
    resid = collect_residuals(model, b.xs, b.ys)
    fit = probes.cross_fit(model, resid, b.ys, folds=4)
    assert fit.folds == [(0, 10), (10, 20), (20, 30), (30, 40)]
    for a, z in fit.folds:
        others = torch.cat([resid[:, :a], resid[:, z:]], dim=1)
        ref = probes.LayerProbes().fit_residuals(others, torch.cat([b.ys[:a], b.ys[z:]]))
        torch.testing.assert_close(fit.preds[:, a:z], ref.apply(resid[:, a:z]).double(),
                                   atol=1e-6, rtol=1e-6)
    # the held-out R² is that of the out-of-fold predictions
    y = b.ys[:, 1:].double()
    r2 = 1 - (fit.preds[:, :, 1:] - y).pow(2).sum((1, 2)) / (y - y.mean()).pow(2).sum()
    assert fit.metrics.r2 == pytest.approx(r2.tolist())
    # probes for the first 10 sequences are fitted on folds 1-3 only
    lp = fit.probes_excluding(slice(0, 10))
    torch.testing.assert_close(lp.apply(resid[:, :10]).double(), fit.preds[:, :10],
                               atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="every fold holds some of the sequences 0..39"):
        fit.probes_excluding(slice(0, 40))
    with pytest.raises(ValueError, match="folds must be an integer in \\[2, 40\\], got 1"):
        probes.cross_fit(model, resid, b.ys, folds=1)
    with pytest.raises(ValueError, match=r"too few rows for the probes: the other 1 of 2 folds "
                                         r"\(2 sequences\) x \d+ positions t >= 1 give"):
        probes.cross_fit(model, resid[:, :4], b.ys[:4], folds=2)


@pytest.mark.parametrize("scale", [1e200, -1e155])
def test_readout_probe_on_huge_inputs_names_them(scale):
    """Inputs whose squares leave float64 are refused by name, not by torch's LinAlgError."""
    from iclprobe.probes import ReadoutProbe

    X = np.random.default_rng(0).normal(size=(20, 3)) * scale
    with pytest.raises(ValueError, match=r"X reaches .*: the ridge fit squares it beyond "
                                         r"float64's range .*rescale it"):
        ReadoutProbe().fit(X, np.arange(20.0))
    with pytest.raises(ValueError, match=r"y reaches .*rescale it"):
        ReadoutProbe().fit(X / scale, np.arange(20.0) * scale)


def test_the_ridge_solver_refuses_sums_that_overflow():
    """The solver every probe shares (ReadoutProbe, LayerProbes, cross_fit) checks its sums."""
    from iclprobe.probes.ridge import ridge_gcv

    x = torch.full((1, 4000, 2), 1e153, dtype=torch.float64)  # each finite, their sum not
    x[0, :, 1] = torch.arange(4000, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"the probes' sums of layers \[0\] hold NaN or Inf: "
                                         r".* or their squares overflow float64"):
        ridge_gcv(x, torch.ones(4000, dtype=torch.float64))


def test_ridge_coefficients_at_a_given_alpha_equal_sklearn():
    """The Cholesky solve the readout noise uses: scikit-learn's Ridge, and `ridge_at`."""
    from iclprobe.probes.ridge import ridge_at, ridge_coef_at, ridge_sums

    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 80, 6)) * np.array([1e-2, 1.0, 1.0, 5.0, 1.0, 1.0]) + 2.0
    y = x[0] @ rng.normal(size=6) + 0.3 * rng.normal(size=80)
    alpha = torch.tensor([0.01, 1.0, 30.0], dtype=torch.float64)
    sums = ridge_sums(torch.tensor(x), torch.tensor(y))
    coef, intercept = ridge_coef_at(sums, alpha)
    for layer, a in enumerate(alpha.tolist()):
        ref = Ridge(alpha=a, solver="svd").fit(x[layer], y)
        np.testing.assert_allclose(coef[layer].numpy(), ref.coef_, rtol=1e-8, atol=1e-10)
        assert intercept[layer].item() == pytest.approx(ref.intercept_, rel=1e-8)
    # α = 0 somewhere: the eigendecomposition's pseudo-inverse, as ridge_at gives it
    zero = torch.tensor([0.0, 1.0, 30.0], dtype=torch.float64)
    torch.testing.assert_close(ridge_coef_at(sums, zero)[0], ridge_at(sums, zero).coef)


def test_the_readout_noise_reuses_the_folds_fits():
    """Each fold's fit is kept: the noise's α and the weight rows' probes are the same fits."""
    from iclprobe.hooks import collect_residuals
    from iclprobe.probes.crossfit import readout_noise
    from iclprobe.probes.ridge import ridge_from_sums

    model = tiny_gpt()
    b = tasks.RegressionTask(n_dims=3, n_points=8).sample(40, generator=2)
    resid = collect_residuals(model, b.xs, b.ys)
    fit = probes.cross_fit(model, resid, b.ys, folds=4)
    kept = fit.probes_excluding(slice(0, 10))
    refit = ridge_from_sums(fit.sums[1] + fit.sums[2] + fit.sums[3], fit.alphas)
    torch.testing.assert_close(kept.coef_, refit.coef, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(kept.alpha_, refit.alpha)
    noise = readout_noise(fit, resid).noise
    plain = dataclasses.replace(fit, fold_fits=None)  # every fit redone from the sums
    torch.testing.assert_close(readout_noise(plain, resid).noise, noise, rtol=1e-6, atol=1e-9)
    # the noise's degrees of freedom (the answer's slack, `TableSpec.slack`): the width read
    assert readout_noise(fit, resid).features == resid.shape[-1] == model.cfg.d_model


@pytest.mark.slow
def test_the_readout_noise_draws_have_the_size_of_the_probes_own_error():
    """Every draw of the readout noise (one per rotation of the other folds' halves) is a
    sample of the cross-fitted probes' estimation error: on features whose best linear
    readout is known, a draw's mean squared size over 100 data sets is the realized error's
    (0.98, 1.02, 0.98: the half-split scale √(1/n ÷ (1/n_A + 1/n_B)) makes it so; unscaled,
    a draw is 4.5 times too large), and their mean measures a data set's expected error
    more steadily than the first draw alone (spread 0.30 against 0.37 of it).
    """
    from iclprobe.probes.crossfit import readout_noise

    model = tiny_gpt()  # only named by the fit; the features are synthetic
    gen = torch.Generator().manual_seed(0)
    beta = torch.randn(6, generator=gen, dtype=torch.float64)
    real, drawn = [], []
    for _ in range(100):
        feats = torch.randn(2, 48, 10, 6, generator=gen, dtype=torch.float64)
        ys = feats[0] @ beta + torch.randn(48, 10, generator=gen, dtype=torch.float64)
        fit = probes.cross_fit(model, feats, ys, folds=4, t_min=1)
        noise = readout_noise(fit, feats)
        assert noise.draws.shape == (3, 2, 48, 10)
        assert torch.equal(noise.draws[0], noise.noise)
        real.append((fit.preds[0, :, 1:] - feats[0, :, 1:] @ beta).pow(2).sum())
        drawn.append(noise.draws[:, 0, :, 1:].pow(2).sum((1, 2)))
    real_t, drawn_t = torch.stack(real), torch.stack(drawn)
    assert (drawn_t.mean(0) / real_t.mean()).tolist() == pytest.approx([1.0] * 3, abs=0.08)
    expected = real_t.mean()  # the error's expected size (the same design every time)
    one, mean = drawn_t[:, 0] / expected, drawn_t.mean(1) / expected
    assert mean.std() < 0.9 * one.std()
    # with 3 or 5 folds, rotations past the middle repeat a split with its halves swapped
    for folds, n_draws in ((3, 1), (5, 2), (8, 7)):
        draws = readout_noise(probes.cross_fit(model, feats, ys, folds=folds, t_min=1),
                              feats).draws
        assert draws.shape[0] == n_draws
        for a in range(n_draws):
            for b in range(a):
                assert not torch.allclose(draws[a].abs(), draws[b].abs())


def test_probes_fitted_on_extra_sequences_equal_fitting_on_them_and_the_other_folds():
    from iclprobe.hooks import collect_residuals

    model = tiny_gpt()
    task = tasks.RegressionTask(n_dims=3, n_points=8)
    b, more = task.sample(40, generator=2), task.sample(24, generator=3)
    resid, extra = collect_residuals(model, b.xs, b.ys), collect_residuals(model, more.xs, more.ys)
    parts = [probes.fold_sums(extra[:, a:a + 6], more.ys[a:a + 6], 1) for a in range(0, 24, 6)]
    fit = probes.cross_fit(model, resid, b.ys, folds=4, extra=parts)
    assert fit.extra == [4, 5, 6, 7] and fit.others(slice(0, 10)) == [1, 2, 3, 4, 5, 6, 7]
    for a, z in fit.folds:  # every fold read by probes fitted on the others and the extra
        rows = torch.cat([resid[:, :a], resid[:, z:], extra], dim=1)
        ref = probes.LayerProbes().fit_residuals(rows, torch.cat([b.ys[:a], b.ys[z:], more.ys]))
        torch.testing.assert_close(fit.preds[:, a:z], ref.apply(resid[:, a:z]).double(),
                                   atol=1e-6, rtol=1e-6)
    plain = probes.cross_fit(model, resid, b.ys, folds=4)
    assert not torch.allclose(plain.preds, fit.preds, atol=1e-4)  # the extra rows count
    with pytest.raises(ValueError, match=r"extra must be 4 RidgeSums \(one per fold\)"):
        probes.cross_fit(model, resid, b.ys, folds=4, extra=parts[:3])
    with pytest.raises(ValueError, match=r"extra must be 4 RidgeSums .* got \[\(\d+, 5\)"):
        probes.cross_fit(model, resid, b.ys, folds=4,
                         extra=[probes.fold_sums(extra[..., :5], more.ys, 1)] * 4)


def test_the_readout_noise_with_extra_sequences_has_the_size_of_the_smaller_error():
    """With 4 times the other folds' sequences besides, the probes' realized error is about
    a fifth of what it is without them (0.19), and the noise draws still measure it: the
    halves split the extra sequences with the folds, and the draws' mean squared size over
    60 data sets is the realized error's (1.18, 1.20, 1.12 here; without extra sequences
    on the same kind of data 1.09, 1.10, 1.20 — the statistic's own spread at 60 sets).
    Extra sequences left out of the halves, or put in both, would make the draws 3 to 5
    times too large or small."""
    from iclprobe.probes.crossfit import readout_noise

    model = tiny_gpt()
    gen = torch.Generator().manual_seed(1)
    beta = torch.randn(6, generator=gen, dtype=torch.float64)

    def data(batch):
        feats = torch.randn(2, batch, 10, 6, generator=gen, dtype=torch.float64)
        return feats, feats[0] @ beta + torch.randn(batch, 10, generator=gen,
                                                     dtype=torch.float64)

    real, plain, drawn = [], [], []
    for _ in range(60):
        feats, ys = data(48)
        more, more_ys = data(144)  # 4 x the 36 sequences each fold's probe sees
        parts = [probes.fold_sums(more[:, a:a + 36], more_ys[a:a + 36], 1)
                 for a in range(0, 144, 36)]
        fit = probes.cross_fit(model, feats, ys, folds=4, t_min=1, extra=parts)
        real.append((fit.preds[0, :, 1:] - feats[0, :, 1:] @ beta).pow(2).sum())
        drawn.append(readout_noise(fit, feats).draws[:, 0, :, 1:].pow(2).sum((1, 2)))
        alone = probes.cross_fit(model, feats, ys, folds=4, t_min=1)
        plain.append((alone.preds[0, :, 1:] - feats[0, :, 1:] @ beta).pow(2).sum())
    real_t, drawn_t = torch.stack(real), torch.stack(drawn)
    assert (drawn_t.mean(0) / real_t.mean()).tolist() == pytest.approx([1.0] * 3, abs=0.3)
    assert float(real_t.mean() / torch.stack(plain).mean()) == pytest.approx(0.2, abs=0.05)


def test_align_fits_its_probes_on_the_extra_sequences_of_its_task():
    """`layer_predictions` with ``probe_extra_sequences``: the cross-fit over the evaluation
    sequences plus that many more of the evaluation task (seed + 2), in one part per fold."""
    from iclprobe.alignment import AlignConfig
    from iclprobe.alignment.measuring.layers import layer_predictions
    from iclprobe.constructions.oracle import oracle
    from iclprobe.hooks import collect_residuals

    task = tasks.RegressionTask(n_dims=3, n_points=9)
    model = oracle("gd", 3, 4, lr=0.2, exact_readout=False, task=task)
    cfg = AlignConfig(n_sequences=32, probe_extra_sequences=12, seed=5, probe_target="y")
    batch = task.sample(32, generator=torch.Generator().manual_seed(5))
    preds, how, *_ = layer_predictions(model, task, batch, cfg, None)
    more = task.sample(12, generator=torch.Generator().manual_seed(7))
    resid, extra = collect_residuals(model, batch.xs, batch.ys), collect_residuals(
        model, more.xs, more.ys)
    # a sequence whose residuals at some layer are larger than every evaluation sequence's
    # is left out, sequence by sequence and layer by layer
    top = [max(float(resid[k, b, 1:].double().pow(2).sum()) for b in range(32))
           for k in range(resid.shape[0])]
    inside = [all(float(extra[k, b, 1:].double().pow(2).sum()) <= top[k]
                  for k in range(resid.shape[0])) for b in range(12)]
    assert how.endswith(f"and fitted on {sum(inside)} of 12 more"
                        + (" (the others' residuals beyond the evaluation's))"
                           if not all(inside) else ")"))
    parts = []
    for a in range(0, 12, 3):
        keep = [b for b in range(a, a + 3) if inside[b]]
        parts.append(probes.fold_sums(extra[:, keep], more.ys[keep], 1))
    want = probes.cross_fit(model, resid, batch.ys, folds=4, extra=parts).preds
    torch.testing.assert_close(preds, want)
    plain, *_ = layer_predictions(model, task, batch, AlignConfig(n_sequences=32, seed=5), None)
    assert not torch.allclose(plain, preds)


def test_extra_sequences_a_model_diverges_on_are_not_used():
    """GD sized on the evaluation batch (1.9 / its largest λ_max, a fixed step) diverges on
    sequences with a larger one: the probes are then fitted on the evaluation sequences
    alone, and the readout says so."""
    from iclprobe.algorithms.prefix import prefix_stats
    from iclprobe.alignment import AlignConfig
    from iclprobe.alignment.measuring.layers import layer_predictions
    from iclprobe.constructions.oracle import oracle

    task = tasks.RegressionTask(n_dims=3, n_points=9)
    batch = task.sample(16, generator=torch.Generator().manual_seed(5))
    top = prefix_stats(batch.xs.double(), torch.zeros(16, 9, dtype=torch.float64)).eigvals
    model = oracle("gd", 3, 4, lambda layer: 6 * layer, lr=float(1.9 / top[..., -1].max()),
                   normalize=False, exact_readout=False, task=task)
    preds, how, *_ = layer_predictions(
        model, task, batch, AlignConfig(n_sequences=16, probe_extra_sequences=64, seed=5,
                                       probe_target="y"), None)
    assert how.endswith("not on 64 more: the model diverges on them)")
    plain, *_ = layer_predictions(model, task, batch, AlignConfig(n_sequences=16, seed=5), None)
    torch.testing.assert_close(preds, plain, rtol=0, atol=0)
