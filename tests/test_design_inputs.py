"""The designed evaluation's inputs checked, and the settings it has to live with.

Each bad input is refused with a ValueError or TypeError naming the argument and the value
(they escaped as a bare OverflowError, "math domain error", AttributeError or torch error);
a model aligned from a later position, or read with fewer sequences than the designed data's
shorter sequences need, still gets its answer.
"""

import dataclasses
import math

import pytest
import torch
from helpers import designed_text

from iclprobe import models, tasks
from iclprobe.alignment import AlignConfig, align
from iclprobe.alignment import design as D
from iclprobe.alignment.design.family import spectrum
from iclprobe.cli import main
from iclprobe.constructions.oracle import oracle

CFG = AlignConfig(n_sequences=64, n_boot=20, separation=False)
GOOD = dict(condition_number=10.0, shape="geometric", n_points=9, noise_std=0.0,
            query="context")


@pytest.mark.parametrize(("change", "says"), [
    ({"condition_number": -5}, "Distribution.condition_number must be a number in [1, 1e6], "
                               "got -5"),
    ({"condition_number": True}, "Distribution.condition_number must be a number"),
    ({"shape": "foo"}, "Distribution.shape must be one of ('geometric', 'linear'), got 'foo'"),
    ({"n_points": "x"}, "Distribution.n_points must be an integer >= 2, got 'x'"),
    ({"noise_std": math.nan}, "Distribution.noise_std must be a number >= 0, got nan"),
    ({"query": "far"}, "Distribution.query must be one of"),
    ({"scale": 1e155}, "top × scale² = 1.0 × 1e+155² lies outside [1e-30, 1e+30]"),
    ({"top": 1e80}, "top × scale² = 1e+80 × 1.0² lies outside"),
    ({"scale": 1e-200}, "top × scale² = 1.0 × 1e-200² lies outside"),
    ({"scale": 0.0}, "Distribution.scale must be a number > 0, got 0.0"),
])
def test_a_distribution_is_checked_when_it_is_made(change, says):
    with pytest.raises(ValueError) as err:
        D.Distribution(**{**GOOD, **change})
    assert says in str(err.value)


def test_a_distribution_at_the_edge_of_float32_samples_finite_data():
    data = D.Distribution(**GOOD, scale=1e15).task(4, 0).sample(8, generator=0)
    assert bool(data.xs.isfinite().all()) and bool(data.ys.isfinite().all())


@pytest.mark.parametrize(("field", "value", "says"), [
    ("condition_numbers", (0.0, 10.0), "DesignFamily.condition_numbers must be a number in "
                                       "[1, 1e6], got 0.0"),
    ("condition_numbers", "10", "DesignFamily.condition_numbers must be a tuple of values, "
                                "got '10'"),
    ("condition_numbers", (True,), "got True"),
    ("examples", (math.nan,), "DesignFamily.examples must be a number > 0, got nan"),
    ("examples", (-1.0,), "DesignFamily.examples must be a number > 0, got -1.0"),
    ("noise", ("a",), "DesignFamily.noise must be a number >= 0, got 'a'"),
    ("noise", (-0.5,), "DesignFamily.noise must be a number >= 0, got -0.5"),
    ("queries", "context", "DesignFamily.queries must be a tuple of values, got 'context'"),
    ("shapes", (), "DesignFamily.shapes must not be empty"),
    ("n_sequences", True, "DesignFamily.n_sequences must be an integer >= 8, got True"),
])
def test_a_design_family_is_checked_when_it_is_made(field, value, says):
    with pytest.raises((ValueError, TypeError)) as err:
        D.DesignFamily(**{field: value})
    assert says in str(err.value)


@pytest.mark.parametrize(("args", "says"), [
    ((0, 10.0, "geometric"), "spectrum.n_dims must be a positive integer, got 0"),
    ((5.5, 10.0, "geometric"), "spectrum.n_dims must be a positive integer, got 5.5"),
    ((5, True, "geometric"), "spectrum.condition_number must be a number in [1, 1e6], got True"),
    ((5, 10.0, "geometric", True), "spectrum.top must be a number > 0, got True"),
])
def test_a_spectrum_names_its_bad_argument(args, says):
    with pytest.raises(ValueError) as err:
        spectrum(*args)
    assert says in str(err.value)


@pytest.fixture(scope="module")
def gd_oracle():
    model = oracle("gd", 4, 6, lambda layer: 2 * layer, lr="max", normalize=True,
                   task=tasks.RegressionTask(n_dims=4, n_points=13))
    return model, align(model, CFG, name="gd")


@pytest.mark.slow
def test_wrong_types_are_named(gd_oracle):
    model, res = gd_oracle
    cases = [(lambda: D.design_evaluation(None, res, CFG), "design_evaluation: model must be "
              "an iclprobe model (a Regressor), got NoneType"),
             (lambda: D.design_evaluation(model, "x", CFG), "res must be align's AlignResult"),
             (lambda: D.design_evaluation(model, res, {"n_sequences": 32}), "cfg must be an "
              "AlignConfig, got dict"),
             (lambda: D.design_evaluation(model, res, CFG, {"n_sequences": 8}), "family must be "
              "a DesignFamily"),
             (lambda: D.design_evaluation(model, res, CFG, seed=-1), "design_evaluation.seed "
              "must be an integer seed"),
             (lambda: D.align_designed(model, CFG, own="x"), "align_designed: own must be"),
             (lambda: D.align_designed(model, CFG, design="x"), "design must be a Design"),
             (lambda: D.contending_pairs(None), "contending_pairs: res must be"),
             (lambda: D.Design(D.Distribution(**GOOD), math.inf, 0.0, [], {}, 0),
              "Design.objective must be a number >= 0, got inf"),
             (lambda: D.design_evaluation(model, res, CFG, D.DesignFamily(n_sequences=10**12)),
              "DesignFamily.n_sequences=1000000000000: judging a distribution needs at least")]
    for call, says in cases:
        with pytest.raises((ValueError, TypeError)) as err:
            call()
        assert says in str(err.value)


def test_a_result_of_another_model_is_refused():
    pq = models.load("pq-isotropic-1layer")  # claims its own preconditioned GD
    cfg = dataclasses.replace(CFG, n_sequences=32)
    res = align(pq, cfg, name="pq")
    gd = oracle("gd", 5, 1, [0, 1], lr="max", normalize=True, task=pq.task)
    with pytest.raises(ValueError, match=r"names candidates \['pgd_own'.*neither registered"):
        D.design_evaluation(gd, res, cfg)
    other_d = oracle("gd", 3, 1, [0, 1], lr="max", normalize=True,
                     task=tasks.RegressionTask(n_dims=3, n_points=21))
    with pytest.raises(ValueError, match="n_dims 5, the model's evaluation task has n_dims 3"):
        D.design_evaluation(other_d, res, cfg)


@pytest.mark.slow
def test_a_model_aligned_from_a_later_position_gets_designs_that_reach_it(gd_oracle):
    # from t = 6 on: 5 examples (m = 1 at d = 4) end before it; the search refused such a
    # design with "t_min=6, t_max=4: need t_min <= t_max <= 4 for 5 points"
    model, _ = gd_oracle
    cfg = dataclasses.replace(CFG, t_min=6)
    res = align(model, cfg, name="gd")
    family = D.DesignFamily(condition_numbers=(1.0, 100.0), noise=(0.0,), n_sequences=16)
    design = D.design_evaluation(model, res, cfg, family)
    assert {d.n_points for d, _ in design.tried} == {7, 9, 13}
    assert family.n_options(4, 13, False) == [13, 5, 7, 9]  # without a first position: all


@pytest.mark.slow
def test_designed_data_too_short_for_the_probes_leave_the_own_answer():
    # a GPT read by probes fitted on the other folds' sequences: 4 sequences of 21 points
    # give its 64 residual features enough rows, 9 points do not
    model = models.load("gpt-linear-paired")
    cfg = dataclasses.replace(CFG, n_sequences=4, n_boot=10)
    short = D.Design(D.Distribution(**GOOD), 1.0, 0.0, [], {}, 0)
    done = D.align_designed(model, cfg, "gpt", design=short)
    assert done.own.answer is not None and done.designed is None
    assert not done.out_of_distribution and "too few rows for the probes" in done.not_read
    assert "cannot be read with these settings" in designed_text(done)
    assert done.to_dict()["not_read"] == done.not_read


@pytest.mark.slow  # a design search through the CLI; the search itself: the tests above
def test_align_design_verbose_prints_the_design(capsys):
    assert main(["align", "ka-gd-pq", "--design", "--verbose", "--n-sequences", "32",
                 "--n-boot", "10", "--no-separation", "--algorithms", "gd,newton"]) == 0
    out = capsys.readouterr().out
    assert "designed evaluation:" in out and "the model's error ÷ the zero predictor's" in out


@pytest.mark.parametrize("prior", ["standard", "inverse-cov", "rotated"])
def test_the_designed_data_keep_the_own_tasks_prior_of_w(prior):
    # the family varies Σ, n, noise and the query; w's prior is the model's own (a PQ
    # model trained on w ~ N(0, Σ⁻¹) was aligned on designed data with w ~ N(0, I))
    own = tasks.RegressionTask(n_dims=4, n_points=9, cov="rotated", w_prior=prior, seed=7)
    start = D.nearest_distribution(own, D.DesignFamily())
    assert start.w_prior == prior and start.w_seed == (7 if prior == "rotated" else None)
    for kappa in (1.0, 100.0):
        there = dataclasses.replace(start, condition_number=kappa, scale=1.3).task(4, 0)
        cov = there.covariance
        expected = {"standard": torch.eye(4, dtype=torch.float64),
                    "inverse-cov": torch.linalg.inv(cov),
                    "rotated": own.w_covariance}[prior]
        torch.testing.assert_close(there.w_covariance, expected)
        # the sampled w have it: their second moment over many sequences
        ws = there.sample(20000, generator=1, dtype=torch.float64).ws
        moment = ws.T @ ws / ws.shape[0]
        assert float((moment - expected).abs().max()) < 0.1 * float(expected.abs().max())
    assert ("Σ⁻¹" in start.text) == (prior == "inverse-cov")
    assert ("Σ_w) as on its own task" in start.text) == (prior == "rotated")


@pytest.mark.parametrize(("change", "says"), [
    ({"w_prior": "flat"}, "Distribution.w_prior must be one of"),
    ({"w_prior": "rotated"}, "w_seed (the own task's seed, which fixes Σ_w) is given with "
                             "w_prior='rotated' and only then, got w_seed=None"),
    ({"w_seed": 3}, "got w_seed=3 with w_prior='standard'"),
    ({"w_prior": "rotated", "w_seed": -1}, "Distribution.w_seed must be"),
])
def test_a_distributions_prior_is_checked(change, says):
    with pytest.raises(ValueError) as err:
        D.Distribution(**{**GOOD, **change})
    assert says in str(err.value)
