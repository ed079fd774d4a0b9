"""The distribution: only ``iclprobe/`` lands in site-packages; the CLI answers fast."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from iclprobe.cli import main

ROOT = Path(__file__).resolve().parents[1]


def source_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "iclprobe"
    for rel in source_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True)
    (whl,) = out.glob("iclprobe-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_holds_only_the_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    outside = [n for n in names if not (n.startswith("iclprobe/") or ".dist-info/" in n)]
    assert outside == []
    for module in ("iclprobe/__init__.py", "iclprobe/cli.py", "iclprobe/__main__.py",
                   "iclprobe/tasks/regression.py", "iclprobe/models/gpt.py",
                   "iclprobe/hooks/__init__.py", "iclprobe/algorithms/__init__.py",
                   "iclprobe/probes/__init__.py", "iclprobe/alignment/__init__.py"):
        assert module in names, module
    assert not any(n.startswith(("iclprobe/tests/", "iclprobe/bench/", "iclprobe/scripts/"))
                   for n in names)
    # every module of the package, subpackages too (each must be in pyproject's packages)
    modules = [f"iclprobe/{f}" for f in source_files() if f.endswith(".py")
               and not f.startswith(("tests/", "bench/", "scripts/", "docs/", "."))]
    assert [m for m in modules if m not in names] == []
    for name in ("gpt-softmax", "pq-rotated-3layer"):  # the shipped models are package data
        for file in ("config.json", "model.safetensors", "task.json", "error_curve.json"):
            assert f"iclprobe/models/pretrained/{name}/{file}" in names
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert "iclprobe = iclprobe.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


@pytest.mark.slow
def test_installed_wheel_imports_as_iclprobe_only(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True)
    top = sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info"))
    assert top in (["iclprobe"], ["bin", "iclprobe"])
    code = ("import iclprobe, iclprobe.tasks as t; import importlib.util as u; "
            "assert u.find_spec('models') is None and u.find_spec('probes') is None; "
            "print(iclprobe.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(target))


def test_help_does_not_import_torch():
    code = "import sys; from iclprobe.cli import build_parser; build_parser(); " \
           "print('torch' in sys.modules, 'transformer_lens' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_cli_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "invalid choice: 'no-such-command'" in err
    assert main(["models"]) == 0
