"""`HookedAdapter`: your own torch model, made a `Regressor` that iclprobe can align.

Wrap a model iclprobe never built — a TransformerLens ``HookedRootModule`` of yours, or a
plain ``torch.nn.Module`` such as a Hugging Face ``GPT2Model`` between a read-in and a
read-out — and `iclprobe.alignment.align`, ``compare``, `iclprobe.probes.LayerProbes` and
`iclprobe.hooks.collect_residuals` accept it. You say how (xs, ys) become its inputs, which
hook (or module) gives each layer's residual stream, where the readout positions are, and
optionally its readout. A complete, runnable walk-through is in ``docs/adapters.md``.

Adapters are not registered as a model family and cannot be saved as iclprobe
checkpoints: save your own module your own way, and adapt it again after loading.

Axis legend: ``batch``, ``pos`` (examples n), ``tok`` (the model's tokens), ``prefix`` and
``row`` (hooks laid out per prefix, ``resid_layout="prefix"``), ``query`` (T extra query
points per prefix), ``layer``, ``d_model``, ``n_dims``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from iclprobe._checks import check_int
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models import adapter_rows
from iclprobe.models._tl import HookedRootModule, HookPoint
from iclprobe.models.adapter_hooks import (
    check_inputs_arg,
    check_names,
    keeper,
    readout_stride,
    router,
    submodule,
)
from iclprobe.models.base import Regressor
from iclprobe.models.config import LAYOUTS
from iclprobe.models.layout import TokenLayoutMixin

#: Tokens per forward call when `HookedAdapter.query_residuals` runs substituted prefixes.
QUERY_CHUNK_TOKENS = 2**16


@dataclasses.dataclass(frozen=True)
class AdapterConfig:
    """The sizes and geometry of an adapted model (what iclprobe reads from ``model.cfg``)."""

    n_dims: int  # covariate dimension d
    n_layers: int  # layers with a residual hook beyond the embedding (L + 1 hooks)
    d_model: int  # residual width
    n_positions: int | None = None  # most examples the model takes (None: not checked)
    layout: str | None = None  # token layout the adapter builds ("interleaved" | "paired")
    readout_stride: int = 1  # the readout of example t is token readout_offset + stride * t
    readout_offset: int = 0
    resid_layout: str = "tokens"  # hooks [batch, tok, d_model] | "prefix": [batch, prefix, row, d_model]
    query_row: int = -1  # "prefix": example t is row query_row of prefix t

    def __post_init__(self) -> None:
        adapter_rows.check_layout(self.resid_layout, self.query_row, None)
        for name in ("n_dims", "n_layers", "d_model", "readout_stride"):
            check_int("HookedAdapter", name, getattr(self, name))
        check_int("HookedAdapter", "readout_offset", self.readout_offset, low=0)
        if self.n_positions is not None:
            check_int("HookedAdapter", "n_positions", self.n_positions)
        if self.layout is not None and self.layout not in LAYOUTS:
            raise InputError(f"HookedAdapter.layout must be one of {LAYOUTS} or None, got "
                             f"{self.layout!r}")


class HookedAdapter(TokenLayoutMixin, Regressor):
    """A user's torch model as a `Regressor` (``docs/adapters.md``: examples, every argument).

    Args:
        module: the model; its own output is ignored when a ``readout`` is given.
        n_dims: the covariate dimension d of the task.
        n_layers: the number of layers L; ``resid_hooks`` names L + 1 hooks.
        d_model: the width of every residual.
        resid_hooks: layer l's residual for l = 0..L (0: the embedded input, l: the output
            of block l - 1, before any final norm): a hook name of a TransformerLens
            ``HookedRootModule`` (default: ``blocks.0.hook_resid_pre``, then
            ``blocks.{l}.hook_resid_post``), or the path of a submodule whose output is the
            residual (or a tuple starting with it), e.g. ``h.3`` of a Hugging Face
            ``GPT2Model``. Each must run once per forward pass.
        resid_layout: the residuals' shape. "tokens" (default): ``[batch, tok, d_model]``,
            read at ``positions``. "prefix": ``[batch, prefix, row, d_model]``, one forward
            computing every prefix t's rows (as iclprobe's `PQTransformer` does), example
            t read at row ``query_row`` of prefix t.
        query_row: with ``resid_layout="prefix"``, the row of each prefix block that holds
            its query (default -1: the last row, a PQ model's).
        inputs: None: ``module(xs, ys)``. "interleaved" or "paired": `GPTRegressor`'s token
            layouts, through ``read_in`` if given, passed positionally or as keyword
            ``input_name``. A callable ``(xs, ys) ->`` a tensor or tuple (positional
            arguments) or a dict (keyword arguments).
        read_in: with a layout, applied to its tokens (e.g. Garg et al.'s ``_read_in``).
        input_name: with a layout, the keyword for its tokens (e.g. ``"inputs_embeds"``).
        positions: with ``resid_layout="tokens"``, the token of example t's readout:
            "interleaved" (2t), "paired" (t) or ``(stride, offset)`` (offset + stride t).
            Default: ``inputs`` when it names a layout.
        readout: a module or callable ``[..., d_model] -> [...]`` (a trailing axis of size
            1 is dropped); predictions are the readout of layer L. "probe": none — layers
            are read by fitted probes, ``model(xs, ys)`` returns the module's own output,
            and ``predict_queries``/``readout_residual`` raise.
        n_positions: the most examples the model takes (None: not checked).
        exact_readout: with a ``readout``, declare that it applied to layer l's residual
            is layer l's own prediction (as a PQ layer's query row is), so `align` reads
            every layer through it instead of fitting probes. Default False: probes.
        task: the `iclprobe.tasks.RegressionTask` it was trained on (`align`'s default data).
        query_chunk_tokens: tokens per forward call in ``query_residuals``.

    ``preds[:, t]`` must see only examples ``0..t-1`` and the query ``xs[:, t]``: the model
    must be causal at the readout positions.
    """

    def __init__(
        self, module: nn.Module, *, n_dims: int, n_layers: int, d_model: int,
        resid_hooks: Sequence[str] | None = None,
        inputs: str | Callable[[Tensor, Tensor], Any] | None = None,
        read_in: Callable[[Tensor], Tensor] | None = None, input_name: str | None = None,
        positions: str | tuple[int, int] | None = None,
        readout: str | Callable[[Tensor], Tensor] = "probe", n_positions: int | None = None,
        task: Any = None, query_chunk_tokens: int = QUERY_CHUNK_TOKENS,
        exact_readout: bool = False, resid_layout: str = "tokens", query_row: int = -1,
    ):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise InputTypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        layout = check_inputs_arg(inputs, read_in, input_name)
        adapter_rows.check_layout(resid_layout, query_row, positions)
        stride, offset = readout_stride(positions, layout) if resid_layout == "tokens" \
            else (1, 0)
        self.cfg = AdapterConfig(n_dims, n_layers, d_model, n_positions, layout, stride, offset,
                                 resid_layout, query_row)
        self.model = module
        self.read_in = read_in  # a Module is registered (moved by .to, hashed by probes)
        self._inputs, self._input_name = inputs, input_name
        self._readout: Callable[[Tensor], Tensor] | None = None
        if callable(readout):
            self._readout = readout
            if isinstance(readout, nn.Module):
                self.read_out = readout
        if not isinstance(exact_readout, bool):
            raise InputTypeError(f"exact_readout must be a bool, got {exact_readout!r}")
        if exact_readout and not callable(readout):
            raise InputError("exact_readout=True needs a readout (a module or callable on "
                             "residuals), got readout='probe'")
        self.exact_layer_readout = exact_readout  # type: ignore[misc]
        if not callable(readout) and readout != "probe":
            raise InputTypeError(f"readout must be a module or callable on residuals, or 'probe', "
                            f"got {readout!r}")
        self.query_chunk_tokens = check_int("HookedAdapter", "query_chunk_tokens",
                                            query_chunk_tokens)
        if task is not None:
            from iclprobe.tasks import RegressionTask

            if not isinstance(task, RegressionTask):
                raise InputTypeError(f"task must be a RegressionTask or None, got "
                                f"{type(task).__name__}")
            self.check_task(task)
        self.task = task
        self._setup_hooks(module, resid_hooks)

    # ------------------------------------------------------------------ hooks
    def _setup_hooks(self, module: nn.Module, names: Sequence[str] | None) -> None:
        """Build ``hook_dict`` without renaming anything inside the user's module.

        TransformerLens's ``setup`` would set ``.name`` on every submodule of ``module``;
        instead a ``HookedRootModule``'s hook points are shared under their own names, and
        any other path gets a hook point of the adapter's, fed by a torch forward hook
        that is attached only while the adapter runs.
        """
        own: dict[str, HookPoint] = {  # a HookedRootModule's hook points, set up
            name: point for name, point in getattr(module, "hook_dict", {}).items()
            if isinstance(module, HookedRootModule) and point.name == name}
        if names is None:
            if not own:
                raise InputError(f"resid_hooks is required for a {type(module).__name__} (not "
                                 f"a TransformerLens HookedRootModule): give "
                                 f"{self.cfg.n_layers + 1} hook names or module paths")
            names = [Regressor.resid_hook_name(self, layer)
                     for layer in range(self.cfg.n_layers + 1)]
        names = check_names(names, self.cfg.n_layers)
        self._routes: dict[str, tuple[nn.Module, HookPoint]] = {}
        self._resid: list[HookPoint] = []
        for name in names:
            point = own.get(name)
            if point is None:
                point = HookPoint()
                point.name = name
                self._routes[name] = (submodule(module, name, own), point)
            self._resid.append(point)
        self._resid_names = list(names)
        self.hook_dict = {**own, **{name: p for name, (_, p) in self._routes.items()}}
        self.mod_dict = dict(self.hook_dict)

    def resid_hook_name(self, layer: int) -> str:
        """The hook (a name of the module's, or a module path) of layer ``layer``'s residual."""
        return self._resid_names[layer]

    @contextlib.contextmanager
    def _routing(self) -> Iterator[None]:
        """While it runs, feed each routed module's output through its hook point."""
        handles = [module.register_forward_hook(router(name, point))
                   for name, (module, point) in self._routes.items()]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _run(self, xs: Tensor, ys: Tensor, layers: Sequence[int]) -> tuple[Any, list[Tensor]]:
        """Run ``module``; return its output and the residual hooks' tensors of ``layers``.

        Every residual hook must run exactly once (a hook that never runs, or a module
        called twice, e.g. a weight-shared block, would give some other tensor).
        """
        args, kwargs = self._module_inputs(xs, ys)
        seen: list[list[Tensor | None]] = [[] for _ in self._resid]
        handles = [point.register_forward_hook(keeper(keep, layer in layers))
                   for layer, (point, keep) in enumerate(zip(self._resid, seen))]
        try:
            with self._routing():
                out = self.model(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        for layer, keep in enumerate(seen):
            if len(keep) != 1:
                raise InputError(
                    f"residual hook {self._resid_names[layer]!r} (layer {layer}) ran "
                    f"{len(keep)} times in one forward pass of {type(self.model).__name__}; "
                    "each must run exactly once: name a hook or module on the path from the "
                    "inputs to the output, used once")
        return out, [seen[layer][0] for layer in layers]  # type: ignore[misc]

    def _module_inputs(self, xs: Tensor, ys: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self._inputs is None:
            return (xs, ys), {}
        if callable(self._inputs):
            value = self._inputs(xs, ys)
        else:
            value = self.tokens(xs, ys)
            if self.read_in is not None:
                value = self.read_in(value)
            if self._input_name is not None:
                return (), {self._input_name: value}
        if isinstance(value, dict):
            return (), value
        return (value if isinstance(value, tuple) else (value,)), {}

    # ------------------------------------------------------------------ forward and readout
    def forward(
        self, xs: Float[Tensor, "batch pos n_dims"], ys: Float[Tensor, "batch pos"],
        last_only: bool = False,
    ) -> Float[Tensor, "batch pos"]:
        """The readout of layer L at every readout position (``[batch, 1]``: the last).

        With ``readout="probe"``, the module's own output, unchanged.
        """
        self.check_inputs(xs, ys)
        if self._readout is None:
            return self._run(xs, ys, [])[0]
        _, (last,) = self._run(xs, ys, [self.cfg.n_layers])
        rows = self.readout_rows(last, xs.shape[1])
        return self.readout_residual(rows[:, -1:] if last_only else rows)

    def readout_residual(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        """The model's read-out applied to residuals (the no-training probe of any layer)."""
        out = self._require_readout()(resid)
        if isinstance(out, Tensor) and out.shape == (*resid.shape[:-1], 1):
            out = out[..., 0]
        if not isinstance(out, Tensor) or out.shape != resid.shape[:-1]:
            shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise InputError(f"readout must map residuals {tuple(resid.shape)} to "
                             f"{tuple(resid.shape[:-1])} (or with a trailing 1), got {shape}")
        return out

    def _require_readout(self) -> Callable[[Tensor], Tensor]:
        if self._readout is None:
            raise InputError("this HookedAdapter has no readout (readout='probe'): its layers "
                             "are read by fitted probes only; pass readout=<module or "
                             "callable on residuals> for predictions")
        return self._readout

    # ------------------------------------------------------------------ readout rows
    def readout_positions(self, n_points: int) -> Tensor:
        """Token index of each example's readout: ``offset + stride * t``, ``[pos]``."""
        if self.cfg.resid_layout == "prefix":
            raise InputError("readout_positions: with resid_layout='prefix' example t is row "
                             f"query_row={self.cfg.query_row} of prefix t, not a token")
        device = next(itertools.chain(self.parameters(), self.buffers()), torch.empty(0)).device
        return self.cfg.readout_offset + self.cfg.readout_stride * torch.arange(
            n_points, device=device)

    def n_points_of(self, activation: Tensor) -> int:
        """Examples in a hook tensor (``[batch, tok, d_model]`` or per prefix)."""
        return adapter_rows.n_points_of(self.cfg, activation)

    def readout_rows(self, activation: Tensor, n_points: int) -> Tensor:
        """A residual hook's tensor at the readout rows: ``[batch, pos, d_model]``."""
        return adapter_rows.readout_rows(self.cfg, activation, n_points)

    def set_readout_rows(self, activation: Tensor, rows: Tensor) -> Tensor:
        """A copy of the hook's tensor with ``rows`` written into the readout rows."""
        return adapter_rows.set_readout_rows(self.cfg, activation, rows)

    def check_points(self, n_points: int, what: str = "xs") -> None:
        """At most ``n_positions`` examples, when given."""
        if self.cfg.n_positions is not None:
            super().check_points(n_points, what)

    def check_task(self, task: Any) -> None:
        """The task's dimension, and at most ``n_positions`` examples when given."""
        Regressor.check_task(self, task)
        self.check_points(task.n_points, "task")

    # ------------------------------------------------------------------ queries
    def predict_queries(
        self, xs: Float[Tensor, "batch pos n_dims"], ys: Float[Tensor, "batch pos"],
        queries: Float[Tensor, "batch pos query n_dims"],
    ) -> Float[Tensor, "batch pos query"]:
        """Predict each query ``queries[:, t, j]`` from the t examples before position t.

        By substitution: the query takes ``xs[:, t]``'s place in the prefix of t + 1
        examples (its label zeroed), and the readout is read at position t (with
        ``resid_layout="prefix"``: at the query row of prefix t).
        """
        self._require_readout()
        return self._over_queries(xs, ys, queries, [self.cfg.n_layers],
                                  lambda r: self.readout_residual(r[0]))

    def query_residuals(
        self, xs: Float[Tensor, "batch pos n_dims"], ys: Float[Tensor, "batch pos"],
        queries: Float[Tensor, "batch pos query n_dims"],
        reduce: Callable[[Tensor], Tensor] | None = None,
    ) -> Float[Tensor, "layer batch pos query d_model"]:
        """Every layer's residual at each query, by substitution (see `predict_queries`).

        ``reduce`` (e.g. a probe) is applied per position t, to
        ``[layer, batch, 1, query, d_model]``; its outputs (``[..., 1, query]``) are joined
        along the position axis, so the full stack of residuals is never held at once.
        """
        return self._over_queries(xs, ys, queries, range(self.cfg.n_layers + 1), reduce)

    def _over_queries(self, xs: Tensor, ys: Tensor, queries: Tensor, layers: Sequence[int],
                      reduce: Callable[[Tensor], Tensor] | None) -> Tensor:
        """One position at a time, every sequence and query of it batched, in chunks."""
        self.check_queries(xs, ys, queries)
        b, n, n_q, d = queries.shape
        out = []
        for t in range(n):  # prefixes differ in length: one batched pass per position
            prefix_x = torch.cat([xs[:, None, :t].expand(b, n_q, t, d),
                                  queries[:, t, :, None]], dim=2).flatten(0, 1)
            prefix_y = torch.cat([ys[:, None, :t].expand(b, n_q, t),
                                  ys.new_zeros(b, n_q, 1)], dim=2).flatten(0, 1)
            tokens = adapter_rows.tokens_per_sequence(self.cfg, t + 1)
            chunk = max(1, self.query_chunk_tokens // tokens)
            rows = [self._rows_at(prefix_x[s:s + chunk], prefix_y[s:s + chunk], t, layers)
                    for s in range(0, b * n_q, chunk)]
            resid = torch.cat(rows, dim=1).unflatten(1, (b, n_q))[:, :, None]  # [layer, b, 1, T, m]
            out.append(reduce(resid) if reduce is not None else resid)
        return torch.cat(out, dim=-2 if reduce is not None else 2)

    def _rows_at(self, xs: Tensor, ys: Tensor, t: int, layers: Sequence[int]) -> Tensor:
        """``[layer, batch, d_model]``: each layer's residual at example t's readout token."""
        _, acts = self._run(xs, ys, layers)
        return torch.stack([self.readout_rows(a, t + 1)[:, t] for a in acts])

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike[str], task: Any = None,
             overwrite: bool = False) -> Path:
        """Refused: an adapter wraps your own module, which iclprobe cannot rebuild."""
        raise InputTypeError(
            "a HookedAdapter cannot be saved as an iclprobe checkpoint: it wraps your own "
            f"{type(self.model).__name__}, whose class iclprobe cannot rebuild on loading; "
            "save that module your own way (e.g. torch.save(module.state_dict(), path)) and "
            "wrap it in a HookedAdapter again after loading it")
