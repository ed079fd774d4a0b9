"""Safe output files: atomic writes, iclprobe's marker, the user's permissions, the cache.

Every directory iclprobe writes holds a marker file (``.iclprobe``: what kind of output it
is and which files iclprobe put there). A writer never deletes or moves anything it did not
create: it refuses a path that is a file or a non-empty directory without the marker, and
replaces one with the marker only when asked (``overwrite=True``, ``--overwrite``) and only
if the directory holds nothing but the files its own marker lists (another iclprobe output
put inside it, a run or probes, is not the writer's to delete).

A temporary directory is marked as a writer's own (its process and host) when it is made;
the next writer of the same path removes those that a dead writer left (killed mid-write),
and nothing else.
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
from iclprobe.errors import InputError

logger = logging.getLogger(__name__)
MARKER = ".iclprobe"
WRITING = "writing"  # the key of a temporary directory's marker: who is writing it
CACHE_ENV = "ICLPROBE_CACHE"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class CheckpointError(InputError):
    """A checkpoint exists but cannot be read: the message names the file and the problem."""


class OutputExistsError(FileExistsError):
    """An output path iclprobe may not write: the message names it and says what to do."""


def normal_mode(directory: bool) -> int:
    """The permissions ``open``/``mkdir`` would give under the current umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def parse_json(text: str) -> Any:
    """``json.loads``, where nesting too deep for the parser is a ValueError as bad JSON is.

    Python's parser recurses once per ``[`` or ``{``: ``"[" * 100000`` would otherwise end
    in a RecursionError traceback.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError("nested too deeply to be read (thousands of levels of [ or {)") \
            from None


def read_marker(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The marker of a directory iclprobe wrote, or None (no marker, or not one of ours)."""
    try:
        data = parse_json((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("kind"), str) else None


def write_marker(directory: str | os.PathLike[str], kind: str,
                 files: list[str] | None = None) -> None:
    """Mark ``directory`` as iclprobe's ``kind`` output holding ``files`` (default: all).

    The default lists every entry, and inside each subdirectory (not a link) every entry
    as ``sub/name``, so that what is added there later is not taken for iclprobe's.
    """
    directory = Path(directory)
    if files is None:
        files = _entries(directory)
    write_text_atomic(directory / MARKER, json.dumps({"kind": kind, "files": sorted(files)}))


def _entries(directory: Path, prefix: str = "") -> list[str]:
    out = []
    for p in directory.iterdir():
        if p.name == MARKER and not prefix:
            continue
        out.append(prefix + p.name)
        if p.is_dir() and not p.is_symlink():
            out += _entries(p, f"{prefix}{p.name}/")
    return out


def foreign_entries(directory: Path, marker: dict[str, Any], own: tuple[str, ...] = (),
                    nested: bool = False) -> list[str]:
    """Entries of ``directory`` that its marker does not list (nor ``own``).

    Inside a listed subdirectory whose entries the marker lists too (``sub/name``), the
    entries it does not list are foreign as well (named ``sub/name``); a subdirectory
    listed alone is the writer's whole. ``nested=True`` also passes subdirectories
    holding iclprobe output of their own (a run's probes): for a caller that keeps them,
    never for one that deletes the tree.
    """
    listed = {MARKER, *own, *(f for f in marker.get("files", []) if isinstance(f, str))}
    return sorted(_foreign(directory, listed, "", nested))


def _foreign(directory: Path, listed: set[str], prefix: str, nested: bool) -> list[str]:
    out = []
    for p in directory.iterdir():
        name = prefix + p.name
        if name not in listed:
            if not (nested and p.is_dir() and not p.is_symlink() and read_marker(p) is not None):
                out.append(name)
        elif p.is_dir() and not p.is_symlink() and any(f.startswith(name + "/") for f in listed):
            out += _foreign(p, listed, name + "/", nested)
    return out


def check_target(path: str | os.PathLike[str], kind: str, ignore: tuple[str, ...] = ()
                 ) -> tuple[Path, dict[str, Any] | None]:
    """``(path, its marker)`` if iclprobe may write ``kind`` output there, else refuse.

    The path may be absent, an empty directory (``ignore`` names aside: a lock file, ...),
    or iclprobe's own ``kind`` output (then its marker is returned, else None).

    Raises:
        OutputExistsError: ``path`` is a file or lies below one, is a non-empty directory
            without iclprobe's marker, or holds iclprobe's output of another kind.
    """
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if path.exists() and not path.is_dir():
        raise OutputExistsError(f"{path} is a file, not a directory: choose another path")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise OutputExistsError(f"{path} cannot be created: {blocker} is a file, not a "
                                "directory; choose another path")
    if not path.exists() or all(p.name in ignore for p in path.iterdir()):
        return path, None
    marker = read_marker(path)
    if marker is None:
        raise OutputExistsError(f"{path} is a non-empty directory that iclprobe did not "
                                "write: choose another path (nothing was changed)")
    if marker["kind"] != kind:
        raise OutputExistsError(f"{path} holds an iclprobe {marker['kind']}, not {kind} "
                                "output: choose another path")
    return path, marker


def check_output(path: str | os.PathLike[str], kind: str, overwrite: bool = False,
                 own: tuple[str, ...] = ()) -> Path:
    """Refuse an output directory that iclprobe may not write; returns the path to write.

    Args:
        path: the output directory (a link to a directory counts as that directory).
        kind: what is written ("checkpoint", "probes", "report", "run", ...).
        overwrite: replace iclprobe's own ``kind`` output found there.
        own: further names that this kind of output owns without listing them.

    Raises:
        OutputExistsError: as `check_target`; or ``path`` holds iclprobe's output and
            ``overwrite`` is False, or it holds files that iclprobe did not write.
    """
    path, marker = check_target(path, kind)
    if marker is None:
        return path
    if not overwrite:
        raise OutputExistsError(f"{path} already holds iclprobe {kind} output: pass "
                                "--overwrite (overwrite=True) to replace it")
    foreign = foreign_entries(path, marker, own)
    if foreign:
        raise OutputExistsError(f"{path} also holds files that iclprobe did not write "
                                f"({', '.join(foreign[:5])}) as this {kind}: move them "
                                "away or choose another path")
    return path


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
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
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
    ``.NAME.old-*``) whose marker says a process of this host was writing them and that
    process is gone; a directory of the user's with such a name, or one a live writer
    holds, is left alone. Returns what was removed.
    """
    path = Path(path)
    if not path.parent.is_dir():
        return []
    removed = []
    for entry in path.parent.iterdir():
        if not entry.name.startswith((f".{path.name}.tmp-", f".{path.name}.old-")) or \
                entry.is_symlink() or not entry.is_dir():
            continue
        writer = (read_marker(entry) or {}).get(WRITING)
        if not isinstance(writer, dict) or writer.get("host") != socket.gethostname():
            continue
        pid = writer.get("pid")
        if not is_int(pid) or pid <= 0 or _alive(pid):
            continue
        _remove_marked_last(entry)
        removed.append(entry)
    if removed:
        logger.info("removed %d temporary director%s that an interrupted writer left: %s",
                    len(removed), "y" if len(removed) == 1 else "ies",
                    ", ".join(str(p) for p in removed[:5]))
    return removed


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
            pid, _, host = entry.name[len(prefix):].rpartition(".")[0].partition("@")
            if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
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
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.rmdir(old)
    os.rename(path, old)
    os.rename(tmp, path)
    _mark_temporary(old, kind)  # only now: until the rename above it was the only copy
    _remove_marked_last(old)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write a text file through a temporary file and ``os.replace``.

    The file keeps the permissions of the one it replaces, or gets the umask's.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = normal_mode(directory=False)
    # named for its writer (pid and host), so that `remove_abandoned_files` can tell it
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}@{socket.gethostname()}.",
                               dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # mkstemp made it 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def cache_dir() -> Path:
    """The user cache directory: ``$ICLPROBE_CACHE``, else the platform's (``~/.cache/iclprobe``)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("iclprobe", appauthor=False))


def torch_load_failure(err: BaseException) -> str:
    """Why a ``torch.load(..., weights_only=True)`` failed, in a few words.

    Torch's own message advises turning the safety check off; this one never does.
    """
    import pickle

    if isinstance(err, pickle.UnpicklingError):
        return "not a plain tensor file: it holds pickled objects that iclprobe never loads"
    if isinstance(err, EOFError):
        return "the file ends early"
    first = str(err).split(". ")[0].splitlines()[0] if str(err) else type(err).__name__
    return first if "weights_only" not in first else type(err).__name__


def torch_load_tensors(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, without torch's pickle warnings.

    Raises:
        CheckpointError: the file is truncated, corrupt or holds more than tensors; the
            message names it.
    """
    import warnings

    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a bad file
        raise CheckpointError(f"{path}: truncated, corrupt or unsafe "
                              f"({torch_load_failure(err)})") from None
