"""Probe resolution is the library's: ``iclprobe align X`` and ``align(load(X))`` agree."""

import dataclasses
import json

import pytest
import torch
from helpers import tiny_gpt, tiny_pq

from iclprobe import models, probes, tasks
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.measuring.probe_source import probes_dir, resolve_probes
from iclprobe.alignment.pipeline import align
from iclprobe.cli import main

SHIPPED = "gpt-linear-paired"  # the cheapest shipped GPT to run (n tokens, not 2n)
FLAGS = ["--n-sequences", "64", "--n-boot", "20", "--metrics", "error_cosine",
         "--algorithms", "newton", "--no-separation", "--no-fitted"]
CFG = AlignConfig(n_sequences=64, n_boot=20, metrics=("error_cosine",),
                  algorithms=("newton",), separation=False, fitted=False)
TASK = tasks.RegressionTask(n_dims=3, n_points=8)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLPROBE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def cli_json(capsys, *extra):
    assert main(["align", SHIPPED, *FLAGS, *extra, "--json"]) == 0
    captured = capsys.readouterr()  # the notes unwrapped (stderr keeps to 100 columns)
    return json.loads(captured.out)[SHIPPED], " ".join(captured.err.split())


def library(cfg):
    res = align(models.load(SHIPPED), cfg, name=SHIPPED)
    return json.loads(json.dumps(res.to_dict()))  # as the CLI prints it


@pytest.mark.slow
def test_the_cli_and_the_library_agree_with_and_without_a_cached_probe(cache, capsys):
    printed, err = cli_json(capsys)
    assert printed["probes"]["source"] == "cross-fitted" and "cross-fitting" in err
    assert printed == library(CFG)
    assert main(["probe", SHIPPED, "--n-sequences", "64"]) == 0  # into the user cache
    capsys.readouterr()
    assert (cache / "probes" / SHIPPED / "probes.json").is_file()
    printed_saved, err = cli_json(capsys)
    assert printed_saved["probes"]["source"] == "saved"
    assert printed_saved["probes"]["path"] == str(cache / "probes" / SHIPPED)
    assert f"{SHIPPED}: using the probes saved in {cache / 'probes' / SHIPPED}" in err
    assert printed_saved == library(CFG)
    assert printed_saved["layer_error"] != printed["layer_error"]  # the probes mattered
    printed_refit, err = cli_json(capsys, "--refit-probes")  # cross-fitted as at first
    assert printed_refit["layer_error"] == printed["layer_error"] and "(--refit-probes)" in err


def test_saved_probes_are_used_by_the_library_where_they_fit(tmp_path):
    path = tmp_path / "lin"
    tiny_gpt("linear", "paired").save(path, task=TASK)
    model = models.load(path)
    assert model.checkpoint == path.resolve() and probes_dir(path) == path.resolve() / "probes"
    cfg = AlignConfig(n_sequences=32, metrics=("error_cosine",), algorithms=("newton",))
    assert resolve_probes(model, cfg, TASK)[0] is None  # none saved: align cross-fits
    saved = probes.LayerProbes().fit(model, TASK, n_sequences=48, generator=1)
    saved.save(path / "probes")
    lp, record = resolve_probes(model, cfg, TASK)
    torch.testing.assert_close(lp.coef_, saved.coef_, rtol=0, atol=0)
    assert (record["source"], record["n_sequences"], record["seed"]) == ("saved", 48, 1)
    for change, why in [({"n_probe_sequences": 64}, "48 sequences, not 64"),
                        ({"seed": 4}, "seed 1, not 5"),
                        ({"refit_probes": True}, "(--refit-probes)")]:
        lp, record = resolve_probes(model, dataclasses.replace(cfg, **change), TASK)
        assert lp is None and record["source"] == "cross-fitted", change
        assert why in record["notes"][-1], (change, record["notes"])
    fresh = dataclasses.replace(cfg, probe_fit="fresh", refit_probes=True)
    lp, record = resolve_probes(model, fresh, TASK)
    assert record["source"] == "fitted" and record["n_sequences"] == 1000
    assert lp.fit_settings_["n_sequences"] == 1000 and lp.fit_settings_["seed"] == 1
    built = tiny_gpt("linear", "paired")  # not loaded: nowhere to look for saved probes
    assert built.checkpoint is None and resolve_probes(built, cfg, TASK)[0] is None


def test_probe_settings_given_to_a_model_read_exactly_are_said_not_to_apply():
    # an exact readout needs no probes: the settings were accepted and dropped silently
    model = tiny_pq()
    assert model.exact_layer_readout
    _, record = resolve_probes(model, AlignConfig(probe_fit="fresh", n_probe_sequences=50,
                                                  probe_folds=7), TASK, "pq")
    assert record["source"] == "none: the layers are read exactly"
    assert record["notes"] == ["the layers are read exactly, without probes: "
                               "probe_fit='fresh', probe_folds=7, n_probe_sequences=50 do "
                               "not apply"]
    assert resolve_probes(model, AlignConfig(), TASK)[1]["notes"] == []  # defaults: no note


def test_the_screen_says_when_saved_probes_read_the_layers(tmp_path):
    """In Python the saved probes' line was logged at INFO only (hidden by default), while
    they change the numbers and even the answer: the screen's readout line says so."""
    from iclprobe.alignment.output.screen import screen

    path = tmp_path / "lin"
    tiny_gpt("linear", "paired").save(path, task=TASK)
    cfg = AlignConfig(n_sequences=32, metrics=("error_cosine",), algorithms=("newton", "gd"))
    said = "the ridge probes saved in"
    assert said not in align(models.load(path), cfg, name="lin").readout
    probes.LayerProbes().fit(models.load(path), TASK, n_sequences=48, generator=1
                             ).save(path / "probes")
    res = align(models.load(path), cfg, name="lin")
    assert res.readout == (f"{said} {(path / 'probes').resolve()} (fitted per layer to y on 48 "
                           "fresh sequences; refit_probes=True, --refit-probes, ignores them)")
    assert f"layers read by {res.readout}" in " ".join(screen(res).split())
    refit = align(models.load(path), dataclasses.replace(cfg, refit_probes=True), name="lin")
    assert said not in refit.readout
