"""scripts/ahn_reviewers.py at its small sizes: every question answered, the report whole."""

import json
import re
import statistics
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def reviewers():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import ahn_reviewers
        import ahn_study

        yield ahn_reviewers, ahn_study
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def report(reviewers, tmp_path_factory):
    script, _ = reviewers
    out = tmp_path_factory.mktemp("study") / "report"
    assert script.main(["--small", "--threads", "1", "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_the_report_opens_with_one_line_per_question(report):
    lines = (report / "report.md").read_text().splitlines()
    assert lines[0].startswith("# ")
    questions = [line for line in lines[2:10]]
    assert [re.match(r"- \*\*(Q\d)\*\*", q).group(1) for q in questions] == [
        f"Q{i}" for i in range(1, 9)]
    assert all(re.search(r"\d\.\d", q) for q in questions)  # each with a number
    for name in ("results.json", "ahn_reviewers.png", "q1_definiteness.csv", "q7_grid.csv",
                 "q8_curve.csv"):
        assert (report / name).stat().st_size > 0
    assert "![Q6, Q2, Q7, Q8](ahn_reviewers.png)" in lines


def test_answers_are_the_numbers_in_the_results(report):
    results = json.loads((report / "results.json").read_text())["results"]
    q6 = results["Q6"]
    for name, runs in q6["runs"].items():
        assert len(runs) == 2  # the small version's restarts
        for layer in range(3):
            values = [r["scale"][layer] for r in runs]
            assert q6[f"{name}_scale"][layer]["mean"] == pytest.approx(statistics.mean(values))
            assert q6[f"{name}_scale"][layer]["sd"] == pytest.approx(statistics.stdev(values))
    q7 = results["Q7"]
    assert len(q7["rows"]) == 4 and all(r["ols"] < 1e-6 for r in q7["rows"])
    wins = sum(r["model"]["mean"] < r["gd_best"] for r in q7["rows"])
    assert q7["answer"].startswith(f"the trained model beats GD at its best step size in {wins} "
                                   "of 4 cells")
    q1 = results["Q1"]
    assert sum(g["layers"] for g in q1["by_group"].values()) == len(q1["rows"])
    assert "pq-rotated-3layer" in q1["by_group"]
    assert q1["answer"].startswith(f"{sum(r['min_sym_eig'] > 0 for r in q1['rows'])} of "
                                   f"{len(q1['rows'])} trained A_l are positive definite")


def test_best_step_size_is_the_minimum_of_its_grid(reviewers):
    _, study = reviewers
    task = study.ahn_task(n_dims=3)
    batch = task.sample(64, generator=0)
    err, lr = study.best_step_size(batch, 2, 1.0)
    xs, ys = batch.xs[:, :-1].double(), batch.ys[:, :-1].double()
    n = xs.shape[1]

    def naive(rate):  # two GD steps on the mean loss, sequence by sequence
        total = 0.0
        for x, y, xq, yq in zip(xs, ys, batch.xs[:, -1].double(), batch.ys[:, -1].double()):
            w = torch.zeros(3, dtype=torch.float64)
            for _ in range(2):
                w = w - rate * x.T @ (x @ w - y) / n
            total += float((xq @ w - yq) ** 2)
        return total / len(xs) / float(batch.ys[:, -1].double().pow(2).mean())

    assert naive(lr) == pytest.approx(err, rel=1e-9)
    assert naive(lr * 1.3) > err and naive(lr / 1.3) > err


def test_a_report_is_never_written_over_foreign_files(reviewers, tmp_path, capsys):
    script, _ = reviewers
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_:  # one line, exit 2, before the work
        script.main(["--small", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "non-empty directory that iclprobe did not" in err and "Traceback" not in err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_study_intervals_are_the_expanded_percentile_ones_align_reads(reviewers):
    """Q4's intervals, re-derived in numpy: the means of the same resamples (the seeded
    draws of `bootstrap_weights`), read at the expanded percentile levels (scipy's t and
    normal quantiles) by numpy's type-6 quantile; the plain percentile interval torch's
    quantile gave before is narrower."""
    import dataclasses

    import numpy as np
    from scipy import stats

    _, study = reviewers
    sizes = dataclasses.replace(study.Sizes.small(), boot=200)  # the study's own count
    values = -torch.rand(40, generator=torch.Generator().manual_seed(0), dtype=torch.float64).log()
    gen = torch.Generator().manual_seed(3)
    picks = torch.randint(len(values), (sizes.boot, len(values)), generator=gen).numpy()
    means = values.numpy()[picks].mean(1)
    n = len(values)
    low = stats.norm.cdf(-np.sqrt(n / (n - 1)) * stats.t.ppf(0.975, n - 1))
    ref = np.quantile(means, [low, 1 - low], method="weibull")
    got = study.boot_ci(values, sizes, seed=3)
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    plain = np.quantile(means, [0.025, 0.975])
    assert got[0] < plain[0] and got[1] > plain[1]
