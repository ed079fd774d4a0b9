"""The fu2024 protocol against a re-implementation of Fu et al.'s evaluation code.

The reference below is written from reading their ``src/models.py`` (LeastSquaresModel-
NewtonMethod, -GradientDescent, -OnlineGradientDescent) and ``src/eval_similarity.py``
(per-sequence cosine of the residuals over every position, t = 0 included, with sklearn's
``cosine_similarity``; best step = numpy ``argmax``): loops over prefixes and sequences
in numpy, nothing shared with iclprobe's learners.
"""

import numpy as np
import pytest
import torch
from sklearn.metrics.pairwise import cosine_similarity

from iclprobe import algorithms, tasks
from iclprobe.alignment.pipeline import AlignConfig, align_layers
from iclprobe.alignment.protocols import FU2024, PROTOCOLS, get_protocol


def fu_newton(xs, ys, n_steps, numerator=1.0):
    """Their Newton: M_0 = (1/‖AAᵀ‖_F) Aᵀ with A = XᵀX, n_steps of M <- M(2I − AM).

    ``newton_inv`` in their ``src/models.py`` from the commit after their first (52376dd)
    on; the first (32b1021) started from 2/‖AAᵀ‖_F (``numerator=2``).
    """
    b, n, d = xs.shape
    out = np.zeros((b, n))
    for i in range(1, n):
        for s in range(b):
            x, y = xs[s, :i], ys[s, :i]
            a = x.T @ x
            inv = numerator / np.linalg.norm(a @ a.T) * a.T
            for _ in range(n_steps):
                inv = inv @ (2 * np.eye(d) - a @ inv)
            out[s, i] = xs[s, i] @ (inv @ (x.T @ y))
    return out


def fu_gd(xs, ys, grid, lr=0.01):
    """Their GD from w = 0: w <- w − lr (XᵀX w − Xᵀy), recorded at the step counts of grid."""
    b, n, d = xs.shape
    out = np.zeros((len(grid), b, n))
    for i in range(1, n):
        x, y = xs[:, :i], ys[:, :i]
        w = np.zeros((b, d))
        for k in range(1, max(grid) + 1):
            resid = np.einsum("bid,bd->bi", x, w) - y
            w = w - lr * np.einsum("bid,bi->bd", x, resid)
            if k in grid:
                out[grid.index(k), :, i] = np.einsum("bd,bd->b", w, xs[:, i])
    return out


def fu_online_gd(xs, ys, lr, init):
    """Their online GD: one pass over the prefix from a given start, example by example."""
    b, n, d = xs.shape
    out = np.zeros((b, n))
    for i in range(1, n):
        for s in range(b):
            w = init[s, i].copy()
            for j in range(i):
                xj = xs[s, j]
                w = w - lr * (xj * (xj @ w) - ys[s, j] * xj)
            out[s, i] = xs[s, i] @ w
    return out


def fu_similarity(layer_preds, method_preds, ys):
    """Their similarity of errors: mean over sequences of sklearn's cosine, all positions."""
    return np.array([[np.mean([cosine_similarity((lp - ys)[k:k + 1], (mp - ys)[k:k + 1])[0, 0]
                               for k in range(ys.shape[0])]) for mp in method_preds]
                     for lp in layer_preds])


@pytest.fixture(scope="module")
def setup():
    task = tasks.RegressionTask(n_dims=3, n_points=9)
    batch = task.sample(12, generator=5)
    xs, ys = batch.xs.double().numpy(), batch.ys.double().numpy()
    g = np.random.default_rng(0)
    # "Layers" between a learner's early and late steps, with noise: varied best steps.
    ols = algorithms.ols(batch.xs.double(), batch.ys.double()).preds[0].numpy()
    layers = np.stack([0 * ols] + [f * ols + 0.3 * (1 - f) * g.standard_normal(ols.shape)
                                   for f in (0.2, 0.5, 0.8, 0.95)])
    cfg = AlignConfig(protocol="fu2024", metrics=("error_cosine",), separation=False,
                      n_boot=20)
    result = align_layers(torch.from_numpy(layers), batch, cfg)
    return batch, xs, ys, layers, result


@pytest.mark.slow
def test_fu_newton_and_error_cosine_as_their_code(setup):
    batch, xs, ys, layers, result = setup
    steps = list(FU2024.runs["newton"].steps)
    assert steps == list(range(1, 24)) and result.window == (0, 8)
    ref = fu_similarity(layers, [fu_newton(xs, ys, k) for k in steps], ys)
    sim = result.similarities["newton"]["error_cosine"]
    np.testing.assert_allclose(sim.values.numpy(), ref, atol=1e-9)
    assert result.matches["newton"]["error_cosine"].best_step == \
        [steps[int(i)] for i in ref.argmax(1)]


def test_fu_gd_as_their_code(setup):
    batch, xs, ys, layers, result = setup
    grid = [2**i for i in range(13)]
    ref = fu_similarity(layers, fu_gd(xs, ys, grid), ys)
    sim = result.similarities["gd"]["error_cosine"]
    assert sim.steps == grid
    np.testing.assert_allclose(sim.values.numpy(), ref, atol=1e-9)
    assert result.matches["gd"]["error_cosine"].best_step == [grid[int(i)] for i in
                                                             ref.argmax(1)]


def test_fu_online_gd_as_their_code(setup):
    batch, xs, ys, layers, result = setup
    # their start is torch.rand per call; ours is U[0, 1)^d drawn with the run's seed
    init = torch.rand(xs.shape, generator=torch.Generator().manual_seed(0),
                      dtype=torch.float64).numpy()
    lrs = [0.01, 0.02, 0.03, 0.04, 0.05]
    ref = fu_similarity(layers, [fu_online_gd(xs, ys, lr, init) for lr in lrs], ys)
    sim = result.similarities["online_gd"]["error_cosine"]
    np.testing.assert_allclose(sim.values.numpy(), ref, atol=1e-9)
    assert sim.labels == [f"1 (lr {lr:g})" for lr in lrs]


def test_protocols_are_recorded_and_listed():
    assert set(PROTOCOLS) == {"iclprobe", "fu2024"}
    with pytest.raises(ValueError, match=r"protocol must be one of \['fu2024', 'iclprobe'\]"):
        get_protocol("garg")
    with pytest.raises(ValueError, match=r"algorithms \['heavy'\] are not registered learners"):
        AlignConfig(protocol="fu2024", algorithms=("cg", "heavy"))
    AlignConfig(protocol="fu2024", algorithms=("cg",))  # a candidate the protocol does not run
    d = get_protocol("iclprobe").to_dict()
    assert d["runs"]["gd"]["hyper"] == {"lr": "max", "normalize": True} and d["t_min"] == 1


@pytest.mark.parametrize("alpha, numerator", [("frobenius", 1.0), ("2/frobenius", 2.0)])
def test_newton_alpha_is_their_scaling(alpha, numerator):
    """1/‖SSᵀ‖_F is their code's (and fu2024's); 2/‖SSᵀ‖_F their first commit's, which at
    rank-1 prefixes (t = 1) sits on the divergence boundary: every step predicts 0 there."""
    b = tasks.RegressionTask(n_dims=3, n_points=7).sample(5, generator=1)
    xs, ys = b.xs.double(), b.ys.double()
    ours = algorithms.newton(xs, ys, steps=[1, 4], alpha=alpha).preds.numpy()
    for i, k in enumerate([1, 4]):
        np.testing.assert_allclose(ours[i], fu_newton(xs.numpy(), ys.numpy(), k, numerator),
                                   atol=1e-10)
    assert FU2024.runs["newton"].hyper == {"alpha": "frobenius"}
    assert (np.abs(ours[:, :, 1]) > 1e-3).all() != (numerator == 2.0)
    with pytest.raises(ValueError, match="alpha must be one of"):
        algorithms.newton(xs, ys, steps=[1], alpha="paper")


def test_online_gd_init_options():
    b = tasks.RegressionTask(n_dims=2, n_points=5).sample(3, generator=2)
    start = torch.full((3, 5, 2), 0.5, dtype=torch.float64)
    it = algorithms.online_gd(b.xs.double(), b.ys.double(), steps=[1], lr=0.1, init=start)
    ref = fu_online_gd(b.xs.double().numpy(), b.ys.double().numpy(), 0.1, start.numpy())
    np.testing.assert_allclose(it.preds[0].numpy(), ref, atol=1e-12)
    assert torch.all(it.preds[0, :, 0] == 0)
    with pytest.raises(ValueError, match="init must have shape"):
        algorithms.online_gd(b.xs, b.ys, steps=[1], init=torch.zeros(3, 5))
    with pytest.raises(ValueError, match="init must be 'zero', 'uniform'"):
        algorithms.online_gd(b.xs, b.ys, steps=[1], init="normal")


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_run_on_some_sequences_is_those_rows_of_the_run_on_all(protocol):
    # align runs the weight metrics on a subset: its iterates (random starts included) must
    # be the rows of the full run, or the two tables would describe different learners
    from iclprobe.alignment.measuring.runs import run_spec

    batch = tasks.RegressionTask(n_dims=3, n_points=8).sample(12, generator=4)
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    rows = slice(0, 5)
    for key, spec in get_protocol(protocol).runs.items():
        full = run_spec(spec, batch, 4, True, stats, seed=3)
        part = run_spec(spec, batch, 4, True, stats, seed=3, sequences=rows)
        torch.testing.assert_close(part.preds, full.preds[:, rows], rtol=1e-12, atol=1e-12,
                                   msg=key)
        torch.testing.assert_close(part.weights, full.weights[:, rows], rtol=1e-12, atol=1e-12,
                                   msg=key)
