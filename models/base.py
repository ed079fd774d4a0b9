"""Behaviour shared by the model families."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from torch import Tensor, nn

from iclprobe.models._tl import ActivationCache

M = TypeVar("M", bound=nn.Module)


class ModuleList(nn.ModuleList, Generic[M]):
    """``nn.ModuleList`` whose items have one static type (for the type checker only)."""

    if TYPE_CHECKING:

        def __iter__(self) -> Iterator[M]: ...

        @overload
        def __getitem__(self, idx: slice) -> ModuleList[M]: ...

        @overload
        def __getitem__(self, idx: int) -> M: ...

        def __getitem__(self, idx: int | slice) -> M | ModuleList[M]: ...


class RegressorMixin:
    """Checkpointing and TransformerLens-style caching shared by the hooked regressors.

    Mixed in before ``HookedRootModule``.
    """

    def check_inputs(self, xs: Tensor, ys: Tensor) -> None:
        """Validate ``xs [batch, pos, n_dims]`` and ``ys [batch, pos]`` against the config.

        Inputs must have the dtype of the model's weights (float32 unless converted, e.g.
        by ``model.double()``): other dtypes are a TypeError, never a silent cast.
        """
        self._check_dtype(xs=xs, ys=ys)
        d = self.cfg.n_dims  # type: ignore[attr-defined]
        if xs.ndim != 3 or xs.shape[-1] != d:
            raise ValueError(f"xs must have shape [batch, pos, {d}], got {tuple(xs.shape)}")
        if ys.shape != xs.shape[:2]:
            raise ValueError(f"ys must have shape {tuple(xs.shape[:2])}, got {tuple(ys.shape)}")

    def _check_dtype(self, **inputs: Tensor) -> None:
        dtype = next(self.parameters()).dtype  # type: ignore[attr-defined]
        for name, t in inputs.items():
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != dtype:
                raise TypeError(f"{name} has dtype {t.dtype}, but the model's weights are "
                                f"{dtype}: pass {name}.to({dtype}) (or convert the model, "
                                f"e.g. model.double() for float64 inputs)")

    def check_queries(self, xs: Tensor, ys: Tensor, queries: Tensor) -> None:
        """Validate the context and ``queries [batch, pos, T, n_dims]`` (of the same dtype)."""
        self.check_inputs(xs, ys)
        self._check_dtype(queries=queries)
        b, n, d = xs.shape
        if queries.ndim != 4 or queries.shape[:2] != (b, n) or queries.shape[-1] != d:
            raise ValueError(
                f"queries must have shape [{b}, {n}, T, {d}], got {tuple(queries.shape)}"
            )

    def save(self, path: str | os.PathLike[str], task: Any = None,
             overwrite: bool = False) -> Path:
        """Save the model, its config and ``task`` (default: ``self.task``) atomically.

        ``overwrite=True`` replaces a checkpoint that iclprobe wrote at ``path``; nothing
        else is ever replaced (see `iclprobe.models.save`).
        """
        from iclprobe.models.checkpoint import save  # checkpoint imports the families

        return save(self, path, task=task, overwrite=overwrite)  # type: ignore[arg-type]

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
