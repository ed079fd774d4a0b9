"""`LSTMRegressor`: read-in → stacked LSTM layers → read-out, hooked like the transformers.

The recurrent baseline for "does depth implement an optimizer?": the same tokens, read-in
and read-out as Garg et al.'s transformer, with the GPT-2 backbone replaced by LSTM layers.
Garg et al.'s and Fu et al.'s config schemas accept ``family: lstm``, but their
``build_model`` builds only ``gpt2``, so no LSTM run of theirs exists to import.

Axis legend: ``batch``, ``pos`` (examples n), ``tok`` (tokens: 2n interleaved, n paired),
``n_dims`` (d), ``d_model`` (hidden width), ``query`` (T extra query points per prefix),
``layer``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from iclprobe.errors import InputTypeError
from iclprobe.models._tl import HookPoint
from iclprobe.models.base import ModuleList, Regressor
from iclprobe.models.config import LSTMConfig
from iclprobe.models.layout import QUERY_CHUNK_ELEMENTS, TokenLayoutMixin, over_query_chunks

#: Largest gate tensor ``predict_queries`` builds at once (elements).


class LSTMBlock(nn.Module):
    """One single-layer ``nn.LSTM``, its input and hidden-state sequence hooked."""

    def __init__(self, cfg: LSTMConfig):
        super().__init__()
        self.lstm = nn.LSTM(cfg.d_model, cfg.d_model, batch_first=True)  # PyTorch's init
        self.hook_resid_pre = HookPoint()  # [batch, tok, d_model]: the layer's input
        self.hook_resid_post = HookPoint()  # [batch, tok, d_model]: its hidden states h

    def forward(self, x: Float[Tensor, "batch tok d_model"]) -> Float[Tensor, "batch tok d_model"]:
        """The hidden state after every token, from the zero state."""
        h, _ = self.lstm(self.hook_resid_pre(x))
        return self.hook_resid_post(h)

    def cell_states(self, x: Tensor, h: Tensor) -> Float[Tensor, "batch tok d_model"]:
        """The cell state c after every token, given the layer's input ``x`` and output ``h``.

        ``nn.LSTM`` returns only the last c. With every h known, all gates come from one
        batched product; what remains of the recurrence, c_t = f_t c_{t-1} + i_t g_t, is
        elementwise.
        """
        h_prev = torch.cat([h.new_zeros(h.shape[0], 1, h.shape[2]), h[:, :-1]], dim=1)
        i, f, g, _ = self._gates(x, h_prev)
        c, cells = h.new_zeros(h.shape[0], h.shape[2]), []
        for t in range(h.shape[1]):
            c = f[:, t] * c + i[:, t] * g[:, t]
            cells.append(c)
        return torch.stack(cells, dim=1)

    def step(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """One LSTM step from state ``(h, c)`` on input ``x`` (any broadcastable leading axes)."""
        i, f, g, o = self._gates(x, h)
        c = f * c + i * g
        return o * torch.tanh(c), c

    def _gates(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """PyTorch's gates (input, forget, cell, output) of input ``x`` from hidden ``h``."""
        w_ih, w_hh, b_ih, b_hh = self.lstm.all_weights[0]  # [4 d_model, d_model], [4 d_model]
        pre = (x @ w_ih.T + b_ih) + (h @ w_hh.T + b_hh)  # [..., 4 d_model]
        i, f, g, o = pre.chunk(4, dim=-1)
        return torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)


class LSTMRegressor(TokenLayoutMixin, Regressor):
    """An LSTM regressor on in-context regression sequences.

    Tokens as `GPTRegressor`'s: ``layout="interleaved"`` is ``x_1, (y_1, 0, …, 0), x_2, …``
    read out at the x tokens; ``layout="paired"`` is ``(x_{t-1}, y_{t-1}, x_t)`` read out at
    every token. A read-in Linear maps tokens to ``d_model``; ``n_layers`` single-layer LSTMs
    run in turn (no residual connections: layer l's "residual" is its hidden-state sequence
    h, hooked as ``blocks.{l}.hook_resid_post``; layer 0 is the read-in's output,
    ``hook_embed`` = ``blocks.0.hook_resid_pre``); a read-out Linear maps the last layer's h
    at the readout tokens to a prediction. ``preds[:, t]`` sees the examples ``0..t-1`` and
    the query ``x_t`` only: a recurrence is causal by construction.
    """

    family = "lstm"
    block_output_hooks = ("hook_resid_post",)  # a layer's output is its hidden states

    def __init__(self, cfg: LSTMConfig):
        super().__init__()
        if not isinstance(cfg, LSTMConfig):
            raise InputTypeError(f"cfg must be an LSTMConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.task: Any = None  # the RegressionTask it was trained on, when known
        # Build and initialize under cfg.seed; the caller's global RNG is left untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.read_in = nn.Linear(cfg.token_dim, cfg.d_model)
            self.blocks: ModuleList[LSTMBlock] = ModuleList(
                LSTMBlock(cfg) for _ in range(cfg.n_layers))
            self.read_out = nn.Linear(cfg.d_model, 1)
        self.hook_embed = HookPoint()  # [batch, tok, d_model]
        self.setup()

    # ------------------------------------------------------------------ forward
    def embed(self, xs: Tensor, ys: Tensor) -> Float[Tensor, "batch tok d_model"]:
        """The read-in of every token: layer 0."""
        self.check_inputs(xs, ys)
        return self.hook_embed(self.read_in(self.tokens(xs, ys)))

    def readout(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        """The read-out Linear applied to any hidden states (no norm: the no-training probe)."""
        return self.read_out(resid)[..., 0]

    readout_residual = readout

    # ------------------------------------------------------------------ queries
    def query_residuals(
        self,
        xs: Float[Tensor, "batch pos n_dims"],
        ys: Float[Tensor, "batch pos"],
        queries: Float[Tensor, "batch pos query n_dims"],
        reduce: Callable[[Tensor], Tensor] | None = None,
    ) -> Float[Tensor, "layer batch pos query d_model"]:
        """Every layer's hidden state at each query token (layer 0: the read-in of the query).

        Equal to substituting the query for ``xs[:, t]``: each query token takes x_t's
        place, one LSTM step per layer from the state the context left there (all prefixes
        and queries at once).

        ``reduce`` (e.g. a probe) is applied to each chunk of queries as it is computed,
        ``[layer, batch, pos, chunk, d_model] -> [..., chunk]``, so the full stack of
        hidden states never has to be held at once.
        """
        return self._over_queries(xs, ys, queries, reduce=reduce)

    def _over_queries(self, xs: Tensor, ys: Tensor, queries: Tensor,
                      reduce: Callable[[Tensor], Tensor] | None) -> Tensor:
        """Query steps in chunks of queries (bounded gate memory)."""
        self.check_queries(xs, ys, queries)
        b, n, _ = xs.shape
        states = self._context_states(xs, ys)
        chunk = max(1, QUERY_CHUNK_ELEMENTS // (b * n * 4 * self.cfg.d_model))
        return over_query_chunks(queries, chunk,
                                 lambda q: self._query_layers(states, xs, ys, q), reduce)

    def _context_states(self, xs: Tensor, ys: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per layer, the state ``(h, c)`` each query starts from: ``[batch, pos, 1, d_model]``.

        A query at prefix t takes the place of readout token p_t, so it starts from the state
        after token p_t − 1 (the zero state when p_t = 0).
        """
        x = self.embed(xs, ys)
        b, _, m = x.shape
        before = self.readout_positions(xs.shape[1])  # index into [zero state, states...]
        states = []
        for block in self.blocks:
            h = block.lstm(x)[0]
            c = block.cell_states(x, h)
            zero = x.new_zeros(b, 1, m)
            states.append((torch.cat([zero, h], 1)[:, before, None],
                           torch.cat([zero, c], 1)[:, before, None]))
            x = h
        return states

    def _query_layers(self, states: list[tuple[Tensor, Tensor]], xs: Tensor, ys: Tensor,
                      queries: Tensor) -> Float[Tensor, "layer batch pos query d_model"]:
        layers = [self.read_in(self.query_tokens(xs, ys, queries))]
        for block, (h, c) in zip(self.blocks, states):
            layers.append(block.step(layers[-1], h, c)[0])
        return torch.stack(layers)
