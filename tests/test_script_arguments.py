"""scripts/train_pretrained.py and bench/known_answers.py refuse bad flags and files in one line.

``--curves-only`` recomputes a shipped model's error curve from its exported folder: a
``config.json`` whose recorded training is not numbers, a folder without a model, a file
that is a directory, threads that are not positive — each is named, exit status 2, and
nothing is written.
"""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from iclprobe import models
from iclprobe._shipped import PRETRAINED_DIR
from iclprobe.storage import OutputExistsError

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_pretrained.py"
NAME = "pq-isotropic-1layer"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_pretrained", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_pretrained"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["train_pretrained"]


@pytest.fixture
def dest(tmp_path):
    shutil.copytree(PRETRAINED_DIR / NAME, tmp_path / NAME)
    return tmp_path


def _config(dest, **changes):
    path = dest / NAME / "config.json"
    meta = json.loads(path.read_text())
    meta.update(changes)
    for key in [k for k, v in changes.items() if v is ...]:
        del meta[key]
    path.write_text(json.dumps(meta))
    return path


def _refused(script, capsys, argv, *needles):
    with pytest.raises(SystemExit) as exit_:
        script.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize(("changes", "says"), [
    ({"trained_steps": "x", "training_minutes": None},
     "trained_steps must be an integer >= 0, got 'x'"),
    ({"training_minutes": None}, "training_minutes must be a finite number >= 0, got None"),
    ({"trained_steps": ...}, "trained_steps must be an integer >= 0, got None (absent)"),
    ({"training_minutes": float("nan")}, "training_minutes must be a finite number >= 0, "
                                         "got nan"),
    ({"trained_steps": True}, "trained_steps must be an integer >= 0, got True"),
])
def test_curves_only_refuses_a_recorded_training_that_is_not_numbers(script, dest, capsys,
                                                                     changes, says):
    path = _config(dest, **changes)
    before = path.read_text()
    _refused(script, capsys, [NAME, "--curves-only", "--dest", str(dest)], str(path), says)
    assert path.read_text() == before


def test_curves_only_refuses_a_nested_config(script, dest, capsys):
    path = dest / NAME / "config.json"
    path.write_text("[" * 100000 + "]" * 100000)
    _refused(script, capsys, [NAME, "--curves-only", "--dest", str(dest)], str(path),
             "nested too deeply")


def test_curves_only_without_an_exported_model_says_so(script, tmp_path, capsys):
    _refused(script, capsys, [NAME, "--curves-only", "--dest", str(tmp_path)],
             f"{tmp_path / NAME}: no exported model to recompute the curve of")


def test_curves_only_refuses_a_curve_file_that_is_a_directory(script, dest, capsys):
    (dest / NAME / "error_curve.json").unlink()
    (dest / NAME / "error_curve.json").mkdir()
    before = (dest / NAME / "config.json").read_text()
    _refused(script, capsys, [NAME, "--curves-only", "--dest", str(dest)],
             f"{dest / NAME / 'error_curve.json'} is not a file")
    assert (dest / NAME / "config.json").read_text() == before


@pytest.mark.parametrize(("threads", "says"), [
    ("0", "expected a number of threads from 1 to 1024, got 0"),
    ("-1", "expected a number of threads from 1 to 1024, got -1"),
    ("two", "expected a number of threads, got 'two'"),
    ("99999999999999", "expected a number of threads from 1 to 1024, got 99999999999999")])
def test_threads_must_be_positive(script, dest, capsys, threads, says):
    # (a huge count overflowed in torch.set_num_threads, a traceback)
    _refused(script, capsys, [NAME, "--curves-only", "--dest", str(dest), "--threads", threads],
             "--threads", says)


def test_curves_only_recomputes_the_curve(script, dest, capsys):
    meta = json.loads((dest / NAME / "config.json").read_text())
    assert script.main([NAME, "--curves-only", "--dest", str(dest)]) == 0
    out = capsys.readouterr().out
    assert f"({meta['training_minutes']} min of training)" in out
    assert json.loads((dest / NAME / "error_curve.json").read_text())["steps"] == \
        meta["trained_steps"]


def _trained(script, dest, tmp_path):
    """``export``'s input from the shipped model: its run folder holds its recipe and log."""
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    shutil.copy(dest / NAME / "train.json", run / "checkpoint" / "train.json")
    shutil.copy(dest / NAME / "metrics.jsonl", run / "metrics.jsonl")
    model = models.load(dest / NAME)
    return {"model": model, "run": run, "curve": [0.5] * model.task.n_points, "steps": 7}


def test_an_export_is_one_atomic_folder_replaced_only_with_overwrite(script, dest, tmp_path,
                                                                     capsys):
    spec = next(s for s in script.SPECS if s.name == NAME)
    result, out = _trained(script, dest, tmp_path), tmp_path / "out"
    written = script.export(spec, result, out)
    names = {p.name for p in written.iterdir()}
    assert names == {p.name for p in (dest / NAME).iterdir()} | {".iclprobe"}
    assert json.loads((written / "config.json").read_text())["trained_steps"] == 7
    with pytest.raises(OutputExistsError, match="pass --overwrite"):  # the flag exists now
        script.export(spec, result, out)
    assert script.export(spec, {**result, "steps": 8}, out, overwrite=True) == written
    assert json.loads((written / "config.json").read_text())["trained_steps"] == 8
    # an export that fails half-way (its log gone) leaves the folder as it was
    (result["run"] / "metrics.jsonl").unlink()
    before = {p.name: p.read_bytes() for p in written.iterdir()}
    with pytest.raises(FileNotFoundError):
        script.export(spec, result, out, overwrite=True)
    assert {p.name: p.read_bytes() for p in written.iterdir()} == before
    assert [p.name for p in out.iterdir()] == [NAME]  # no temporary folder left


def test_a_folder_the_script_did_not_write_is_refused_before_any_training(script, dest, capsys,
                                                                          monkeypatch):
    def train_one(*args):
        raise AssertionError("trained before the destination was checked")

    monkeypatch.setattr(script, "train_one", train_one)
    before = {p.name: p.read_bytes() for p in (dest / NAME).iterdir()}
    for flags in ([], ["--overwrite"]):  # a shipped model's folder carries no mark
        _refused(script, capsys, [NAME, "--dest", str(dest), *flags],
                 "non-empty directory that iclprobe did not write")
    assert {p.name: p.read_bytes() for p in (dest / NAME).iterdir()} == before


BENCH = Path(__file__).resolve().parents[1] / "bench" / "known_answers.py"


@pytest.mark.parametrize(("argv", "says"), [
    (["--n-boot", "0"], "--n-boot: AlignConfig.n_boot must be an integer >= 2, got 0"),
    (["--n-boot", "-1"], "--n-boot: AlignConfig.n_boot must be an integer >= 2, got -1"),
    (["--n-sequences", "0"], "--n-sequences: AlignConfig.n_sequences must be an integer >= 2, "
                             "got 0"),
    (["--n-sequences", "1"], "--n-sequences: AlignConfig.n_sequences must be an integer >= 2, "
                             "got 1"),
    (["--n-sequences", "-5"], "--n-sequences: AlignConfig.n_sequences must be an integer >= 2,"
                              " got -5"),
    (["--jobs", "0"], "--jobs must be >= 1 and <= 256, got 0"),
    (["--jobs", "100000"], "--jobs must be >= 1 and <= 256, got 100000"),  # as many processes
    (["--probe-folds", "1"], "--probe-folds: AlignConfig.probe_folds must be an integer >= 2, "
                             "got 1"),
    (["--probe-fit", "fresh", "--n-probe-sequences", "1"],
     "--n-probe-sequences: AlignConfig.n_probe_sequences must be an integer >= 2, got 1"),
    (["--n-probe-sequences", "500"], "--n-probe-sequences 500 needs --probe-fit fresh "
                                     "(cross-fitted probes read the evaluation sequences)"),
    (["--probe-fit", "fresh", "--probe-folds", "8"],
     "--probe-folds 8 applies to cross-fitted probes, not to --probe-fit fresh"),
])
def test_the_benchmark_refuses_bad_sizes_in_one_line(capsys, argv, says):
    assert _refusal(BENCH, "parse", argv, capsys) == f"known_answers.py: error: {says}"


def test_the_benchmark_refuses_an_out_it_may_not_write_before_the_run(tmp_path, capsys):
    """--out was checked only after the run: a user's known_answers.json was overwritten,
    a file as --out a traceback."""
    (tmp_path / "notes.txt").write_text("mine")
    user = tmp_path / "user"
    user.mkdir()
    (user / "known_answers.json").write_text("mine")
    for out, says in ((tmp_path / "notes.txt", "is a file"),
                      (user, "is a non-empty directory that iclprobe did not write")):
        err = _refusal(BENCH, "parse", ["--out", str(out)], capsys)
        assert err.startswith("known_answers.py: error: --out: ") and says in err, err
    assert (user / "known_answers.json").read_text() == "mine"
    bench, out = _load(BENCH), tmp_path / "ka"
    bench.write_outputs(out, {"answer": {}}, [])
    assert {p.name for p in out.iterdir()} == {"known_answers.json", "known_answers.csv",
                                               ".iclprobe"}
    assert "already holds iclprobe known answers output" in \
        _refusal(BENCH, "parse", ["--out", str(out)], capsys)
    assert bench.parse(["--out", str(out), "--overwrite"]).overwrite


def _load(path: Path):
    """The script at ``path`` as a module (its ``__main__`` block not run)."""
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _refusal(path: Path, entry: str, argv: list[str] | None, capsys) -> str:
    """What the script at ``path`` writes to stderr when ``entry(argv)`` exits with status 2.

    ``argv`` None: ``entry()``, which reads ``sys.argv``.
    """
    module = _load(path)
    with pytest.raises(SystemExit) as exit_:
        getattr(module, entry)(*([] if argv is None else [argv]))
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize("threads", ["0", "1025"])
@pytest.mark.parametrize("script_path", ["scripts/reproduce_ahn2023.py", "bench/learners.py",
                                         "scripts/ahn_reviewers.py"])
def test_other_scripts_refuse_a_bad_thread_count(script_path, threads, capsys, monkeypatch):
    """Siblings of --threads 0: every script's thread count is one type (cli.thread_count)."""
    path = Path(__file__).resolve().parents[1] / script_path
    monkeypatch.setattr(sys, "argv", [path.name, "--threads", threads])
    err = _refusal(path, "main", None, capsys)
    assert f"argument --threads: expected a number of threads from 1 to 1024, got {threads}" \
        in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", ["families", "learners", "demo", "design"])
def test_the_benches_refuse_zero_repeats_in_one_line(name, capsys, monkeypatch):
    """(Plain argparse printed its usage line too, wrapped over two for demo.py.)"""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    monkeypatch.setattr(sys, "argv", [path.name, "--repeats", "0"])
    err = _refusal(path, "main", None, capsys)
    assert err == f"{name}.py: error: argument --repeats: expected a positive integer, got 0"


def test_the_design_bench_checks_every_model_before_any_runs(capsys, monkeypatch):
    """(`--models lstm nosuch` ran lstm's benchmark, then ended in a traceback.)"""
    path = Path(__file__).resolve().parents[1] / "bench" / "design.py"
    monkeypatch.setattr(sys, "argv", [path.name, "--models", "lstm", "nosuch"])
    err = _refusal(path, "main", None, capsys)
    assert err.startswith("design.py: error: --models: checkpoint 'nosuch' not found") \
        and "\n" not in err


DECODE = Path(__file__).resolve().parents[1] / "bench" / "decode_probe.py"


@pytest.mark.parametrize(("argv", "says"), [
    (["--kinds", "blend oracle"], "--kinds: ['blend oracle'] are not kinds with a truth"),
    (["--kinds", "gd orcale"], "--kinds: ['gd orcale'] are not kinds with a truth"),
    (["--limit", "0"], "--limit must be >= 1, got 0"),
    (["--kinds", "gd oracle long"], "--kinds: no probe cell of ['gd oracle long'] in the main "
                                    "setting"),
    (["--out", "/nonexistent/dir/x.json"], "--out: the folder '/nonexistent/dir' does not exist"),
    # a user's file was replaced after the work, a folder a traceback, "" the work started
    (["--out", "{tmp}/notes.txt"], "--out: {tmp}/notes.txt exists: pass --overwrite to replace"),
    (["--out", "{tmp}"], "--out: {tmp} is a directory, not a file"),
    (["--out", ""], "argument --out: expected a file path, got ''"),
    (["--models", "lstm", "--out", "{tmp}/x.json", "--limit", "-5"],
     "--models reads the shipped models: --limit, --out apply to the benchmark's cells only"),
    (["--models", "gpt-sotfmax"], "--models: ['gpt-sotfmax'] are not shipped models; choose "
                                  "from ["),
    (["--models", ","], "--models: [] are not shipped models; choose from ["),
])
def test_the_decoding_measurement_refuses_bad_flags_in_one_line(capsys, argv, says, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    says = says.replace("{tmp}", str(tmp_path))
    err = _refusal(DECODE, "main", argv, capsys)
    assert err.startswith(f"decode_probe.py: error: {says}") and "\n" not in err


@pytest.mark.parametrize(("name", "argv", "says"), [
    ("align_layers", ["gpt-softmax", "extra"], "unrecognized arguments: extra"),
    ("align_layers", ["no-such-model"], "checkpoint 'no-such-model' not found"),
    ("quickstart", ["--steps", "0"], "argument --steps: expected a positive integer, got 0"),
    # (a count past Python's index bound overflowed in range's length, a traceback)
    ("quickstart", ["--steps", str(10**26)], "argument --steps: expected a positive integer at "
                                             f"most {sys.maxsize}, got {10**26}"),
    ("quickstart", ["--threads", "2"], "unrecognized arguments: --threads 2"),
])
def test_the_example_scripts_refuse_bad_arguments_in_one_line(capsys, name, argv, says):
    """The examples parse their arguments (they took a second one as a TypeError, and
    quickstart ignored any and trained for its full length)."""
    err = _refusal(Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py", "cli", argv,
                   capsys)
    assert "\n" not in err and says in err and "Traceback" not in err, err


def test_the_api_example_reads_every_kind_of_shipped_model(capsys):
    """align_layers.py crashed where no step-vs-layer line exists (one layer: the PQ and LSTM
    models) and refused ka-newton-pq, whose layers blow up off its trained length."""
    example = _load(Path(__file__).resolve().parents[1] / "scripts" / "align_layers.py")
    assert example.cli(["pq-isotropic-1layer"]) == 0
    assert "step vs layer: undefined (" in capsys.readouterr().out
    assert example.cli(["ka-newton-pq"]) == 0  # read exactly, at its trained length alone
    out = capsys.readouterr().out.splitlines()
    sims = [[float(v) for v in line.split("[")[1].rstrip("]").split(", ")]
            for line in out if line.startswith("  similarity")]
    newton, gd = sims
    # its known answer: Newton's iterates, closer than GD's at every layer that computes
    assert all(n > g for n, g in zip(newton[6:], gd[6:])), (newton, gd)


def test_the_benchmarks_exit_code_with_and_without_the_designed_views(capsys):
    bench = _load(BENCH)
    clean = {("main", "gd", "exact"): {"true": 31, "false": 0, "cannot tell": 0, "none": 0,
                                       "separable": 31, "true_separable": 31}}
    wrong = {k: {**v, "false": 1} for k, v in clean.items()}
    assert bench.exit_code(clean, {}, []) == 0  # without --design: the answer alone
    assert bench.exit_code(clean, {}, [], clean) == 0
    assert bench.exit_code(clean, {}, [], wrong) == 1  # a false attribution over both
    assert bench.exit_code(wrong, {}, [], clean) == 1
    out = capsys.readouterr().out
    assert "answer, both evaluations: FAIL: main exact: 1 false attributions" in out


@pytest.mark.parametrize(("script", "argv", "says"), [
    ("reproduce_ahn2023.py", ["--threads", "99999999999999999999"],
     "argument --threads: expected a number of threads from 1 to 1024"),
    ("reproduce_ahn2023.py", ["--plot-only", "--out", "{tmp}/none"],
     "--plot-only: no {tmp}/none/results.json: run without --plot-only first"),
    ("reproduce_ahn2023.py", ["--out", "{tmp}/user"], "is a non-empty directory that iclprobe "
                                                      "did not write"),
    ("reproduce_ahn2023.py", ["--plot-only", "--out", "{tmp}/user"], "not this script's JSON"),
    ("reproduce_fu2024.py", ["--device", "foo"], "argument --device: expected a torch device"),
    ("reproduce_fu2024.py", ["--out", "{tmp}/user"], "is a non-empty directory that iclprobe "
                                                     "did not write"),
    ("ahn_reviewers.py", ["--threads", "0"], "argument --threads: expected a number of threads"),
    # ("" is the current folder to Path: the refusal named "." instead of the value typed)
    ("ahn_reviewers.py", ["--out", ""], "argument --out: expected a directory path, got ''"),
    ("reproduce_fu2024.py", ["--out", " "], "argument --out: expected a directory path, got ' '"),
    ("ahn_reviewers.py", ["--out", "{tmp}/user/results.json"], "is a file, not a directory"),
])
def test_the_papers_scripts_refuse_in_one_line_before_any_work(script, argv, says, tmp_path,
                                                               capsys, monkeypatch):
    """A review found tracebacks (a bad --device, a file as --out, --threads 0 or huge), a
    report refused only after ten minutes of work, and reproduce_ahn2023.py writing over a
    user's results.json and figure. Each is now one line, exit 2, before the work, and
    the user's files are as they were."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "results.json").write_text("my results")
    path = Path(__file__).resolve().parents[1] / "scripts" / script
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    monkeypatch.setattr(sys, "argv", [path.name, *argv])
    err = _refusal(path, "main", None, capsys)
    assert says.replace("{tmp}", str(tmp_path)) in err and "Traceback" not in err
    assert err.count("\n") == 0
    assert [p.name for p in user.iterdir()] == ["results.json"]
    assert (user / "results.json").read_text() == "my results"


@pytest.mark.parametrize(("argv", "says"), [
    (["HEAD", "HEAD", "--models", "no-such-model"],
     "--models: ['no-such-model'] are not shipped models"),
    (["nosuchcommit", "HEAD"], "git could not resolve 'nosuchcommit' in"),
    (["HEAD", "HEAD", "--repo", "/nonexistent"], "git could not resolve 'HEAD' in /nonexistent"),
    (["HEAD", "HEAD", "--repo", "{other}", "--models", "lstm"],
     "--repo {other}: the commit's tree has no __init__.py at its root, so python imports "
     "no package iclprobe from"),
])
def test_same_outputs_refuses_what_it_cannot_compare(argv, says, capsys, tmp_path):
    """An unknown model failed alike on both commits and was reported "identical: 12 of 12
    outputs identical" (exit 0); a commit git cannot resolve gave a traceback, and so did a
    repository that is not iclprobe's (exit 1), which then was said to import iclprobe
    "from None"."""
    other = tmp_path / "other"  # a git repository of something else
    other.mkdir()
    (other / "a.txt").write_text("x")
    for cmd in (["init", "-q"], ["add", "a.txt"],
                ["-c", "user.email=a@b", "-c", "user.name=n", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(other), *cmd], check=True)
    argv = [a.replace("{other}", str(other)) for a in argv]
    says = says.replace("{other}", str(other))
    path = Path(__file__).resolve().parents[1] / "scripts" / "same_outputs.py"
    err = _refusal(path, "main", argv, capsys)
    assert says in err and "Traceback" not in err and err.count("\n") == 0


@pytest.fixture(scope="module")
def known_answers_script(script):  # its sibling import of train_pretrained needs `script`
    path = Path(__file__).resolve().parents[1] / "scripts" / "export_known_answers.py"
    spec = importlib.util.spec_from_file_location("export_known_answers", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def test_known_answer_exports_are_whole_and_never_rewrite_a_folder(known_answers_script,
                                                                   tmp_path, capsys):
    """The script rewrote config.json and the curves of any folder holding the same model
    (a user's saved copy too), and wrote each folder file by file."""
    ka, name = known_answers_script, "ka-gd-oracle"
    assert ka.main([name, "--dest", str(tmp_path)]) == 0
    out = tmp_path / name
    assert {p.name for p in out.iterdir()} == \
        {p.name for p in (PRETRAINED_DIR / name).iterdir()} | {".iclprobe"}
    assert ka._same_model(models.load(out), models.load(PRETRAINED_DIR / name))
    shipped = json.loads((PRETRAINED_DIR / name / "error_curve.json").read_text())
    curve = json.loads((out / "error_curve.json").read_text())
    assert curve.keys() == shipped.keys()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit) as exit_:
        ka.main([name, "--dest", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "already holds iclprobe checkpoint output" in err and "\n" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # --curves-only rewrites a folder only where it holds the constructor's model
    other = tmp_path / "other"
    shutil.copytree(PRETRAINED_DIR / "ka-newton-oracle", other / name)
    with pytest.raises(SystemExit):
        ka.main([name, "--dest", str(other), "--curves-only"])
    assert "holds another model than ka-gd-oracle's constructor" in capsys.readouterr().err
    (out / "error_curve.json").write_text("{}")
    assert ka.main([name, "--dest", str(tmp_path), "--curves-only"]) == 0
    assert (out / "error_curve.json").read_bytes() == before["error_curve.json"]
    # a curve-file name taken by a folder is refused before config.json is touched
    config = (out / "config.json").read_bytes()
    (out / "error_curve.csv").unlink()
    (out / "error_curve.csv").mkdir()
    with pytest.raises(SystemExit):
        ka.main([name, "--dest", str(tmp_path), "--curves-only"])
    assert "error_curve.csv is not a file" in capsys.readouterr().err
    assert (out / "config.json").read_bytes() == config
    (out / "error_curve.csv").rmdir()
    # rewritten in place, the folder is still iclprobe's: --overwrite replaces it whole
    meta = json.loads(config)
    (out / "config.json").write_text(json.dumps({**meta, "summary": "stale", "seen": 1}))
    assert ka.main([name, "--dest", str(tmp_path), "--curves-only"]) == 0
    assert json.loads((out / "config.json").read_text()) == {**meta, "seen": 1}
    assert ka.main([name, "--dest", str(tmp_path), "--overwrite"]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
