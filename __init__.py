"""iclprobe: which learning algorithm does each layer of an in-context regressor run?

Subpackages are imported lazily (``from iclprobe import models`` works as usual), so that
``import iclprobe`` and the ``iclprobe --help`` command stay fast: the models pull in
TransformerLens, which imports Hugging Face transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["algorithms", "alignment", "hooks", "models", "probes", "tasks"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
