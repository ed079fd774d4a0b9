import math

import numpy as np
import pytest
import torch
from helpers import gdpp_loop, linear_data
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.linear_model import Ridge

from iclprobe import algorithms
from iclprobe.algorithms.reference import gd_direct, newton_direct


def per_prefix(xs, ys, fn):
    """Apply fn(X [t, d], y [t], x_query [d]) -> (pred, w) per sequence and prefix t >= 1."""
    x, y = xs.numpy(), ys.numpy()
    b, n, d = x.shape
    preds, ws = np.zeros((b, n)), np.zeros((b, n, d))
    for s in range(b):
        for t in range(1, n):
            w = fn(x[s, :t], y[s, :t])
            preds[s, t], ws[s, t] = x[s, t] @ w, w
    return torch.from_numpy(preds), torch.from_numpy(ws)


def close(it, ref_preds, ref_w, k=0, tol=1e-8):
    torch.testing.assert_close(it.preds[k], ref_preds, atol=tol, rtol=tol)
    torch.testing.assert_close(it.weights[k], ref_w, atol=tol, rtol=tol)


def gd_loop(steps, lr, normalize=True, precond=None):
    def fn(x, y):
        w, c = np.zeros(x.shape[1]), (1 / len(y) if normalize else 1.0)
        m = np.eye(x.shape[1]) if precond is None else precond
        for _ in range(steps):
            w = w - lr * m @ (c * (x.T @ (x @ w - y)))
        return w
    return fn


def test_ols_is_pinv_also_below_d():
    xs, ys = linear_data(n=9, d=5)
    it = algorithms.iterates("ols", xs, ys)
    close(it, *per_prefix(xs, ys, lambda x, y: np.linalg.pinv(x) @ y))
    assert torch.all(it.preds[0, :, 0] == 0) and it.steps.tolist() == [0]


def test_ridge_is_sklearn():
    xs, ys = linear_data(n=8, d=3, noise=0.3)
    it = algorithms.ridge(xs, ys, lam=0.7)

    def fn(x, y):
        return Ridge(alpha=0.7, fit_intercept=False, solver="svd", tol=1e-12).fit(x, y).coef_
    close(it, *per_prefix(xs, ys, fn))


@pytest.mark.parametrize("normalize", [True, False])
def test_gd_is_the_naive_loop(normalize):
    xs, ys = linear_data(n=8, d=3)
    lr = 0.1 if normalize else 0.02
    it = algorithms.gd(xs, ys, steps=[0, 1, 7, 30], lr=lr, normalize=normalize)
    for k, steps in enumerate([0, 1, 7, 30]):
        close(it, *per_prefix(xs, ys, gd_loop(steps, lr, normalize)), k=k)


def test_gd_max_lr_and_weights_off():
    xs, ys = linear_data(n=8, d=3)
    it = algorithms.gd(xs, ys, steps=[3], lr="max", weights=False)
    assert it.weights is None

    def fn(x, y):
        lr = 1 / np.linalg.eigvalsh(x.T @ x / len(y)).max()
        return gd_loop(3, lr)(x, y)
    torch.testing.assert_close(it.preds[0], per_prefix(xs, ys, fn)[0], atol=1e-8, rtol=1e-8)


def test_gd_tuned_picks_from_the_grid_on_the_tuning_batch():
    xs, ys = linear_data(b=8, n=10, d=3)
    tune = linear_data(b=16, n=10, d=3, seed=5)
    grid = [0.05, 0.3, 1.0, 1.9]
    it = algorithms.gd(xs, ys, steps=[1, 4], lr="tuned", tune_on=tune, grid=grid)
    stats = algorithms.prefix_stats(*tune)
    lam_max = (stats.eigvals[..., -1] / stats.counts.clamp(min=1))[:, 1:].median().item()
    candidates = [g / lam_max for g in grid]

    def tune_error(lr, steps):
        try:
            preds = algorithms.gd(*tune, steps=[steps], lr=lr).preds[0]
        except ValueError as err:  # a fixed lr that diverges on the tuning batch
            assert "diverges on these data" in str(err)
            return math.inf
        return (preds - tune[1])[:, 1:].pow(2).mean()

    assert len(it.hyper["lr"]) == 2
    for k, (lr, steps) in enumerate(zip(it.hyper["lr"], [1, 4])):
        assert min(abs(lr - c) for c in candidates) < 1e-12
        assert tune_error(lr, steps) <= min(tune_error(c, steps) for c in candidates) + 1e-15
        # the rate it picked, as a one-candidate grid: a fixed lr this large is refused on
        # these data (it diverges at t = 1), the tuned one is what it is
        one = algorithms.gd(xs, ys, steps=[steps], lr="tuned", tune_on=tune,
                            grid=[lr * lam_max])
        torch.testing.assert_close(it.preds[k], one.preds[0])
    assert it.hyper["lr"][0] != it.hyper["lr"][1]  # one rate per step count
    halves = algorithms.gd(xs, ys, steps=[2], lr="tuned")  # tunes on the second half
    assert isinstance(halves.hyper["lr"][0], float)
    with pytest.raises(ValueError, match=r"grid must hold positive learning-rate multipliers, "
                                         r"got \[0.0, -1.0\] among them"):
        algorithms.gd(xs, ys, steps=[2], lr="tuned", tune_on=tune, grid=[0.5, 0.0, -1.0])


def test_pgd_is_the_naive_loop():
    xs, ys = linear_data(n=8, d=3)
    m = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]], dtype=torch.float64)
    it = algorithms.pgd(xs, ys, steps=[5], precond=m, lr=0.1)
    close(it, *per_prefix(xs, ys, gd_loop(5, 0.1, precond=m.numpy())))


@pytest.mark.parametrize("alpha", ["frobenius", "spectral"])
def test_newton_is_the_naive_loop_and_converges_to_ols(alpha):
    xs, ys = linear_data(n=9, d=4)

    def loop(steps):
        def fn(x, y):
            s = x.T @ x
            norm = np.linalg.norm(s @ s.T, "fro" if alpha == "frobenius" else 2)
            m = s.T / norm
            for _ in range(steps):
                m = m @ (2 * np.eye(len(s)) - s @ m)
            return m @ x.T @ y
        return fn

    it = algorithms.newton(xs, ys, steps=[0, 1, 5, 12], alpha=alpha)
    for k, steps in enumerate([0, 1, 5, 12]):
        close(it, *per_prefix(xs, ys, loop(steps)), k=k, tol=1e-7)
    far = algorithms.newton(xs, ys, steps=[80], alpha=alpha)
    ols = algorithms.ols(xs, ys)
    torch.testing.assert_close(far.weights, ols.weights, atol=1e-7, rtol=1e-7)  # t < d and t >= d


def test_newton_on_the_papers_alpha_never_converges():
    xs, ys = linear_data(b=1, n=7, d=3)
    x = xs[0, :6].numpy()
    s = x.T @ x
    lam_max = np.linalg.eigvalsh(s).max()
    m = 2 / np.linalg.norm(s @ s.T, 2) * s.T  # alpha = 2/||SS^T||_2
    top = np.linalg.eigh(s)[1][:, -1]
    seen = []
    for _ in range(6):
        seen.append(top @ (np.eye(3) - s @ m) @ top)
        m = m @ (2 * np.eye(3) - s @ m)
    np.testing.assert_allclose(seen, [-1, 1, 1, 1, 1, 1], atol=1e-9)
    it = algorithms.newton(xs, ys, steps=[2, 5, 10], alpha=float(2 / lam_max**2))
    ols = algorithms.ols(xs, ys)
    # Stuck: the top direction is dropped (m_k = 0) at every step, so w_k never reaches OLS.
    # (Only round-off, growing as 2^k eps, lets it escape after some 30-50 steps.)
    top_t = torch.from_numpy(top)
    assert (ols.weights[0, 0, 6] @ top_t).abs() > 0.1
    assert torch.all((it.weights[:, 0, 6] @ top_t).abs() < 1e-9)
    assert (it.weights[-1, 0, 6] - ols.weights[0, 0, 6]).norm() > 0.1


def test_cg_is_the_naive_loop_and_exact_in_d_steps():
    xs, ys = linear_data(n=10, d=4)

    def loop(steps):
        def fn(x, y):
            s, b = x.T @ x, x.T @ y
            w, r = np.zeros(len(b)), b.copy()
            p = r.copy()
            for _ in range(steps):
                if r @ r < 1e-28 * (b @ b) or p @ s @ p <= 0:
                    break
                a = (r @ r) / (p @ s @ p)
                w, r_new = w + a * p, r - a * s @ p
                p, r = r_new + (r_new @ r_new) / (r @ r) * p, r_new
            return w
        return fn

    it = algorithms.cg(xs, ys, steps=[1, 2, 4])
    for k, steps in enumerate([1, 2]):
        close(it, *per_prefix(xs, ys, loop(steps)), k=k, tol=1e-7)
    ols = algorithms.ols(xs, ys)
    torch.testing.assert_close(it.preds[2][:, 4:], ols.preds[0][:, 4:], atol=1e-7, rtol=1e-7)


def test_momentum_is_the_naive_loop():
    xs, ys = linear_data(n=8, d=3)

    def fn(x, y):
        w = prev = np.zeros(3)
        for _ in range(9):
            w, prev = w - 0.05 * x.T @ (x @ w - y) / len(y) + 0.8 * (w - prev), w
        return w
    it = algorithms.momentum(xs, ys, steps=[9], lr=0.05, beta=0.8)
    close(it, *per_prefix(xs, ys, fn))


@pytest.mark.parametrize("lr", [0.05, "normalized"])
def test_online_gd_is_the_naive_loop(lr):
    xs, ys = linear_data(n=8, d=3)

    def fn_for(passes):
        def fn(x, y):
            w = np.zeros(3)
            for _ in range(passes):
                for xj, yj in zip(x, y):
                    eta = 1 / (xj @ xj) if lr == "normalized" else lr
                    w = w - eta * xj * (xj @ w - yj)
            return w
        return fn
    it = algorithms.online_gd(xs, ys, steps=[1, 3], lr=lr)
    for k, passes in enumerate([1, 3]):
        close(it, *per_prefix(xs, ys, fn_for(passes)), k=k)


@pytest.mark.parametrize("per_prefix", [False, True])
def test_gd_plus_plus_is_the_naive_loop(per_prefix):
    xs, ys = linear_data(n=8, d=3)
    # per prefix: η_t and γ_t differ with t, and are 0 before t = 3 (no step there)
    lrs = np.where(np.arange(8) >= 3, 0.05 + 0.02 * np.arange(8), 0.0) if per_prefix \
        else np.full(8, 0.1)
    gammas = lrs / 3 if per_prefix else np.full(8, 0.05)

    lr, gamma = (torch.from_numpy(lrs), torch.from_numpy(gammas)) if per_prefix \
        else (0.1, 0.05)
    it = algorithms.gd_plus_plus(xs, ys, steps=[4], lr=lr, gamma=gamma)
    x, y = xs.numpy(), ys.numpy()
    ref = np.zeros(y.shape)
    for s in range(3):
        for t in range(1, 8):
            ref[s, t] = gdpp_loop(x[s, :t], y[s, :t], x[s, t], lrs[t], gammas[t], 4)
    torch.testing.assert_close(it.preds[0], torch.from_numpy(ref), atol=1e-8, rtol=1e-8)
    # its weights are the linear predictor in the original coordinates
    torch.testing.assert_close((it.weights[0] * xs).sum(-1), it.preds[0])


def test_direct_references_agree():
    xs, ys = linear_data(n=9, d=4)
    steps = [0, 3, 10]
    torch.testing.assert_close(algorithms.gd(xs, ys, steps, lr=0.05).preds,
                               gd_direct(xs, ys, steps, 0.05), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(algorithms.newton(xs, ys, steps).preds,
                               newton_direct(xs, ys, steps), atol=1e-8, rtol=1e-8)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), n=st.integers(1, 7), d=st.integers(1, 4), seed=st.integers(0, 99),
       scale=st.floats(0.1, 3.0), k=st.integers(0, 12))
def test_batched_equals_naive_property(b, n, d, seed, scale, k):
    xs, ys = linear_data(b, n, d, seed)
    xs = xs * scale
    gd_it = algorithms.gd(xs, ys, steps=[k], lr=0.02)
    torch.testing.assert_close(gd_it.preds, gd_direct(xs, ys, [k], 0.02), atol=1e-8, rtol=1e-7)
    nw = algorithms.newton(xs, ys, steps=[k])
    torch.testing.assert_close(nw.preds, newton_direct(xs, ys, [k]), atol=1e-7, rtol=1e-6)
    for name in ("ols", "cg", "momentum", "online_gd", "gd_plus_plus"):
        try:
            it = algorithms.iterates(name, xs, ys, steps=[k])
        except ValueError as err:  # a default rate beyond these data's bound: refused
            assert name in ("momentum", "online_gd", "gd_plus_plus") and "diverge" in str(err)
            continue
        assert torch.isfinite(it.preds).all(), name
        assert torch.all(it.preds[:, :, 0] == 0), name


def test_float32_in_float32_out_float64_in_float64_out():
    xs, ys = linear_data(d=4)
    assert algorithms.gd(xs, ys, [2]).preds.dtype == torch.float64
    assert algorithms.gd(xs.float(), ys.float(), [2]).preds.dtype == torch.float32


def test_gd_plus_plus_at_its_max_rule_is_the_naive_loop_and_free_of_the_data_scale():
    # "max": η_t = lr_scale/λ_max(S_t/t) and γ_t = gamma_scale/λ_max(S_t/t), each sequence's
    # own prefix (align's tables run it so): the numpy definition at those rates, and the
    # same predictions on x scaled by 100 (a fixed η = 0.1 diverges there)
    xs, ys = linear_data(n=8, d=3)
    it = algorithms.gd_plus_plus(xs, ys, steps=[4], lr="max", gamma="max", lr_scale=0.8,
                                 gamma_scale=0.25)
    x, y = xs.numpy(), ys.numpy()
    ref = np.zeros(y.shape)
    for s in range(x.shape[0]):
        for t in range(1, 8):
            top = np.linalg.eigvalsh(x[s, :t].T @ x[s, :t] / t).max()
            ref[s, t] = gdpp_loop(x[s, :t], y[s, :t], x[s, t], 0.8 / top, 0.25 / top, 4)
    torch.testing.assert_close(it.preds[0], torch.from_numpy(ref), atol=1e-10, rtol=1e-10)
    assert it.hyper == {"lr": "max", "gamma": "max", "lr_scale": 0.8, "gamma_scale": 0.25}
    table = algorithms.learner_info("gd_plus_plus").align_hyper
    steps = list(range(1, 9))
    here = algorithms.iterates("gd_plus_plus", xs, ys, steps=steps, **table)
    far = algorithms.iterates("gd_plus_plus", xs * 100, ys, steps=steps, **table)
    torch.testing.assert_close(far.preds, here.preds, atol=1e-10, rtol=1e-9)
    with pytest.raises(ValueError, match="diverge"):
        algorithms.iterates("gd_plus_plus", xs * 100, ys, steps=steps, lr=0.1, gamma=0.01)


def test_gd_plus_plus_without_gamma_is_gd():
    # γ 0 at every prefix, as a tensor or a number: no covariate map, GD on the mean loss
    xs, ys = linear_data(n=8, d=3)
    for gamma in (0.0, torch.zeros(8)):
        it = algorithms.gd_plus_plus(xs, ys, steps=[1, 3], lr=0.2, gamma=gamma)
        ref = algorithms.gd(xs, ys, steps=[1, 3], lr=0.2)
        torch.testing.assert_close(it.preds, ref.preds, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda xs, ys: algorithms.iterates("sgd", xs, ys, [1]),
         r"unknown learner 'sgd'; valid: \['cg', 'gd', "),
        (lambda xs, ys: algorithms.iterates("gd", xs, ys, [1], eta=0.1),
         r"unknown hyperparameter\(s\) \['eta'\] for 'gd'"),
        (lambda xs, ys: algorithms.gd(xs, ys, [1, -2]), "steps must be integers >= 0, got -2"),
        (lambda xs, ys: algorithms.gd(xs, ys, [1], lr=0.0), "lr must be a finite number > 0"),
        (lambda xs, ys: algorithms.gd(xs, ys, [1], lr=-1.0), "lr must be a finite number > 0"),
        (lambda xs, ys: algorithms.gd(xs, ys, [1], lr="fast"), "lr must be a number > 0 or 'max'"),
        (lambda xs, ys: algorithms.newton(xs, ys, [1], alpha="paper"), "alpha must be"),
        (lambda xs, ys: algorithms.momentum(xs, ys, [1], beta=1.0), "beta must be a number in"),
        (lambda xs, ys: algorithms.ridge(xs, ys, lam=0), "lam must be a finite number > 0"),
        (lambda xs, ys: algorithms.gd(xs, ys[:, :-1], [1]), r"ys must have shape \(3, 9\)"),
        (lambda xs, ys: algorithms.gd(xs[0], ys, [1]), r"xs must have shape \[batch, pos"),
        (lambda xs, ys: algorithms.gd(xs * float("nan"), ys, [1]), "NaN or Inf"),
        (lambda xs, ys: algorithms.gd(xs, ys * float("inf"), [1]), "NaN or Inf"),
        (lambda xs, ys: algorithms.gd(xs, ys), "steps is required"),
        (lambda xs, ys: algorithms.pgd(xs, ys, [1], precond=-torch.eye(4)),
         "precond must be positive definite"),
        (lambda xs, ys: algorithms.pgd(xs, ys, [1], precond=torch.eye(3)),
         r"precond must have shape \(4, 4\)"),
        (lambda xs, ys: algorithms.gd_plus_plus(xs, ys, [1], gamma=-1.0), "gamma must be"),
        (lambda xs, ys: algorithms.gd_plus_plus(xs, ys, [1], lr="fast"),
         r"lr must be a number, a tensor \[pos\] or 'max', got 'fast'"),
        (lambda xs, ys: algorithms.gd_plus_plus(xs, ys, [1], lr="max", lr_scale=0.0),
         "lr_scale must be a finite number > 0, got 0.0"),
        (lambda xs, ys: algorithms.gd_plus_plus(xs, ys, [8, 64], lr="max",
                                                    gamma=0.0, lr_scale=3.0),
         r"lr='max' × lr_scale=3.0, gamma=0.0 make the iterates diverge.*lr_scale < 2"),
        (lambda xs, ys: algorithms.gd_plus_plus(xs, ys, [8, 64], lr=0.01, gamma=0.0,
                                                    lr_scale=300.0),  # the scale is named
         r"lr=0.01 × lr_scale=300.0, gamma=0.0 make .* stable for lr × lr_scale < "),
        (lambda xs, ys: algorithms.gd_plus_plus(xs, ys, [1], lr=torch.ones(3)),
         r"lr as a tensor must be real with shape \(9,\), one value per prefix"),
        (lambda xs, ys: algorithms.gd_plus_plus(xs, ys, [1], gamma=torch.full((9,), -0.1)),
         r"gamma must be finite and >= 0 at every prefix, got \[-0.1"),
        (lambda xs, ys: algorithms.gd_plus_plus(xs, ys, [1], gamma=torch.zeros(9, dtype=bool)),
         r"gamma as a tensor must be real with shape \(9,\)"),
        (lambda xs, ys: algorithms.gd_plus_plus(xs, ys, [1], lr=torch.zeros(9)),
         r"lr must be finite and >= 0 at every prefix \(> 0 somewhere\)"),
    ],
)
def test_bad_input(call, match):
    xs, ys = linear_data(d=4)
    with pytest.raises(ValueError, match=match):
        call(xs, ys)


@pytest.mark.parametrize("steps", [[0, 1, 2, 3, 9, 10, 40, 41, 300], [300, 5, 5, 0, 1], [7], [0]])
def test_heavy_ball_decays_are_the_recurrence(steps):
    # r_k = [M^k (1, 1)]_0 stepped one at a time, against the closed form's mix of single
    # steps and squared powers (stable and unstable rates, β at both ends)
    from iclprobe.algorithms.recurrences import heavy_ball_decays
    rate = torch.linspace(0.0, 3.9, 40, dtype=torch.float64)
    for beta in (0.0, 0.5, 0.95):
        prev, cur, naive = torch.ones_like(rate), torch.ones_like(rate), {0: torch.ones_like(rate)}
        for k in range(1, max(steps) + 1):
            prev, cur = cur, (1 + beta - rate) * cur - beta * prev
            naive[k] = cur
        got = heavy_ball_decays(rate, beta, steps)
        for k, r in zip(steps, got):
            scale = naive[k].abs().clamp(min=1.0)  # unstable rates grow: relative there
            assert torch.allclose(r / scale, naive[k] / scale, rtol=0, atol=1e-9), (beta, k)
