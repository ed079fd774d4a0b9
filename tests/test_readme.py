"""The README's Python example runs, and its commands are the ones CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_runs(tmp_path, monkeypatch, capsys):
    text = (ROOT / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    best_steps = capsys.readouterr().out.splitlines()[0]
    assert best_steps.startswith("[") and len(eval(best_steps)) == 5


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci and "eval \"$test_cmd\"" in ci
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- test-command -->", 1)[1]
    assert "python -m pytest" in block.split("```")[1]
