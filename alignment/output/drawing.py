"""A report's figures, drawn after its text by as many processes as there are cores.

Drawing is most of a report's time (a similarity heatmap takes about a second, a demo
report 47 figures) and is single-threaded Python, so `Figures` collects each figure as a
call with its path while the report is written, and `Figures.draw` runs them at the end:
in this process and, on Linux, in forked children that inherit the results (nothing is
pickled) and take figures from one shared counter until none is left.
A figure is the same file whichever process draws it. A figure that fails raises here,
with the child's traceback, before the report is complete (its folder is then not
swapped in).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
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

        Default: the cores, at most `MAX_WORKERS`. One process (this one) where forking is
        not safe or not allowed: off Linux (macOS's system libraries are not fork-safe,
        Windows cannot fork) and in a daemonic process (a `multiprocessing.Pool` worker
        may have no children). A fork the system refuses leaves the figures to the
        processes already running.

        Raises:
            RuntimeError: a figure failed in a child process (its traceback quoted) or a
                child died.
        """
        calls, self._calls = self._calls, []
        n = min(len(calls), default_workers() if workers is None else workers)
        if n < 2 or not can_fork():
            for _, call in calls:
                call()
            return
        _draw_forked(calls, n)


def can_fork() -> bool:
    """Whether figures may be drawn by forked children here (see `Figures.draw`)."""
    return sys.platform.startswith("linux") and not multiprocessing.current_process().daemon


def default_workers() -> int:
    """The cores this process may run on, at most `MAX_WORKERS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def _draw_forked(calls: list[tuple[Path, Callable[[], Any]]], n: int) -> None:
    """``calls`` by this process and ``n - 1`` forked children, from one shared counter."""
    ctx = multiprocessing.get_context("fork")
    counter = ctx.Value("i", 0)
    children: list[tuple[Any, Connection]] = []
    try:
        _start(ctx, n - 1, calls, counter, children)
        _take(calls, counter)
    except BaseException:
        _stop(calls, counter)  # the children stop taking figures too
        raise
    finally:
        failures = _joined_all(children)
    if failures:
        raise RuntimeError("drawing the report's figures failed in a child process:\n"
                           + "\n".join(failures))


def _start(ctx: Any, k: int, calls: list[tuple[Path, Callable[[], Any]]], counter: Any,
           children: list[tuple[Any, Connection]]) -> None:
    """Start up to ``k`` children, each added to ``children`` once running.

    After a fork the system refuses, no more are started.
    """
    with warnings.catch_warnings():  # Python >= 3.12 warns of forking with threads running
        warnings.simplefilter("ignore", DeprecationWarning)
        for _ in range(k):
            receive, send = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_child, args=(calls, counter, send), daemon=True)
            try:
                child.start()
            except OSError:  # no more processes or memory: draw with those running
                receive.close()
                send.close()
                return
            send.close()
            children.append((child, receive))


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


#: the most characters of a child's traceback sent back (the end of it: where it failed)
MAX_MESSAGE = 20_000


def _child(calls: list[tuple[Path, Callable[[], Any]]], counter: Any, send: Connection) -> None:
    """A forked child's work: figures until none is left; a failure goes back by ``send``."""
    try:
        import torch

        torch.set_num_threads(1)  # the parent's thread pool is not the child's
        _take(calls, counter)
        send.send("")
    except BaseException:  # noqa: BLE001 - everything is reported to the parent
        _stop(calls, counter)  # first: the parent stops taking figures too
        send.send(traceback.format_exc()[-MAX_MESSAGE:])
    finally:
        send.close()


def _joined_all(children: list[tuple[Any, Connection]]) -> list[str]:
    """Every child's failure, once all have exited; interrupted, the rest are terminated."""
    out = []
    try:
        for child, receive in children:
            message = _joined(child, receive)
            if message:
                out.append(message)
    except BaseException:  # e.g. an interrupt while waiting: no child is left running
        for child, _ in children:
            if child.is_alive():
                child.terminate()
            child.join()
        raise
    return out


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
