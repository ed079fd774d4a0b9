"""Learners on hard data: extreme scales, divergent step sizes, low precision, complex input."""

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import linear_data
from safetensors.torch import load_file

from iclprobe import algorithms

BEFORE = Path(__file__).parent / "data" / "learners_before.safetensors"
PRECOND = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]], dtype=torch.float64)
# (learner, hyperparameters) whose outputs tests/data/learners_before.safetensors holds, as
# computed by the learners before the hard-data changes (commit 50e5a6d).
CASES = {
    "ols": ("ols", {}),
    "ridge": ("ridge", {"lam": 0.7}),
    "gd": ("gd", {"steps": [0, 1, 5, 40], "lr": 0.1}),
    "gd_sum": ("gd", {"steps": [1, 5, 40], "lr": 0.02, "normalize": False}),
    "gd_max": ("gd", {"steps": [1, 5, 40], "lr": "max"}),
    "gd_tuned": ("gd", {"steps": [1, 5], "lr": "tuned"}),
    "pgd": ("pgd", {"steps": [1, 5, 40], "lr": 0.2, "precond": PRECOND}),
    "momentum": ("momentum", {"steps": [1, 5, 40], "lr": 0.05, "beta": 0.5}),
    "newton": ("newton", {"steps": [0, 1, 5, 20]}),
    "newton_spectral": ("newton", {"steps": [1, 5, 20], "alpha": "spectral"}),
    "newton_alpha": ("newton", {"steps": [1, 5, 20], "alpha": 1e-3}),
    "cg": ("cg", {"steps": [0, 1, 2, 3, 4]}),
    "online_gd": ("online_gd", {"steps": [1, 3]}),
    "online_gd_lr": ("online_gd", {"steps": [1, 3], "lr": 0.05}),
    "gd_plus_plus": ("gd_plus_plus", {"steps": [1, 3, 6], "lr": 0.1, "gamma": 0.05}),
}


def golden_data():
    g = torch.Generator().manual_seed(2024)
    xs = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    w = torch.randn(2, 3, generator=g, dtype=torch.float64)
    noise = 0.1 * torch.randn(2, 6, generator=g, dtype=torch.float64)
    return xs, torch.einsum("bnd,bd->bn", xs, w) + noise




def lam_max_per_prefix(xs, normalize=True):
    """max over sequences and prefixes t >= 1 of λ_max(c_t S_t), by numpy."""
    x = xs.numpy()
    top = 0.0
    for s in range(x.shape[0]):
        for t in range(1, x.shape[1]):
            lam = np.linalg.eigvalsh(x[s, :t].T @ x[s, :t]).max()
            top = max(top, lam / t if normalize else lam)
    return top


@pytest.mark.parametrize("case", sorted(CASES))
def test_normal_data_give_what_they_gave_before(case):
    before = load_file(str(BEFORE))
    name, hyper = CASES[case]
    it = algorithms.iterates(name, *golden_data(), **hyper)
    torch.testing.assert_close(it.preds, before[f"{case}.preds"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(it.weights, before[f"{case}.weights"], rtol=1e-12, atol=1e-12)


# x -> s x and y -> r y: each learner's hyperparameters map as below, predictions scale by r
# and weights by r / s. With s = 2^±700 the Gram matrices (s² ~ 1e±421) are beyond float64
# (s is capped where the mapped hyperparameter itself would be: lr s^-2, alpha s^-4).
SCALED = [
    ("ols", {}, {}),
    ("ridge", {"lam": 0.7}, {"lam": 2}),
    ("gd", {"steps": [1, 7], "lr": 0.1}, {"lr": -2}),
    ("gd", {"steps": [1, 7], "lr": "max"}, {}),
    ("momentum", {"steps": [3], "lr": 0.05, "beta": 0.5}, {"lr": -2}),
    ("newton", {"steps": [0, 4, 12]}, {}),
    ("newton", {"steps": [4], "alpha": 1e-3}, {"alpha": -4}),
    ("cg", {"steps": [1, 3]}, {}),
    ("pgd", {"steps": [2], "lr": 0.2, "precond": PRECOND}, {"lr": -2}),
    ("online_gd", {"steps": [2]}, {}),
    ("online_gd", {"steps": [2], "lr": 0.05}, {"lr": -2}),
    ("gd_plus_plus", {"steps": [3], "lr": 0.1, "gamma": 0.05}, {"lr": -2, "gamma": -2}),
]


@pytest.mark.parametrize(("name", "hyper", "powers"), SCALED)
@pytest.mark.parametrize(("log2_s", "log2_r"), [(700, 0), (-700, 0), (-400, 600), (100, -900)])
def test_learners_are_scale_covariant_far_beyond_float64(name, hyper, powers, log2_s, log2_r):
    xs, ys = linear_data()
    cap = 1000 // max((abs(p) for p in powers.values()), default=1)
    log2_s = max(-cap, min(cap, log2_s))
    s, r = 2.0**log2_s, 2.0**log2_r
    mapped = {k: (v * 2.0 ** (powers[k] * log2_s) if k in powers else v)
              for k, v in hyper.items()}
    ref = algorithms.iterates(name, xs, ys, **hyper)
    got = algorithms.iterates(name, xs * s, ys * r, **mapped)
    torch.testing.assert_close(got.preds / r, ref.preds, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.weights * (s / r), ref.weights, rtol=1e-10, atol=1e-12)


def test_tiny_and_huge_x_give_the_predictions_of_ordinary_x():
    xs, ys = linear_data()
    ols = algorithms.ols(xs, ys).preds
    assert ols[0, :, 4:].abs().min() > 1e-3
    for factor in (1e-200, 1e-30, 1e30, 1e200):
        torch.testing.assert_close(algorithms.ols(xs * factor, ys).preds, ols, rtol=1e-9,
                                   atol=1e-12)
        newton = algorithms.newton(xs * factor, ys, steps=[30]).preds[0]
        torch.testing.assert_close(newton, ols[0], rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("normalize", [True, False])
def test_gd_with_a_divergent_lr_names_the_largest_stable_lr(normalize):
    from iclprobe import tasks

    task = tasks.RegressionTask(n_dims=4, n_points=12, cov="ill-conditioned",
                                condition_number=1e6)
    b = task.sample(6, generator=0, dtype=torch.float64)
    bound = 2 / lam_max_per_prefix(b.xs, normalize)
    ok = algorithms.gd(b.xs, b.ys, steps=[4096], lr=0.99 * bound, normalize=normalize)
    assert torch.isfinite(ok.preds).all()
    with pytest.raises(ValueError, match=rf"^gd: lr=.* diverges on these data .* largest stable "
                                         rf"lr here is 2/max\(c·λ_max\) = {bound:.3g}$"):
        algorithms.gd(b.xs, b.ys, steps=[1, 4096], lr=3 * bound, normalize=normalize)


def test_gd_on_huge_x_with_a_fixed_lr_says_how_small_lr_must_be():
    xs, ys = linear_data()
    bound = 2 / lam_max_per_prefix(xs * 1e30)
    assert 1e-62 < bound < 1e-58
    with pytest.raises(ValueError, match=f"gd: lr=0.1 diverges .* = {bound:.3g}$"):
        algorithms.gd(xs * 1e30, ys, steps=[2000], lr=0.1)
    # far beyond float64's squares, the bound is still named (from the scaled data)
    with pytest.raises(ValueError, match=r"largest stable lr here is 2/max\(c·λ_max\) = "
                                         r"\d\.\d+e-40\d$"):
        algorithms.gd(xs * 1e200, ys, steps=[2000], lr=0.1)
    # a stable lr on |x| ~ 1e150 (where S_t ~ 1e300) runs as GD on ordinary x does
    lr = 0.5 * 2 / lam_max_per_prefix(xs * 1e150)
    fine = algorithms.gd(xs * 1e150, ys, steps=[2000], lr=lr)
    torch.testing.assert_close(fine.preds, algorithms.gd(xs, ys, steps=[2000], lr=lr * 1e300).preds,
                               rtol=1e-9, atol=1e-12)


def test_newton_and_momentum_with_divergent_hyperparameters():
    xs, ys = linear_data()
    lam = max(np.linalg.eigvalsh(xs[s, :t].numpy().T @ xs[s, :t].numpy()).max()
              for s in range(3) for t in range(1, 9))
    with pytest.raises(ValueError, match=f"newton: alpha=1000000.0 diverges .* largest stable "
                                         rf"alpha here is 2/max\(λ_max²\) = {2 / lam**2:.3g}$"):
        algorithms.newton(xs, ys, steps=[40], alpha=1e6)
    bound = 2 * 1.5 / lam_max_per_prefix(xs)
    with pytest.raises(ValueError, match=rf"momentum: lr=.* 2\(1\+β\)/max\(c·λ_max\) = "
                                         rf"{bound:.3g}$"):
        algorithms.momentum(xs, ys, steps=[3000], lr=2 * bound, beta=0.5)
    with pytest.raises(ValueError, match=r"online_gd: lr=50.0 diverges .* 2/max‖x_j‖²"):
        algorithms.online_gd(xs, ys, steps=[400], lr=50.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float64_and_cast_back(dtype):
    xs, ys = linear_data()
    xh, yh = xs.to(dtype), ys.to(dtype)
    for name, hyper in (("pgd", {"steps": [3], "precond": PRECOND, "lr": 0.2}),
                        ("newton", {"steps": [10]}), ("ols", {})):
        got = algorithms.iterates(name, xh, yh, **hyper)
        ref = algorithms.iterates(name, xh.double(), yh.double(), **hyper)
        assert got.preds.dtype == dtype
        assert torch.equal(got.preds, ref.preds.to(dtype))
        assert torch.equal(got.weights, ref.weights.to(dtype))


def test_results_beyond_float16_are_refused_not_inf():
    xs, ys = linear_data()
    x16, y16 = (xs * 1e-3).half(), (ys * 1e3).half()  # the weights are ~1e6 > 65504
    preds = algorithms.pgd(x16, y16, steps=[5], precond=PRECOND, lr=1e5, weights=False).preds
    assert preds.dtype == torch.float16 and torch.isfinite(preds).all()
    with pytest.raises(ValueError, match=r"pgd: the weights reach .*e\+0[67], beyond the range "
                                         r"of torch.float16, the dtype of xs .*: pass float32 "
                                         r"or float64 xs"):
        algorithms.pgd(x16, y16, steps=[5], precond=PRECOND, lr=1e5)
    with pytest.raises(ValueError, match="ols: the weights reach .* torch.float16"):
        algorithms.ols(x16, y16)


@pytest.mark.parametrize("name", sorted(algorithms.LEARNERS))
def test_complex_input_is_refused(name):
    xs, ys = linear_data()
    hyper = {"precond": PRECOND} if name == "pgd" else {}
    steps = None if name in ("ols", "ridge") else [1]
    for x, y in ((xs.to(torch.complex128), ys), (xs, ys.to(torch.complex64))):
        with pytest.raises(TypeError, match="must hold real numbers .* got torch.complex"):
            algorithms.iterates(name, x, y, steps, **hyper)
    if name == "pgd":
        with pytest.raises(TypeError, match="precond must hold real numbers .* got torch.complex128"):
            algorithms.pgd(xs, ys, [1], precond=PRECOND.to(torch.complex128))
