"""Behaviour shared by the model families."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from iclprobe.models._tl import ActivationCache


class RegressorMixin:
    """Checkpointing and TransformerLens-style caching shared by the hooked regressors.

    Mixed in before ``HookedRootModule``.
    """

    def save(self, path: str | os.PathLike[str], task: Any = None) -> Path:
        """Save the model, its config and ``task`` (default: ``self.task``) atomically."""
        from iclprobe.models.checkpoint import save  # checkpoint imports the families

        return save(self, path, task=task)  # type: ignore[arg-type]

    def run_with_cache(
        self, *model_args: Any, return_cache_object: bool = True, remove_batch_dim: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        """Run the model and return ``(output, cache)``, the cache as an ``ActivationCache``.

        Keyword arguments (``names_filter``, ``device``, ...) go to TransformerLens's
        ``HookedRootModule.run_with_cache``; no hook stays attached afterwards.
        """
        out, cache = super().run_with_cache(  # type: ignore[misc]
            *model_args, remove_batch_dim=remove_batch_dim, **kwargs
        )
        if return_cache_object:
            cache = ActivationCache(cache, self, has_batch_dim=not remove_batch_dim)
        return out, cache
