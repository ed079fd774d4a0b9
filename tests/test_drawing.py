"""A report's figures drawn by several processes: the same files, failures raised, no echo.

Off Linux `Figures.draw` draws everything in this process; the tests below then check
that path (those that need a child are skipped, saying so).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from iclprobe.alignment.output import drawing  # noqa: E402
from iclprobe.alignment.output.drawing import Figures  # noqa: E402

FORKS = drawing.can_fork()  # Linux, not in a daemonic process


def _figure(path: Path, k: int, pids: Path | None = None) -> None:
    """A small figure of its own (a curve that depends on k), and who drew it."""
    if pids is not None:  # drawn by several processes: long enough that a child takes some
        time.sleep(0.2)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot(range(10), [(i * k) % 7 for i in range(10)], label=f"figure {k}")
    ax.legend()
    fig.savefig(path, dpi=60)
    plt.close(fig)
    if pids is not None:
        (pids / f"{path.stem}.pid").write_text(str(os.getpid()))


def _figures(folder: Path, n: int, pids: Path | None = None) -> Figures:
    folder.mkdir()
    figures = Figures()
    for k in range(n):
        path = folder / f"f{k}.png"
        assert figures.add(path, lambda path=path, k=k: _figure(path, k, pids)) == path
    return figures


@pytest.mark.slow
def test_figures_drawn_by_several_processes_are_the_files_one_process_draws(tmp_path):
    _figures(tmp_path / "one", 8).draw(workers=1)
    pids = tmp_path / "pids"
    pids.mkdir()
    figures = _figures(tmp_path / "two", 8, pids)
    assert len(figures) == 8
    figures.draw(workers=2)
    assert len(figures) == 0  # drawn once
    for k in range(8):
        assert (tmp_path / "one" / f"f{k}.png").read_bytes() == \
            (tmp_path / "two" / f"f{k}.png").read_bytes()
    drawers = {p.read_text() for p in pids.iterdir()}
    assert len(drawers) == (2 if FORKS else 1), drawers  # a child drew some where it forks
    assert str(os.getpid()) in drawers


def _fails_in(where: str, parent: int):
    def call() -> None:
        time.sleep(0.2)
        if where == "child" and os.getpid() != parent:
            raise ValueError("no such colormap: 'not-a-map'")
        if where == "parent" and os.getpid() == parent:
            raise ValueError("the parent's figure failed")
        if where == "dies" and os.getpid() != parent:
            os._exit(3)
    return call


NEEDS_FORK = pytest.mark.skipif(not FORKS, reason="figures are drawn by forked children on "
                                "Linux only: nothing is drawn in a child here")


@pytest.mark.parametrize("where, error, message", [
    # a child's failure comes back with its traceback; a child that dies is named
    pytest.param("child", RuntimeError, r"(?s)child process.*ValueError: no such colormap",
                 marks=NEEDS_FORK),
    pytest.param("dies", RuntimeError, "exited with status 3", marks=NEEDS_FORK),
    # this process's own failure is raised as it is, the children stopped and joined
    ("parent", ValueError, "the parent's figure failed"),
])
@pytest.mark.slow
def test_a_figure_that_fails_is_an_error(tmp_path, where, error, message):
    figures = Figures()
    for k in range(8):
        figures.add(tmp_path / f"f{k}.png", _fails_in(where, os.getpid()))
    with pytest.raises(error, match=message):
        figures.draw(workers=2)
    assert not multiprocessing.active_children()  # joined, none left behind


@NEEDS_FORK
def test_a_long_traceback_comes_back_cut_to_its_end(tmp_path):
    def huge() -> None:
        time.sleep(0.2)
        if os.getpid() != parent:
            raise ValueError("x" * 200_000 + " where it failed")
    parent = os.getpid()
    figures = Figures()
    for k in range(8):
        figures.add(tmp_path / f"f{k}.png", huge)
    with pytest.raises(RuntimeError, match="where it failed") as caught:
        figures.draw(workers=2)
    assert len(str(caught.value)) <= drawing.MAX_MESSAGE + 100


def test_a_fork_the_system_refuses_leaves_the_figures_to_this_process(tmp_path, monkeypatch):
    def refused(self) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(multiprocessing.get_context("fork").Process, "start", refused)
    pids = tmp_path / "pids"
    pids.mkdir()
    _figures(tmp_path / "f", 4, pids).draw(workers=3)
    assert {p.read_text() for p in pids.iterdir()} == {str(os.getpid())}
    assert len(list((tmp_path / "f").iterdir())) == 4
    assert not multiprocessing.active_children()


def test_a_daemonic_process_draws_alone(monkeypatch):
    # a multiprocessing.Pool worker may not have children: it draws every figure itself
    class Daemon:
        daemon = True
    monkeypatch.setattr(drawing.multiprocessing, "current_process", lambda: Daemon())
    assert not drawing.can_fork()


@pytest.mark.slow
def test_what_was_printed_before_the_figures_is_printed_once():
    # a forked child inherits this process's unflushed output buffer; written out by both,
    # a line printed before the report would appear twice
    code = ("import sys, time\n"
            "from iclprobe.alignment.output.drawing import Figures\n"
            "print('written before the figures', end='')\n"
            "figures = Figures()\n"
            "for k in range(6):\n"
            "    figures.add(None, lambda: time.sleep(0.2))\n"
            "figures.draw(workers=2)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.count("written before the figures") == 1, out
