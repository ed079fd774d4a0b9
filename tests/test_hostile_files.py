"""Hostile or careless files, round 3: every reader answers in one line naming the file."""

import json
import re
import shutil

import pytest
import torch
import yaml
from helpers import one_line_error

from iclprobe import models
from iclprobe.cli import main
from iclprobe.models.config import GPTConfig
from iclprobe.storage import CheckpointError

DEEP_LIST = "[" * 100000 + "]" * 100000
DEEP_OBJECT = '{"a":' * 100000 + "1" + "}" * 100000
FAST = ["--n-sequences", "32", "--n-boot", "10", "--algorithms", "gd", "--metrics",
        "error_cosine"]
TRAIN = ["--n-dims", "3", "--n-points", "8", "--n-layers", "1", "--d-model", "8",
         "--n-heads", "1", "--batch-size", "8"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(["train", "--out", str(out), *TRAIN, "--steps", "2"]) == 0
    return out


@pytest.mark.parametrize("deep", [DEEP_LIST, DEEP_OBJECT], ids=["list", "object"])
@pytest.mark.parametrize("name", ["checkpoint/config.json", "checkpoint/task.json",
                                  "checkpoint/train.json"])
def test_deeply_nested_json_in_a_checkpoint_is_one_line(run, tmp_path, capsys, name, deep):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / name).write_text(deep)
    capsys.readouterr()
    assert main(["align", str(copy), *FAST]) == 2
    one_line_error(capsys, str(copy / name), "nested too deeply")
    if name == "checkpoint/train.json":
        assert main(["train", "--out", str(copy), "--resume", "--steps", "3"]) == 2
        one_line_error(capsys, str(copy / name), "nested too deeply")


@pytest.mark.parametrize("name", [".iclprobe", "metrics.jsonl"])
def test_deeply_nested_marker_or_log_line_does_not_stop_a_resume(run, tmp_path, capsys, name):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / name).write_text(DEEP_LIST + "\n")
    assert main(["align", str(copy), *FAST]) == 0
    assert main(["train", "--out", str(copy), "--resume", "--steps", "3"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_config_that_is_not_an_object_is_one_line(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    path = copy / "checkpoint" / "config.json"
    meta = json.loads(path.read_text())
    for bad in ([1, 2], "gpt", 3):
        path.write_text(json.dumps({**meta, "config": bad}))
        assert main(["align", str(copy), *FAST]) == 2
        one_line_error(capsys, str(path), "config", "JSON object")
    with pytest.raises(TypeError, match="GPTConfig.from_dict.*dict.*list"):
        GPTConfig.from_dict([1, 2])


@pytest.mark.parametrize(("field", "value", "says"), [
    ("n_points", 60, "task.n_points=60 is more than the model's n_positions=8"),
    ("n_dims", 4, "task.n_dims=4 but the model has n_dims=3")])
def test_a_task_json_the_model_cannot_take_is_refused_at_load(run, tmp_path, capsys, field,
                                                              value, says):
    """A task.json edited apart from its config.json (longer sequences than the model's
    positions, another dimension) is refused by `load`, naming both files, as `save` would
    refuse it; before, the longer task loaded and failed once probes were being fitted."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    path = copy / "checkpoint" / "task.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    with pytest.raises(CheckpointError, match=re.escape(says)):
        models.load(copy)
    assert main(["align", str(copy), *FAST]) == 2
    one_line_error(capsys, str(path), "the task does not fit the model of", says)


def _garg_dir(path, **model):
    """A Garg/Fu run directory of a 1-layer GPT-2 on d = 3 (its real file layout)."""
    path.mkdir()
    cfg = {"n_dims": 3, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 1, **model}
    (path / "config.yaml").write_text(yaml.safe_dump({"model": cfg, "training": {}}))
    torch.save({"model_state_dict": {"_read_in.weight": torch.zeros(8, 3)}}, path / "state.pt")
    return path


@pytest.mark.parametrize("field, value", [("n_layer", 1000000), ("n_embd", 10**9),
                                          ("n_positions", 10**9)])
def test_a_garg_config_far_larger_than_its_weights_is_refused_before_building(
        tmp_path, field, value):
    path = _garg_dir(tmp_path / "garg", **{field: value})
    with pytest.raises(CheckpointError, match=rf"config.yaml.*{field}={value}.*state.pt"):
        models.load(path)


@pytest.mark.parametrize("field, value, says", [
    ("n_layer", "abc", "'abc'"), ("n_dims", [3], "[3]"), ("n_head", 1.5, "1.5"),
    ("n_embd", True, "True")])
def test_a_garg_config_with_a_bad_value_names_the_file_and_field(tmp_path, capsys, field,
                                                                 value, says):
    path = _garg_dir(tmp_path / "garg", **{field: value})
    with pytest.raises(CheckpointError, match=rf"config.yaml: model.{field} must be a positive "
                                              rf"integer, got {re.escape(says)}"):
        models.load(path)
    assert main(["align", str(path), *FAST]) == 2
    one_line_error(capsys, str(path / "config.yaml"), f"model.{field}")


def test_deeply_nested_task_json_text_is_a_value_error():
    from iclprobe.tasks import RegressionTask

    with pytest.raises(ValueError, match="invalid task JSON"):
        RegressionTask.from_json(DEEP_OBJECT)


@pytest.mark.slow
def test_deeply_nested_garg_yaml_is_one_line(tmp_path, capsys):
    path = _garg_dir(tmp_path / "garg")
    (path / "config.yaml").write_text("model: " + DEEP_LIST)
    assert main(["align", str(path), *FAST]) == 2
    one_line_error(capsys, str(path / "config.yaml"), "nested too deeply")


@pytest.mark.parametrize("edit", [lambda meta: DEEP_LIST, lambda meta: json.dumps(
    {**meta, "model_hash": 12}), lambda meta: json.dumps({**meta, "target": ["y"]})])
def test_a_hostile_probes_json_is_a_value_error_naming_it(tmp_path, edit):
    from helpers import tiny_gpt

    from iclprobe import probes, tasks

    model = tiny_gpt()
    probes.LayerProbes().fit(model, tasks.RegressionTask(n_dims=3, n_points=8), n_sequences=64,
                             n_heldout=8).save(tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "probes.json").read_text())
    (tmp_path / "p" / "probes.json").write_text(edit(meta))
    with pytest.raises(ValueError, match="probes.json: (not valid JSON|invalid)"):
        probes.LayerProbes.load(tmp_path / "p", model)


def test_a_garg_run_missing_or_with_junk_weights_names_state_pt(tmp_path, capsys):
    """config.yaml without state.pt names the missing state.pt (not a config.json the run
    never had); a state.pt of five bytes of text, which torch reads as a legacy file and
    fails on with a bare number, says it is no file torch can read."""
    missing = _garg_dir(tmp_path / "missing")
    (missing / "state.pt").unlink()
    assert main(["align", str(missing), *FAST]) == 2
    one_line_error(capsys, str(missing / "state.pt"), "file is missing", "beside config.yaml")
    junk = _garg_dir(tmp_path / "junk")
    (junk / "state.pt").write_bytes(b"junk\n")
    with pytest.raises(CheckpointError, match=r"truncated, corrupt or unsafe \(not a file "
                                              r"torch can read: \w+ -?\d+\)"):
        models.load(junk)
