"""Token layouts of the sequence families (GPT, LSTM): tokens and readout positions.

``layout="interleaved"``: ``x_1, (y_1, 0, …, 0), x_2, …`` (2n tokens), read out at the x
tokens (Garg et al., Fu et al.). ``layout="paired"``: token t is ``(x_{t-1}, y_{t-1}, x_t)``
with zeros before the first example, read out at every token. Either way ``preds[:, t]``
sees the examples ``0..t-1`` and the query ``x_t`` only. Axis legend: ``batch``, ``pos``,
``tok``, ``n_dims``, ``d_model``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from iclprobe.errors import InputError

#: Elements of the largest intermediate a chunk of query tokens may take (attention scores,
#: LSTM gates): it sets how many queries are run at once. At Garg size (16 sequences of 41
#: points, 30 queries) 2^22 runs the query tokens 30% faster than 2^25, in 0.5 GB less.
QUERY_CHUNK_ELEMENTS = 2**22


class TokenLayoutMixin:
    """Tokens, readout positions and readout rows of a model with ``cfg.layout``.

    Mixed in before `iclprobe.models.base.Regressor`; provides the readout-row methods the
    base class asks for, the forward pass of a stack of blocks over the tokens (the model
    provides ``embed``, ``blocks`` and ``readout``), and refuses inputs and tasks with more
    than ``cfg.n_positions`` examples.
    """

    cfg: Any

    def tokens(self, xs: Tensor, ys: Tensor) -> Float[Tensor, "batch tok token_dim"]:
        """Lay the examples out as input tokens (before the read-in)."""
        b, n, d = xs.shape
        if self.cfg.layout == "interleaved":
            y_tok = torch.zeros_like(xs)
            y_tok[..., 0] = ys
            return torch.stack([xs, y_tok], dim=2).reshape(b, 2 * n, d)  # x_1, y_1, x_2, …
        prev = torch.cat([xs.new_zeros(b, 1, d + 1), torch.cat([xs, ys[..., None]], -1)], 1)
        return torch.cat([prev[:, :n], xs], dim=-1)  # (x_{t-1}, y_{t-1}, x_t)

    def query_tokens(self, xs: Tensor, ys: Tensor,
                     queries: Float[Tensor, "batch pos query n_dims"]
                     ) -> Float[Tensor, "batch pos query token_dim"]:
        """The token each query x̃ takes at position t: x̃, or (x_{t-1}, y_{t-1}, x̃) if paired."""
        if self.cfg.layout == "interleaved":
            return queries
        b, n, n_q, d = queries.shape
        prev = self.tokens(xs, ys)[..., : d + 1]  # (x_{t-1}, y_{t-1}) of each token
        return torch.cat([prev[:, :, None].expand(b, n, n_q, d + 1), queries], -1)

    def readout_positions(self, n_points: int) -> Tensor:
        """Token index of each example's query x: ``[pos]``."""
        step = 2 if self.cfg.layout == "interleaved" else 1
        device = next(self.parameters()).device  # type: ignore[attr-defined]
        return torch.arange(n_points, device=device) * step

    def readout_rows(self, activation: Tensor, n_points: int) -> Tensor:
        """A residual hook's ``[batch, tok, d_model]`` at the x tokens: ``[batch, pos, d_model]``."""
        return activation[:, self.readout_positions(n_points)]

    def n_points_of(self, activation: Tensor) -> int:
        """Examples in a ``[batch, tok, d_model]`` hook tensor."""
        return activation.shape[1] // (2 if self.cfg.layout == "interleaved" else 1)

    def set_readout_rows(self, activation: Tensor, rows: Tensor) -> Tensor:
        """A copy of the hook's tensor with ``rows`` written into the readout tokens."""
        n = self.n_points_of(activation)
        expected = (activation.shape[0], n, activation.shape[-1])
        if tuple(rows.shape) != expected:
            raise InputError(f"rows must have shape {expected} for this tensor, got "
                             f"{tuple(rows.shape)}")
        out = activation.clone()
        out[:, self.readout_positions(n)] = rows.to(activation)
        return out

    def check_inputs(self, xs: Tensor, ys: Tensor) -> None:
        """Validate the shapes, and at most ``n_positions`` examples."""
        super().check_inputs(xs, ys)  # type: ignore[misc]
        self.check_points(xs.shape[1])

    def forward(
        self, xs: Float[Tensor, "batch pos n_dims"], ys: Float[Tensor, "batch pos"],
        last_only: bool = False,
    ) -> Float[Tensor, "batch pos"]:
        """Predict every ``ys[:, t]`` from examples ``0..t-1`` and ``xs[:, t]``.

        The embedded tokens (``self.embed``) pass through ``self.blocks`` and are read out
        (``self.readout``) at the readout positions; ``last_only=True`` returns the last
        position alone, ``[batch, 1]``.
        """
        h = self.embed(xs, ys)  # type: ignore[attr-defined]
        for block in self.blocks:  # type: ignore[attr-defined]
            h = block(h)
        positions = self.readout_positions(xs.shape[1])
        if last_only:
            positions = positions[-1:]
        return self.readout(h[:, positions])  # type: ignore[attr-defined,no-any-return]

    def predict_queries(
        self, xs: Float[Tensor, "batch pos n_dims"], ys: Float[Tensor, "batch pos"],
        queries: Float[Tensor, "batch pos query n_dims"],
    ) -> Float[Tensor, "batch pos query"]:
        """Predict each query ``queries[:, t, j]`` from the t examples before position t.

        Equal to substituting the query for ``xs[:, t]`` and reading ``preds[:, t]``: the
        readout of the last layer of ``query_residuals``.
        """
        return self.query_residuals(  # type: ignore[attr-defined,no-any-return]
            xs, ys, queries, reduce=lambda r: self.readout(r[-1]))  # type: ignore[attr-defined]

    def check_points(self, n_points: int, what: str = "xs") -> None:
        """At most ``n_positions`` examples."""
        if n_points > self.cfg.n_positions:
            raise InputError(f"{what} has {n_points} points but the model has "
                             f"n_positions={self.cfg.n_positions}")

    def check_task(self, task: Any) -> None:
        """The task's dimension, and at most ``n_positions`` examples."""
        super().check_task(task)  # type: ignore[misc]
        if task.n_points > self.cfg.n_positions:
            raise InputError(f"task.n_points={task.n_points} is more than the model's "
                             f"n_positions={self.cfg.n_positions}")


def over_query_chunks(queries: Tensor, chunk: int,
                      layers_of: Callable[[Tensor], Tensor],
                      reduce: Callable[[Tensor], Tensor] | None) -> Tensor:
    """``layers_of`` on ``queries [batch, pos, query, d]`` a chunk of queries at a time.

    Each chunk's ``[layer, batch, pos, chunk, d_model]`` is ``reduce``d (to ``[..., chunk]``)
    as it is computed, so memory holds one chunk's stack; the chunks are joined on the query
    axis.
    """
    out = []
    for s in range(0, queries.shape[2], chunk):
        layers = layers_of(queries[:, :, s : s + chunk])
        out.append(reduce(layers) if reduce is not None else layers)
    return torch.cat(out, dim=-2 if reduce is None else -1)
