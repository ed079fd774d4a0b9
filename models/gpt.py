"""`GPTRegressor`: Garg et al.'s read-in → pre-LN GPT-2 → read-out, hooked.

Axis legend: ``batch``, ``pos`` (examples n), ``tok`` (tokens: 2n interleaved, n paired),
``n_dims`` (d), ``d_model``, ``query`` (T extra query points per prefix).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from iclprobe.errors import InputTypeError
from iclprobe.models._tl import HookPoint
from iclprobe.models.base import ModuleList, Regressor
from iclprobe.models.components import Block, LayerNorm, context_keys, side_block
from iclprobe.models.config import GPTConfig
from iclprobe.models.layout import QUERY_CHUNK_ELEMENTS, TokenLayoutMixin, over_query_chunks

#: Largest side-attention score tensor ``predict_queries`` builds at once (elements).


class GPTRegressor(TokenLayoutMixin, Regressor):
    """A GPT-2 regressor on in-context regression sequences.

    ``layout="interleaved"``: tokens ``x_1, (y_1, 0, …, 0), x_2, …`` (2n tokens), read out at
    the x tokens (Garg et al., Fu et al.). ``layout="paired"``: token t is
    ``(x_{t-1}, y_{t-1}, x_t)`` with zeros before the first example, read out at every token.
    Either way ``preds[:, t]`` sees the examples ``0..t-1`` and the query ``x_t`` only.
    ``final_norm=False`` drops the final LayerNorm (no ``ln_final`` hooks or weights): the
    read-out is applied to the last block's residual, as in Fu et al.'s probing runs.
    """

    family = "gpt"
    head_hook = ("attn.hook_z", -2)  # [batch, tok, head, d_head]
    block_output_hooks = ("hook_attn_out", "hook_mlp_out")

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise InputTypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.task: Any = None  # the RegressionTask it was trained on, when known
        # Build and initialize under cfg.seed; the caller's global RNG is left untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.read_in = nn.Linear(cfg.token_dim, cfg.d_model)  # PyTorch's default init
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))  # [tok, d_model]
            self.blocks: ModuleList[Block] = ModuleList(Block(cfg) for _ in range(cfg.n_layers))
            # Without a final norm (Fu et al.'s truncated models) the read-out sees the raw
            # residual; an identity keeps `readout` and TransformerLens's apply_ln consistent.
            self.ln_final: nn.Module = (LayerNorm(cfg.d_model, cfg.ln_eps) if cfg.final_norm
                                        else nn.Identity())
            self.read_out = nn.Linear(cfg.d_model, 1)
            self._init_gpt2_weights()
        self.hook_embed = HookPoint()  # [batch, tok, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, tok, d_model]
        self.setup()

    def _init_gpt2_weights(self) -> None:
        """GPT-2's initialization: N(0, 0.02), output projections scaled by 1/sqrt(2L)."""
        nn.init.normal_(self.W_pos, std=0.02)
        proj_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for block in self.blocks:
            for w in (block.attn.W_Q, block.attn.W_K, block.attn.W_V, block.mlp.W_in):
                nn.init.normal_(w, std=0.02)
            nn.init.normal_(block.attn.W_O, std=proj_std)
            nn.init.normal_(block.mlp.W_out, std=proj_std)

    # ------------------------------------------------------------------ forward
    def embed(self, xs: Tensor, ys: Tensor) -> Float[Tensor, "batch tok d_model"]:
        """Read-in plus learned positions: the residual stream entering block 0."""
        self.check_inputs(xs, ys)
        embed = self.hook_embed(self.read_in(self.tokens(xs, ys)))
        pos = self.hook_pos_embed(self.W_pos[: embed.shape[1]].expand_as(embed))
        return embed + pos

    def readout(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        """Final norm (if any) and read-out applied to any residual (the no-training probe)."""
        return self.read_out(self.ln_final(resid))[..., 0]

    readout_residual = readout

    def query_residuals(
        self,
        xs: Float[Tensor, "batch pos n_dims"],
        ys: Float[Tensor, "batch pos"],
        queries: Float[Tensor, "batch pos query n_dims"],
        reduce: Callable[[Tensor], Tensor] | None = None,
    ) -> Float[Tensor, "layer batch pos query d_model"]:
        """Every layer's residual at each query token (layer 0: the embedded query).

        Equal to substituting the query for ``xs[:, t]``, for every t and j, but done in one
        pass: queries are side tokens that attend to the real context and are attended by
        nobody.

        ``reduce`` (e.g. a probe) is applied to each chunk of queries as it is computed,
        ``[layer, batch, pos, chunk, d_model] -> [..., chunk]``, so the full stack of
        residuals never has to be held at once.
        """
        return self._over_queries(xs, ys, queries, reduce=reduce)

    def _over_queries(self, xs: Tensor, ys: Tensor, queries: Tensor,
                      reduce: Callable[[Tensor], Tensor] | None) -> Tensor:
        """Side-token passes in chunks of queries (bounded attention-score memory)."""
        self.check_queries(xs, ys, queries)
        b, n, _ = xs.shape
        per_query = b * n * self.cfg.n_heads * self.cfg.n_ctx
        chunk = max(1, QUERY_CHUNK_ELEMENTS // per_query)
        resid, ctx = self.embed(xs, ys), []
        for i, block in enumerate(self.blocks):  # each block's keys and values, once
            ctx.append(context_keys(block, resid))
            if i + 1 < len(self.blocks):
                resid = block(resid)
        return over_query_chunks(queries, chunk,
                                 lambda q: self._side_residuals(ctx, xs, ys, q), reduce)

    def _side_residuals(self, ctx: list[tuple[Tensor, Tensor]], xs: Tensor, ys: Tensor,
                        queries: Tensor) -> Tensor:
        q_pos = self.readout_positions(queries.shape[1])
        layers = [self.read_in(self.query_tokens(xs, ys, queries))
                  + self.W_pos[q_pos][None, :, None]]
        for block, ctx_kv in zip(self.blocks, ctx):
            layers.append(side_block(block, ctx_kv, layers[-1], q_pos))
        return torch.stack(layers)
