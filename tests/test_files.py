"""Nothing lost: every writer refuses what it did not write, reports are swapped in whole,
saved probes say how they were fitted, outputs get the user's permissions."""

import json
import os
import stat

import pytest
import torch
from helpers import one_line_error, tiny_gpt
from safetensors.torch import load_file, save_file

from iclprobe import models, probes, tasks, training
from iclprobe._shipped import PRETRAINED_DIR
from iclprobe.cli import main

FAST = ["--n-sequences", "32", "--n-probe-sequences", "64"]
TASK = tasks.RegressionTask(n_dims=3, n_points=8)


@pytest.fixture
def ckpt(tmp_path):
    model = tiny_gpt("linear", "paired")
    model.save(tmp_path / "lin", task=TASK)
    return tmp_path / "lin"


def foreign_dir(path):
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("mine")
    return path


def listing(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# ---------------------------------------------------------------- writers refuse
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_probe_out_refuses_a_foreign_directory_and_a_file(ckpt, tmp_path, capsys, overwrite):
    mine = foreign_dir(tmp_path / "mine")
    assert main(["probe", str(ckpt), "--n-sequences", "16", "--out", str(mine), *overwrite]) == 2
    one_line_error(capsys, str(mine), "did not write")
    assert listing(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "mine"
    paper = tmp_path / "paper.txt"
    paper.write_text("draft")
    assert main(["probe", str(ckpt), "--n-sequences", "16", "--out", str(paper), *overwrite]) == 2
    one_line_error(capsys, str(paper), "is a file")
    assert paper.read_text() == "draft"
    below = paper / "sub"  # a path through a file: named, not "[Errno 17] File exists"
    assert main(["probe", str(ckpt), "--n-sequences", "16", "--out", str(below), *overwrite]) == 2
    one_line_error(capsys, f"{below} cannot be created: {paper} is a file", "choose another")
    assert paper.read_text() == "draft"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lin", "mine", "paper.txt"]


def test_save_replaces_only_its_own_checkpoint_and_only_when_asked(tmp_path):
    model, other = tiny_gpt(), tiny_gpt(seed=3)
    mine = foreign_dir(tmp_path / "mine")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="non-empty directory that iclprobe did not"):
            models.save(model, mine, task=TASK, overwrite=overwrite)
    assert listing(mine) == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="file is a file, not a directory"):
        models.save(model, tmp_path / "file", overwrite=True)
    assert (tmp_path / "file").read_text() == "x"
    models.save(model, tmp_path / "ck", task=TASK)
    with pytest.raises(FileExistsError, match="already holds iclprobe checkpoint output"):
        models.save(other, tmp_path / "ck")
    models.save(other, tmp_path / "ck", overwrite=True)  # re-saving its own: allowed
    assert torch.equal(models.load(tmp_path / "ck").read_in.weight, other.read_in.weight)
    (tmp_path / "ck" / "notes.txt").write_text("mine")  # a user's file inside
    with pytest.raises(FileExistsError, match=r"files that iclprobe did not write \(notes.txt\)"):
        models.save(model, tmp_path / "ck", overwrite=True)
    assert (tmp_path / "ck" / "notes.txt").read_text() == "mine"
    with pytest.raises(FileExistsError, match="holds an iclprobe checkpoint, not probes"):
        probes.LayerProbes().fit(model, TASK, n_sequences=16, n_heldout=8).save(
            tmp_path / "ck", overwrite=True)


def test_reports_refuse_foreign_output_before_any_work(ckpt, tmp_path, capsys, monkeypatch):
    import iclprobe.alignment.pipeline as pipeline

    def no_work(*args, **kwargs):
        raise AssertionError("aligned before checking --out")

    monkeypatch.setattr(pipeline, "align", no_work)
    mine = foreign_dir(tmp_path / "mine")
    for argv in (["align", str(ckpt), *FAST], ["compare", str(ckpt), str(ckpt), *FAST],
                 ["demo"]):
        assert main([*argv, "--out", str(mine)]) == 2
        one_line_error(capsys, str(mine), "did not write")
    assert listing(mine) == ["notes.txt"]
    assert main(["train", "--out", str(mine), "--steps", "2"]) == 2
    one_line_error(capsys, str(mine), "did not write")
    assert listing(mine) == ["notes.txt"]
    # every writer, train included, names a file that an --out path runs through
    through = mine / "notes.txt" / "run"
    for argv in (["align", str(ckpt), *FAST], ["demo"], ["train", "--steps", "2"]):
        assert main([*argv, "--out", str(through)]) == 2
        one_line_error(capsys, f"{through} cannot be created: {mine / 'notes.txt'} is a file")
    assert listing(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- reports
@pytest.mark.slow  # two aligns and reports in subprocesses; atomic replacement: test_replace
def test_an_interrupted_align_keeps_the_old_report_and_a_new_one_replaces_it_whole(
        ckpt, tmp_path, capsys, monkeypatch):
    import iclprobe.alignment.output.report as report

    other = tmp_path / "soft"
    tiny_gpt("softmax", "paired").save(other, task=TASK)
    out = tmp_path / "report"
    assert main(["align", str(ckpt), *FAST, "--out", str(out)]) == 0
    before = {p: (out / p).read_bytes() for p in listing(out) if (out / p).is_file()}
    assert "lin/error.png" in before
    capsys.readouterr()
    assert main(["align", str(other), *FAST, "--out", str(out)]) == 2
    one_line_error(capsys, "already holds iclprobe report output", "--overwrite")
    real = report.write_report

    def interrupted(out_dir, *args, **kwargs):
        real(out_dir, *args, **kwargs)
        (out_dir / "summary.json").write_text("{")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_report", interrupted)
    assert main(["align", str(other), *FAST, "--out", str(out), "--overwrite"]) == 130
    assert {p: (out / p).read_bytes() for p in listing(out) if (out / p).is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lin", "report", "soft"]
    monkeypatch.setattr(report, "write_report", real)
    assert main(["align", str(other), *FAST, "--out", str(out), "--overwrite"]) == 0
    names = listing(out)
    assert "soft/error.png" in names and not any("lin" in n for n in names)  # no mix


@pytest.mark.slow  # three aligns and reports; compare's report: test_cli
def test_compare_of_two_runs_with_one_directory_name_keeps_both(tmp_path, capsys):
    # GD constructions: models that solve the task, so their alignment has tables
    d = TASK.n_dims
    models.PQTransformer.from_matrices(A=[0.2 * torch.eye(d)] * 3).save(tmp_path / "a" / "run",
                                                                         task=TASK)
    models.PQTransformer.from_matrices(A=[0.4 * torch.eye(d)] * 3).save(tmp_path / "b" / "run",
                                                                         task=TASK)
    out = tmp_path / "cmp"
    runs = [str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run")]
    assert main(["compare", *runs, *FAST, "--metric", "error_cosine", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["models"]) == {"a_run", "b_run"}
    assert {"a_run/error.png", "b_run/error.png", "a_run/table_error_cosine.csv",
            "b_run/table_error_cosine.csv", "a_run/result.json"} <= set(listing(out))
    # the two entries are the two models' own results
    a, b = (summary["models"][k]["layer_error"] for k in ("a_run", "b_run"))
    assert a != b
    capsys.readouterr()
    assert main(["compare", runs[0], runs[0], *FAST, "--metric", "error_cosine", "--json"]) == 0
    # one checkpoint twice keeps align's name for it, numbered (a shipped model given twice
    # was "pretrained_gpt-softmax", after the package's own folder)
    assert list(json.loads(capsys.readouterr().out)) == ["run", "run-2"]


def test_align_of_a_runs_checkpoint_is_named_after_the_run(tmp_path, capsys):
    run = tmp_path / "my-run"
    training.train(tiny_gpt("linear", "paired"), TASK, training.TrainConfig(steps=2, log_every=1),
                 out=run, progress=False)
    assert main(["align", str(run / "checkpoint"), *FAST, "--metric", "error_cosine",
                 "--algorithms", "newton", "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["my-run"]


# ---------------------------------------------------------------- saved probes
def test_probes_of_a_shipped_model_go_to_the_user_cache(tmp_path, monkeypatch, capsys):
    name = "gpt-linear-paired"  # a GPT: a PQ model is read exactly, without probes
    shipped = PRETRAINED_DIR / name
    inside = shipped / "probes"
    existed = inside.exists()

    def snapshot():
        return sorted((str(p.relative_to(shipped)), p.stat().st_mtime_ns)
                      for p in shipped.rglob("*"))

    before = snapshot()
    monkeypatch.setenv("ICLPROBE_CACHE", str(tmp_path / "cache"))
    try:
        assert main(["probe", name, "--n-sequences", "64"]) == 0
        assert snapshot() == before  # nothing written into, or changed in, the package
    finally:
        if inside.exists() and not existed:  # what the old behaviour left in the package
            import shutil

            shutil.rmtree(inside)
    cached = tmp_path / "cache" / "probes" / name
    assert str(cached) in capsys.readouterr().out
    fit = json.loads((cached / "probes.json").read_text())["fit"]
    assert fit["n_sequences"] == 64 and fit["seed"] == 1
    assert fit["task"] == models.load(name).task.to_dict()


def test_align_says_which_probes_it_used_and_refits_when_asked(ckpt, capsys):
    align = ["align", str(ckpt), "--n-sequences", "32", "--metric", "error_cosine",
             "--algorithms", "newton", "--json"]
    assert main(["probe", str(ckpt), "--n-sequences", "48"]) == 0
    capsys.readouterr()

    def run(*extra):
        assert main([*align, *extra]) == 0
        captured = capsys.readouterr()  # the notes unwrapped (stderr keeps to 100 columns)
        return json.loads(captured.out)["lin"], " ".join(captured.err.split())

    res, err = run()
    assert res["probes"]["source"] == "saved" and res["probes"]["n_sequences"] == 48
    assert res["probes"]["path"] == str(ckpt / "probes") and res["probes"]["seed"] == 1
    assert f"using the probes saved in {ckpt / 'probes'} (48 sequences, data seed 1" in err
    # the numbers are those of the saved probes
    model = models.load(ckpt)
    saved = probes.LayerProbes.load(ckpt / "probes", model)
    from iclprobe.alignment.pipeline import AlignConfig
    from iclprobe.alignment.pipeline import align as align_fn

    cfg = AlignConfig(algorithms=("newton",), metrics=("error_cosine",), n_sequences=32)
    assert res["layer_error"] == align_fn(model, cfg, layer_probes=saved).layer_error
    for extra, reason in [(["--n-probe-sequences", "64"], "48 sequences, not 64"),
                          (["--seed", "2"], "seed 1, not 3"),
                          (["--data", "isotropic"], ""),  # same data: the task is isotropic
                          (["--data", "ill-conditioned"], "other data"),
                          (["--refit-probes"], "--refit-probes")]:
        res, err = run(*extra)
        if not reason:
            assert res["probes"]["source"] == "saved", extra
            continue
        # saved probes that do not fit: align cross-fits probes on its own sequences
        assert res["probes"]["source"] == "cross-fitted", extra
        assert "cross-fitting probes on the 32 evaluation sequences" in err and reason in err
        # a count the cross-fitted probes do not use says so, not silently dropped
        assert ("n_probe_sequences=64 only selects saved probes" in err) == \
            ("--n-probe-sequences" in extra)
    assert res["probes"]["n_sequences"] == 32 and res["probes"]["folds"] == 4


def test_corrupt_or_non_finite_saved_probes_are_refitted_saying_so(ckpt, capsys):
    model = models.load(ckpt)
    probes.LayerProbes().fit(model, n_sequences=64, generator=1).save(ckpt / "probes")
    weights = ckpt / "probes" / "probes.safetensors"
    tensors = load_file(str(weights))
    align = ["align", str(ckpt), *FAST, "--metric", "error_cosine", "--algorithms", "newton",
             "--json"]
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="probes.safetensors: truncated or corrupt"):
        probes.LayerProbes.load(ckpt / "probes", model)
    assert main(align) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["lin"]["probes"]["source"] == "cross-fitted"
    assert "not using the saved probes" in captured.err and str(weights) in captured.err
    tensors["coef"][1, 0] = float("nan")
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match=r"probes.safetensors: non-finite .* \['coef'\]"):
        probes.LayerProbes.load(ckpt / "probes", model)
    assert main(align) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["lin"]["probes"]["source"] == "cross-fitted"
    assert "non-finite" in captured.err and "Traceback" not in captured.err


def test_probes_json_records_how_the_probes_were_fitted(tmp_path):
    model = tiny_gpt()
    lp = probes.LayerProbes(alpha=0.5).fit(model, TASK, n_sequences=40, generator=7,
                                           n_heldout=20)
    lp.save(tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "probes.json").read_text())
    assert meta["alpha"] == 0.5 and meta["target"] == "y"
    fit = meta["fit"]
    assert (fit["n_sequences"], fit["n_heldout"], fit["seed"]) == (40, 20, 7)
    assert fit["task"] == TASK.to_dict() and fit["fitted_at"][:2] == "20"
    assert probes.LayerProbes.load(tmp_path / "p", model).fit_settings_ == fit
    used = torch.Generator().manual_seed(7)
    torch.randn(3, generator=used)  # a drawn-from generator stands for no seed
    again = probes.LayerProbes().fit(model, TASK, n_sequences=40, generator=used, n_heldout=20)
    assert again.fit_settings_["seed"] is None
    fresh = probes.LayerProbes().fit(model, TASK, n_sequences=40,
                                     generator=torch.Generator().manual_seed(7), n_heldout=20)
    assert fresh.fit_settings_["seed"] == 7
    torch.testing.assert_close(fresh.coef_, probes.LayerProbes().fit(
        model, TASK, n_sequences=40, generator=7, n_heldout=20).coef_, rtol=0, atol=0)


# ---------------------------------------------------------------- permissions
def test_outputs_get_the_users_permissions(ckpt, tmp_path):
    old = os.umask(0o027)
    try:
        models.save(tiny_gpt(), tmp_path / "ck")
        assert main(["align", str(ckpt), *FAST, "--algorithms", "newton", "--metric",
                     "error_cosine", "--out", str(tmp_path / "rep")]) == 0
        training.train(tiny_gpt("linear", "paired"), TASK, training.TrainConfig(steps=2),
                     out=tmp_path / "run", progress=False)
    finally:
        os.umask(old)
    for root in ("ck", "rep", "run"):
        for path in [tmp_path / root, *(tmp_path / root).rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == (0o750 if path.is_dir() else 0o640), (path, oct(mode))
