"""Do two commits give users the same outputs, byte for byte? ``iclprobe align`` on shipped models.

    python scripts/same_outputs.py BEFORE AFTER [--models gpt-softmax lstm] [--jobs 2]

For a restructuring commit that must change nothing users see: each commit's tree, as
committed (``git archive``, so uncommitted edits never count), is unpacked into a temporary
directory and put on PYTHONPATH through a link named ``iclprobe``. Per model it runs, from
a working directory of its own,

- ``iclprobe align NAME``, ``iclprobe align NAME --verbose``, ``iclprobe align NAME --json``:
  stdout, stderr and the exit status;
- ``iclprobe align NAME --out report``: the same, and every file of the report folder
  (report.md, summary.json, each model's CSVs and result.json, the PNG figures, the output
  marker), compared as files: matplotlib writes no date into a PNG, only its own version,
  the same for both commits.

It prints ``identical`` or ``differs`` for each output, with the first differing line of a
text (a one-line JSON document is indented first, so that the line says where), and exits
with 1 when anything differs.

Masked before comparing: ISO 8601 timestamps (``2024-05-01T12:00:00...``, written as
``<TIME>``): a saved probe's ``fitted_at`` would be one. ``align`` prints and writes no
timings (``AlignResult.timings`` is not in its JSON or report). The runs share nothing
that could differ between the commits: an empty user cache of their own (ICLPROBE_CACHE:
no saved probes are found, so every GPT's probes are cross-fitted), one thread
(OMP_NUM_THREADS, MKL_NUM_THREADS: sums in one order), PYTHONHASHSEED=0 and the Agg
backend.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from iclprobe._shipped import shipped_models
from iclprobe.cli import OneLineParser
from iclprobe.errors import InputError

MODELS = ("gpt-softmax", "pq-rotated-3layer", "ka-newton-oracle", "lstm")
RUNS = {"screen": [], "verbose": ["--verbose"], "json": ["--json"],
        "report": ["--out", "report"]}
TIMESTAMP = re.compile(rb"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?")
SHOWN = 240  # characters of a differing line that are printed


#: What one command left, by name: "stdout", "stderr", "exit status", "report/FILE".
Output = dict[str, bytes]


def unpack(repo: Path, commit: str, into: Path) -> Path:
    """The tree of ``commit`` under ``into/tree``; returns the directory to put on PYTHONPATH."""
    tree, path = into / "tree", into / "path"
    tree.mkdir(parents=True)
    path.mkdir()
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    (path / "iclprobe").symlink_to(tree, target_is_directory=True)
    return path


def environment(path: Path, cache: Path) -> dict[str, str]:
    """The environment every run of one commit gets (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICLPROBE_")}
    env.update(PYTHONPATH=str(path), ICLPROBE_CACHE=str(cache), OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONHASHSEED="0", MPLBACKEND="Agg")
    return env


def check_import(env: dict[str, str], path: Path) -> None:
    """Refuse to compare a tree that is not the one imported (an editable install, say)."""
    run = subprocess.run([sys.executable, "-c", "import iclprobe; print(iclprobe.__file__)"],
                         env=env, capture_output=True, text=True)
    if run.returncode:
        said = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"python cannot import iclprobe from {path}: {said}")
    where = run.stdout.strip()
    if where == "None":  # the tree is put on the path as iclprobe: a namespace package
        raise InputError(f"the commit's tree has no __init__.py at its root, so python "
                         f"imports no package iclprobe from {path} (is --repo iclprobe's "
                         "repository?)")
    if not Path(where).is_relative_to(path):
        raise InputError(f"python imports iclprobe from {where}, not from {path} (is --repo "
                         "iclprobe's repository?)")


def run(env: dict[str, str], cwd: Path, model: str, flags: list[str]) -> Output:
    """``python -m iclprobe align MODEL FLAGS`` in ``cwd``: streams, status, report files."""
    cwd.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "iclprobe", "align", model, *flags],
                          cwd=cwd, env=env, capture_output=True)
    files: Output = {"stdout": done.stdout, "stderr": done.stderr,
             "exit status": str(done.returncode).encode()}
    for file in sorted(p for p in cwd.rglob("*") if p.is_file()):
        files[str(file.relative_to(cwd))] = file.read_bytes()
    return files


def masked(data: bytes) -> bytes:
    """``data`` with its timestamps replaced by ``<TIME>``."""
    return TIMESTAMP.sub(b"<TIME>", data)


def readable(data: bytes) -> list[str] | None:
    """Lines to show a difference in (a one-line JSON document indented); None: binary."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    if text.lstrip().startswith(("{", "[")) and text.count("\n") <= 1:
        try:
            text = json.dumps(json.loads(text), indent=1, ensure_ascii=False)
        except ValueError:
            pass
    return text.splitlines()


def first_difference(a: bytes, b: bytes) -> str:
    """Where two outputs first differ, in words."""
    la, lb = readable(a), readable(b)
    if la is None or lb is None:
        return f"binary, {len(a)} and {len(b)} bytes"
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return f"line {i + 1}:\n    before: {x[:SHOWN]}\n    after:  {y[:SHOWN]}"
    return f"{len(la)} and {len(lb)} lines (one is the other's start)"


def compare(before: Output, after: Output) -> list[tuple[str, str]]:
    """``(name, verdict)`` per output: identical, or how it differs."""
    out = []
    for name in sorted(set(before) | set(after)):
        if name not in after or name not in before:
            out.append((name, "differs: only " + ("before" if name in before else "after")))
            continue
        a, b = before[name], after[name]
        if a == b:
            out.append((name, "identical"))
        elif masked(a) == masked(b):
            out.append((name, "identical (timestamps masked)"))
        else:
            out.append((name, "differs: " + first_difference(masked(a), masked(b))))
    return out


def outputs(env: dict[str, str], work: Path, models: list[str], jobs: int
            ) -> dict[tuple[str, str], Output]:
    """Every run of every model under one commit's environment, ``jobs`` at a time."""
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {(m, r): pool.submit(run, env, work / m / r, m, flags)
                   for m in models for r, flags in RUNS.items()}
        return {key: f.result() for key, f in futures.items()}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="same_outputs.py", description=__doc__.splitlines()[0])
    parser.add_argument("before", help="a commit (hash, branch, HEAD~1, ...)")
    parser.add_argument("after", help="the commit to compare with it")
    parser.add_argument("--models", nargs="+", default=list(MODELS),
                        help="shipped model names (`iclprobe models` lists them)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the git repository (default: this script's)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    shipped = [name for name, _ in shipped_models()]
    args.models = list(dict.fromkeys(args.models))  # each run's folder once
    unknown = [m for m in args.models if m not in shipped]
    if unknown:  # both sides would fail alike, and compare as identical
        parser.error(f"--models: {unknown} are not shipped models (shipped: {shipped})")
    # both commits resolved and unpacked first: a commit made while this runs changes nothing
    try:
        hashes = {side: resolve(args.repo, commit) for side, commit in
                  (("before", args.before), ("after", args.after))}
    except subprocess.CalledProcessError as err:
        said = (err.stderr or "").strip().splitlines() or [f"exit status {err.returncode}"]
        parser.error(f"git could not resolve {err.cmd[-1].removesuffix('^{commit}')!r} in "
                     f"{args.repo}: {said[-1]}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as tmp:
        paths = {side: unpack(args.repo, full, Path(tmp) / side) for side, full in hashes.items()}
        for side, path in paths.items():
            env = environment(path, Path(tmp) / side / "cache")
            try:
                check_import(env, path)
            except InputError as err:
                parser.error(f"--repo {args.repo}: {err}")
            print(f"{side}: {hashes[side][:12]}, running {len(args.models)} models x "
                  f"{len(RUNS)} commands", file=sys.stderr)
            results[side] = outputs(env, Path(tmp) / side / "runs", args.models, args.jobs)
    return report(results, args.models, hashes["before"][:12], hashes["after"][:12])


def resolve(repo: Path, commit: str) -> str:
    """The full hash of ``commit`` (a hash, a branch, ``HEAD~1``, ...)."""
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", commit + "^{commit}"],
                          check=True, capture_output=True, text=True).stdout.strip()


def report(results: dict[str, dict[tuple[str, str], Output]], models: list[str],
           before: str, after: str) -> int:
    """Print each output's verdict; 0 when all are identical, else 1."""
    differing = 0
    total = 0
    print(f"{before} -> {after}")
    for model in models:
        for name, flags in RUNS.items():
            verdicts = compare(results["before"][model, name], results["after"][model, name])
            bad = [(n, v) for n, v in verdicts if not v.startswith("identical")]
            total += len(verdicts)
            differing += len(bad)
            command = " ".join(["iclprobe align", model, *flags])
            print(f"{command}: {len(verdicts) - len(bad)} of {len(verdicts)} outputs identical")
            for output, verdict in bad:
                print(f"  {output}: {verdict}")
    print(f"{'identical' if not differing else 'differs'}: {total - differing} of {total} "
          f"outputs identical ({before} -> {after})")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
