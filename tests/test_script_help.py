"""The scripts' and benches' flags: help on each, and bad values refused in one line.

``--help`` of each script names what every flag does and its default; ``ci_widths.py
--model bogus`` (a FileNotFoundError with a traceback) and ``design_reach.py --multiplier
nan`` (a ConfigError with a traceback, after the cell was built) exit with status 2 and
one line, before any work. The scripts run in this process (their ``main`` as their
``__main__`` block calls it), so that torch is imported once for them all.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["scripts/reproduce_fu2024.py", "scripts/reproduce_ahn2023.py",
           "scripts/ahn_reviewers.py", "scripts/train_pretrained.py", "bench/demo.py",
           "bench/ci_widths.py", "bench/design_reach.py"]


def _load(script: str, monkeypatch):
    """The script as a module (its ``__main__`` block not run), unloaded after the test."""
    path = ROOT / script
    name = f"help_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # its dataclasses look their module up
    monkeypatch.setattr(sys, "path", list(sys.path))  # ahn_reviewers adds scripts/ to it
    spec.loader.exec_module(module)
    return module


def _run(module, argv: list[str], monkeypatch) -> int:
    """``python SCRIPT ARGV``'s exit status: ``main()`` reads ``sys.argv`` as there."""
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    return exit_.value.code


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_says_what_it_does_and_its_default(script, monkeypatch, capsys):
    module = _load(script, monkeypatch)
    parse_args, parsers = argparse.ArgumentParser.parse_args, []

    def helped(self, args=None, namespace=None):
        parsers.append(self)  # the script's own parser, read below
        return parse_args(self, ["--help"], namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", helped)
    assert _run(module, [], monkeypatch) == 0
    out = capsys.readouterr().out
    (parser,) = parsers
    unbroken = "".join(out.split())  # argparse wraps lines, at hyphens too
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = "/".join(action.option_strings) or action.dest
        assert action.help and action.help != argparse.SUPPRESS, (script, flag)
        text = parser._get_formatter()._expand_help(action)  # %(default)s filled in
        assert len(text.split()) >= 3, (script, flag, text)
        if action.default not in (None, False):  # a store_true flag is off by default
            assert "default" in text, (script, flag, text)
        assert text.count("default") <= 1, (script, flag, text)
        assert "".join(text.split()) in unbroken, (script, flag, text)
        for option in action.option_strings:
            assert option in out, (script, option)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _never(*args, **kwargs):
    raise AssertionError("the work started before the flags were checked")


def test_ci_widths_refuses_a_model_that_is_not_there(monkeypatch, capsys):
    module = _load("bench/ci_widths.py", monkeypatch)
    monkeypatch.setattr(module, "align", _never)
    assert _run(module, ["--model", "bogus"], monkeypatch) == 2
    err = _one_line(capsys)
    assert err.startswith("ci_widths.py: error: --model: checkpoint 'bogus' not found"), err
    assert "gpt-softmax" in err, err  # what is accepted: the shipped models' names


@pytest.mark.parametrize(("counts", "says"), [
    (["512"], "argument --counts: expected N:W, evaluation and weight sequences, integers "
              ">= 2 (such as 512:16), got '512'"),
    (["1:16"], "argument --counts: expected N:W, evaluation and weight sequences, integers "
               ">= 2 (such as 512:16), got '1:16'"),
    (["512:x"], "argument --counts: expected N:W, evaluation and weight sequences, integers "
                ">= 2 (such as 512:16), got '512:x'"),
    (["16:32"], "argument --counts: expected N:W with W <= N (the induced weights are read on "
                "W of the N evaluation sequences), got '16:32'"),
    # the counts before it would have run first, and then the traceback
    (["128:16", "1000000000000000:16"], "--counts 1000000000000000:16: "
                                        "AlignConfig.n_sequences=1000000000000000: aligning "
                                        "gpt-softmax needs at least"),
])
def test_ci_widths_refuses_bad_counts_before_any_align(counts, says, monkeypatch, capsys):
    module = _load("bench/ci_widths.py", monkeypatch)
    monkeypatch.setattr(module, "align", _never)
    assert _run(module, ["--counts", *counts], monkeypatch) == 2
    err = _one_line(capsys)
    assert err.startswith(f"ci_widths.py: error: {says}"), err
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "0", "-1", "x"])
def test_design_reach_refuses_a_multiplier_that_is_not_finite_and_positive(
        value, monkeypatch, capsys):
    module = _load("bench/design_reach.py", monkeypatch)
    monkeypatch.setattr(module, "run", _never)
    assert _run(module, [f"--multiplier={value}"], monkeypatch) == 2
    assert _one_line(capsys) == ("design_reach.py: error: argument --multiplier: expected a "
                                 f"finite number > 0, got {value!r}")
