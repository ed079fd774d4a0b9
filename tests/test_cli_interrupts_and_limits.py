"""The command line's limits: Ctrl-C, empty or ignored flags, huge counts, reports that must
be drawn."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from helpers import one_line_error, tiny_gpt, wait_until

from iclprobe import tasks
from iclprobe.cli import main

TASK = tasks.RegressionTask(n_dims=3, n_points=8)
FAST = ["--n-sequences", "32", "--n-boot", "10", "--algorithms", "gd", "--metrics",
        "error_cosine"]


@pytest.fixture
def ckpt(tmp_path):
    tiny_gpt("linear", "paired").save(tmp_path / "lin", task=TASK)
    return tmp_path / "lin"


def _interrupted(argv, started, tmp_path):
    """Run ``iclprobe ARGV``, press Ctrl-C once stderr shows ``started``; (rc, stderr lines)."""
    err = tmp_path / "stderr.txt"
    with open(err, "w") as fh:
        # a shell's background job ignores SIGINT: give the child a terminal's disposition
        proc = subprocess.Popen([sys.executable, "-m", "iclprobe", *argv], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=fh,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        wait_until(lambda: started in err.read_text(), proc)
        proc.send_signal(signal.SIGINT)
        proc.wait()
    said: list[str] = []  # a note wrapped within 100 columns continues on "  " lines
    for line in err.read_text().splitlines():
        if line.startswith("  ") and said:
            said[-1] += " " + line.strip()
        elif line.strip():
            said.append(line)
    lines = [x for x in said if started not in x]
    return proc.returncode, lines


# with -m slow: one subprocess each, interrupted (the same handler for every command)
@pytest.mark.slow
@pytest.mark.parametrize("command", ["align", "compare", "probe", "demo"])
def test_ctrl_c_exits_130_with_one_line_and_writes_nothing(ckpt, tmp_path, command):
    out = tmp_path / "out"
    many = ["--n-sequences", "200000"]
    argv = {"align": ["align", str(ckpt), *many, "--out", str(out)],
            "compare": ["compare", str(ckpt), str(ckpt), *many, "--out", str(out)],
            "probe": ["probe", str(ckpt), *many, "--out", str(out)],
            "demo": ["demo", "--n-sequences", "20000", "--out", str(out)]}[command]
    started = "fitting probes" if command == "probe" else "probes"
    rc, lines = _interrupted(argv, started, tmp_path)
    assert rc == 130, lines
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert lines[0].startswith(f"iclprobe {command}: interrupted"), lines
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lin", "stderr.txt"]


def test_ctrl_c_in_a_command_is_one_line_and_exit_130(ckpt, tmp_path, capsys, monkeypatch):
    """The handler the subprocess runs above exercise (-m slow), in-process: a Ctrl-C while
    the models are aligned."""
    from iclprobe import cli_commands

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_commands, "align_checkpoints", interrupted)
    out = tmp_path / "out"
    assert main(["align", str(ckpt), *FAST, "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["iclprobe align: interrupted; nothing was written (an output folder is "
                   "swapped in whole or not at all)"], err
    assert not out.exists()


@pytest.mark.parametrize("argv", [["align", "CKPT"], ["compare", "CKPT", "CKPT"],
                                  ["probe", "CKPT"], ["demo"], ["train"]])
def test_an_empty_out_is_refused(ckpt, capsys, argv, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    argv = [str(ckpt) if a == "CKPT" else a for a in argv]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--out", ""])
    assert exit_.value.code == 2
    one_line_error(capsys, "--out", "''")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lin"]


def test_condition_number_with_task_data_is_refused_or_said(ckpt, capsys):
    argv = ["align", str(ckpt), *FAST, "--condition-number", "50"]
    assert main([*argv, "--no-separation"]) == 2
    one_line_error(capsys, "--condition-number", "--data ill-conditioned")
    assert main([*argv, "--data", "isotropic", "--algorithms", "newton,gd"]) == 0
    err = capsys.readouterr().err
    assert "note: --condition-number 50 sets only the κ of the separation views" in err
    assert main([*argv, "--data", "ill-conditioned", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lin"]["task"]["condition_number"] == 50


def test_a_capped_weight_subset_is_said(ckpt, capsys):
    assert main(["align", str(ckpt), "--n-sequences", "32", "--n-boot", "10", "--algorithms",
                 "gd", "--metrics", "weight_cosine", "--n-weight-sequences", "1000000000",
                 "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["lin"]["notes"]
    assert any("--n-weight-sequences" in n or "n_weight_sequences" in n for n in notes), notes
    assert any("1000000000" in n and " 8 " in n for n in notes), notes  # 32 // 4 folds


@pytest.mark.slow  # an align through the CLI (4 s)
def test_a_report_is_drawn_when_an_estimate_lies_outside_its_interval(tmp_path, capsys):
    out = tmp_path / "R"
    assert main(["align", "pq-isotropic-1layer", "--n-sequences", "16", "--n-boot", "5",
                 "--out", str(out), "--verbose"]) == 0
    assert (out / "report.md").is_file()
    summary = json.loads((out / "summary.json").read_text())["models"]["pq-isotropic-1layer"]
    outside = [(run, layer) for comp in summary["comparisons"].values()
               for run, score in comp["scores"].items()
               for layer, (v, lo, hi) in enumerate(zip(score["score"]["value"],
                                                       score["score"]["lower"],
                                                       score["score"]["upper"]))
               if not lo <= v <= hi]
    assert outside, "no estimate outside its interval: the case is not exercised"
    # in the terminal's learner table too: by its bounds, not as value ± half-width
    assert re.search(r"-?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\] @\d", capsys.readouterr().out)


def test_a_taskless_ahn_file_aligns_on_the_data_asked_for(tmp_path, capsys, caplog):
    import torch

    allparam = 0.1 * torch.randn(2, 1, 2, 3, 3, generator=torch.Generator().manual_seed(0))
    torch.save(allparam, tmp_path / "ahn.pt")
    fast = ["--n-sequences", "32", "--n-boot", "10", "--algorithms", "gd", "--json"]
    assert main(["align", str(tmp_path / "ahn.pt"), *fast]) == 2
    one_line_error(capsys, "no task.json", "--data isotropic")
    assert main(["align", str(tmp_path / "ahn.pt"), *fast, "--data", "isotropic"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["ahn.pt"]["task"]["n_points"] == 21
    assert "no task: evaluating on 21 points (Ahn et al.'s N = 20" in caplog.text
    from iclprobe import models
    from iclprobe.alignment import AlignConfig
    from iclprobe.alignment.evaluation import evaluation_task

    caplog.clear()
    model, cfg = models.load(tmp_path / "ahn.pt"), AlignConfig(data="isotropic")
    assert {evaluation_task(model, cfg).n_points for _ in range(3)} == {21}
    assert caplog.text.count("no task: evaluating") == 1  # once per model (the design: 11)


@pytest.mark.parametrize("argv, says", [
    (["align", "CKPT", "--n-sequences", "1000000000"], "--n-sequences: AlignConfig.n_sequences"),
    (["compare", "CKPT", "CKPT", "--n-boot", "1000000000"], "--n-boot: AlignConfig.n_boot"),
    (["align", "CKPT", "--n-queries", "1000000000", "--metric", "weight_cosine"],
     "--n-queries: AlignConfig.n_queries"),
    (["probe", "CKPT", "--n-sequences", "1000000000"], "n_sequences=1000000000"),
    (["align", "CKPT", "--probe-fit", "fresh", "--n-probe-sequences", "1000000000"],
     "n_sequences=1000000000")])
def test_huge_counts_are_refused_before_allocating(ckpt, capsys, argv, says):
    argv = [str(ckpt) if a == "CKPT" else a for a in argv]
    assert main(argv) == 2
    one_line_error(capsys, says, "GiB of memory")
