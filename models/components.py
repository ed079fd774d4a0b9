"""Hooked GPT-2 components with TransformerLens hook names and raw per-head weights.

Axis legend: ``batch``, ``pos`` (tokens), ``head``, ``d_head``, ``d_model``, ``d_mlp``,
``key_pos`` (attended tokens).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from iclprobe.models._tl import HookPoint, observed
from iclprobe.models.config import GPTConfig


class LayerNorm(nn.Module):
    """LayerNorm exposing ``hook_scale`` [batch, pos, 1] and ``hook_normalized``."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d_model))  # [d_model]
        self.b = nn.Parameter(torch.zeros(d_model))  # [d_model]
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Tensor) -> Tensor:
        """Normalize ``x [..., d_model]``; fused unless ``hook_scale`` is observed."""
        if not observed(self.hook_scale):
            out = F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps)
            return self.hook_normalized(out)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w + self.b)


class Attention(nn.Module):
    """Causal multi-head attention, softmax or linear kernel.

    Linear kernel: no softmax; the (scaled, causally masked) scores are divided by the
    number of keys each query sees, so a token's output is a mean over its prefix.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        h, m, e = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(h, m, e))  # [head, d_model, d_head]
        self.W_K = nn.Parameter(torch.empty(h, m, e))
        self.W_V = nn.Parameter(torch.empty(h, m, e))
        self.b_Q = nn.Parameter(torch.zeros(h, e))  # [head, d_head]
        self.b_K = nn.Parameter(torch.zeros(h, e))
        self.b_V = nn.Parameter(torch.zeros(h, e))
        self.W_O = nn.Parameter(torch.empty(h, e, m))  # [head, d_head, d_model]
        self.b_O = nn.Parameter(torch.zeros(m))  # [d_model]
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_attn_scores = HookPoint()  # [batch, head, pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, head, pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project ``x [..., d_model]`` to q, k, v ``[..., head, d_head]`` in one matmul."""
        w = torch.cat([self.W_Q, self.W_K, self.W_V], dim=0)  # [3*head, d_model, d_head]
        w = rearrange(w, "h m e -> m (h e)")
        b = torch.cat([self.b_Q, self.b_K, self.b_V], dim=0).flatten()
        qkv = (x @ w + b).unflatten(-1, (3 * self.cfg.n_heads, self.cfg.d_head))
        return qkv.chunk(3, dim=-2)

    def project_out(self, z: Tensor) -> Tensor:
        """``z [..., head, d_head]`` → ``[..., d_model]``."""
        return z.flatten(-2) @ self.W_O.flatten(0, 1) + self.b_O

    def forward(self, x: Tensor) -> Tensor:
        """Attend causally over ``x [batch, pos, d_model]``; SDPA when no score hook is set."""
        q, k, v = self.qkv(x)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        qh, kh, vh = (rearrange(t, "b p h e -> b h p e") for t in (q, k, v))
        if self.cfg.attention == "softmax" and not observed(
            self.hook_attn_scores, self.hook_pattern
        ):
            z = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        else:
            pattern = self.pattern(qh, kh)
            z = pattern @ vh  # [batch, head, pos, d_head]
        z = self.hook_z(rearrange(z, "b h p e -> b p h e"))
        return self.project_out(z)

    def pattern(self, qh: Tensor, kh: Tensor) -> Tensor:
        """Causal attention pattern ``[batch, head, pos, key_pos]`` through the hooks."""
        n_pos = qh.shape[-2]
        scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(self.cfg.d_head)
        causal = torch.ones(n_pos, n_pos, dtype=torch.bool, device=qh.device).tril()
        if self.cfg.attention == "softmax":
            scores = self.hook_attn_scores(scores.masked_fill(~causal, float("-inf")))
            return self.hook_pattern(scores.softmax(dim=-1))
        scores = self.hook_attn_scores(scores.masked_fill(~causal, 0.0))
        n_keys = torch.arange(1, n_pos + 1, device=qh.device, dtype=qh.dtype)
        return self.hook_pattern(scores / n_keys[:, None])


class MLP(nn.Module):
    """GPT-2 MLP (tanh-approximated GELU, ``gelu_new``)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        m, f = cfg.d_model, cfg.d_mlp_resolved
        self.W_in = nn.Parameter(torch.empty(m, f))  # [d_model, d_mlp]
        self.b_in = nn.Parameter(torch.zeros(f))
        self.W_out = nn.Parameter(torch.empty(f, m))  # [d_mlp, d_model]
        self.b_out = nn.Parameter(torch.zeros(m))
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., d_model]`` → ``[..., d_model]``."""
        pre = self.hook_pre(torch.addmm(self.b_in, x.flatten(0, -2), self.W_in))
        post = self.hook_post(F.gelu(pre, approximate="tanh"))
        return torch.addmm(self.b_out, post, self.W_out).unflatten(0, x.shape[:-1])


class Block(nn.Module):
    """Pre-LN transformer block with the residual hooks."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = LayerNorm(cfg.d_model, cfg.ln_eps)
        self.attn = Attention(cfg)
        self.ln2 = LayerNorm(cfg.d_model, cfg.ln_eps)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Tensor) -> Tensor:
        """One block on the residual stream ``[batch, pos, d_model]``."""
        resid = self.hook_resid_pre(resid)
        resid = self.hook_resid_mid(resid + self.hook_attn_out(self.attn(self.ln1(resid))))
        return self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))))


def context_keys(block: Block, ctx_resid: Tensor) -> tuple[Tensor, Tensor]:
    """The keys and values ``block`` reads from its input ``ctx_resid [batch, pos, d_model]``.

    Each ``[batch, pos, head, d_head]``: what `side_block` attends to, computed once for
    every chunk of side tokens that reads the same context.
    """
    _, k_ctx, v_ctx = block.attn.qkv(block.ln1(ctx_resid))
    return k_ctx.contiguous(), v_ctx.contiguous()  # copies: the views held all of q, k, v


def side_block(
    block: Block, ctx_kv: tuple[Tensor, Tensor], q_resid: Tensor, q_pos: Tensor
) -> Tensor:
    """Run ``block`` on side tokens that read a causal context but are read by nobody.

    Each side token at row ``t`` of ``q_resid [batch, n, T, d_model]`` stands at token
    position ``q_pos[t]``: it attends to the context tokens before that position (their
    keys and values ``ctx_kv``, `context_keys` of the block's input on the real sequence)
    and to itself, exactly as if it replaced the token at ``q_pos[t]``. Hooks are not run.
    """
    attn, cfg = block.attn, block.attn.cfg
    k_ctx, v_ctx = ctx_kv  # [batch, pos, head, d_head]
    q, k, v = attn.qkv(block.ln1(q_resid))  # [batch, n, T, head, d_head]
    scale = 1.0 / math.sqrt(cfg.d_head)
    scores_ctx = torch.einsum("bntha,bpha->bnthp", q, k_ctx) * scale
    scores_self = (q * k).sum(-1, keepdim=True) * scale  # [batch, n, T, head, 1]
    visible = torch.arange(k_ctx.shape[1], device=q.device) < q_pos[:, None]  # [n, pos]
    visible = visible[None, :, None, None, :]
    if cfg.attention == "softmax":
        scores_ctx = scores_ctx.masked_fill(~visible, float("-inf"))
        pattern = torch.cat([scores_ctx, scores_self], dim=-1).softmax(dim=-1)
    else:
        n_keys = (q_pos + 1).to(q.dtype)[None, :, None, None, None]
        pattern = torch.cat([scores_ctx.masked_fill(~visible, 0.0), scores_self], -1) / n_keys
    z = torch.einsum("bnthp,bpha->bntha", pattern[..., :-1], v_ctx) + pattern[..., -1:] * v
    q_resid = q_resid + attn.project_out(z)
    return q_resid + block.mlp(block.ln2(q_resid))
