"""How the CLI reports errors: bad input, a bad config field, a bug.

Bad input is a one-line usage error with exit status 2; a config's error carries its field
(`ConfigError`), which the CLI maps to the flag the user typed without reading the message;
an unexpected exception is one line with a hint to rerun with ``--debug``, which shows its
traceback.
"""

from __future__ import annotations

import pytest
import torch
from helpers import one_line_error

from iclprobe import algorithms, models, tasks
from iclprobe._checks import ConfigError
from iclprobe.alignment import AlignConfig
from iclprobe.cli import flag_of, main
from iclprobe.errors import InputError
from iclprobe.training import TrainConfig


def test_a_config_error_carries_its_config_and_field():
    with pytest.raises(ConfigError, match="AlignConfig.n_sequences must be an integer >= 2, "
                                          "got 1") as err:
        AlignConfig(n_sequences=1)
    assert (err.value.owner, err.value.field) == ("AlignConfig", "n_sequences")
    assert isinstance(err.value, ValueError) and isinstance(err.value, TypeError)
    with pytest.raises(ConfigError) as err:
        TrainConfig(warmup_steps=3)
    assert err.value.field == "warmup_steps"
    with pytest.raises(ConfigError) as err:
        models.GPTConfig(n_dims=2, n_positions=4, d_model=6, n_heads=4)
    assert (err.value.owner, err.value.field) == ("GPTConfig", "d_model/n_heads")


def test_the_flag_comes_from_the_field_not_the_message():
    assert flag_of(ConfigError("TrainConfig", "lr", "anything at all"), "train") == "--lr"
    assert flag_of(ConfigError("GPTConfig", "seed", "x"), "train") == "--model-seed"
    assert flag_of(ConfigError("RegressionTask", "seed", "x"), "train") == "--task-seed"
    assert flag_of(ConfigError("TrainConfig", "seed", "x"), "train") == "--seed"
    assert flag_of(ConfigError("GPTConfig", "no_such_field", "x"), "train") is None
    assert flag_of(ConfigError("AlignConfig", "n_boot", "x"), "align") == "--n-boot"
    assert flag_of(ConfigError("AlignConfig", "n_boot", "x"), "probe") is None


def test_a_bad_field_is_a_usage_error_naming_its_flag(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "r"), "--lr", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "iclprobe train: error: --lr: TrainConfig.lr must be a number in (0, 1e20], got -1.0"


def test_a_width_heads_mismatch_names_no_one_flag(tmp_path, capsys):
    """Only --n-heads 5 was given, and the error was blamed on --d-model."""
    assert main(["train", "--out", str(tmp_path / "r"), "--n-heads", "5", "--steps", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "iclprobe train: error: GPTConfig.d_model=64 must be divisible by n_heads=5")


@pytest.fixture
def checkpoint(tmp_path):
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 2)
    return model.save(tmp_path / "pq", task=tasks.RegressionTask(n_dims=3, n_points=7))


@pytest.fixture
def learners():
    """Two learners: one refuses its input on purpose (an InputError), one has a bug."""

    @algorithms.register("refuses_test", steps=(1,))
    def refuses_test(xs, ys, steps=None, weights=True):
        raise InputError("refuses_test: these data are not for me")

    @algorithms.register("buggy_test", steps=(1,))
    def buggy_test(xs, ys, steps=None, weights=True):
        return {"preds": xs}["iterates"]  # a KeyError: a bug, not the user's input

    yield
    algorithms.LEARNERS.pop("refuses_test")
    algorithms.LEARNERS.pop("buggy_test")


def test_bad_input_and_a_bug_read_differently(checkpoint, learners, capsys):
    argv = ["align", str(checkpoint), "--n-sequences", "16", "--algorithms"]
    assert main([*argv, "refuses_test"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "iclprobe align: error: refuses_test: these data are not for me"
    assert main([*argv, "buggy_test"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("iclprobe align: internal error: KeyError: 'iterates'")
    assert err.endswith("(a bug, not your input: rerun with --debug for the traceback, and "
                        "report it with that traceback and the command)")
    with pytest.raises(KeyError, match="iterates"):
        main([*argv, "buggy_test", "--debug"])
    with pytest.raises(KeyError, match="iterates"):
        main(["--debug", *argv, "buggy_test"])


def test_an_accidental_type_error_is_a_bug_not_a_usage_error(checkpoint, capsys):
    @algorithms.register("typo_test", steps=(1,))
    def typo_test(xs, ys, steps=None, weights=True):
        return xs + None  # TypeError raised by an operation, not by a `raise`

    try:
        assert main(["align", str(checkpoint), "--n-sequences", "16", "--algorithms",
                     "typo_test"]) == 1
    finally:
        algorithms.LEARNERS.pop("typo_test")
    assert "internal error: TypeError: unsupported operand" in capsys.readouterr().err


def test_the_exit_status_comes_from_the_type_not_the_source_text(checkpoint, capsys):
    """A ValueError raised by a ``raise`` statement that is not iclprobe's check of its input
    (torch's own, or a plain one in a user's learner) is a bug: only an InputError is bad input."""

    @algorithms.register("torch_refuses_test", steps=(1,))
    def torch_refuses_test(xs, ys, steps=None, weights=True):
        torch.zeros(2).view(3)  # torch raises RuntimeError; and a ValueError of its own below
        return None

    @algorithms.register("plain_value_error_test", steps=(1,))
    def plain_value_error_test(xs, ys, steps=None, weights=True):
        raise ValueError("not an InputError")

    @algorithms.register("numpy_value_error_test", steps=(1,))
    def numpy_value_error_test(xs, ys, steps=None, weights=True):
        import numpy as np

        np.reshape(np.zeros(2), (3,))  # numpy's own `raise ValueError`
        return None

    argv = ["align", str(checkpoint), "--n-sequences", "16", "--algorithms"]
    try:
        for name, kind in [("plain_value_error_test", "ValueError: not an InputError"),
                           ("numpy_value_error_test", "ValueError: cannot reshape"),
                           ("torch_refuses_test", "RuntimeError: shape '[3]' is invalid")]:
            assert main([*argv, name]) == 1, name
            err = capsys.readouterr().err.strip()
            assert f"iclprobe align: internal error: {kind}" in err and "report it" in err
    finally:
        for name in ("torch_refuses_test", "plain_value_error_test", "numpy_value_error_test"):
            algorithms.LEARNERS.pop(name)


def test_extra_probe_sequences_are_for_cross_fitted_probes_and_fill_every_fold(capsys):
    with pytest.raises(ConfigError, match=r"AlignConfig.probe_extra_sequences applies to "
                                          r"cross-fitted probes .* got 8 with probe_fit='fresh'"):
        AlignConfig(probe_fit="fresh", probe_extra_sequences=8)
    with pytest.raises(ConfigError, match=r"applies to probes fitted to y \(probe_target='y'"
                                          r".* got 8 with probe_target='column'"):
        AlignConfig(probe_extra_sequences=8)  # the further sequences have no target columns
    with pytest.raises(ConfigError, match=r"must be 0 or at least probe_folds=4 .* got 3"):
        AlignConfig(probe_target="y", probe_extra_sequences=3)
    with pytest.raises(ConfigError, match=r"probe_extra_sequences must be an integer >= 0"):
        AlignConfig(probe_extra_sequences=-1)
    assert AlignConfig(probe_fit="fresh").probe_extra_sequences == 0  # the default fits both
    assert main(["align", "gpt-softmax", "--probe-target", "y", "--probe-extra-sequences",
                 "2"]) == 2
    assert capsys.readouterr().err.strip().startswith(
        "iclprobe align: error: --probe-extra-sequences: AlignConfig.probe_extra_sequences "
        "must be 0 or at least probe_folds=4")


@pytest.mark.slow
def test_more_folds_than_sequences_names_the_flag(capsys):
    # cross_fit's own "folds must be an integer in [2, 3], got 4" named no flag; a model
    # read exactly has no folds and aligns on 2 sequences
    assert main(["align", "gpt-linear-paired", "--n-sequences", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("iclprobe align: error: --probe-folds: AlignConfig.probe_folds must be "
                        "at most the 3 sequences the probes are cross-fitted on (folds of "
                        "sequences), got 4"), err
    assert main(["align", "ka-gd-pq", "--n-sequences", "2", "--n-boot", "10", "--json"]) == 0


@pytest.mark.parametrize(("argv", "says"), [
    # a window given to a model aligned at its last position was dropped silently
    (["pq-isotropic-1layer", "--t-min", "100"],
     "--t-min: AlignConfig.t_min=100 sets the window of positions='all', but "
     "pq-isotropic-1layer is aligned at its last position only (the position it was "
     "trained at)"),
    (["gpt-softmax", "--positions", "last", "--t-max", "3"],
     "--t-max: AlignConfig.t_max=3 sets the window of positions='all', but gpt-softmax is "
     "aligned at its last position only (positions='last')"),
    # the window t = 0 failed inside a learner ("alpha must be finite and >= 0 at every
    # prefix"), after the probes were fitted, naming no flag
    (["gpt-softmax", "--t-min", "0", "--t-max", "0"],
     "--t-max: t_max=0: the window t = 0 holds no prediction from examples"),
])
def test_a_window_align_would_not_use_is_refused_naming_its_flag(argv, says, capsys):
    assert main(["align", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"iclprobe align: error: {says}"), err


def test_demo_with_fewer_sequences_than_folds_names_its_own_flag(capsys, tmp_path):
    # align's message named --probe-folds, a flag demo does not have
    assert main(["demo", "--n-sequences", "2", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.strip() == (
        "iclprobe demo: error: --n-sequences 2: the demo cross-fits gpt-softmax's probes in 4 "
        "folds of the evaluation sequences; use at least 4 (more for enough rows per probe)")
    assert not (tmp_path / "r").exists()


def test_a_learning_rate_the_optimizer_cannot_hold_is_refused(capsys, tmp_path):
    # lr = 1e38 overflowed float32 inside Adam: an internal error (status 1) after the run
    # directory was made
    assert main(["train", "--out", str(tmp_path / "run"), "--n-dims", "3", "--n-points", "8",
                 "--n-layers", "2", "--d-model", "16", "--n-heads", "2", "--steps", "3",
                 "--lr", "1e38"]) == 2
    assert "TrainConfig.lr must be a number in (0, 1e20], got 1e+38" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_given_twice_keeps_its_name(tmp_path):
    from iclprobe.cli_commands import unique_names

    assert unique_names(["gpt-softmax", "gpt-softmax"]) == ["gpt-softmax", "gpt-softmax-2"]
    for parent in ("a", "b"):
        (tmp_path / parent / "m").mkdir(parents=True)
    assert unique_names([str(tmp_path / "a" / "m"), str(tmp_path / "b" / "m")]) == \
        ["a_m", "b_m"]  # two directories of one name: told apart by their parents


@pytest.mark.parametrize(("argv", "says"), [
    (["align", "gpt-softmax", "--json", "--verbose"],
     "argument --verbose: not allowed with argument --json"),
    (["train", "--out", "{tmp}/run", "--condition-number", "5"],
     "--condition-number applies to --cov ill-conditioned only, not --cov isotropic"),
    (["train", "--out", "{tmp}/run", "--condition-number", "5", "--eigenbasis", "batch"],
     "--condition-number and --eigenbasis apply to --cov ill-conditioned only"),
    (["train", "--out", "{tmp}/run", "--n-dims", "3", "--n-points", "6", "--n-positions", "2"],
     "--n-points 6 is more than the model's --n-positions 2"),
])
def test_flags_that_would_be_ignored_or_fail_late_are_refused_up_front(argv, says, tmp_path,
                                                                       capsys):
    """Options the command would drop (the screen's --verbose beside --json; the κ and
    eigenbasis of ill-conditioned data on another covariance) and a model too short for
    its task are one usage line, exit 2, before any work; nothing is written."""
    try:
        code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    except SystemExit as err:  # argparse's own refusals
        code = err.code
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert says in lines[-1] and "Traceback" not in "\n".join(lines)
    assert not (tmp_path / "run").exists()


def test_demo_names_its_flag_for_a_bad_probe_count(tmp_path, capsys):
    """The demo's --n-probe-sequences sets AlignConfig's field of that name: its error names
    the flag the user typed, as align's do."""
    assert main(["demo", "--out", str(tmp_path / "demo"), "--n-probe-sequences", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "iclprobe demo: error: --n-probe-sequences: AlignConfig.n_probe_sequences must be an "
        "integer >= 2, got 1")
    assert not (tmp_path / "demo").exists()


def test_probe_refuses_a_model_whose_layers_align_reads_exactly(tmp_path, capsys, monkeypatch):
    """``iclprobe probe pq-rotated-3layer`` saved probes that align never reads (it reads a
    PQ model's layers exactly), under a table of held-out R² near 0 that looked like the
    model's."""
    monkeypatch.setenv("ICLPROBE_CACHE", str(tmp_path / "cache"))
    assert main(["probe", "pq-rotated-3layer"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "iclprobe probe: error: pq-rotated-3layer: align reads its layers exactly (each layer's "
        "own prediction), never through probes, so none are saved (in Python, "
        "probes.LayerProbes().fit(model, ...) fits some)")
    assert not (tmp_path / "cache" / "probes").exists()


@pytest.mark.parametrize("command", [] if torch.cuda.is_available() else ["align", "probe"])
def test_a_device_torch_lacks_is_one_line_under_its_flag(command, capsys):
    """The CLI and ``models.load`` share one device check (the CLI names its flag)."""
    assert main([command, "gpt-softmax", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"iclprobe {command}: error: --device: device 'cuda': no CUDA device is available to "
        f"torch {torch.__version__}; use 'cpu'")


@pytest.mark.parametrize(("argv", "flag", "says"), [
    (["--n-dims", "4", "--curriculum-points", "100", "2"], "--curriculum-points",
     "TrainConfig.curriculum_points starts at 100, beyond the task's 24 points (n_points); "
     "curriculum_dims starts at 5, beyond its 4 dimensions, too"),
    (["--n-points", "5", "--curriculum-dims", "100", "1"], "--curriculum-dims",
     "TrainConfig.curriculum_dims starts at 100, beyond the task's 8 dimensions (n_dims); "
     "curriculum_points starts at 11, beyond its 5 points, too"),
    (["--curriculum-points", "100", "2"], "--curriculum-points",
     "TrainConfig.curriculum_points starts at 100, beyond the task's 24 points (n_points)"),
])
def test_a_curriculum_start_beyond_the_task_names_the_flag_given(argv, flag, says, tmp_path,
                                                                 capsys):
    """``--curriculum-points 100 2`` on a task of 4 dimensions was reported under
    --curriculum-dims (whose default start, 5, exceeds 4 too): the start changed from its
    default is the one named, the other mentioned."""
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--curriculum-every", "10", *argv]) == 2
    one_line_error(capsys, f"iclprobe train: error: {flag}: {says}")
    assert not out.exists()


@pytest.mark.parametrize("argv", [["train", "--out", "{tmp}/new\nrun"],
                                  ["align", "{tmp}/tab\tname"],
                                  ["compare", "gpt-softmax", "{tmp}/tab\tname"],
                                  ["probe", "{tmp}/bad\rname"]])
def test_a_path_with_a_control_character_is_one_usage_line(argv, tmp_path, checkpoint, capsys):
    """A run trained into ``--out $'a\\nb'`` printed "run in a" and "b" on two lines, and
    align named a checkpoint "a\\tb" so on every line of its screen: a newline, tab or other
    control character in a path is refused before any work (a space is ordinary: allowed)."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] != "train":  # the checkpoint exists, under its awkward name
        checkpoint.rename(argv[-1])
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    one_line_error(capsys, f"iclprobe {argv[0]}: error: argument ",
                   "a path or name must not hold a control character such as a newline or "
                   "tab (it is printed on one line), got ")
    assert not (tmp_path / "new\nrun").exists()
