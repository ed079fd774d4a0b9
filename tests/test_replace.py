"""Nothing lost, round 3: a writer replaces only what it wrote, and cleans up only what
an interrupted writer of its own left."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from helpers import one_line_error, tiny_gpt

from iclprobe import atomic, storage, tasks
from iclprobe.cli import main

FAST = ["--n-sequences", "32", "--n-boot", "10", "--algorithms", "gd", "--metrics",
        "error_cosine"]
TASK = tasks.RegressionTask(n_dims=3, n_points=8)


@pytest.fixture
def ckpt(tmp_path):
    tiny_gpt("linear", "paired").save(tmp_path / "lin", task=TASK)
    return tmp_path / "lin"


def listing(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.slow
def test_overwrite_of_a_report_keeps_a_run_or_probes_the_user_put_inside(ckpt, tmp_path,
                                                                        capsys):
    report = tmp_path / "r"
    assert main(["align", str(ckpt), *FAST, "--out", str(report)]) == 0
    assert main(["train", "--out", str(tmp_path / "run"), "--n-dims", "3", "--n-points", "8",
                 "--n-layers", "1", "--d-model", "8", "--n-heads", "1", "--steps", "2",
                 "--batch-size", "8"]) == 0
    shutil.copytree(tmp_path / "run", report / "my_run")
    assert main(["probe", str(ckpt), "--n-sequences", "16", "--out",
                 str(report / "my_probes")]) == 0
    before = listing(report / "my_run") + listing(report / "my_probes")
    capsys.readouterr()
    assert main(["align", str(ckpt), *FAST, "--out", str(report), "--overwrite"]) == 2
    one_line_error(capsys, str(report), "my_probes", "my_run", "did not write")
    assert listing(report / "my_run") + listing(report / "my_probes") == before
    assert (report / "my_run" / "checkpoint" / "model.safetensors").is_file()
    # the library's writers refuse the same: a nested output is not the report's to delete
    with pytest.raises(storage.OutputExistsError, match="my_run"):
        storage.check_output(report, "report", overwrite=True)


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from iclprobe import atomic, storage
    with atomic.atomic_directory(sys.argv[1], sys.argv[2], overwrite=True) as tmp:
        (tmp / "half.bin").write_bytes(b"x" * 1000)
        if sys.argv[3] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        print("writing", flush=True)
        sys.stdin.readline()
""")


def _writer(target, kind, how):
    return subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target), kind, how],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _temporaries(parent, name):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}.tmp-"))


def test_a_killed_writers_temporary_directory_is_removed_by_the_next_write(tmp_path):
    out = tmp_path / "report"
    left = []
    for _ in range(3):  # each writer removes what the one killed before it left
        proc = _writer(out, "report", "kill")
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert len(_temporaries(tmp_path, "report")) == 1
        assert _temporaries(tmp_path, "report") != left
        left = _temporaries(tmp_path, "report")
    mine = tmp_path / ".report.tmp-mine"  # the user's, named like ours: never touched
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    live = _writer(out, "report", "wait")  # a writer still at work: never touched
    assert live.stdout.readline() == "writing\n"
    with atomic.atomic_directory(out, "report") as tmp:
        (tmp / "report.md").write_text("done")
    left = _temporaries(tmp_path, "report")
    assert ".report.tmp-mine" in left and len(left) == 2, left
    assert (mine / "notes.txt").read_text() == "mine"
    live.stdin.write("\n")
    live.stdin.close()
    assert live.wait() == 0
    assert _temporaries(tmp_path, "report") == [".report.tmp-mine"]
    assert (out / "half.bin").is_file()  # the live writer finished and swapped its output in


def test_resume_removes_the_checkpoint_temporaries_of_a_killed_trainer(tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--out", str(run), "--n-dims", "3", "--n-points", "8", "--n-layers", "1",
            "--d-model", "8", "--n-heads", "1", "--batch-size", "8"]
    assert main([*argv, "--steps", "2"]) == 0
    proc = _writer(run / "checkpoint", "checkpoint", "kill")  # killed mid-checkpoint
    proc.wait()
    assert _temporaries(run, "checkpoint")
    assert main([*argv[:3], "--resume", "--steps", "3"]) == 0
    assert _temporaries(run, "checkpoint") == []
    assert sorted(p.name for p in run.iterdir()) == [".iclprobe", ".iclprobe.lock",
                                                     "checkpoint", "metrics.jsonl"]


KILLED_LOGGER = textwrap.dedent("""
    import os, signal, sys
    from iclprobe import atomic, storage
    os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # killed mid-write
    storage.write_text_atomic(sys.argv[1], "")
""")


def test_resume_removes_the_log_temporaries_of_a_killed_trainer_and_nothing_else(tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--out", str(run), "--n-dims", "3", "--n-points", "8", "--n-layers", "1",
            "--d-model", "8", "--n-heads", "1", "--batch-size", "8"]
    assert main([*argv, "--steps", "2"]) == 0
    for name in ("metrics.jsonl", ".iclprobe"):
        proc = subprocess.run([sys.executable, "-c", KILLED_LOGGER, str(run / name)],
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert proc.returncode == -signal.SIGKILL
    left = sorted(p.name for p in run.iterdir() if ".tmp-" in p.name)
    assert len(left) == 2 and all(f"@{os.uname().nodename}." in n for n in left), left
    (run / ".metrics.jsonl.tmp-mine").write_text("the user's")
    assert main([*argv[:3], "--resume", "--steps", "3"]) == 0
    assert sorted(p.name for p in run.iterdir()) == [".iclprobe", ".iclprobe.lock",
                                                     ".metrics.jsonl.tmp-mine", "checkpoint",
                                                     "metrics.jsonl"]
