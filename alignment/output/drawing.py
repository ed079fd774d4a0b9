"""A report's figures, drawn after its text by as many processes as there are cores.

Drawing is most of a report's time (a similarity heatmap takes about a second, a demo
report 47 figures) and is single-threaded Python, so `Figures` collects each figure as a
call with its path while the report is written, and `Figures.draw` runs them at the end:
in this process and, where the platform forks, in forked children that inherit the
results (nothing is pickled) and take figures from one shared counter until none is left.
A figure is the same file whichever process draws it. A figure that fails raises here,
with the child's traceback, before the report is complete (its folder is then not
swapped in).
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

#: the most processes a report's figures are drawn by (its own included)
MAX_WORKERS = 4


class Figures:
    """The figures of one report, drawn together by `draw`."""

    def __init__(self) -> None:
        self._calls: list[tuple[Path, Callable[[], Any]]] = []

    def add(self, path: Path, call: Callable[[], Any]) -> Path:
        """Draw ``path`` by ``call()`` (it writes the file) when `draw` runs; returns ``path``."""
        self._calls.append((path, call))
        return path

    def __len__(self) -> int:
        return len(self._calls)

    def draw(self, workers: int | None = None) -> None:
        """Draw every figure added, by ``workers`` processes.

        Default: the cores, at most `MAX_WORKERS`; one where the platform cannot fork.

        Raises:
            RuntimeError: a figure failed in a child process (its traceback quoted) or a
                child died.
        """
        calls, self._calls = self._calls, []
        n = min(len(calls), default_workers() if workers is None else workers)
        if n < 2 or "fork" not in multiprocessing.get_all_start_methods():
            for _, call in calls:
                call()
            return
        _draw_forked(calls, n)


def default_workers() -> int:
    """The cores this process may run on, at most `MAX_WORKERS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def _draw_forked(calls: list[tuple[Path, Callable[[], Any]]], n: int) -> None:
    """``calls`` by this process and ``n - 1`` forked children, from one shared counter."""
    ctx = multiprocessing.get_context("fork")
    counter = ctx.Value("i", 0)
    children = []
    with warnings.catch_warnings():  # Python >= 3.12 warns of forking with threads running
        warnings.simplefilter("ignore", DeprecationWarning)
        for _ in range(n - 1):
            receive, send = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_child, args=(calls, counter, send), daemon=True)
            child.start()
            send.close()
            children.append((child, receive))
    try:
        _take(calls, counter)
    except BaseException:
        _stop(calls, counter)  # the children stop taking figures too
        raise
    finally:
        failures = [_joined(child, receive) for child, receive in children]
    failed = [f for f in failures if f]
    if failed:
        raise RuntimeError("drawing the report's figures failed in a child process:\n"
                           + "\n".join(failed))


def _take(calls: list[tuple[Path, Callable[[], Any]]], counter: Any) -> None:
    """Draw figures, each taken from ``counter``, until none is left."""
    while True:
        with counter.get_lock():
            i = counter.value
            counter.value += 1
        if i >= len(calls):
            return
        calls[i][1]()


def _stop(calls: list[tuple[Path, Callable[[], Any]]], counter: Any) -> None:
    with counter.get_lock():
        counter.value = len(calls)


def _child(calls: list[tuple[Path, Callable[[], Any]]], counter: Any, send: Connection) -> None:
    """A forked child's work: figures until none is left; a failure goes back by ``send``."""
    try:
        import torch

        torch.set_num_threads(1)  # the parent's thread pool is not the child's
        _take(calls, counter)
        send.send("")
    except BaseException:  # noqa: BLE001 - everything is reported to the parent
        send.send(traceback.format_exc())
        _stop(calls, counter)  # the parent stops taking figures too
    finally:
        send.close()


def _joined(child: Any, receive: Connection) -> str:
    """The child's failure ("" if none), once it has exited."""
    try:
        message = receive.recv()
    except EOFError:  # it died before it could say
        message = ""
    child.join()
    receive.close()
    if not message and child.exitcode != 0:
        message = f"a child drawing figures exited with status {child.exitcode}"
    return message
