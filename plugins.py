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

import logging
from importlib import metadata

logger = logging.getLogger(__name__)

GROUP = "iclprobe.plugins"
_LOADED: dict[str, str] = {}  # entry-point name -> its value, once loaded


def load_plugins() -> dict[str, str]:
    """Load every installed plugin of `GROUP` not loaded yet; returns name -> value loaded.

    A plugin that fails to load is reported (a warning naming it and the error) and skipped,
    so that a broken package cannot take the other commands down with it.
    """
    for entry in metadata.entry_points(group=GROUP):
        if entry.name in _LOADED:
            continue
        _LOADED[entry.name] = entry.value  # tried once, whether or not it loads
        try:
            loaded = entry.load()
            if callable(loaded):
                loaded()
        except Exception as err:  # noqa: BLE001 - any error of a third-party import
            logger.warning("iclprobe plugin %r (%s) failed to load: %s: %s", entry.name,
                           entry.value, type(err).__name__, err)
            _LOADED[entry.name] = f"failed: {type(err).__name__}: {err}"
    return dict(_LOADED)
