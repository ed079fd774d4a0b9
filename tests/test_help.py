"""Help texts: one default per flag, help on every flag, a package docstring that runs."""

import argparse
import pydoc
import subprocess
import sys
import textwrap

import pytest
from helpers import listed_models

import iclprobe
from iclprobe.cli import build_parser, main


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def visible(parser):
    return [a for a in parser._actions
            if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS]


def test_no_flag_states_its_default_twice_or_as_none():
    for name, parser in commands().items():
        for action in visible(parser):
            text = action.help or ""
            assert text.count("default") <= 1, (name, action.dest, text)
            assert "(default: None)" not in text, (name, action.dest, text)


def test_train_help_reads_once_per_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "2x tokens when interleaved) (default: --n-points) --n-layers" in out
    assert "MLP hidden width (default: 4 d_model, GPT-2's) --attention" in out
    # a flag the families share says each one's default
    assert "lstm: LSTM layers, one per block (each one's hidden states are hooked) " \
        "(default: gpt: 8; pq, lstm: 3)" in out
    assert "(default: gpt: 64; lstm: 128)" in out and "(default: None)" not in out


def test_every_command_has_a_description_and_help_on_every_flag():
    for name, parser in commands().items():
        assert parser.description and len(parser.description) > 40, name
        for action in visible(parser):
            assert action.help and len(action.help) > 8, (name, action.dest)


def test_probe_help_explains_each_flag(capsys):
    with pytest.raises(SystemExit):
        main(["probe", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Fit one ridge readout per layer of CHECKPOINT" in out
    for text in ("--n-sequences N_SEQUENCES sequences the probes are fitted on (default: 2000)",
                 "--seed SEED seed as `align --seed`: a later align with this seed uses "
                 "these probes (default: 0)",
                 "--device {cpu,cuda} where the model runs (default: cpu)",
                 "checkpoint a checkpoint or `iclprobe train` run directory"):
        assert text in out, text


def test_package_docstring_says_what_it_is_and_where_to_start():
    text = pydoc.render_doc(iclprobe, renderer=pydoc.plaintext)
    assert "which learning algorithm does each layer" in text
    for name in ("iclprobe demo", "iclprobe models", "iclprobe.tasks", "iclprobe.models",
                 "iclprobe.hooks", "iclprobe.probes", "iclprobe.algorithms",
                 "iclprobe.alignment", "models.load"):
        assert name in text, name


def docstring_example() -> str:
    doc = iclprobe.__doc__
    block = doc[doc.index("::\n\n") + 3:].split("\n\n")[0]
    return textwrap.dedent(block)


@pytest.mark.slow
def test_package_docstring_example_runs():
    code = docstring_example()
    assert len(code.strip().splitlines()) == 7  # the import and five statements
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - our own docstring
    steps = namespace["steps"]
    model = namespace["model"]
    assert len(steps) == model.cfg.n_layers + 1
    assert steps[0] == 0 and steps[-1] >= 10  # the last layers match many Newton steps


def test_models_lists_names_without_importing_torch():
    code = ("import sys; from iclprobe.cli import main; rc = main(['models']); "
            "print(rc, 'torch' in sys.modules, 'transformer_lens' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[-1] == "0 False False"
    listed = listed_models("\n".join(out[:-1]))
    names = list(listed)
    assert names == ["gpt-linear-paired", "gpt-softmax", "gpt-softmax-ill", "gpt-softmax-paired",
                     "ka-gd-oracle", "ka-gd-pq", "ka-newton-oracle", "ka-newton-pq", "lstm",
                     "pq-isotropic-1layer", "pq-rotated-3layer"]
    assert "softmax attention, interleaved layout" in listed["gpt-softmax"]
