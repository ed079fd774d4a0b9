"""Garg et al.'s construction on Hugging Face GPT-2, the baseline of the benchmarks."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2Model


class Garg(torch.nn.Module):
    """Garg et al.'s model: read-in, HF GPT2Model on inputs_embeds, read-out at x tokens."""

    def __init__(self, n_dims, n_positions, n_embd, n_layer, n_head):
        super().__init__()
        cfg = GPT2Config(n_positions=2 * n_positions, n_embd=n_embd, n_layer=n_layer,
                         n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         use_cache=False)
        self._read_in = torch.nn.Linear(n_dims, n_embd)
        self._backbone = GPT2Model(cfg)
        self._read_out = torch.nn.Linear(n_embd, 1)

    def forward(self, xs, ys):
        b, n, d = xs.shape
        ys_wide = torch.cat([ys[..., None], xs.new_zeros(b, n, d - 1)], dim=2)
        zs = torch.stack([xs, ys_wide], dim=2).reshape(b, 2 * n, d)
        hidden = self._backbone(inputs_embeds=self._read_in(zs)).last_hidden_state
        return self._read_out(hidden)[:, ::2, 0]
