"""The README's Python example runs, and its commands are the ones CI runs."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_readme_examples_run(tmp_path, monkeypatch, capsys):
    text = (ROOT / "README.md").read_text()
    verdict, parts = re.findall(r"```python\n(.*?)```", text, re.S)
    monkeypatch.chdir(tmp_path)

    exec(compile(verdict, "README.md", "exec"), {})
    answer, verdict, score, sentence, linear, log2 = capsys.readouterr().out.splitlines()
    # what the README's screen and its reading say of gpt-softmax
    assert answer.startswith("none of them: nearest ridge (") and "0.984" in answer, answer
    assert verdict.startswith("newton vs gd, the verdict (step sizes fitted, metrics combined): "
                              "closer to gd but within the learners' own resemblance at layers "
                              "4–8"), verdict
    value, lower, upper = (float(v) for v in re.findall(r"-?\d+\.\d+", score))
    assert 0 < lower <= value <= upper <= 1
    assert sentence.startswith("newton vs gd by error cosine: ")
    assert linear.startswith("step vs layer") and log2.startswith("log2(step) vs layer")

    exec(compile(parts, "README.md", "exec"), {})
    best_steps = capsys.readouterr().out.splitlines()[0]
    assert best_steps.startswith("[") and len(eval(best_steps)) == 5


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci and "eval \"$test_cmd\"" in ci
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- test-command -->", 1)[1]
    assert "python -m pytest" in block.split("```")[1]
