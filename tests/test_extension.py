"""Extension points: a learner and a metric registered from outside the package.

Each is one function and one decorator in this file; no package file changes, and the
new name shows up in align's learner table, JSON, CSVs, report and heatmaps.
"""

import csv
import json

import pytest
import torch

from iclprobe import algorithms, models, tasks
from iclprobe.algorithms.base import LEARNERS
from iclprobe.alignment import AlignConfig, align, write_report
from iclprobe.alignment.measuring.runs import run_spec
from iclprobe.alignment.metrics import METRIC_INFO, register_metric
from iclprobe.alignment.protocols import get_protocol
from iclprobe.cli import main


@pytest.fixture
def heavy_ball():
    """A learner registered here: GD with momentum, run by align's default protocol."""

    @algorithms.register("heavy_ball_test", label="heavy ball (test)", steps=(1, 2, 4, 8),
                         step_scale="log2", align_hyper={"lr": "max", "beta": 0.5}, align=True)
    def heavy_ball_test(xs, ys, steps=None, lr="max", beta=0.5, weights=True):
        it = algorithms.momentum(xs, ys, steps=steps, lr=lr, beta=beta, weights=weights)
        return algorithms.Iterates(it.steps, it.preds, it.weights, it.hyper, "heavy_ball_test")

    yield "heavy_ball_test"
    LEARNERS.pop("heavy_ball_test")


@pytest.fixture
def error_l1():
    """A metric registered here: the mean absolute difference of the two predictions."""

    @register_metric("error_l1_test", on="preds", higher_is_better=False,
                     label="mean |prediction difference|")
    def error_l1_test(a, b, ys, t_min, t_max):
        return (a - b)[..., t_min:t_max + 1].abs().mean(-1)

    yield "error_l1_test"
    METRIC_INFO.pop("error_l1_test")


def pq_gd_model():
    """Three steps of GD as a PQ transformer: a model that solves its task."""
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 3)
    model.task = tasks.RegressionTask(n_dims=3, n_points=9)
    return model


@pytest.mark.slow
def test_a_learner_registered_outside_appears_everywhere(heavy_ball, tmp_path, capsys):
    cfg = AlignConfig(n_sequences=64, n_weight_sequences=16, n_boot=20, separation=False)
    res = align(pq_gd_model(), cfg, name="gd3")
    assert heavy_ball in res.similarities and heavy_ball in res.step_runs
    assert heavy_ball in res.comparisons["error_cosine"].scores  # the learner table
    assert res.run_labels[heavy_ball] == "heavy ball (test)"
    fit = res.matches[heavy_ball]["error_cosine"].fit
    assert fit.log2  # its registered step scale
    assert heavy_ball in res.protocol["runs"]  # recorded in the protocol of the result
    report = write_report(tmp_path / "r", [res])
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert heavy_ball in summary["models"]["gd3"]["similarities"]
    header = next(csv.reader((tmp_path / "r" / "gd3" / "table_error_cosine.csv").open()))
    assert f"{heavy_ball}_step" in header
    learners = next(csv.reader((tmp_path / "r" / "gd3" / "learners_error_cosine.csv").open()))
    assert f"{heavy_ball}_best" in learners
    assert (tmp_path / "r" / "gd3" / f"similarity_{heavy_ball}_error_cosine.csv").is_file()
    text = report.read_text()
    assert (tmp_path / "r" / "gd3" / "heatmaps_error_cosine.png").is_file()
    assert "](gd3/heatmaps_error_cosine.png)" in text
    assert heavy_ball in text.split("](gd3/heatmaps_error_cosine.png)")[1].split("\n\n")[1]
    # and the CLI runs it by name
    model = pq_gd_model()
    model.save(tmp_path / "gd3", task=model.task)
    assert main(["align", str(tmp_path / "gd3"), "--n-sequences", "32", "--algorithms",
                 f"{heavy_ball},newton", "--metrics", "error_cosine", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["gd3"]
    assert sorted(printed["similarities"]) == sorted([heavy_ball, "newton"])


@pytest.mark.slow
def test_a_metric_registered_outside_is_a_metric_like_the_others(error_l1, tmp_path):
    cfg = AlignConfig(metrics=("error_cosine", error_l1), n_sequences=64, n_boot=20,
                      algorithms=("newton", "gd"), separation=False)
    res = align(pq_gd_model(), cfg, name="gd3")
    sim = res.similarities["gd"][error_l1]
    assert not sim.higher_is_better and sim.metric == error_l1
    # a lower value is better: the best GD step of the last layer is the one closest to it
    best = res.matches["gd"][error_l1].best_column[-1]
    assert sim.values[-1, best] == sim.values[-1].min()
    # its values are the function's: layer 0 of a PQ model predicts 0 at the query, so its
    # value against GD step k is the mean |GD's prediction| at the trained t = 8
    batch = pq_gd_model().task.sample(64, generator=torch.Generator().manual_seed(cfg.seed))
    gd = run_spec(get_protocol("iclprobe").runs["gd"], batch, 3, False)
    torch.testing.assert_close(sim.values[0], gd.preds[:, :, 8].abs().mean(-1), rtol=1e-12,
                               atol=1e-12)
    assert error_l1 in res.comparisons and res.comparisons[error_l1].pairs
    write_report(tmp_path / "r", [res])
    text = (tmp_path / "r" / "report.md").read_text()
    assert "By mean |prediction difference|" in text
    assert (tmp_path / "r" / "gd3" / f"learners_{error_l1}.csv").is_file()
    with pytest.raises(ValueError, match="metrics must be among"):
        AlignConfig(metrics=("error_l2_unknown",))


def test_a_registered_learner_gets_verdicts_against_newton_and_gd(heavy_ball):
    # registered without compare_with: compared with the reference pair, Newton and GD
    assert LEARNERS[heavy_ball].compare_with == ("newton", "gd")
    cfg = AlignConfig(n_sequences=64, n_boot=20, separation=False, fitted=False,
                      metrics=("error_cosine",), algorithms=(heavy_ball, "newton", "gd"))
    res = align(pq_gd_model(), cfg, name="gd3")
    table = res.comparisons["error_cosine"]
    pairs = {(p.a, p.b): p for p in table.pairs}
    assert set(pairs) == {("newton", "gd"), (heavy_ball, "newton"), (heavy_ball, "gd")}
    hb_gd = pairs[(heavy_ball, "gd")]
    best = {k: res.similarities[k]["error_cosine"].values.max(1).values for k in (heavy_ball, "gd")}
    torch.testing.assert_close(torch.tensor(hb_gd.difference.value, dtype=torch.float64),
                               best[heavy_ball] - best["gd"])
    assert len(hb_gd.verdicts) == res.n_layers + 1
    # a family's claims are compared too: the PQ model's own preconditioned GD
    claims = align(pq_gd_model(), AlignConfig(n_sequences=64, n_boot=20, separation=False,
                                              fitted=False, metrics=("error_cosine",)))
    assert [(p.a, p.b) for p in claims.comparisons["error_cosine"].pairs][:2] == [
        ("newton", "gd"), ("newton", "online_gd")]
    assert {("pgd_own", "gd"), ("pgd_own", "newton")} <= {
        (p.a, p.b) for p in claims.comparisons["error_cosine"].pairs}


def test_verdict_pairs_come_from_each_runs_compare_with():
    from iclprobe.alignment.protocols import RunSpec, verdict_pairs

    runs = {"newton": RunSpec("newton", "Newton", compare_with=("gd", "online_gd")),
            "gd": RunSpec("gd", "GD", compare_with=("newton",)),  # the same pair, once
            "mine": RunSpec("gd", "mine", compare_with=("gd", "absent"))}
    assert verdict_pairs(runs) == [("newton", "gd"), ("mine", "gd")]
    with pytest.raises(TypeError, match="compare_with must be a sequence of learner names"):
        algorithms.register("bad_rivals", compare_with="gd")
    with pytest.raises(ValueError, match="compare_with names the learner itself"):
        algorithms.register("selfish", compare_with=("selfish",))
