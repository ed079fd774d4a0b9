"""Atomic output directories: written whole or not at all, and what a dead writer left.

`atomic_directory` yields a temporary sibling of the output path, marked as this
process's work in progress (its pid and host, in its marker and in its name); when the
block succeeds the directory gets its final marker (`iclprobe.storage.write_marker`) and is
swapped in, and the directory it replaces is deleted only after `check_output` found
nothing there that iclprobe did not write. The next writer of the same path removes what a
dead writer left (`remove_abandoned`), and nothing else.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from iclprobe._checks import is_int
from iclprobe.storage import (
    MARKER,
    WRITING,
    check_output,
    normal_mode,
    read_marker,
    unwritable,
    write_marker,
    write_text_atomic,
)

logger = logging.getLogger(__name__)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _libc() -> Any:
    """The C library, found once (``find_library`` runs ``ldconfig`` each time); None if absent."""
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name, use_errno=True)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with Linux ``renameat2(RENAME_EXCHANGE)``; False if unsupported."""
    libc = _libc()
    if libc is None or not hasattr(libc, "renameat2"):
        return False
    res = libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return res == 0


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], kind: str,
                     overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory that becomes ``path`` when the block succeeds.

    ``path`` is checked first (`check_output`); the new directory gets iclprobe's marker
    listing what the block wrote. On error the temporary directory is removed and ``path``
    is left as it was. Where the kernel supports it the swap is one atomic exchange;
    elsewhere it is two renames.
    """
    path = check_output(path, kind, overwrite)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{_writer_tag()}.",
                                    dir=path.parent))
    except OSError as err:  # named by the path asked for, not by our temporary sibling
        raise unwritable(path, err) from None
    try:
        _mark_temporary(tmp, kind)
        yield tmp
        _settle(tmp)
        write_marker(tmp, kind)  # replaces the temporary marker, just before the rename
        if not path.exists():
            os.rename(tmp, path)
        else:
            check_output(path, kind, overwrite)  # it may have changed while we wrote
            _swap_in(tmp, path, kind)
        _fsync_dir(path.parent)
    finally:
        if tmp.exists():
            _remove_marked_last(tmp)


def _writer_tag() -> str:
    """``PID@HOST``: a temporary name's writer, so that its leftovers can be told apart."""
    return f"{os.getpid()}@{socket.gethostname()}"


def _dead_writer(tag: str) -> bool:
    """Whether ``PID@HOST`` names a process of this host that is gone."""
    pid, _, host = tag.partition("@")
    return host == socket.gethostname() and pid.isdigit() and int(pid) > 0 \
        and not _alive(int(pid))


def writing_here(directory: str | os.PathLike[str], kind: str) -> bool:
    """Whether ``directory`` is a temporary directory this process is writing ``kind`` into.

    `atomic_directory` yields one: a writer given it (a report written inside the CLI's
    atomic folder) writes into it directly instead of making its own.
    """
    marker = read_marker(directory) or {}
    writer = marker.get(WRITING)
    return marker.get("kind") == kind and isinstance(writer, dict) \
        and writer.get("pid") == os.getpid() and writer.get("host") == socket.gethostname()


def _mark_temporary(directory: Path, kind: str) -> None:
    """Mark ``directory`` as this process's work in progress (see `remove_abandoned`)."""
    writer = {"pid": os.getpid(), "host": socket.gethostname()}
    write_text_atomic(directory / MARKER, json.dumps({"kind": kind, "files": [],
                                                      WRITING: writer}))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but is not ours to signal
        return True
    return True


def remove_abandoned(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary siblings of ``path`` that a dead iclprobe writer left.

    Only directories named as `atomic_directory` names them (``.NAME.tmp-*``,
    ``.NAME.old-*``) with iclprobe's marker, whose writer — the process of this host the
    marker names, or, for one killed after its final marker was written, the ``PID@HOST``
    in its name — is gone; and, without a marker, one killed before it wrote its marker:
    named for a dead writer and empty but for that marker's own temporary file. A
    directory of the user's with such a name, or one a live writer holds, is left alone.
    Returns what was removed.
    """
    path = Path(path)
    if not path.parent.is_dir():
        return []
    removed = []
    prefixes = (f".{path.name}.tmp-", f".{path.name}.old-")
    for entry in path.parent.iterdir():
        if not entry.name.startswith(prefixes) or entry.is_symlink() or not entry.is_dir():
            continue
        marker = read_marker(entry)
        tag = entry.name[len(prefixes[0]):].rpartition(".")[0]  # both prefixes are as long
        if marker is None and _unmarked_leftover(entry, tag):
            try:  # another writer may be removing it too
                for leftover in entry.iterdir():
                    leftover.unlink(missing_ok=True)
                entry.rmdir()
            except FileNotFoundError:
                pass
        elif marker is not None and _abandoned(tag, marker.get(WRITING)):
            _remove_marked_last(entry)
        else:
            continue
        removed.append(entry)
    if removed:
        logger.info("removed %d temporary director%s that an interrupted writer left: %s",
                    len(removed), "y" if len(removed) == 1 else "ies",
                    ", ".join(str(p) for p in removed[:5]))
    return removed


def _unmarked_leftover(entry: Path, tag: str) -> bool:
    """Whether ``entry`` is a temporary directory killed before its marker was in place.

    Its name's writer is a dead process of this host, and it holds nothing but the
    marker's unfinished temporary file (`write_text_atomic`'s, of that same writer).
    """
    if not _dead_writer(tag):
        return False
    partial = f".{MARKER}.tmp-{tag}."
    try:  # another user's, unreadable to us (mkdtemp makes it 0700): not ours to judge
        return all(p.name.startswith(partial) and p.is_file() and not p.is_symlink()
                   for p in entry.iterdir())
    except OSError:
        return False


def _abandoned(tag: str, writer: Any) -> bool:
    """Whether a temporary directory's writer (its marker's, else its name's tag) is dead."""
    if isinstance(writer, dict):
        pid = writer.get("pid")
        return writer.get("host") == socket.gethostname() and is_int(pid) and pid > 0 \
            and not _alive(pid)
    return _dead_writer(tag)


def remove_abandoned_files(directory: str | os.PathLike[str], names: tuple[str, ...]
                           ) -> list[Path]:
    """Remove `write_text_atomic`'s temporary files of ``names`` whose writer is dead.

    Such a file is named ``.NAME.tmp-PID@HOST.XXXXXXXX`` after the process writing it; it
    is removed when that process is one of this host's and gone. For a directory one
    writer holds at a time (a locked run), where a user's file is never named so.
    """
    removed = []
    for entry in Path(directory).iterdir():
        for name in names:
            prefix = f".{name}.tmp-"
            if not entry.name.startswith(prefix) or entry.is_symlink() or not entry.is_file():
                continue
            if _dead_writer(entry.name[len(prefix):].rpartition(".")[0]):
                entry.unlink()
                removed.append(entry)
    if removed:
        logger.info("removed %d temporary file(s) that an interrupted writer left: %s",
                    len(removed), ", ".join(str(p) for p in removed[:5]))
    return removed


def _remove_marked_last(directory: Path) -> None:
    """Delete a directory of ours, its marker last: a deletion cut short stays marked."""
    for entry in directory.iterdir():
        if entry.name == MARKER:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    with contextlib.suppress(FileNotFoundError):
        (directory / MARKER).unlink()
    directory.rmdir()


def _settle(tmp: Path) -> None:
    """Flush what was written to disk, with the umask's permissions.

    mkdtemp makes directories 0700 and safetensors writes files 0600.
    """
    os.chmod(tmp, normal_mode(directory=True))
    for root, dirs, files in os.walk(tmp):
        for name in dirs:
            os.chmod(Path(root) / name, normal_mode(directory=True))
        for name in files:
            os.chmod(Path(root) / name, normal_mode(directory=False))
            with open(Path(root) / name, "rb") as fh:
                os.fsync(fh.fileno())


def _swap_in(tmp: Path, path: Path, kind: str) -> None:
    """Put ``tmp`` at ``path`` and delete the directory it replaces (checked to be ours).

    The replaced directory is marked temporary before it is deleted, so that a deletion
    cut short is finished by the next writer.
    """
    if _exchange(tmp, path):
        _mark_temporary(tmp, kind)  # tmp now holds the previous output
        _remove_marked_last(tmp)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-{_writer_tag()}.", dir=path.parent))
    os.rmdir(old)
    os.rename(path, old)
    os.rename(tmp, path)
    _mark_temporary(old, kind)  # only now: until the rename above it was the only copy
    _remove_marked_last(old)
