"""Lazy exports: a subpackage's names imported on first use (PEP 562).

``import iclprobe.models`` must not import torch and TransformerLens before a name needs
them, so that ``iclprobe --help`` and ``iclprobe models`` stay fast. A subpackage maps each
public name to the module defining it and installs the pair returned here as its
``__getattr__`` and ``__dir__``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps name -> defining module.

    A name is imported once, then cached in the package's namespace.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
