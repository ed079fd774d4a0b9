"""CLI flags generated from the config dataclasses: one per field, with the field's default."""

import argparse
import dataclasses
import json
import math
import re

import pytest

from iclprobe import models, tasks
from iclprobe._checks import option
from iclprobe.alignment.config import DEFAULT_METRICS, AlignConfig
from iclprobe.cli import build_parser, main
from iclprobe.cli_commands import _align_config
from iclprobe.cli_flags import (
    MODEL_FROM_TASK,
    TRAIN_TASK_DEFAULTS,
    align_flags,
    given,
    train_flags,
)
from iclprobe.cli_train import _train_setup
from iclprobe.models.config import ConfigMixin
from iclprobe.models.registry import FAMILIES, register_family
from iclprobe.tasks.fields import TaskFields
from iclprobe.training.config import TrainConfig

MISSING = dataclasses.MISSING


def trainable():
    """The families ``iclprobe train`` builds (an oracle is built in Python, never trained)."""
    return {name: family for name, family in FAMILIES.items() if family.trainable}


def actions(command):
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {a.dest: a for a in sub.choices[command]._actions}


def shown_defaults(help_text, owners):
    """The help's ``(default: …)`` per owner: one text, or ``a, b: x; c: y``."""
    match = re.search(r"\(default: ([^()]*)\)$", help_text)
    assert match, help_text
    text, out = match.group(1), {}
    for part in text.split("; "):
        names, sep, value = part.rpartition(": ")
        if not sep or not set(names.split(", ")) <= set(owners):
            return dict.fromkeys(owners, text)
        out.update(dict.fromkeys(names.split(", "), value))
    return out


def parse(argv):
    args = build_parser().parse_args(argv)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()}


def typed(option_string, text):
    """The words that give ``text`` (as the help shows it) to a flag."""
    if text in ("True", "False"):  # --flag / --no-flag
        return [option_string if text == "True" else "--no-" + option_string[2:]]
    return [option_string, *text.split()]


def check_shown_default(command, prefix, cls, owner="", rename=None):
    """Each field of ``cls`` has a flag; the default its help shows parses to the field's.

    ``owner``: the family whose config ``cls`` is (a flag of several says each default).
    """
    rename = rename or {}
    found = actions(command)
    for field in dataclasses.fields(cls):
        dest = rename.get(field.name, field.name)
        if field.name in MODEL_FROM_TASK and command == "train":
            source = MODEL_FROM_TASK[field.name]
            assert source in found, (cls.__name__, field.name)  # the task's flag sets it
            if field.name != source:
                assert found[dest].help.endswith(f"(default: --{source.replace('_', '-')})")
            continue
        assert dest in found, (cls.__name__, field.name)
        action = found[dest]
        assert action.default == argparse.SUPPRESS  # absent: the dataclass's default applies
        assert dest not in parse(prefix)
        if field.default is None:
            assert "(default: " in action.help, (field.name, action.help)  # says what None is
            continue
        owners = [n for n, f in FAMILIES.items() if f.trainable
                  and field.name in {g.name for g in dataclasses.fields(f.config)}]
        owners = owners if owner else [owner]
        text = shown_defaults(action.help, owners)[owner]
        value = parse([*prefix, *typed(action.option_strings[0], text)])[dest]
        assert value == field.default, (cls.__name__, field.name, text)


def test_every_train_and_align_field_has_a_flag_showing_its_default():
    check_shown_default("train", ["train", "--out", "x"], TrainConfig)
    check_shown_default("align", ["align", "ckpt"], AlignConfig)
    for name, family in trainable().items():
        check_shown_default("train", ["train", "--out", "x", "--family", name], family.config,
                            name, {"seed": "model_seed"})
    assert len(dataclasses.fields(AlignConfig)) == len(align_flags()) == 25


def test_the_task_flags_come_from_the_task_dataclass():
    """One home: RegressionTask's fields are TaskFields', and train's flags are made of them."""
    task_fields = {f.name: f.default for f in dataclasses.fields(tasks.RegressionTask) if f.init}
    flags = {f.name: f for f in train_flags()["task"]}
    assert flags.keys() == task_fields.keys()
    assert issubclass(tasks.RegressionTask, TaskFields)
    for name, flag in flags.items():
        want = TRAIN_TASK_DEFAULTS.get(name, task_fields[name])  # train's sizes: its own
        assert flag.defaults == {"": want}, name
        assert flag.help == dataclasses.fields(TaskFields)[list(flags).index(name)].metadata[
            "help"]


@pytest.mark.slow
def test_absent_flags_give_the_dataclass_defaults(tmp_path):
    assert _align_config(build_parser().parse_args(["align", "ckpt"])) == AlignConfig()
    for name, family in trainable().items():
        args = build_parser().parse_args(["train", "--out", str(tmp_path), "--family", name])
        model, task, cfg = _train_setup(args)
        assert cfg == TrainConfig()
        assert task.to_dict() == tasks.RegressionTask(n_dims=8, n_points=24).to_dict()
        sizes = {"n_dims": 8, "n_positions": 24}
        fields = {f.name for f in dataclasses.fields(family.config)}
        assert model.cfg == family.config(**{k: v for k, v in sizes.items() if k in fields})


def test_given_flags_are_the_values_typed():
    args = build_parser().parse_args(["align", "ckpt", "--metric", "both", "--algorithms",
                                      "newton, gd", "--no-separation", "--n-queries", "7",
                                      "--confidence", "0.9"])
    assert given(args, align_flags()) == {"metrics": DEFAULT_METRICS, "separation": False,
                                          "algorithms": ("newton", "gd"), "n_queries": 7,
                                          "confidence": 0.9}
    args = build_parser().parse_args(["align", "ckpt", "--metrics", "error_cosine,spd"])
    assert _align_config(args).metrics == ("error_cosine", "spd")
    args = build_parser().parse_args(["train", "--out", "x", "--betas", "0.5", "0.6",
                                      "--seed", "3", "--model-seed", "4", "--task-seed", "5"])
    flags = train_flags()
    assert given(args, flags["training"]) == {"betas": (0.5, 0.6), "seed": 3}
    assert given(args, flags["model"]) == {"seed": 4}
    assert given(args, flags["task"]) == {"seed": 5}


@dataclasses.dataclass(frozen=True)
class TinyConfig(ConfigMixin):
    n_dims: int = option(help="covariate dimension d")
    n_layers: int = option(2, "mixing layers")
    width: float = option(0.5, "mixing width")
    kind: str = option("a", "mixing kind", choices=("a", "b"))
    seed: int = option(0, "initialization seed")


def test_a_newly_registered_family_gets_its_flags(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(FAMILIES, "tiny", None)  # removed again after the test
    register_family("tiny", TinyConfig, "iclprobe.models.lstm:LSTMRegressor", "a tiny mixer")
    found = actions("train")
    assert found["width"].help == "tiny: mixing width (default: 0.5)"
    assert found["kind"].metavar == "{a,b}"
    assert found["n_layers"].help.endswith("(default: gpt: 8; pq, lstm: 3; tiny: 2)")
    check_shown_default("train", ["train", "--out", "x", "--family", "tiny"], TinyConfig, "tiny")
    args = build_parser().parse_args(["train", "--out", "x", "--width", "0.25"])
    assert given(args, train_flags()["model"]) == {"width": 0.25}
    assert main(["train", "--out", str(tmp_path / "r"), "--width", "0.25"]) == 2
    assert "not applicable to --family gpt: --width" in capsys.readouterr().err
    # its config's errors name the flag the user typed, its seed as --model-seed
    from iclprobe._checks import ConfigError
    from iclprobe.cli import flag_of

    assert flag_of(ConfigError("TinyConfig", "width", "must be > 0"), "train") == "--width"
    assert flag_of(ConfigError("TinyConfig", "seed", "bad seed"), "train") == "--model-seed"
    assert flag_of(ConfigError("Other", "width", "must be > 0"), "train") == "--width"
    assert flag_of(ConfigError("TinyConfig", "nothing", "must be > 0"), "train") is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_sequences": True}, TypeError, "AlignConfig.n_sequences must be an integer >= 2, "
                                           "got True"),
        ({"n_probe_heldout": 1}, ValueError, "AlignConfig.n_probe_heldout must be an integer >= 2"),
        ({"n_weight_sequences": 1.5}, TypeError, "AlignConfig.n_weight_sequences must be an "),
        ({"n_boot": 1}, ValueError, "AlignConfig.n_boot must be an integer >= 2, got 1"),
        ({"n_queries": 0}, ValueError, "AlignConfig.n_queries must be a positive integer, got 0"),
        ({"t_min": -1}, ValueError, "AlignConfig.t_min must be an integer >= 0, got -1"),
        ({"t_min": 15, "t_max": 12}, ValueError,  # was accepted where positions were "last"
         r"AlignConfig.t_max must be >= t_min=15 \(the window t_min..t_max\), got 12"),
        ({"seed": -1}, ValueError, r"AlignConfig.seed must be an integer seed in \[0, 2\*\*63\)"),
        ({"seed": 2**63}, ValueError, "AlignConfig.seed must be an integer seed"),
        ({"seed": 2**63 - 1}, ValueError,  # named the probes' generator, not the seed
         r"AlignConfig.seed must be at most 2\*\*63 - 4 \(the probes' data are drawn with"),
        ({"seed": 2**63 - 3}, ValueError,  # the queries' stream is seed + 3
         r"the induced weights' queries with seed \+ 3\), got 9223372036854775805"),
        ({"device": "tpu"}, ValueError, r"AlignConfig.device must be one of \('cpu', 'cuda'\)"),
        ({"data": "hard"}, ValueError, "AlignConfig.data must be one of"),
        ({"separation": "yes"}, TypeError, "AlignConfig.separation must be a bool, got 'yes'"),
        ({"confidence": 1.0}, ValueError, r"AlignConfig.confidence must be a number in \(0, 1\)"),
        ({"confidence": math.nan}, ValueError,
         r"AlignConfig.confidence must be .*, got nan \(not finite\)"),
        ({"condition_number": math.inf}, ValueError,
         r"AlignConfig.condition_number must be a number in \[1, 1e6\], got inf"),
        ({"metrics": "error_cosine"}, TypeError, "AlignConfig.metrics must be a tuple of names"),
        ({"metrics": ()}, ValueError, "AlignConfig.metrics must be among"),
        ({"algorithms": ()}, ValueError, r"AlignConfig.algorithms must name at least one learner"),
    ],
)
def test_align_config_refuses_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        AlignConfig(**kwargs)


def test_align_config_takes_lists_as_tuples():
    cfg = AlignConfig(algorithms=["newton"], metrics=["error_cosine"])
    assert cfg.algorithms == ("newton",) and cfg.metrics == ("error_cosine",)
    assert hash(cfg) == hash(AlignConfig(algorithms=("newton",), metrics=("error_cosine",)))


@pytest.mark.parametrize(
    ("flags", "cfg"),
    [
        pytest.param(["--seed", "3", "--n-sequences", "64", "--n-probe-sequences", "128"],
                     {"seed": 3, "n_sequences": 64, "n_probe_sequences": 128},
                     marks=pytest.mark.slow),
        (["--seed", "3", "--n-sequences", "16", "--n-probe-sequences", "32", "--metric",
          "error_cosine", "--no-separation", "--n-boot", "10", "--n-probe-heldout", "16",
          "--algorithms", "newton,gd"],
         {"seed": 3, "n_sequences": 16, "n_probe_sequences": 32, "metrics": ("error_cosine",),
          "separation": False, "n_boot": 10, "n_probe_heldout": 16,
          "algorithms": ("newton", "gd")}),
    ],
)
@pytest.mark.slow
def test_cli_align_gives_the_numbers_of_the_python_api(tmp_path, monkeypatch, capsys, flags,
                                                        cfg):
    monkeypatch.setenv("ICLPROBE_CACHE", str(tmp_path))  # no saved probes
    name = "gpt-softmax-paired"
    assert main(["align", name, *flags, "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)[name]
    from iclprobe.alignment import align

    res = align(models.load(name), AlignConfig(**cfg), name=name)
    api = json.loads(json.dumps(res.to_dict()))
    # no saved probes: both cross-fit probes on the evaluation sequences (and say so)
    assert cli["probes"]["seed"] == 3 and cli["probes"]["n_sequences"] == cfg["n_sequences"]
    assert cli["probes"]["source"] == "cross-fitted"
    assert cli == api


def test_resume_names_the_model_and_task_flags_it_refuses(tmp_path, capsys):
    argv = ["train", "--out", str(tmp_path / "run"), "--resume", "--steps", "5"]
    assert main([*argv, "--model-seed", "3", "--task-seed", "1", "--n-layers", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("drop --task-seed, --n-layers, --model-seed"), err
    assert main([*argv, "--family", "pq"]) == 2
    assert capsys.readouterr().err.strip().endswith("drop --family")
    assert not (tmp_path / "run").exists()
