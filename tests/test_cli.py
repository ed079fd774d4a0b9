"""The command line, driven through main(argv) on tiny models in tmp_path."""

import csv
import json

import pytest
import torch
from helpers import tiny_gpt

from iclprobe import models, tasks
from iclprobe.cli import main

FAST = ["--n-sequences", "32", "--n-probe-sequences", "64"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    task = tasks.RegressionTask(n_dims=3, n_points=8)
    a = tiny_gpt("softmax", "paired")
    a.save(root / "soft", task=task)
    b = tiny_gpt("linear", "paired", seed=11)
    b.save(root / "lin", task=task)
    pq = models.PQTransformer.from_matrices(A=[0.2 * torch.eye(3)] * 3)
    pq.save(root / "pq", task=task)
    return root


@pytest.mark.slow
def test_align_writes_the_report(tmp_path, capsys):
    out = tmp_path / "report"
    model = "gpt-softmax-paired"  # a shipped model that solves its task
    assert main(["align", model, *FAST, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert len(lines) <= 42 and max(map(len, lines)) <= 100  # one screen, and the report line
    assert "newton vs gd, the verdict" in printed and "report:" in printed
    assert "newton vs gd (protocol iclprobe) by " in printed
    assert "--verbose shows the full tables" in printed
    assert main(["align", model, *FAST, "--verbose"]) == 0  # the answer opens it
    # the model named first: in compare's --verbose a second model's tables followed the
    # first's with no name for 30 lines
    assert capsys.readouterr().out.startswith(f"{model} — what each layer runs, among ")
    assert {p.name for p in out.iterdir()} == {".iclprobe", "report.md", "summary.json",
                                               "matched_newton_steps.png", model}
    names = {p.name for p in (out / model).iterdir()}  # the model's files: a folder of its own
    assert {"error.png", "heatmaps_error_cosine.png", "table_error_cosine.csv", "result.json",
            "learners_weight_cosine.csv", "learners_error_cosine.png",
            "similarity_gd_weight_cosine.csv"} <= names
    summary = json.loads((out / "summary.json").read_text())
    result = summary["models"][model]
    assert result["protocol"]["name"] == "iclprobe" and result["positions"] == "all"
    table = result["table"]["error_cosine"]
    assert [row["layer"] for row in table] == list(range(9))
    assert {"newton_step", "newton_sim", "gd_step", "newton_zero_sim"} <= set(table[0])
    rows = list(csv.reader((out / model / "table_error_cosine.csv").open()))
    assert rows[0][:4] == ["protocol", "layer", "normalized_error", "live"] and len(rows) == 10
    assert rows[1][0] == "iclprobe"
    assert len(set(rows[0])) == len(rows[0])  # unique column names
    steps = rows[0].index("newton_step")
    assert all(r[steps].isdigit() for r in rows[1:])  # numeric, the † lives in "live"
    learners = list(csv.reader((out / model / "learners_error_cosine.csv").open()))
    assert len(set(learners[0])) == len(learners[0])
    assert {"newton_minus_gd_lower", "verdict_newton_vs_gd"} <= set(learners[0])
    report = (out / "report.md").read_text()
    for png in (p for p in names if p.endswith(".png")):
        assert f"]({model}/{png})" in report  # every figure is embedded
    assert "](matched_newton_steps.png)" in report
    assert "Protocol **iclprobe**" in report and "How to read the tables" in report
    assert f"Produced by `iclprobe align {model}" in report
    assert json.loads((out / model / "result.json").read_text()) == result
    # the findings first, the glossary last
    headings = [line for line in report.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Findings" and headings[1] == f"## {model}"
    assert headings[-1] == "## How to read the tables"
    assert summary["findings"][model]["verdict"] == result["verdict"]["layers"]
    fitted = summary["findings"][model]["by_metric"]["error_cosine"]["fitted"]
    assert fitted == result["fitted"]["error_cosine"]["verdicts"]


@pytest.mark.slow
def test_align_under_fu_protocol_says_so(capsys):
    assert main(["align", "gpt-softmax-paired", *FAST, "--protocol", "fu2024", "--metric",
                 "error_cosine", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["gpt-softmax-paired"]
    assert result["protocol"]["name"] == "fu2024" and result["window"][0] == 0
    assert result["similarities"]["gd"]["error_cosine"]["steps"] == [2**i for i in range(13)]
    assert result["comparisons"]["error_cosine"]["pairs"][0]["a"] == "newton"


def test_align_json_and_options(ckpts, capsys):
    assert main(["align", str(ckpts / "pq"), *FAST, "--json", "--algorithms", "newton,gd",
                 "--metric", "error_cosine", "--data", "ill-conditioned",
                 "--condition-number", "10"]) == 0
    data = json.loads(capsys.readouterr().out)
    result = data["pq"]
    assert set(result["matches"]) == {"newton", "gd"}
    assert set(result["matches"]["newton"]) == {"error_cosine"}
    assert result["task"]["cov"] == "ill-conditioned" and result["task"]["condition_number"] == 10


@pytest.mark.slow
def test_compare_and_probe(ckpts, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(ckpts / "soft"), str(ckpts / "lin"), *FAST,
                 "--metric", "error_cosine", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "best Newton step per layer" in printed
    side = printed.split("best Newton step per layer")[1].splitlines()[1:]
    assert side[0].split() == ["layer", "soft", "step", "(sim)", "lin", "step", "(sim)"]
    assert [row.split()[0] for row in side[1:4]] == ["0", "1", "2"]  # tiny_gpt: 2 layers
    assert any(row.startswith("soft: step vs layer") for row in side)
    assert any(row.startswith("lin: step vs layer") for row in side)
    assert all(len(line) <= 100 and line == line.rstrip() for line in printed.splitlines())
    assert (out / "comparison_newton.csv").exists()
    assert main(["probe", str(ckpts / "lin"), "--n-sequences", "64"]) == 0
    assert (ckpts / "lin" / "probes" / "probes.json").exists()
    assert "probes saved" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["align", "no/such/checkpoint"], "checkpoint 'no/such/checkpoint' not found"),
        (["align", ""], "checkpoint must be a checkpoint directory or a shipped model's name"),
        (["align", "{soft}", "--algorithms", "newton,sgd"],
         "AlignConfig.algorithms ['sgd'] are not registered learners"),
        (["align", "{soft}", "--algorithms", ""],
         "AlignConfig.algorithms must name at least one learner, got none"),
        (["align", "{soft}", "--algorithms", "gd,pgd_schedule"],  # needs a model's schedule
         "AlignConfig.algorithms ['pgd_schedule']: a learner stepped by a model's own"),
        (["align", "{soft}", "--metric", "cka"], "AlignConfig.metrics must be among ['error_cosine'"),
        (["align", "{soft}", "--n-sequences", "0"],
         "AlignConfig.n_sequences must be an integer >= 2, got 0"),
        (["compare", "{soft}", "nope"], "checkpoint 'nope' not found"),
        (["probe"], "the following arguments are required: checkpoint"),
        (["align", "{soft}", "--t-min", "1000"], "--t-min: t_min=1000, t_max="),
        (["align", "{soft}", "--algorithms", "gd,pgd_own"],  # a PQ model's claim
         "--algorithms: AlignConfig.algorithms: 'pgd_own' cannot be run on"),
        (["demo", "--n-sequences", "1"],
         "argument --n-sequences: expected an integer >= 2 (evaluation sequences), got 1"),
    ],
)
def test_bad_invocations_exit_2_with_one_line(ckpts, capsys, argv, message):
    argv = [a.format(soft=ckpts / "soft") for a in argv]
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_every_command_has_help(capsys):
    for command in ("train", "align", "compare", "probe", "demo", "models"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"])
        assert exc.value.code == 0
        assert "usage: iclprobe " + command in capsys.readouterr().out


@pytest.mark.slow
def test_demo_writes_the_whole_report(tmp_path, capsys):
    out = tmp_path / "iclprobe-report"
    assert main(["demo", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "pq-rotated-3layer: distance of A_l to Σ⁻¹" in printed
    assert "pq-rotated-3layer: λ_min(sym A_l) 0.422, 0.695, 1.72; max ‖skew‖/‖A‖" in printed
    assert (out / "pq_preconditioners.csv").read_text().startswith(
        "model,layer,dist_to_inv_cov,scale,dist_to_identity,min_sym_eigenvalue,skew_ratio")
    names = {str(p.relative_to(out)) for p in out.rglob("*")}
    assert {"report.md", "summary.json", "gpt-softmax/error.png", "matched_newton_steps.png",
            "pq_preconditioners.png", "pq_preconditioners.csv", "comparison_newton.csv",
            "gpt-linear-paired/heatmaps_weight_cosine.png"} <= names
    top = {p.name for p in out.iterdir() if p.is_file()}
    assert len(top) <= 8, top  # the rest lies in a folder per model
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["models"]) == {"ka-gd-oracle", "ka-newton-pq",  # known answers first
                                      "gpt-softmax", "gpt-softmax-fu2024", "gpt-softmax-paired",
                                      "gpt-linear-paired", "lstm", "pq-rotated-3layer",
                                      "pq-isotropic-1layer"}
    assert summary["models"]["gpt-softmax-fu2024"]["protocol"]["name"] == "fu2024"
    assert summary["models"]["pq-rotated-3layer"]["positions"] == "last"
    assert "Fu et al.'s headline" in printed
    assert "recurrent baseline (lstm)" in printed and "lstm [iclprobe], layer 4: newton" in printed
    assert set(summary["pq"]) == {"pq-rotated-3layer", "pq-isotropic-1layer"}
    report = (out / "report.md").read_text()
    assert all(f"]({p})" in report for p in names if p.endswith(".png"))


def test_unwritable_output_is_a_one_line_error(ckpts, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    rc = main(["probe", str(ckpts / "pq"), "--n-sequences", "16", "--out",
               str(blocker / "probes")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "iclprobe probe: error:" in err
