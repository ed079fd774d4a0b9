"""Plugins: installed packages whose registrations join iclprobe's (entry-point group).

A package adds learners, metrics or model families to every ``iclprobe`` command by naming
the module that registers them in the ``iclprobe.plugins`` entry-point group of its
metadata, e.g. in its ``pyproject.toml``::

    [project.entry-points."iclprobe.plugins"]
    tinyext = "tinyext"

Loading a plugin imports its module (the ``@register`` decorators and ``register_family``
lines run then); an entry point that names a function (``"tinyext.setup:register_all"``)
is also called, without arguments. The CLI loads the plugins when a command runs (not for
``iclprobe --help``, which stays torch-free), and `iclprobe.models.load` loads them when a
checkpoint names a family it does not know.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from importlib import metadata

from iclprobe.errors import InputError, InputTypeError

logger = logging.getLogger(__name__)

GROUP = "iclprobe.plugins"
_LOADED: dict[str, str] = {}  # entry-point name -> its value, once loaded
_LOADING: list[str] = []  # the plugin being loaded now (its entry-point name)
#: What registrations replaced, by (registry, name): the sentence saying it and the
#: replacing registrant (``register(..., replace=True)``); every command that loads the
#: plugins says those still in force (`iclprobe.cli`).
REPLACED: dict[tuple[str, str], tuple[str, str]] = {}


def registrant(module: str) -> str:
    """Who registers now, for messages: ``plugin 'NAME' (module M)`` or ``module M``.

    Args:
        module: the module the registration comes from (a function's ``__module__``, the
            caller of ``register_family``).
    """
    where = f"module {module}"
    return f"plugin {_LOADING[-1]!r} ({where})" if _LOADING else where


def claim(kind: str, name: str, taken_by: str | None, by: str, replace: bool) -> None:
    """Refuse to register ``name`` again unless ``replace``; record a replacement.

    One rule for the three registries (learners, metrics, model families): a name belongs
    to its first registrant; another registration under it is refused, naming the first,
    unless it passes ``replace=True``, which is then logged and recorded in `REPLACED`
    (by registry and name: the latest replacement of a name is the one in force).

    Args:
        kind: "learner", "metric" or "model family", for the message.
        name: the name registered.
        taken_by: the registrant of the registration under ``name`` (None: it is free).
        by: this registration's registrant (`registrant`).
        replace: the caller's explicit opt-in to replace a registration.

    Raises:
        InputError: the name is taken and ``replace`` is False, or ``replace`` is True and
            there is nothing to replace.
    """
    if not isinstance(replace, bool):
        raise InputTypeError(f"{kind} {name!r}: replace must be a bool, got {replace!r}")
    if taken_by is None:
        if replace:
            raise InputError(f"{kind} {name!r}: replace=True, but no {kind} {name!r} is "
                             "registered: drop replace=True to add it")
        return
    if not replace:
        raise InputError(f"{kind} {name!r} is already registered by {taken_by}; "
                         f"register under another name, or pass replace=True to replace it")
    sentence = f"{kind} {name!r} of {taken_by} is replaced by {by}"
    logger.warning("%s", sentence)
    REPLACED[(kind, name)] = (sentence, by)


def load_plugins() -> dict[str, str]:
    """Load every installed plugin of `GROUP` not loaded yet; returns name -> value loaded.

    A plugin that fails to load is reported (a warning naming it and the error) and skipped,
    so that a broken package cannot take the other commands down with it.
    """
    for entry in metadata.entry_points(group=GROUP):
        if entry.name in _LOADED:
            continue
        _LOADED[entry.name] = entry.value  # tried once, whether or not it loads
        _load(entry)
    return dict(_LOADED)


def _load(entry: metadata.EntryPoint) -> None:
    """Import (and call) one plugin; what it prints goes to stderr, never stdout.

    Stdout is the commands' output (``align --json``): a plugin that prints must not make
    it invalid. A plugin that fails — an exception, or ``sys.exit`` — is skipped with a
    warning naming it; one interrupted (Ctrl-C, or a KeyboardInterrupt it raises) stops
    the command with a `KeyboardInterrupt` naming it.
    """
    who = f"{entry.name!r} ({entry.value})"
    _LOADING.append(entry.name)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            loaded = entry.load()
            if callable(loaded):
                loaded()
    except KeyboardInterrupt:
        _LOADED[entry.name] = "interrupted"
        raise KeyboardInterrupt(f"while loading iclprobe plugin {who}") from None
    except (Exception, SystemExit) as err:  # noqa: BLE001 - any error of a third-party import
        what = f"called sys.exit({err.code!r})" if isinstance(err, SystemExit) else \
            f"{type(err).__name__}: {err}"
        logger.warning("iclprobe plugin %s failed to load, skipped: %s", who, what)
        _LOADED[entry.name] = f"failed: {what}"
    finally:
        _LOADING.pop()
