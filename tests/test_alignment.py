import csv
import io
import json
import math

import numpy as np
import pytest
import torch

from iclprobe import algorithms, alignment
from iclprobe.algorithms import Iterates
from iclprobe.alignment import Similarity
from iclprobe.alignment.measuring.matching import GRID_BENDS, growth_verdict, on_grid


def test_error_cosine_by_hand():
    ys = torch.tensor([[9.0, 1.0, 2.0, 3.0]])
    a = torch.tensor([[0.0, 2.0, 2.0, 3.0]])  # residuals (t >= 1): (1, 0, 0)
    b = torch.tensor([[5.0, 2.0, 3.0, 3.0]])  # residuals: (1, 1, 0)
    assert alignment.error_cosine(a, b, ys).item() == pytest.approx(1 / math.sqrt(2))
    # t_min = 0 includes position 0: residuals (-9, 1, 0, 0) and (-4, 1, 1, 0)
    expected = (36 + 1) / (math.sqrt(82) * math.sqrt(18))
    assert alignment.error_cosine(a, b, ys, t_min=0).item() == pytest.approx(expected)
    # mean over sequences, not a pooled cosine
    two = alignment.error_cosine(torch.cat([a, a]), torch.cat([b, a]), torch.cat([ys, ys]))
    assert two.item() == pytest.approx((1 / math.sqrt(2) + 1) / 2)


def test_error_cosine_across_sequences_against_numpy():
    import numpy as np

    g = torch.Generator().manual_seed(0)
    ys = torch.randn(6, 5, generator=g, dtype=torch.float64)
    layers = ys + torch.randn(2, 6, 5, generator=g, dtype=torch.float64)  # [layer, seq, t]
    learner = ys + torch.randn(3, 6, 5, generator=g, dtype=torch.float64)  # [step, seq, t]
    it = Iterates(torch.arange(3), learner, None, {}, "gd")
    sim = alignment.similarity(layers, it, ys, t_min=2, t_max=4, over="sequences", n_boot=2)
    ra, rb = (layers - ys).numpy(), (learner - ys).numpy()
    want = np.zeros((2, 3))
    for layer in range(2):
        for step in range(3):
            cos = [ra[layer, :, t] @ rb[step, :, t]
                   / np.linalg.norm(ra[layer, :, t]) / np.linalg.norm(rb[step, :, t])
                   for t in range(2, 5)]  # one cosine across the 6 sequences per position
            want[layer, step] = np.mean(cos)
    np.testing.assert_allclose(sim.values.numpy(), want, rtol=1e-12, atol=1e-12)


def test_weight_cosine_spd_ilwd_by_hand():
    wa = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]])  # [batch, pos, d]
    wb = torch.tensor([[[5.0, 5.0], [1.0, 1.0], [2.0, 2.0]]])
    assert alignment.weight_cosine(wa, wb).item() == pytest.approx((1 / math.sqrt(2) + 1) / 2)
    assert alignment.ilwd(wa, wb).item() == pytest.approx((1 + 2) / 2)
    assert alignment.ilwd(wa, wb, normalized=True).item() == pytest.approx(3 / 4)
    pa, pb = torch.tensor([[7.0, 1.0, 2.0]]), torch.tensor([[0.0, 2.0, 0.0]])
    assert alignment.spd(pa, pb).item() == pytest.approx((1 + 4) / 2)
    assert alignment.spd(pa, pb, n_dims=5).item() == pytest.approx(0.5)
    # zero vectors have cosine 0, not NaN
    assert alignment.weight_cosine(torch.zeros(1, 3, 2), wb).item() == 0.0


def test_learner_with_itself_is_one_and_zero_reference():
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(64, 12, 3, generator=g)
    ys = torch.einsum("bnd,bd->bn", xs, torch.randn(64, 3, generator=g))
    it = algorithms.gd(xs, ys, steps=[1, 2, 4, 8, 16])
    sim = alignment.similarity(it.preds, it, ys)
    torch.testing.assert_close(torch.diagonal(sim.values), torch.ones(5, dtype=torch.float64))
    assert torch.all(sim.lower <= sim.values + 1e-12) and torch.all(sim.values <= sim.upper + 1e-12)
    # the zero predictor's residual is -y: error cosine with step k's residual
    expected = alignment.error_cosine(torch.zeros_like(ys)[None], it.preds, ys)
    torch.testing.assert_close(sim.zero, expected.double())
    assert sim.zero[0] > 0.9  # one tiny GD step "matches" a layer that computes nothing
    w_sim = alignment.similarity(it.weights, it, ys, metric="weight_cosine")
    torch.testing.assert_close(torch.diagonal(w_sim.values), torch.ones(5, dtype=torch.float64))
    again = alignment.similarity(it.preds, it, ys, seed=0)
    assert torch.equal(again.lower, sim.lower)  # seeded bootstrap
    other = alignment.similarity(it.preds, it, ys, seed=1)
    assert not torch.equal(other.lower, sim.lower)


def planted(values, learner="newton", higher=True, zero=None):
    v = torch.tensor(values, dtype=torch.float64)
    return Similarity("error_cosine" if higher else "spd", learner, list(range(1, v.shape[1] + 1)),
                      v, v - 0.01, v + 0.01,
                      torch.zeros(v.shape[1], dtype=torch.float64) if zero is None else zero,
                      higher, 1, 100, 0.95)


def test_match_steps_finds_a_planted_linear_trend_and_ties():
    n_layers, n_steps = 7, 20
    values = torch.full((n_layers, n_steps), 0.5)
    for layer in range(n_layers):
        values[layer, 2 * layer + 1] = 0.99  # best step = 2 * layer + 2
    values[3, 10] = 0.9895  # a tie within 1e-3 at layer 3 (step 11)
    match = alignment.match_steps(planted(values.tolist()))
    assert match.best_step == [2 * layer + 2 for layer in range(n_layers)]
    as_tensor = alignment.match_steps(planted(values.tolist()), torch.arange(1, n_steps + 1))
    assert as_tensor.best_step == match.best_step and json.loads(as_tensor.to_json())
    assert match.ties[3] == [8, 11] and match.ties[2] == [6]
    assert match.fit.slope == pytest.approx(2.0) and match.fit.intercept == pytest.approx(2.0)
    assert match.fit.r2 == pytest.approx(1.0) and match.fit.layers == list(range(1, 7))
    assert all(match.above_zero)
    # lower is better for distances; log2 fit for GD: steps 2^layer
    gd_values = torch.ones(5, 17)
    for layer in range(5):
        gd_values[layer, 2**layer - 1] = 0.0
    gd = alignment.match_steps(planted(gd_values.tolist(), learner="gd", higher=False),
                               live=[True] * 5)
    assert gd.best_step == [1, 2, 4, 8, 16] and gd.fit.log2
    assert gd.fit.slope == pytest.approx(1.0) and gd.fit.r2 == pytest.approx(1.0)


def _matched_on(grid, best):
    """A table over ``grid`` whose layer l is best at step ``best[l]`` (layer 0 dead)."""
    values = torch.full((len(best), len(grid)), 0.5)
    for layer, step in enumerate(best):
        values[layer, grid.index(step)] = 0.99
    return alignment.match_steps(planted(values.tolist(), learner="gd"), grid,
                                 live=[False] + [True] * (len(best) - 1))


def _r2(x, y):
    """R² of numpy's least-squares line."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    return 1 - ((y - np.polyval(np.polyfit(x, y, 1), x)) ** 2).sum() / ((y - y.mean()) ** 2).sum()


def test_a_doubling_grid_does_not_turn_a_linear_growth_exponential():
    """GD oracle at step 3l (ka-gd-oracle) matched on GD's grid 1, 2, 4, …: 4, 8, 8, 16, 16,
    16, 16, 32, which log₂ fits better than a line (R² 0.85 against 0.79) and read
    "exponential". Rounded to the grid, the fitted line itself leans log₂ that far, so the
    verdict is that the grid cannot tell; steps that double with depth stay exponential,
    and 3l on a grid of every step stays linear."""
    doubling = [2**k for k in range(13)]
    linear = _matched_on(doubling, [1, 4, 8, 8, 16, 16, 16, 16, 32])
    lin, log = linear.fits["linear"], linear.fits["log2"]
    layers, steps = range(1, 9), [4, 8, 8, 16, 16, 16, 16, 32]
    assert lin.r2 == pytest.approx(_r2(layers, steps)) and lin.r2 == pytest.approx(0.79, abs=5e-3)
    assert log.r2 == pytest.approx(_r2(layers, np.log2(steps)))
    # the line 3.1 l − 0.9 rounded to the grid (on a log scale) is the matched steps again
    assert on_grid([lin.slope * x + lin.intercept for x in layers], doubling) == steps
    assert linear.grid_bias["linear"] == pytest.approx(log.r2 - lin.r2)
    assert growth_verdict(lin, log, linear.grid_bias) == GRID_BENDS
    assert growth_verdict(lin, log) != GRID_BENDS  # the grid unheeded
    doubled = _matched_on(doubling, [1, 2, 4, 8, 16, 32, 64, 128, 256])
    assert growth_verdict(doubled.fits["linear"], doubled.fits["log2"],
                                    doubled.grid_bias).startswith("log₂ step ∝ layer")
    unit = _matched_on(list(range(1, 30)), [1, 3, 6, 9, 12, 15, 18, 21, 24])
    assert unit.grid_bias["linear"] < 0  # on a fine grid a line stays a line
    assert growth_verdict(unit.fits["linear"], unit.fits["log2"],
                                    unit.grid_bias) == "step ∝ layer explains better"


def test_match_steps_flags_layers_that_do_not_beat_zero():
    sim = planted([[0.96, 0.95], [0.99, 0.5]], zero=torch.tensor([0.97, 0.2], dtype=torch.float64))
    match = alignment.match_steps(sim, layers=[0, 1])
    assert match.above_zero == [False, True]


def test_serialization():
    sim = planted([[0.1, 0.9], [0.8, 0.2]])
    data = json.loads(sim.to_json())
    assert data["values"] == [[0.1, 0.9], [0.8, 0.2]] and data["learner"] == "newton"
    rows = list(csv.DictReader(io.StringIO(sim.to_csv())))
    assert len(rows) == 4 and rows[1]["step"] == "2" and float(rows[1]["value"]) == 0.9
    match = alignment.match_steps(sim, layers=[0, 1])
    assert json.loads(match.to_json())["best_step"] == [2, 1]
    assert match.to_csv().splitlines()[1].startswith("0,2,0.9")


def test_bad_input():
    it = Iterates(torch.tensor([1, 2]), torch.zeros(2, 4, 5), None, {}, "newton")
    ys = torch.zeros(4, 5)
    with pytest.raises(ValueError, match="metric must be one of"):
        alignment.similarity(torch.zeros(3, 4, 5), it, ys, metric="cka")
    with pytest.raises(ValueError, match="needs the learner's weights"):
        alignment.similarity(torch.zeros(3, 4, 5, 2), it, ys, metric="weight_cosine")
    with pytest.raises(ValueError, match=r"layer_values must have shape \[layer, 4, 5\]"):
        alignment.similarity(torch.zeros(3, 4, 6), it, ys)
    with pytest.raises(ValueError, match=r"t_min must be an integer in \[0, 4\], got 5"):
        alignment.error_cosine(ys, ys, ys, t_min=5)
    sim = planted([[0.1, 0.9]])
    with pytest.raises(ValueError, match="steps has 3 entries"):
        alignment.match_steps(sim, steps=[1, 2, 3])
    with pytest.raises(ValueError, match=r"layers \[4\] out of range"):
        alignment.match_steps(sim, layers=[4])


def test_figure_helpers_group_overlaps_and_keep_the_colour_range_useful():
    from iclprobe.alignment.output import plots

    curves = [[2.0, 1.0, 1.0], [2.0, 1.005, 0.999], [2.0, 0.5, 0.25], [1.0, 0.5, 0.251]]
    assert plots.overlapping_groups(curves) == [[0, 1], [2, 3]]  # t = 0 is not compared
    values = [[0.1, 0.2, 0.3], [0.90, 0.95, 0.99], [0.92, 0.96, 0.98]]
    sim = planted(values)
    match = alignment.match_steps(sim, live=[False, True, True])
    vmin, vmax = plots.color_range(sim, match)
    assert vmin > 0.9 and vmax == pytest.approx(0.99)  # the dead layer does not wash it out


def test_a_bootstrap_of_one_sequence_is_said_to_be_a_point(caplog):
    """One sequence resamples as itself: lower == upper, which must not read as certainty."""
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(1, 6, 2, generator=g), torch.randn(1, 6, generator=g)
    it = algorithms.iterates("gd", xs.double(), ys.double(), steps=[1, 2])
    layers = torch.stack([torch.zeros_like(ys), 0.5 * ys]).double()
    with caplog.at_level("WARNING"):
        sim = alignment.similarity(layers, it, ys.double(), n_boot=10)
    assert torch.equal(sim.lower, sim.upper)
    assert "a bootstrap over 1 sequence: every resample is that sequence, so its interval " \
           "is a point (lower == upper)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        alignment.similarity(torch.cat([layers, layers], 1), it.__class__(
            it.steps, torch.cat([it.preds, it.preds], 1), None, it.hyper), torch.cat([ys, ys])
            .double(), n_boot=10)
    assert "bootstrap over 1 sequence" not in caplog.text
