"""Nothing lost, round 4: what iclprobe may delete is what it recorded writing, not a name.

A marker records, for each entry iclprobe wrote, what it was (a file's SHA-256, a
directory, a link); ``--overwrite`` and ``overwrite=True`` replace only entries that are
still that. A user's file in the place of a folder iclprobe wrote, the names of a
hand-written marker, a user's files in a folder the library's report writer is given:
never deleted. A temporary directory whose writer was killed after its final marker is
removed by the next writer.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import one_line_error, tiny_gpt

from iclprobe import atomic, storage, tasks
from iclprobe.alignment import AlignConfig, align, write_report
from iclprobe.cli import main

FAST = ["--n-sequences", "32", "--n-boot", "10", "--algorithms", "gd", "--metrics",
        "error_cosine", "--no-separation", "--no-fitted"]
TASK = tasks.RegressionTask(n_dims=3, n_points=8)


@pytest.fixture
def ckpt(tmp_path):
    tiny_gpt("linear", "paired").save(tmp_path / "lin", task=TASK)
    return tmp_path / "lin"


def test_a_users_file_in_place_of_a_model_folder_is_never_deleted(tmp_path, capsys):
    out = tmp_path / "R"
    assert main(["align", "ka-gd-oracle", *FAST, "--out", str(out)]) == 0
    folder = out / "ka-gd-oracle"
    assert folder.is_dir()
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()
    folder.write_text("my notes, named like the model's folder")
    capsys.readouterr()
    assert main(["align", "ka-gd-oracle", *FAST, "--out", str(out), "--overwrite"]) == 2
    one_line_error(capsys, str(out), "did not write", "ka-gd-oracle")
    assert folder.read_text() == "my notes, named like the model's folder"


def test_a_hand_written_marker_lets_nothing_be_deleted(tmp_path, ckpt, capsys):
    out = tmp_path / "thesis"
    (out / "data").mkdir(parents=True)
    (out / "thesis.tex").write_text("\\chapter{Results}")
    (out / "data" / "runs.csv").write_text("1,2\n")
    (out / ".iclprobe").write_text(json.dumps({"kind": "report", "files": [
        "thesis.tex", "data", "data/runs.csv"]}))
    assert main(["align", str(ckpt), *FAST, "--out", str(out), "--overwrite"]) == 2
    one_line_error(capsys, str(out), "data", "thesis.tex", "records no digest")
    assert (out / "thesis.tex").read_text() == "\\chapter{Results}"
    assert (out / "data" / "runs.csv").read_text() == "1,2\n"
    # a forged digest list that names the files but not their contents: refused as well
    marker = {"kind": "report", "files": ["thesis.tex"], "digests": {"thesis.tex": "dir"}}
    (out / ".iclprobe").write_text(json.dumps(marker))
    with pytest.raises(storage.OutputExistsError, match="thesis.tex"):
        storage.check_output(out, "report", overwrite=True)


def test_a_file_iclprobe_wrote_then_edited_by_the_user_is_kept(tmp_path, ckpt, capsys):
    out = tmp_path / "r"
    assert main(["align", str(ckpt), *FAST, "--out", str(out)]) == 0
    (out / "report.md").write_text("my edited report")
    capsys.readouterr()
    assert main(["align", str(ckpt), *FAST, "--out", str(out), "--overwrite"]) == 2
    one_line_error(capsys, str(out), "report.md", "did not write")
    assert (out / "report.md").read_text() == "my edited report"
    (out / "report.md").unlink()  # gone: nothing to keep, the report is replaced
    assert main(["align", str(ckpt), *FAST, "--out", str(out), "--overwrite"]) == 0


@pytest.fixture(scope="module")
def result():
    model = tiny_gpt("linear", "paired")
    model.task = TASK
    return align(model, AlignConfig(n_sequences=32, n_boot=10, separation=False,
                                    fitted=False, algorithms=("gd",),
                                    metrics=("error_cosine",)), name="m")


def test_the_library_report_writer_keeps_the_users_files(tmp_path, result):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my report")
    (out / "summary.json").write_text("{}")
    with pytest.raises(storage.OutputExistsError, match="non-empty directory that iclprobe "
                                                        "did not write"):
        write_report(out, [result])
    assert (out / "report.md").read_text() == "my report"
    assert (out / "summary.json").read_text() == "{}"
    first = write_report(tmp_path / "r", [result])
    with pytest.raises(storage.OutputExistsError, match="already holds iclprobe report "
                                                        "output: pass --overwrite"):
        write_report(tmp_path / "r", [result])
    assert write_report(tmp_path / "r", [result], overwrite=True) == first
    assert {"report.md", "summary.json", ".iclprobe"} <= {p.name for p in first.parent.iterdir()}


KILLED_AT_RENAME = textwrap.dedent("""
    import os, signal, sys
    from iclprobe import atomic
    os.rename = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # after the final marker
    with atomic.atomic_directory(sys.argv[1], "checkpoint", overwrite=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"x" * 100)
""")


def test_a_temporary_directory_with_its_final_marker_is_removed_by_the_next_writer(tmp_path):
    out = tmp_path / "checkpoint"
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_RENAME, str(out)],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -signal.SIGKILL
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".checkpoint.tmp-")]
    assert len(left) == 1
    assert "writing" not in json.loads((left[0] / ".iclprobe").read_text())  # the final one
    mine = tmp_path / ".checkpoint.tmp-mine"  # the user's, named like ours: kept
    mine.mkdir()
    with atomic.atomic_directory(out, "checkpoint") as tmp:
        (tmp / "model.safetensors").write_bytes(b"y")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".checkpoint.tmp-mine",
                                                          "checkpoint"]


KILLED_BEFORE_MARKER = textwrap.dedent("""
    import os, signal, sys
    from iclprobe import atomic
    def kill(*args):
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[2] == "empty":  # killed between making the directory and marking it
        atomic._mark_temporary = kill
    else:  # killed while the marker's temporary file was written, before its rename
        os.replace = kill
    with atomic.atomic_directory(sys.argv[1], "checkpoint") as tmp:
        pass
""")


@pytest.mark.parametrize("when", ["empty", "partial marker"])
def test_a_temporary_directory_killed_before_its_marker_is_removed_by_the_next_writer(
        tmp_path, when):
    """(It was left for good: without a marker nothing said it was iclprobe's.)"""
    out = tmp_path / "checkpoint"
    proc = subprocess.run([sys.executable, "-c", KILLED_BEFORE_MARKER, str(out), when],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -signal.SIGKILL
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".checkpoint.tmp-")]
    assert len(left) == 1 and len(list(left[0].iterdir())) == (when != "empty")
    kept = tmp_path / f"{left[0].name}0"  # the same dead writer's name, with a user's file
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with atomic.atomic_directory(out, "checkpoint") as tmp:
        (tmp / "model.safetensors").write_bytes(b"y")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([kept.name, "checkpoint"])
    assert (kept / "notes.txt").read_text() == "mine"


def test_an_unreadable_leftover_of_another_writer_is_passed_over(tmp_path, monkeypatch):
    """(Another user's leftover, 0700 from mkdtemp, made every later write fail.)"""
    leftover = tmp_path / ".checkpoint.tmp-999999999@nohost.abc"  # no such writer here
    leftover.mkdir()
    real = Path.iterdir

    def iterdir(self):
        if self == leftover:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    monkeypatch.setattr(atomic, "_dead_writer", lambda tag: True)
    assert atomic.remove_abandoned(tmp_path / "checkpoint") == []
    with atomic.atomic_directory(tmp_path / "checkpoint", "checkpoint") as tmp:
        (tmp / "model.safetensors").write_bytes(b"y")
    assert leftover.is_dir() and (tmp_path / "checkpoint" / "model.safetensors").is_file()


@pytest.mark.parametrize("argv", [["align", "CKPT", *FAST], ["probe", "CKPT", "--n-sequences",
                                                           "16"], ["demo"]])
def test_an_unwritable_out_is_named_as_typed_before_the_work(ckpt, capsys, argv):
    if not os.path.isdir("/proc"):
        pytest.skip("needs /proc, a directory where nothing can be created")
    argv = [str(ckpt) if a == "CKPT" else a for a in argv]
    assert main([*argv, "--out", "/proc/x"]) == 2
    err = one_line_error(capsys, "/proc/x cannot be written", "(in /proc)")  # no work first
    assert ".tmp-" not in err


def test_a_file_write_names_its_path_not_a_temporary_one(tmp_path):
    with pytest.raises(OSError, match=r"^/proc/notes.txt cannot be written: .* \(in /proc\)$"):
        storage.write_text_atomic("/proc/notes.txt", "x")
