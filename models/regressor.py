"""`Regressor`: either hooked model family (for type annotations)."""

from __future__ import annotations

from typing import Union

from iclprobe.models.gpt import GPTRegressor
from iclprobe.models.pq import PQTransformer

Regressor = Union[GPTRegressor, PQTransformer]  # noqa: UP007 - a runtime alias
