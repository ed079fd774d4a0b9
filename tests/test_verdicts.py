"""Learner tables, calibrated verdicts, fits over live layers, and family-aware alignment."""

import math

import pytest
import torch
from helpers import tiny_gpt

from iclprobe import algorithms, models, tasks
from iclprobe.alignment import comparison as C
from iclprobe.alignment.measuring.matching import fit_line, fit_steps, match_steps
from iclprobe.alignment.measuring.runs import run_spec
from iclprobe.alignment.measuring.similarities import similarity
from iclprobe.alignment.output.tables import text_table
from iclprobe.alignment.pipeline import AlignConfig, align, align_layers
from iclprobe.alignment.protocols import ICLPROBE

CFG = AlignConfig(metrics=("error_cosine",), separation=False, n_boot=100)


@pytest.fixture(scope="module")
def data():
    batch = tasks.RegressionTask(n_dims=4, n_points=12).sample(256, generator=3)
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    newton = run_spec(ICLPROBE.runs["newton"], batch, 0, False, stats)
    gd = run_spec(ICLPROBE.runs["gd"], batch, 0, False, stats)
    return batch, newton, gd


def test_exact_learner_layers_get_calibrated_verdicts(data):
    batch, newton, gd = data
    # layer 0 computes nothing; layer 1 is Newton step 3; layer 2 is GD step 16
    layers = torch.stack([torch.zeros_like(newton.preds[0]), newton.preds[3], gd.preds[4]])
    res = align_layers(layers, batch, AlignConfig(algorithms=("newton", "gd"),
                                                  metrics=("error_cosine",), separation=False))
    pair = res.comparisons["error_cosine"].pairs[0]
    assert (pair.a, pair.b) == ("newton", "gd")
    assert pair.verdicts == ["computes nothing", "prefers newton", "prefers gd"]
    assert res.live == [False, True, True]
    assert res.matches["newton"]["error_cosine"].best_step[1] == 3
    assert res.matches["gd"]["error_cosine"].best_step[2] == 16
    # the calibration numbers are the learners' own cross-similarities
    table = similarity(newton.preds, gd, batch.ys.double(), n_boot=2)
    assert pair.calibration.a_by_b[1] == pytest.approx(float(table.values[3].max()))
    assert pair.calibration.b_by_a[2] == pytest.approx(float(table.values[:, 4].max()))
    assert pair.difference.lower[1] > 0 > pair.difference.upper[2]
    assert "prefers newton at layer 1" in pair.sentence and "prefers gd at layer 2" in \
        pair.sentence


def test_a_noisy_learner_leans_but_is_not_attributed(data):
    batch, newton, _ = data
    # Newton step 3 plus noise: still closer to Newton than to GD, but GD imitates Newton
    # step 3 better than this layer does, so the metric cannot attribute it
    g = torch.Generator().manual_seed(1)
    noisy = newton.preds[3] + 0.3 * torch.randn(newton.preds[3].shape, generator=g,
                                                dtype=torch.float64)
    layers = torch.stack([torch.zeros_like(noisy), noisy])
    res = align_layers(layers, batch, AlignConfig(algorithms=("newton", "gd"),
                                                  metrics=("error_cosine",), separation=False))
    pair = res.comparisons["error_cosine"].pairs[0]
    score = res.comparisons["error_cosine"].scores["newton"].score
    assert pair.difference.lower[1] > 0  # significantly closer to Newton ...
    assert score.value[1] < pair.calibration.a_by_b[1]  # ... farther from it than GD is
    assert pair.verdicts[1] == "leans newton"
    assert "within the learners' own resemblance at layer 1" in pair.sentence


def test_identical_tables_have_a_zero_difference_and_paired_intervals(data):
    batch, newton, gd = data
    layers = newton.preds[[0, 2, 5]]
    sim = similarity(layers, newton, batch.ys.double(), seed=4)
    diff = C.difference(sim, sim)
    assert diff.value == [0.0, 0.0, 0.0] and diff.lower == [0.0] * 3 == diff.upper
    with pytest.raises(ValueError, match=r"same sequences and bootstrap, got \(learner, "
                                         r"sequences, replicates\) \('newton', 256, 200\) and "
                                         r"\('newton', 100, 200\)"):
        C.difference(sim, similarity(layers[:, :100], algorithms.Iterates(
            newton.steps, newton.preds[:, :100], None, {}, "newton"), batch.ys[:100].double()))
    # the best-of-steps interval is re-picked per replicate: it covers the point estimate
    score = C.learner_score(sim, match_steps(sim).best_column)
    for v, lo, hi in zip(score.score.value, score.score.lower, score.score.upper):
        assert lo - 1e-12 <= v <= hi + 1e-12


def test_fits_are_undefined_for_short_or_constant_series():
    assert fit_line([1, 2, 3], [5.0, 5.0, 5.0]) is None
    flat = fit_steps([1, 2, 3, 4], [7, 7, 7, 7], log2=False)
    assert not flat.defined and flat.r2 is None and "constant" in flat.reason
    short = fit_steps([3, 4], [2, 5], log2=False)
    assert not short.defined and "2 layers to fit, 3 needed" in short.reason
    zero = fit_steps([1, 2, 3], [0, 4, 8], log2=True)
    assert not zero.defined and "step 0 at layers [1] has no log2" in zero.reason
    ok = fit_steps([1, 2, 3], [2, 4, 8], log2=True)
    assert ok.slope == pytest.approx(1.0) and ok.r2 == pytest.approx(1.0)
    assert "undefined" in flat.describe() and "slope 1.00, R² 1.00" in ok.describe()


def test_dead_layers_are_left_out_of_the_fits(data):
    batch, newton, gd = data
    # two dead layers (zero predictions), then Newton steps 2, 4, 6, 8
    layers = torch.stack([torch.zeros_like(newton.preds[0])] * 3
                         + [newton.preds[k] for k in (2, 4, 6, 8)])
    res = align_layers(layers, batch, AlignConfig(algorithms=("newton",),
                                                  metrics=("error_cosine",), separation=False))
    m = res.matches["newton"]["error_cosine"]
    assert m.above_zero == [False, False, False, True, True, True, True]
    assert m.fit.layers == [3, 4, 5, 6] and m.fit.slope == pytest.approx(2.0)
    assert m.fit.r2 == pytest.approx(1.0)
    everything = align_layers(layers, batch, AlignConfig(
        algorithms=("newton",), metrics=("error_cosine",), separation=False, fit_layers="all"))
    assert everything.matches["newton"]["error_cosine"].fit.layers == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_a_pq_model_is_aligned_where_it_was_trained():
    g = torch.Generator().manual_seed(0)
    a = [0.3 * torch.eye(3) + 0.05 * torch.randn(3, 3, generator=g) for _ in range(3)]
    model = models.PQTransformer.from_matrices(A=a)
    model.task = tasks.RegressionTask(n_dims=3, n_points=9, cov="rotated",
                                      w_prior="inverse-cov")
    res = align(model, AlignConfig(n_sequences=128, n_weight_sequences=32, n_boot=52))
    assert res.positions == "last" and res.window == (8, 8) and "exact readout" in res.readout
    for metric in ("error_cosine", "weight_cosine"):
        own = res.matches["pgd_own"][metric]
        assert own.best_step == [0, 1, 2, 3]
        assert min(own.best_value[1:]) > 1 - 1e-5  # layer l is exactly l steps of its A's
        assert own.fit.slope == pytest.approx(1.0) and own.fit.r2 == pytest.approx(1.0)
    assert res.similarities["newton"]["error_cosine"].over == "sequences"
    assert res.meaningless is None and res.notes == []
    # the same model read on every prefix is still exact at every prefix
    every = align(model, AlignConfig(n_sequences=64, metrics=("error_cosine",), n_boot=20,
                                     positions="all", separation=False))
    assert every.window == (1, 8) and every.matches["pgd_own"]["error_cosine"].best_step[3] == 3


def test_a_pq_model_with_b_gets_a_note():
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 2,
                                               B=[0.1 * torch.eye(3)] * 2)
    model.task = tasks.RegressionTask(n_dims=3, n_points=8)
    res = align(model, AlignConfig(n_sequences=64, metrics=("error_cosine",), n_boot=20))
    assert any("B = 0" in n and "max |B| 0.1" in n for n in res.notes)


def test_an_untrained_model_gets_one_line_instead_of_numbers():
    model = tiny_gpt("softmax", "interleaved", seed=3)
    model.task = tasks.RegressionTask(n_dims=3, n_points=8)
    res = align(model, AlignConfig(n_sequences=64, n_probe_sequences=64, n_boot=20,
                                   metrics=("error_cosine",), separation=False))
    assert res.meaningless and "does not solve this task" in res.meaningless
    text = text_table(res)
    assert "no alignment: the model does not solve this task" in text
    assert "learner table" not in text


def test_non_finite_layer_predictions_are_refused(data):
    batch, newton, _ = data
    layers = newton.preds[:3].clone()
    layers[1, 0, 2] = math.nan
    with pytest.raises(ValueError, match="layer predictions .* not finite"):
        align_layers(layers, batch, CFG)
    sim = similarity(newton.preds[:3], newton, batch.ys.double())
    sim.values[1, 1] = math.nan
    with pytest.raises(ValueError, match="holds NaN or Inf"):
        match_steps(sim)


def test_a_layer_that_predicts_but_matches_no_learner_run_says_so(data):
    batch, newton, _ = data
    # an oracle layer (its predictions are y: error 0) is no closer to Newton or GD than the
    # zero predictor is, yet it plainly computes something: not "computes nothing"
    ys = batch.ys.double()
    layers = torch.stack([torch.zeros_like(ys), ys, newton.preds[3]])
    res = align_layers(layers, batch, AlignConfig(algorithms=("newton", "gd"),
                                                  metrics=("error_cosine",), separation=False))
    pair = res.comparisons["error_cosine"].pairs[0]
    # live: its error (0) is below the zero predictor's; the zero layer's is not
    assert res.live == [False, True, True]
    assert pair.verdicts[:2] == ["computes nothing", "matches no learner"]
    assert ("computes, but no learner run matches it better than the zero predictor does at "
            "layer 1") in pair.sentence
    assert "computes nothing (error not below the zero predictor's) at layer 0" in pair.sentence


def test_an_algorithm_the_model_cannot_have_is_refused_before_the_forward_work(monkeypatch):
    import iclprobe.alignment.pipeline as pipeline

    model = tiny_gpt()
    model.task = tasks.RegressionTask(n_dims=3, n_points=8)

    def no_forward(*args, **kwargs):
        raise AssertionError("the forward pass ran before the algorithms were checked")

    monkeypatch.setattr(pipeline, "read_layers", no_forward)
    with pytest.raises(ValueError, match=r"algorithms: 'pgd_own' cannot be run on tiny; "
                                         r"available here: newton, gd"):
        align(model, AlignConfig(algorithms=("newton", "pgd_own"), n_sequences=32), name="tiny")


def test_tables_of_other_metrics_say_their_dagger_comes_from_the_error_cosine():
    g = torch.Generator().manual_seed(0)
    model = models.PQTransformer.from_matrices(
        A=[0.3 * torch.eye(3) + 0.05 * torch.randn(3, 3, generator=g) for _ in range(2)])
    model.task = tasks.RegressionTask(n_dims=3, n_points=9)
    res = align(model, AlignConfig(n_sequences=64, n_weight_sequences=16, n_boot=20,
                                   separation=False))
    error, weight = text_table(res, "error_cosine"), text_table(res, "weight_cosine")
    assert "(† = no better than the zero predictor's similarity)" in error
    assert "† = a layer not live by the error cosine" in weight
    heading = [" ".join(line.strip() for line in text.split("\nbest step per layer")[0].split("\n"))
               for text in (error, weight)]  # the first line, wrapped within 100 columns
    assert "(error cosine across sequences)" in heading[0]
    assert "across sequences" not in heading[1]


def test_a_familys_registered_runs_are_the_runs_its_models_claim():
    # AlignConfig accepts a family's runs by their registered names: they must be the keys
    # its models' claimed_learners give align
    from iclprobe.models.registry import FAMILIES

    batch = tasks.RegressionTask(n_dims=3, n_points=8).sample(8, generator=0)
    from iclprobe.constructions import oracle

    made = {"gpt": tiny_gpt(), "pq": models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)]),
            "lstm": models.LSTMRegressor(models.LSTMConfig(n_dims=3, n_positions=8)),
            "oracle": oracle("gd", 3, 2, lr="max")}
    assert set(made) == set(FAMILIES)
    for name, model in made.items():
        runs, _ = model.claimed_learners(batch)
        assert sorted(runs) == sorted(FAMILIES[name].runs), name


def test_the_matched_column_is_the_first_within_round_off():
    """Columns equal in exact arithmetic are not chosen between by their last bits."""
    from iclprobe.alignment.measuring.similarities import first_best

    scored = torch.tensor([[0.5, 0.5 + 1e-15, 0.3],  # round-off: the first
                           [0.5, 0.5 + 1e-9, 0.3],  # a real difference: the better
                           [-2e3, -2e3 + 1e-10, -5e3],  # relative to the row's scale
                           [0.1, 0.2, 0.2]], dtype=torch.float64)
    assert first_best(scored).tolist() == [0, 1, 0, 1]
    assert scored.argmax(1).tolist()[0] == 1  # what a plain argmax picks
    # a column and its scaled copy are one column under the weight cosine: the first wins,
    # in either order of the family
    b = tasks.RegressionTask(n_dims=3, n_points=8).sample(16, generator=0)
    it = algorithms.newton(b.xs.double(), b.ys.double(), steps=[0], alpha="frobenius")
    layers = it.weights[[0]] * 1.7
    for scale in (3.0, 1 / 3.0):
        both = algorithms.Iterates(torch.tensor([0, 0]), torch.cat([it.preds, scale * it.preds]),
                                   torch.cat([it.weights, scale * it.weights]), {}, "newton")
        sim = similarity(layers, both, b.ys, "weight_cosine", n_boot=2)
        assert first_best(sim.values).tolist() == [0]
