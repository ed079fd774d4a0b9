"""Safe output files: iclprobe's marker, atomic file writes, permissions, the cache.

Every directory iclprobe writes holds a marker file (``.iclprobe``: what kind of output it
is, which files iclprobe put there and what each was: a file's SHA-256, a directory, a
link). A writer never deletes or moves anything it did not create: it refuses a path that
is a file or a non-empty directory without the marker, and replaces one with the marker
only when asked (``overwrite=True``, ``--overwrite``) and only if the directory holds
nothing but entries that are still what its marker recorded (`written`: a file the user
put in a listed file's place, a hand-written marker's names, another iclprobe output put
inside it — a run or probes — are not the writer's to delete). Directories are written
whole by `iclprobe.atomic.atomic_directory`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from iclprobe.errors import InputError

logger = logging.getLogger(__name__)
MARKER = ".iclprobe"
WRITING = "writing"  # the key of a temporary directory's marker: who is writing it
CACHE_ENV = "ICLPROBE_CACHE"


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
    as ``sub/name``, so that what is added there later is not taken for iclprobe's, and
    records what each is (`digest`: a file's SHA-256, a directory, a link's target): only
    an entry that is still what was recorded is ever replaced. Names given as ``files``
    (a run's growing log) are listed without a digest; their owner checks them.
    """
    directory = Path(directory)
    marker: dict[str, Any] = {"kind": kind}
    if files is None:
        files = _entries(directory)
        marker["digests"] = {name: digest(directory / name) for name in sorted(files)}
    marker["files"] = sorted(files)
    write_text_atomic(directory / MARKER, json.dumps(marker))


def record_rewritten(directory: str | os.PathLike[str], names: list[str]) -> None:
    """Record in ``directory``'s marker that iclprobe rewrote ``names`` there in place.

    Their new digests replace the recorded ones, so that the folder still counts as
    iclprobe's (an ``--overwrite`` later replaces it). Only a marker with digests is updated
    (this iclprobe's); what it recorded of other entries, and entries it never listed, stay
    as they were. Without such a marker nothing is written.
    """
    directory = Path(directory)
    marker = read_marker(directory)
    if marker is None or not isinstance(marker.get("digests"), dict):
        return
    digests = {**marker["digests"], **{name: digest(directory / name) for name in names}}
    files = sorted({*(f for f in marker.get("files", []) if isinstance(f, str)), *names})
    write_text_atomic(directory / MARKER, json.dumps({**marker, "files": files,
                                                      "digests": digests}))


def digest(path: Path) -> str:
    """What ``path`` is, to tell later whether it is still what iclprobe wrote there.

    ``"dir"``, ``"link:TARGET"``, or ``"sha256:HEX"`` of a regular file's contents;
    ``"other"`` for anything else (never iclprobe's).
    """
    if path.is_symlink():
        return f"link:{os.readlink(path)}"
    if path.is_dir():
        return "dir"
    if not path.is_file():
        return "other"
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return f"sha256:{h.hexdigest()}"


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
    return sorted(_foreign(directory, written(directory, marker) | {MARKER, *own}, "", nested))


def written(directory: Path, marker: dict[str, Any]) -> set[str]:
    """The entries of ``directory`` that are still what its marker recorded iclprobe wrote.

    An entry counts only where the marker records its digest and the entry matches it: a
    file replaced by the user's (or a directory by a file), and any name a marker lists
    without a digest (a hand-written marker, one of an older iclprobe), is not iclprobe's.
    """
    digests = marker.get("digests")
    if not isinstance(digests, dict):
        return set()
    return {name for name, recorded in digests.items()
            if isinstance(name, str) and isinstance(recorded, str) and _inside(name)
            and _matches(directory / name, recorded)}


def _inside(name: str) -> bool:
    """A relative path below the directory (no ``..``, not absolute)."""
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def _matches(path: Path, recorded: str) -> bool:
    if not (path.exists() or path.is_symlink()):
        return True  # gone: nothing to delete
    try:
        return digest(path) == recorded
    except OSError:
        return False


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
    check_writable(path)
    if marker is None:
        return path
    if not overwrite:
        raise OutputExistsError(f"{path} already holds iclprobe {kind} output: pass "
                                "--overwrite (in Python, overwrite=True) to replace it")
    foreign = foreign_entries(path, marker, own)
    if foreign:
        why = "" if isinstance(marker.get("digests"), dict) else (
            "; its marker records no digest of what iclprobe wrote (a marker written by "
            "hand or by an older iclprobe), so nothing there is taken for iclprobe's")
        raise OutputExistsError(f"{path} also holds files that iclprobe did not write "
                                f"({', '.join(foreign[:5])}) as this {kind}: move them "
                                f"away or choose another path{why}")
    return path


def check_writable(path: Path) -> None:
    """Refuse, before any work, a path whose directory cannot take a new entry.

    Tried by making (and removing at once) a temporary directory in the nearest existing
    ancestor, where ``path`` or its parents would be created; the error names ``path``.
    """
    ancestor = next((p for p in path.parents if p.is_dir()), None)
    if ancestor is None:
        return
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".iclprobe-probe-", dir=ancestor))
    except OSError as err:
        raise unwritable(path, err, ancestor) from None


def unwritable(path: Path, err: OSError, where: Path | None = None) -> OSError:
    """An OSError naming ``path`` (what the user asked for) and why, never a temporary name.

    ``where``: the directory that refused (default: ``path``'s parent).
    """
    return OSError(f"{path} cannot be written: {err.strerror or err} (in "
                   f"{where or path.parent})")


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
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{path.name}.tmp-{os.getpid()}@{socket.gethostname()}.", dir=path.parent)
    except OSError as err:  # named by the path asked for, not by our temporary file
        raise unwritable(path, err) from None
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
    if not any(c.isalpha() for c in first):  # junk read as a legacy file: a bare number
        return f"not a file torch can read: {type(err).__name__} {first}"
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
