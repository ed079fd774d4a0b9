"""Verdicts in every metric's direction, the one liveness rule, and probes at the window.

Issue: a distance metric (spd, ilwd: lower is better) read its verdicts the wrong way
round; a dead layer read by probes counted as live (its error above the zero predictor's);
a model aligned at its last position had its probes fitted at prefixes where it diverges.
"""

import dataclasses

import pytest
import torch

from iclprobe import algorithms, tasks
from iclprobe.alignment import comparison as C
from iclprobe.alignment.measuring.liveness import live_layers
from iclprobe.alignment.measuring.runs import run_spec
from iclprobe.alignment.metrics import METRIC_INFO
from iclprobe.alignment.pipeline import AlignConfig, align, align_layers
from iclprobe.alignment.protocols import ICLPROBE
from iclprobe.constructions import benchmark as B
from iclprobe.constructions import power as P
from iclprobe.constructions import scoring as S
from iclprobe.constructions.pq import newton_transformer

BUILT_IN = ("error_cosine", "weight_cosine", "spd", "ilwd")


@pytest.fixture(scope="module")
def data():
    batch = tasks.RegressionTask(n_dims=4, n_points=12).sample(256, generator=3)
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    newton = run_spec(ICLPROBE.runs["newton"], batch, 0, True, stats)
    gd = run_spec(ICLPROBE.runs["gd"], batch, 0, True, stats)
    return batch, newton, gd


def _iv(value, lower, upper):
    return C.Interval([value], [lower], [upper])


def _score(run, value, lower, upper):
    return C.LearnerScore(run, "m", [1], ["1"], _iv(value, lower, upper))


@pytest.mark.parametrize("higher", [True, False])
def test_verdicts_follow_the_metrics_direction(higher):
    # A is closer: for a similarity its value is higher (A − B > 0), for a distance lower
    sign = 1.0 if higher else -1.0
    a = _score("a", sign * 0.9, sign * 0.9 - 0.01, sign * 0.9 + 0.01)
    b = _score("b", sign * 0.5, sign * 0.5 - 0.01, sign * 0.5 + 0.01)
    diff = _iv(sign * 0.4, sign * 0.4 - 0.02, sign * 0.4 + 0.02)
    # B imitates A's matched step far worse than the layer matches A: "prefers a"
    cal = C.Calibration("a", "b", "m", [sign * 0.2], ["1"], [sign * 0.2], ["1"])
    assert C.verdicts(a, b, diff, cal, [True], higher) == ["prefers a"]
    # and B imitating it better than the layer does: only "leans a"
    close = C.Calibration("a", "b", "m", [sign * 0.95], ["1"], [sign * 0.95], ["1"])
    assert C.verdicts(a, b, diff, close, [True], higher) == ["leans a"]


@pytest.mark.parametrize("metric", BUILT_IN)
def test_every_built_in_metric_names_an_exact_learner_layer_the_right_way_round(data, metric):
    batch, newton, gd = data
    layers = torch.stack([torch.zeros_like(newton.preds[0]), newton.preds[3], gd.preds[4]])
    weights = torch.stack([torch.zeros_like(newton.weights[0]), newton.weights[3],
                           gd.weights[4]])[:, :16]
    cfg = AlignConfig(algorithms=("newton", "gd"), metrics=(metric,), separation=False,
                      n_boot=100)
    res = align_layers(layers, batch, cfg, layer_weights=weights)
    protocol = res.comparisons[metric].pairs[0]
    assert METRIC_INFO[metric].higher_is_better == (metric.endswith("cosine"))
    for labels in (protocol.verdicts, res.fitted[metric].verdicts):
        assert labels[0] == "computes nothing"
        assert labels[1] in ("prefers newton", "leans newton"), (metric, labels)
        assert labels[2] in ("prefers gd", "leans gd"), (metric, labels)
    assert protocol.verdicts[1:] == ["prefers newton", "prefers gd"]


def test_liveness_is_the_error_below_the_zero_predictors_beyond_its_interval(data):
    batch, newton, _ = data
    ys = batch.ys.double()
    g = torch.Generator().manual_seed(0)
    noise = 0.05 * torch.randn(ys.shape, generator=g, dtype=torch.float64)
    # a gain per sequence u_b y, u_b of mean 0.06 and spread 0.3: the mean error is a little below
    # the zero predictor's, but by far less than the sequences' spread
    z = torch.randn(ys.shape[0], 1, generator=g, dtype=torch.float64)
    gain = 0.06 + 0.3 * (z - z.mean()) / z.std()  # E (u² − 2u) = −0.026 per unit of y²
    # 0; y (error 0); a Newton step; pure noise (a probe's overfit on a dead layer: error
    # above the zero predictor's); the noisy gain; 1e-3 y (a consistent, tiny gain)
    layers = torch.stack([torch.zeros_like(ys), ys, newton.preds[3], noise, gain * ys,
                          1e-3 * ys])
    live = live_layers(layers, ys, (1, 11), n_boot=200, confidence=0.95, seed=0)
    assert live == [False, True, True, False, False, True]
    # the point estimates: only the interval keeps the noisy gain out
    err = (layers[:, :, 1:] - ys[:, 1:]).pow(2).mean(-1) - ys[:, 1:].pow(2).mean(-1)
    assert (err.mean(-1) < 0).tolist() == [False, True, True, False, True, True]


def test_a_layer_not_below_the_zero_predictor_gets_no_verdict_from_any_view(data):
    batch, newton, gd = data
    ys = batch.ys.double()
    g = torch.Generator().manual_seed(2)
    # a dead layer read by a probe: tiny noise, error just above the zero predictor's,
    # whose weights happen to point like GD's (the weight cosine alone would call it live)
    dead = 0.02 * torch.randn(ys.shape, generator=g, dtype=torch.float64)
    layers = torch.stack([dead, newton.preds[3]])
    weights = torch.stack([0.01 * gd.weights[2], newton.weights[3]])[:, :16]
    cfg = AlignConfig(algorithms=("newton", "gd"), metrics=BUILT_IN, separation=False)
    res = align_layers(layers, batch, cfg, layer_weights=weights)
    assert res.live == [False, True]
    for metric in BUILT_IN:
        assert res.comparisons[metric].pairs[0].verdicts[0] == "computes nothing"
        assert res.fitted[metric].verdicts[0] == "computes nothing"
    assert res.verdict[0] == "computes nothing"
    assert res.spectral is not None and res.spectral.reading[0] == "computes nothing"


@pytest.mark.parametrize("n_dims,n_points", [(3, 9), (10, 21)])
@pytest.mark.slow
def test_newton_construction_read_by_probes_at_its_last_position_gets_verdicts(n_dims, n_points):
    # it diverges at short prefixes (α_t is tuned to the last); probes fitted there met
    # NaN residuals and torch's eigh failed — now they are fitted where it is aligned
    task = tasks.RegressionTask(n_dims=n_dims, n_points=n_points)
    cfg = AlignConfig(n_sequences=192, n_boot=20, algorithms=("newton", "gd"),
                      separation=False, positions="last")
    batch = task.sample(192, generator=torch.Generator().manual_seed(0))
    t = torch.tensor(float(n_points - 1))
    top = torch.linalg.eigvalsh(batch.xs[:, :-1].double().mT @ batch.xs[:, :-1].double())
    bound = float(2.0 / (top[:, -1] / t).pow(2).max())
    model = newton_transformer(n_dims, 12, a=0.5 * bound)
    model.task = task
    model.exact_layer_readout = False
    res = align(model, cfg)
    assert res.readout.startswith("ridge probes")
    assert any(v == "prefers newton" for v in res.verdict)
    assert not any(v in ("prefers gd", "leans gd") for v in res.verdict)


def test_the_verdict_combines_its_verdict_metrics_else_every_metric_computed(data):
    batch, newton, gd = data
    layers = torch.stack([torch.zeros_like(newton.preds[0]), newton.preds[3]])
    weights = torch.stack([torch.zeros_like(newton.weights[0]), newton.weights[3]])[:, :16]
    both = AlignConfig(algorithms=("newton", "gd"), metrics=("error_cosine", "ilwd"),
                       separation=False, n_boot=50)
    res = align_layers(layers, batch, both, layer_weights=weights)
    assert [p.metric for p in res.verdict_pairs] == ["error_cosine"]  # ilwd: verdict=False
    assert not METRIC_INFO["ilwd"].verdict and METRIC_INFO["spd"].verdict
    alone = align_layers(layers, batch, dataclasses.replace(both, metrics=("ilwd",)),
                         layer_weights=weights)
    assert [p.metric for p in alone.verdict_pairs] == ["ilwd"]
    assert alone.verdict == alone.fitted["ilwd"].verdicts


@pytest.mark.parametrize("view, named, other", [
    ("verdict", "prefers gd", "indistinguishable"),
    (S.ANSWER, "gd (1/λmax, step 3)", "cannot tell gd from momentum")])
def test_probe_power_pairs_each_probe_cell_with_its_exact_twin(view, named, other):
    def result(readout, labels):
        cell = B.Cell("gd oracle", "iclprobe", "isotropic", readout, 1.0)
        return B.CellResult(cell, False, {}, {view: labels}, {})

    exact = result("exact", ["computes nothing", named, named, "leans gd", named, named])
    probe = result("probe", ["computes nothing", named, other, named, named, named])
    (power,) = P.probe_power([exact, probe], view)
    # the exact readout names GD at 4 layers; probes at 3 of those (layer 3 is not counted)
    assert (power.named_exactly, power.named_by_probe, power.short) == (4, 3, True)
    assert (power.within, power.named_within) == (4, 3)  # no separability through probes
    assert P.ProbePower(probe.cell, 5, 4, 5, 4).short is False


def test_separable_reads_a_distance_from_zero_and_a_cosine_from_one():
    cal = C.Calibration("newton", "gd", "spd", [0.02], ["1"], [0.02], ["1"])
    pair = C.PairVerdict("newton", "gd", "spd", _iv(-0.05, -0.065, -0.035), cal, [""], "")
    assert not S.separable(pair, "newton", 0)  # the rival's 0.02 is not above the width 0.03
    narrow = dataclasses.replace(pair, difference=_iv(-0.05, -0.055, -0.045))
    assert S.separable(narrow, "newton", 0)
    wide = dataclasses.replace(pair, difference=_iv(-0.05, -0.08, -0.03))
    assert not S.separable(wide, "newton", 0)
    cos = dataclasses.replace(narrow, metric="error_cosine",
                              calibration=dataclasses.replace(cal, a_by_b=[0.98]))
    assert S.separable(cos, "newton", 0)  # 1 − 0.98 = 0.02 > 0.01
    assert not S.separable(dataclasses.replace(cos, difference=_iv(0.05, 0.0, 0.1)), "newton", 0)
