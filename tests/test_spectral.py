"""The spectral-filter view: filter factors and their order, against closed forms.

Exact comparisons here are of float64 closed forms computed two ways (numpy's eigh and
the library's prefix eigendecomposition) to 1e-9: portable, since no sign or basis choice
enters either side (the filter factors are basis-free by construction, which a test checks).
"""

import numpy as np
import pytest
import torch

from iclprobe import algorithms, tasks
from iclprobe.algorithms.prefix import prefix_stats
from iclprobe.alignment import AlignConfig, align_layers
from iclprobe.alignment.views.spectral import filter_factors, reading, spectral_order


def _batch(n_dims=4, n_points=12, sequences=32, seed=0):
    task = tasks.RegressionTask(n_dims=n_dims, n_points=n_points)
    b = task.sample(sequences, generator=torch.Generator().manual_seed(seed))
    return b.xs.double(), b.ys.double()


def test_gd_filter_factors_are_its_closed_form_at_each_eigenvalue():
    xs, ys = _batch()
    stats = prefix_stats(xs, ys)
    it = algorithms.gd(xs, ys, steps=[3], lr=0.05, normalize=False)
    phi, lam, share = filter_factors(it.weights[0], stats)
    for seq, t in [(0, 6), (5, 11), (17, 8)]:
        x = xs[seq, :t].numpy()
        eig = np.linalg.eigvalsh(x.T @ x)
        expected = 1 - (1 - 0.05 * eig) ** 3
        np.testing.assert_allclose(phi[seq, t].numpy(), expected, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(lam[seq, t].numpy(), eig, rtol=1e-9)
        assert share[seq, t].sum().item() == pytest.approx(1.0)


def test_a_power_law_filter_has_its_order():
    # w = V diag(φ/λ) Vᵀ b with 1 − φ = exp(−c λ^p): the order is p, at any c
    xs, ys = _batch(sequences=64)
    stats = prefix_stats(xs, ys)
    for p_true in (1.0, 2.0, 1.5):
        lam = stats.eigvals[:, 8:]
        c = 0.3 / lam[..., -1:].pow(p_true)  # φ of the top direction 0.26
        phi = 1 - torch.exp(-c * lam.pow(p_true))
        g = torch.where(lam > 0, phi / lam.clamp(min=1e-300), 0.0)
        w = torch.einsum("bnij,bnj->bni", stats.eigvecs[:, 8:], g * stats.xty_eig[:, 8:])
        weights = torch.zeros_like(stats.xty)
        weights[:, 8:] = w
        p, lo, hi, count = spectral_order(weights, stats, 8, 11, 20, 0.95, 0)
        assert p.item() == pytest.approx(p_true, abs=1e-8)
        assert lo.item() == pytest.approx(p_true, abs=1e-8) and count.item() > 0


def test_filter_factors_do_not_depend_on_the_basis_of_an_eigenspace():
    # orthogonal columns of equal norm: S = 4 I on a 2-dimensional eigenspace (and more)
    xs = torch.zeros(1, 6, 3, dtype=torch.float64)
    xs[0, 0] = torch.tensor([2.0, 0, 0])
    xs[0, 1] = torch.tensor([0, 2.0, 0])
    xs[0, 2] = torch.tensor([0, 0, 3.0])
    xs[0, 3:] = torch.randn(3, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ys = torch.tensor([[1.0, -2.0, 0.5, 0.3, 0.1, -0.4]], dtype=torch.float64)
    stats = prefix_stats(xs, ys)
    w = torch.randn(1, 6, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    t = 3  # S_3 = diag(4, 4, 9): eigenvalue 4 twice
    phi, _, share = filter_factors(w, stats)
    angle = torch.tensor(0.7, dtype=torch.float64)
    rot = torch.eye(3, dtype=torch.float64)
    rot[:2, :2] = torch.tensor([[angle.cos(), -angle.sin()], [angle.sin(), angle.cos()]])
    flip = torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64))
    vecs = stats.eigvecs.clone()
    vecs[0, t] = stats.eigvecs[0, t] @ rot @ flip  # another basis of the same eigenspaces
    other = stats._replace(eigvecs=vecs, xty_eig=torch.einsum(
        "bnij,bni->bnj", vecs, stats.xty))
    phi2, _, share2 = filter_factors(w, other)
    torch.testing.assert_close(phi[0, t] * (share[0, t] > 0), phi2[0, t] * (share2[0, t] > 0),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(share[0, t], share2[0, t], rtol=1e-12, atol=1e-12)
    # the pooled factor is λ ⟨P w, P b⟩ / ‖P b‖² on the eigenspace of 4
    b = stats.xty[0, t]
    pooled = 4 * (w[0, t, :2] @ b[:2]) / (b[:2] @ b[:2])
    assert float(phi[0, t][share[0, t] > 0][0]) == pytest.approx(float(pooled), rel=1e-10)


def test_the_reading_names_the_learner_whose_order_the_interval_holds():
    orders = {"newton": 2.05, "gd": 1.08}
    assert reading(1.9, 2.2, orders) == "newton-like"
    assert reading(1.0, 1.2, orders) == "gd-like"
    assert reading(1.2, 1.9, orders) == "cannot tell"  # holds neither...
    assert reading(1.0, 2.1, orders) == "cannot tell"  # ...or both
    assert reading(float("nan"), float("nan"), orders) == "too few usable directions"


@pytest.mark.slow
def test_align_reports_the_order_of_gd_and_newton_layers():
    batch = tasks.RegressionTask(n_dims=4, n_points=16).sample(
        96, generator=torch.Generator().manual_seed(3))
    xs, ys = batch.xs.double(), batch.ys.double()
    newton = algorithms.newton(xs, ys, steps=[1, 2, 3])
    gd = algorithms.gd(xs, ys, steps=[2, 4, 8], lr="max")
    for it, truth in ((newton, "newton"), (gd, "gd")):
        layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
        weights = torch.cat([torch.zeros_like(it.weights[:1]), it.weights])
        res = align_layers(layers, batch, AlignConfig(n_boot=20, separation=False),
                           layer_weights=weights)
        spec = res.spectral
        assert spec is not None and spec.reading[0] == "computes nothing"
        assert spec.reading[1:] == [f"{truth}-like"] * 3, spec
        target = 2.0 if truth == "newton" else 1.0
        assert all(abs(p - target) < 0.25 for p in spec.order[1:])
        assert "spectral" in res.to_dict() and res.to_dict()["spectral"]["t_min"] == 6


@pytest.mark.slow
def test_the_spectral_lines_show_each_live_layers_order():
    from iclprobe.alignment.output.tables import spectral_lines

    batch = tasks.RegressionTask(n_dims=4, n_points=16).sample(
        64, generator=torch.Generator().manual_seed(4))
    it = algorithms.newton(batch.xs.double(), batch.ys.double(), steps=[1, 2])
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    weights = torch.cat([torch.zeros_like(it.weights[:1]), it.weights])
    res = align_layers(layers, batch, AlignConfig(n_boot=20, separation=False),
                       layer_weights=weights)
    lines = spectral_lines(res)
    rows = [line.split() for line in lines[3:]]
    assert [r[0] for r in rows] == ["1", "2"]  # layer 0 computes nothing
    for r in rows:
        assert float(r[1]) == pytest.approx(res.spectral.order[int(r[0])], abs=0.005)
        assert r[-1] == res.spectral.reading[int(r[0])] == "newton-like"
    assert all(len(line) <= 100 for line in lines)


def test_the_readouts_noise_widens_each_interval_to_hold_the_noisy_readings():
    """Through probes each layer's interval is the union with its noisy readings' intervals.

    The noisy readings here are GD's weights (order ~1) beside Newton layers (order ~2): a
    probe error that large must leave the view unable to tell, where without it the view
    reads Newton. An interval undefined for the layer stays undefined, and a reading
    whose own interval is undefined changes none.
    """
    from iclprobe.alignment.views.spectral import spectral_view

    batch = tasks.RegressionTask(n_dims=4, n_points=16).sample(
        96, generator=torch.Generator().manual_seed(3))
    xs, ys = batch.xs.double(), batch.ys.double()
    stats = prefix_stats(xs, ys)
    newton = algorithms.newton(xs, ys, steps=[1, 2]).weights
    gd = algorithms.gd(xs, ys, steps=[2, 4], lr="max").weights
    zero = torch.zeros_like(newton[:1])
    layers, noisy = torch.cat([zero, newton]), torch.cat([zero, gd])
    holes = torch.cat([newton[:1], zero, newton[1:]])  # defined at layer 0, not at layer 1
    refs = {"newton": torch.cat([zero, newton]), "gd": torch.cat([zero, gd])}
    args = (refs, stats, (1, 15), [False, True, True], 20, 0.95, 0)
    plain = spectral_view(layers, *args)
    assert plain.reading[1:] == ["newton-like"] * 2 and plain.noisy_readings == 0
    wide = spectral_view(layers, *args, noisy=[noisy, holes])
    assert wide.reading[1:] == ["cannot tell"] * 2 and wide.noisy_readings == 2
    _, lo, hi, _ = spectral_order(noisy, stats, 6, 15, 20, 0.95, 0)
    _, lo_h, hi_h, _ = spectral_order(holes, stats, 6, 15, 20, 0.95, 0)
    assert bool(torch.isfinite(lo_h[0])) and bool(torch.isnan(lo_h[1]))
    for layer in (1, 2):
        assert wide.order[layer] == plain.order[layer]  # the estimate is the layer's own
        low = min(plain.lower[layer], lo[layer].item(), *([lo_h[2].item()] if layer == 2 else []))
        high = max(plain.upper[layer], hi[layer].item(), *([hi_h[2].item()] if layer == 2 else []))
        assert wide.lower[layer] == pytest.approx(low) and wide.upper[layer] == pytest.approx(high)
    assert wide.lower[0] is None and wide.upper[0] is None  # undefined stays undefined


@pytest.mark.slow
def test_align_widens_the_spectral_intervals_where_the_readout_has_noise():
    """`align_layers` given the readout's noise passes both noisy readings to the view."""
    from iclprobe.alignment.output.tables import spectral_lines

    batch = tasks.RegressionTask(n_dims=4, n_points=16).sample(
        64, generator=torch.Generator().manual_seed(4))
    it = algorithms.newton(batch.xs.double(), batch.ys.double(), steps=[1, 2])
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    weights = torch.cat([torch.zeros_like(it.weights[:1]), it.weights])[:, :16]
    gen = torch.Generator().manual_seed(5)
    noise = 0.05 * torch.randn(layers.shape, generator=gen, dtype=torch.float64)
    weight_noise = 0.05 * torch.randn(weights.shape, generator=gen, dtype=torch.float64)
    cfg = AlignConfig(n_boot=20, separation=False, n_weight_sequences=16,
                      algorithms=("newton", "gd"))
    exact = align_layers(layers, batch, cfg, layer_weights=weights, probe_t_min=1)
    noisy = align_layers(layers, batch, cfg, layer_weights=weights, probe_t_min=1,
                         readout_noise=(noise, weight_noise))
    assert exact.spectral.noisy_readings == 0 and noisy.spectral.noisy_readings == 2
    assert all(lo <= lo_e and hi >= hi_e for lo, hi, lo_e, hi_e in zip(
        noisy.spectral.lower[1:], noisy.spectral.upper[1:], exact.spectral.lower[1:],
        exact.spectral.upper[1:]))
    assert noisy.to_dict()["spectral"]["noisy_readings"] == 2
    lines = spectral_lines(noisy)
    assert "the probes' noise ±" in lines[2] and "interval" in lines[3].split()
    assert all(len(line) <= 100 for line in lines)
