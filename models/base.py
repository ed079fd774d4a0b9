"""Behaviour shared by the model families."""

from __future__ import annotations

import abc
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

import torch
from torch import Tensor, nn

from iclprobe._finite import all_finite
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models import files
from iclprobe.models._tl import ActivationCache, HookedRootModule

#: Where a family may say its models were trained (``Regressor.default_positions``).
POSITIONS = ("all", "last")

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


def tensor_home(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of a module's first parameter, else first buffer, else CPU float32.

    A model may have no parameters: a known-answer oracle holds only buffers.
    """
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device, tensor.dtype
    return torch.device("cpu"), torch.float32


def input_dtype(module: nn.Module) -> torch.dtype:
    """The dtype a model takes its inputs in: its weights' float dtype (else float32).

    What `align` and the probes sample their sequences in, so that a model converted with
    ``model.double()`` is read in float64 (its layers' readings then independent of the
    thread count's float32 reduction order) and a float32 one as before.
    """
    dtype = tensor_home(module)[1]
    return dtype if dtype.is_floating_point else torch.float32


def check_precision(model: nn.Module, who: str, name: str) -> None:
    """Refuse a model whose weights are of a half precision (bfloat16, float16).

    The answer tells apart similarities 1e-5 apart (`iclprobe.alignment.views.continua`),
    finer than those formats' own round-off (8e-3 and 1e-3 relative), and the readings'
    checks are sized for float32; such a model is read with ``model.float()``.
    """
    dtype = input_dtype(model)
    if dtype not in (torch.float32, torch.float64):
        eps = torch.finfo(dtype).eps
        raise InputError(f"{who}: {name} has {str(dtype).removeprefix('torch.')} weights "
                         f"(round-off {eps:.0e}); {who} reads a model in float32 or float64, "
                         "whose readings can resolve the answer's 1e-5: convert it with "
                         ".float()")


def _check_finite(**inputs: Tensor) -> None:
    """Refuse NaN or Inf in a model's inputs (its readings would carry them silently)."""
    for name, t in inputs.items():
        if not t.is_meta and not all_finite(t):  # meta: shapes only
            raise InputError(f"{name} must be finite, found NaN or Inf")


class Regressor(HookedRootModule, metaclass=abc.ABCMeta):
    """What every model family provides (the abstract base class; see docs/architecture.md).

    A family subclasses this, implements the abstract methods, and registers itself once
    with `iclprobe.models.registry.register_family`; checkpoints, training, hooks, probes,
    alignment and the CLI then serve it without naming it.

    Conventions: ``forward(xs, ys)`` returns ``preds [batch, pos]`` where ``preds[:, t]``
    sees examples ``0..t-1`` and the query ``xs[:, t]``. Layer l's residual is the output of
    hook `resid_hook_name` (l = 0: the embedded input), read at the readout positions by
    `readout_rows` as ``[batch, pos, d_model]``.

    Class attributes a family may override:
        family: its registry name (set by ``register_family``).
        exact_layer_readout: ``readout_residual`` of layer l's residual is layer l's own
            prediction (a PQ layer's query row), so alignment needs no probes.
        default_positions: where a model without a recorded recipe was trained, "all"
            (every prefix, Garg et al.'s loss) or "last" (Ahn et al.'s loss).
        curriculum: Garg's curriculum applies (the model takes fewer dims and points).
        head_hook: ``(hook name under blocks.{l}., head axis)`` for head ablations, or None.
        block_output_hooks: hook names under ``blocks.{l}.`` whose sum is block l's output
            (what ``hooks.ablate`` replaces); empty (the default): the block's update of
            the residual stream, layer l + 1's residual minus layer l's.
    """

    family: ClassVar[str] = ""
    exact_layer_readout: ClassVar[bool] = False
    default_positions: ClassVar[str] = "all"
    curriculum: ClassVar[bool] = True
    head_hook: ClassVar[tuple[str, int] | None] = None
    block_output_hooks: ClassVar[tuple[str, ...]] = ()
    cfg: Any
    task: Any = None  # the RegressionTask it was trained on, when known (`models.load` sets it)
    train_config: dict[str, Any] | None = None  # the recipe it was trained with, when known
    checkpoint: Path | None = None  # where `models.load` found it (None: built in Python)

    @classmethod
    def check_family_class(cls, family: str) -> None:
        """Refuse a class that is not a complete `Regressor`; give it its ``family`` name.

        `iclprobe.models.registry.register_family` calls it (at once for a class, on first
        import for ``"module:Class"``): every abstract method implemented, the class
        attributes well formed. A class without a ``family`` of its own gets ``family``.
        """
        where = f"model family {family!r}: {cls.__name__}"
        abstract = sorted(getattr(cls, "__abstractmethods__", ()))
        if abstract:
            raise InputTypeError(f"{where} does not implement {abstract} (abstract in Regressor)")
        if cls.default_positions not in POSITIONS:
            raise InputError(f"{where}.default_positions must be one of {POSITIONS}, got "
                             f"{cls.default_positions!r}")
        for flag in ("exact_layer_readout", "curriculum"):
            if not isinstance(getattr(cls, flag), bool):
                raise InputTypeError(f"{where}.{flag} must be a bool, got {getattr(cls, flag)!r}")
        head = cls.head_hook
        if head is not None and not (isinstance(head, tuple) and len(head) == 2
                                     and isinstance(head[0], str) and isinstance(head[1], int)):
            raise InputTypeError(f"{where}.head_hook must be None or (hook name, head axis), got "
                            f"{head!r}")
        hooks = cls.block_output_hooks
        if not (isinstance(hooks, tuple) and all(isinstance(h, str) and h for h in hooks)):
            raise InputTypeError(f"{where}.block_output_hooks must be a tuple of hook names under "
                            f"blocks.{{l}}., got {hooks!r}")
        if not cls.__dict__.get("family"):  # a class of another family keeps its own name
            cls.family = family

    # ------------------------------------------------------------------ what a family provides
    @abc.abstractmethod
    def forward(self, xs: Tensor, ys: Tensor, last_only: bool = False) -> Tensor:
        """``preds [batch, pos]`` (``[batch, 1]`` with ``last_only``: the last position)."""

    @abc.abstractmethod
    def predict_queries(self, xs: Tensor, ys: Tensor, queries: Tensor) -> Tensor:
        """``[batch, pos, T]``: query j at prefix t seen with the t examples before t."""

    @abc.abstractmethod
    def query_residuals(self, xs: Tensor, ys: Tensor, queries: Tensor,
                        reduce: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """Every layer's residual at the query tokens, ``[L+1, batch, pos, T, d_model]``.

        ``reduce`` is applied to the stacked tensor (e.g. a probe's readout), so callers
        can bound memory.
        """

    @abc.abstractmethod
    def readout_residual(self, resid: Tensor) -> Tensor:
        """The model's own read-out of residuals at readout positions, ``[..., d_model] -> [...]``.

        Applied to the last layer it gives the model's prediction; to earlier layers the
        no-training (logit-lens) readout.
        """

    @abc.abstractmethod
    def readout_rows(self, activation: Tensor, n_points: int) -> Tensor:
        """A residual hook's tensor → ``[batch, pos, d_model]`` at the readout positions."""

    @abc.abstractmethod
    def set_readout_rows(self, activation: Tensor, rows: Tensor) -> Tensor:
        """A copy of the hook's tensor with ``rows [batch, pos, d_model]`` written back."""

    @abc.abstractmethod
    def n_points_of(self, activation: Tensor) -> int:
        """The number of examples n of a residual hook's tensor."""

    def resid_hook_name(self, layer: int) -> str:
        """The hook whose output is layer ``layer``'s residual stream."""
        return "blocks.0.hook_resid_pre" if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"

    def setup(self) -> None:
        """Name every hook point after its module path (TransformerLens), then check them.

        A family's ``__init__`` calls it last. Each layer's residual hook
        (`resid_hook_name`) must then be among the hook points: refused here, when the
        first model is built, not at the first alignment.
        """
        super().setup()
        self.check_resid_hooks()

    def check_resid_hooks(self, names: Iterable[str] | None = None) -> None:
        """Refuse residual hook names (default: every layer's) that are not hook points."""
        cls = type(self).__name__
        hook_dict = getattr(self, "hook_dict", None)
        if not hook_dict:
            raise InputError(f"{cls} has no hook points: its __init__ must build its "
                             "HookPoint modules and call self.setup() last "
                             "(TransformerLens's HookedRootModule)")
        if names is None:
            names = [self.resid_hook_name(layer) for layer in range(self.cfg.n_layers + 1)]
        missing = [name for name in names if name not in hook_dict]
        if missing:
            raise InputError(
                f"{cls}: the residual hook(s) {missing} (resid_hook_name) are not among its "
                f"hook points {sorted(hook_dict)[:6]}{' …' if len(hook_dict) > 6 else ''}: "
                "name the HookPoint attributes after the layers (blocks.{l}.hook_resid_pre "
                "and blocks.{l}.hook_resid_post, in a ModuleList named blocks), or override "
                "resid_hook_name")

    def check_task(self, task: Any) -> None:
        """Refuse a task this model cannot take (default: a matching dimension)."""
        if task.n_dims != self.cfg.n_dims:
            raise InputError(f"task.n_dims={task.n_dims} but the model has "
                             f"n_dims={self.cfg.n_dims}")

    # ------------------------------------------------------------------ training hooks
    def train_options(self) -> frozenset[str]:
        """TrainConfig fields (set to non-defaults) that only this family accepts."""
        return frozenset()

    def check_train_config(self, train_cfg: Any) -> None:
        """Refuse a recipe this family cannot train with (beyond `train_options`)."""

    def trainable_parameters(self, train_cfg: Any) -> list[nn.Parameter]:
        """The parameters the optimizer updates under ``train_cfg`` (default: all)."""
        return [p for p in self.parameters() if p.requires_grad]

    def apply_constraints(self, train_cfg: Any) -> None:
        """Project the weights after each optimizer step (default: nothing)."""

    # ------------------------------------------------------------------ alignment hooks
    def claimed_learners(self, batch: Any) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Learners this model is claimed to run beyond the protocol's, and notes.

        ``{key: {"learner", "label", "steps", "hyper", "compare_with"}}`` (see
        ``alignment.RunSpec``; ``compare_with`` defaults to Newton and GD: the learners the
        claim gets a verdict against); the default is none.
        """
        return {}, []

    def check_inputs(self, xs: Tensor, ys: Tensor) -> None:
        """Validate ``xs [batch, pos, n_dims]`` and ``ys [batch, pos]`` against the config.

        Inputs must have the dtype of the model's weights (float32 unless converted, e.g.
        by ``model.double()``): other dtypes are a TypeError, never a silent cast.
        """
        self._check_dtype(xs=xs, ys=ys)
        d = self.cfg.n_dims
        if xs.ndim != 3 or xs.shape[-1] != d:
            raise InputError(f"xs must have shape [batch, pos, {d}], got {tuple(xs.shape)}")
        if ys.shape != xs.shape[:2]:
            raise InputError(f"ys must have shape {tuple(xs.shape[:2])}, got {tuple(ys.shape)}")
        if xs.shape[0] == 0 or xs.shape[1] == 0:
            raise InputError(f"xs must hold at least one sequence and one position, got shape "
                             f"{tuple(xs.shape)}")
        _check_finite(xs=xs, ys=ys)

    def _check_dtype(self, **inputs: Tensor) -> None:
        dtype = tensor_home(self)[1]
        for name, t in inputs.items():
            if not isinstance(t, Tensor):
                raise InputTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != dtype:
                raise InputTypeError(f"{name} has dtype {t.dtype}, but the model's weights are "
                                f"{dtype}: pass {name}.to({dtype}) (or convert the model, "
                                f"e.g. model.double() for float64 inputs)")

    def check_queries(self, xs: Tensor, ys: Tensor, queries: Tensor) -> None:
        """Validate the context and ``queries [batch, pos, T, n_dims]`` (of the same dtype)."""
        self.check_inputs(xs, ys)
        self._check_dtype(queries=queries)
        b, n, d = xs.shape
        if queries.ndim != 4 or queries.shape[:2] != (b, n) or queries.shape[-1] != d or \
                queries.shape[2] == 0:
            raise InputError(
                f"queries must have shape [{b}, {n}, T, {d}] (T >= 1), got "
                f"{tuple(queries.shape)}")
        _check_finite(queries=queries)

    def save(self, path: str | os.PathLike[str], task: Any = None,
             overwrite: bool = False) -> Path:
        """Save the model, its config and ``task`` (default: ``self.task``) atomically.

        ``overwrite=True`` replaces a checkpoint that iclprobe wrote at ``path``; nothing
        else is ever replaced (see `iclprobe.models.save`).
        """
        return files.save(self, path, task=task, overwrite=overwrite)

    def run_with_cache(
        self, *model_args: Any, return_cache_object: bool = True, remove_batch_dim: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        """Run the model and return ``(output, cache)``, the cache as an ``ActivationCache``.

        Keyword arguments (``names_filter``, ``device``, ...) go to TransformerLens's
        ``HookedRootModule.run_with_cache``; no hook stays attached afterwards.
        """
        out, cache = super().run_with_cache(
            *model_args, remove_batch_dim=remove_batch_dim, **kwargs
        )
        if return_cache_object:
            cache = ActivationCache(cache, self, has_batch_dim=not remove_batch_dim)
        return out, cache


def check_model(model: Any) -> None:
    """Refuse anything that is not a model of a registered family, naming the type given."""
    if not isinstance(model, Regressor):
        raise InputTypeError(f"model must be an iclprobe model (a Regressor: GPTRegressor, "
                             f"PQTransformer, ...), got {type(model).__name__}")
    if any(p.is_meta for p in model.parameters()):
        raise InputError("model has parameters on the meta device (shapes without values): "
                         "load or move it to 'cpu' or a GPU first")
