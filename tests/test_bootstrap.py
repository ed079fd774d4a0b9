"""The bootstrap's intervals: numpy's type-6 quantiles, Hesterberg's expanded levels, and
their coverage where the answer is known (means of normal draws)."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from iclprobe.alignment.measuring.bootstrap import (
    bootstrap_weights,
    few_resamples_note,
    fewest_resamples,
    interval,
    levels,
    lower_end,
    quantiles,
)


@pytest.mark.parametrize("n_boot", [1, 2, 7, 100, 200, 999])
def test_quantiles_are_numpys_weibull_quantiles(n_boot):
    g = torch.Generator().manual_seed(n_boot)
    boot = torch.randn(3, 4, n_boot, generator=g, dtype=torch.float64)
    probs = (0.0, 0.001, 0.0139, 0.025, 0.5, 0.975, 0.999, 1.0)
    want = np.quantile(boot.numpy(), probs, axis=-1, method="weibull")
    np.testing.assert_allclose(quantiles(boot, probs).numpy(), want, rtol=0, atol=1e-15)


def test_quantiles_skip_nan_as_numpys_nanquantile_and_nan_rows_stay_nan():
    g = torch.Generator().manual_seed(0)
    boot = torch.randn(5, 50, generator=g, dtype=torch.float64)
    boot[0, :7] = math.nan
    boot[1, ::3] = math.nan
    boot[2] = math.nan  # nothing left
    probs = (0.025, 0.975)
    got = quantiles(boot, probs, skip_nan=True).numpy()
    for row in (0, 1, 3, 4):
        want = np.nanquantile(boot[row].numpy(), probs, method="weibull")
        np.testing.assert_allclose(got[:, row], want, rtol=0, atol=1e-15)
    assert np.isnan(got[:, 2]).all()
    plain = quantiles(boot, probs).numpy()  # without skip_nan a NaN row is NaN, as torch's
    assert np.isnan(plain[:, :3]).all() and not np.isnan(plain[:, 3:]).any()


@pytest.mark.parametrize("n", [2, 3, 16, 64, 512, 10_000])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_levels_are_the_expanded_percentile_levels(n, confidence):
    # Hesterberg (2015): z at the new level is sqrt(n / (n - 1)) t_{n-1} at the asked one
    alpha = 1 - confidence
    z = math.sqrt(n / (n - 1)) * stats.t.ppf(1 - alpha / 2, n - 1)
    low, high = levels(confidence, n)
    assert low == pytest.approx(stats.norm.sf(z), rel=1e-9, abs=1e-300)
    assert high == pytest.approx(1 - stats.norm.sf(z), rel=1e-12)
    assert low < alpha / 2 and (n < 10_000 or low == pytest.approx(alpha / 2, rel=3e-3))
    assert levels(confidence, 1) == pytest.approx((alpha / 2, 1 - alpha / 2))


def test_the_interval_and_its_lower_end_read_the_same_levels():
    boot = torch.randn(6, 200, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    lower, upper = interval(boot, 0.95, 16)
    low, high = levels(0.95, 16)
    np.testing.assert_allclose(lower.numpy(), np.quantile(boot.numpy(), low, axis=-1,
                                                          method="weibull"), atol=1e-15)
    np.testing.assert_allclose(upper.numpy(), np.quantile(boot.numpy(), high, axis=-1,
                                                          method="weibull"), atol=1e-15)
    assert torch.equal(lower_end(boot, 0.95, 16), lower)


@pytest.mark.parametrize(("n", "draw"), [(16, "normal"), (64, "exponential"),
                                         (512, "normal")])
def test_the_interval_covers_a_mean_about_as_often_as_it_says(n, draw):
    # 4000 data sets of n draws with a known mean, each with 200 resamples (the default):
    # the 95% interval holds the mean 93.5-96.5% of the time. torch.quantile's plain
    # percentile interval covers 90.3% at n = 16 (too narrow by the factor the levels widen).
    g = torch.Generator().manual_seed(n)
    reps = 4000
    if draw == "normal":
        data, mean = torch.randn(reps, n, generator=g, dtype=torch.float64), 0.0
    else:
        data = -torch.rand(reps, n, generator=g, dtype=torch.float64).log()
        mean = 1.0
    boot = data @ bootstrap_weights(n, 200, seed=n).T  # [reps, boot]
    lower, upper = interval(boot, 0.95, n)
    covered = float(((lower <= mean) & (mean <= upper)).double().mean())
    assert 0.935 <= covered <= 0.965, covered
    if n == 16:
        q = torch.tensor([0.025, 0.975], dtype=torch.float64)
        plain_lower, plain_upper = torch.quantile(boot, q, dim=-1)
        plain = float(((plain_lower <= mean) & (mean <= plain_upper)).double().mean())
        assert plain < 0.925, plain  # what the widening is for


def test_a_level_per_row_and_infinite_neighbours():
    boot = torch.randn(3, 200, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    per_row = interval(boot, 0.95, torch.tensor([4, 16, 512]))
    for row, n in enumerate((4, 16, 512)):
        one = interval(boot[row:row + 1], 0.95, n)
        assert float(per_row[0][row]) == float(one[0][0])
        assert float(per_row[1][row]) == float(one[1][0])
    # an infinite neighbour is the quantile wherever it weighs (numpy's weibull gives NaN)
    inf = math.inf
    rows = torch.tensor([[-inf, -inf, -inf, 1.0, 2.0], [-inf, -inf, 1.0, inf, inf],
                         [1.0, 2.0, 3.0, 4.0, inf]], dtype=torch.float64)
    assert quantiles(rows, (0.5,))[0].tolist() == [-inf, 1.0, 3.0]
    assert quantiles(rows[2:], (0.8, 0.9))[:, 0].tolist() == [inf, inf]


@pytest.mark.parametrize(("confidence", "n"), [(0.95, 512), (0.95, 16), (0.9, 40), (0.99, 64)])
def test_fewest_resamples_is_where_the_interval_stops_being_the_range(confidence, n):
    # below it the lower end is the smallest replicate whatever the others are; from it on,
    # numpy's type-6 quantile moves with the second smallest
    fewest = fewest_resamples(confidence, n)
    rng = np.random.default_rng(0)
    for n_boot, is_range in ((fewest - 1, True), (fewest, False), (fewest + 5, False)):
        boot = torch.tensor(rng.normal(size=n_boot))
        low = float(lower_end(boot, confidence, n))
        moved = boot.clone()
        second = int(boot.argsort()[1])
        moved[second] = float(boot.sort().values[0]) + 1e-3 * (boot.max() - boot.min())
        moved_low = float(lower_end(moved, confidence, n))
        assert (low == float(boot.min())) == is_range or (fewest - 1 == 0)
        assert (moved_low == low) == is_range


def test_few_resamples_are_said_with_what_to_pass():
    what = ("the weight metrics'", "--n-weight-sequences")
    assert few_resamples_note(200, 0.95, 512, *what) is None
    note = few_resamples_note(20, 0.95, 16, *what)
    assert note is not None and "they need 72" in note and "n_boot >= 72" in note
    assert "the weight metrics' 95% intervals over 16 sequences (--n-weight-sequences" in note
    tiny = few_resamples_note(200, 0.95, 3, *what)  # millions needed: more sequences instead
    assert tiny is not None and "more than 2000" in tiny and "n_boot >=" not in tiny
    assert "more sequences need fewer resamples (--n-weight-sequences)" in tiny
    # at 2 sequences and 99% the expanded level underflows to 0 (a ZeroDivisionError once)
    assert fewest_resamples(0.99, 2) == 2001 and "more than 2000" in few_resamples_note(
        200, 0.99, 2, *what)
    assert "97.5% intervals" in few_resamples_note(20, 0.975, 512, "the", "--n-sequences")
