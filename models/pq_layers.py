"""The PQ transformer's layers: `PQAttention` (per-head P, Q or sparse A, B) and `PQBlock`.

Rows are laid out per prefix copy, ``[batch, prefix, row, D]`` (see `iclprobe.models.pq`);
the first ``n_slots`` rows are context slots, of which prefix i uses ``n_keys[i]`` as keys.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from iclprobe.errors import InputError
from iclprobe.models._tl import HookPoint, observed
from iclprobe.models.config import PQConfig


def sparse_pq(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 8: ``P = [[B, 0], [0, 1]]`` and ``Q = -[[A, 0], [0, 0]]`` from ``A, B [..., d, d]``."""
    d = a.shape[-1]
    corner = torch.zeros(d + 1, d + 1, dtype=b.dtype, device=b.device)
    corner[d, d] = 1.0
    pad = (0, 1, 0, 1)  # one zero column and row
    return nn.functional.pad(b, pad) + corner, -nn.functional.pad(a, pad)


class PQAttention(nn.Module):
    """One layer's heads: parameters A, B (sparse) or P, Q (dense), ``[head, ., .]``."""

    def __init__(self, cfg: PQConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.n_heads, cfg.n_dims
        if cfg.sparse:
            self.A = nn.Parameter(torch.zeros(h, d, d))  # preconditioner, Q = -[[A, 0], [0, 0]]
            self.B = nn.Parameter(torch.zeros(h, d, d))  # P = [[B, 0], [0, 1]]
        else:
            width = cfg.d_model  # d + 1 + n_state
            self.P = nn.Parameter(torch.zeros(h, width, width))  # value matrix
            self.Q = nn.Parameter(torch.zeros(h, width, width))  # merged key-query matrix
        self.hook_attn_scores = HookPoint()  # [batch, prefix, head, row, key]
        self.hook_pattern = HookPoint()  # [batch, prefix, head, row, key]

    def matrices(self) -> tuple[Tensor, Tensor]:
        """Full ``P, Q [head, D, D]`` (for a sparse layer, built from A and B)."""
        if not self.cfg.sparse:
            return self.P, self.Q
        return sparse_pq(self.A, self.B)

    def forward(self, rows: Tensor, n_keys: Tensor, n_slots: int) -> Tensor:
        """Update of ``rows [batch, prefix, row, D]``.

        The first ``n_slots`` rows are context slots; prefix i has ``n_keys[i]`` keys.
        """
        p, q = self.matrices()
        keys = rows[:, :, :n_slots]  # [batch, prefix, key, D], the context slots
        valid = torch.arange(n_slots, device=rows.device) < n_keys[:, None]  # [prefix, key]
        inv_t = torch.where(n_keys > 0, 1.0 / n_keys.clamp(min=1).to(rows.dtype), 0.0)
        if self.cfg.kernel == "linear" and not observed(self.hook_attn_scores, self.hook_pattern):
            # S Z Pᵀ = Z Q (Zᵀ Z) Pᵀ: one (D x D) Gram matrix per prefix, no scores.
            gram = torch.einsum("btjd,btje->btde", keys * valid[None, :, :, None], keys)
            kernel = torch.einsum("hde,btef,hgf->btdg", q, gram, p) * inv_t[:, None, None]
            return rows @ kernel
        scores = torch.einsum("btrd,hde,btje->bthrj", rows, q, keys)
        mask = valid[None, :, None, None, :]
        if self.cfg.kernel == "softmax":
            scores = self.hook_attn_scores(scores.masked_fill(~mask, float("-inf")))
            pattern = torch.nan_to_num(scores.softmax(dim=-1), nan=0.0)  # t = 0: no keys
        elif self.cfg.kernel == "softmax-ahn":
            scores = self.hook_attn_scores(scores.masked_fill(~mask, float("-inf")))
            pattern = _ahn_softmax(scores, rows, q, n_slots) * inv_t[None, :, None, None, None]
        else:
            scores = self.hook_attn_scores(scores.masked_fill(~mask, 0.0))
            kernel = scores.relu() if self.cfg.kernel == "relu" else scores
            pattern = kernel * inv_t[None, :, None, None, None]
        pattern = self.hook_pattern(pattern)
        values = torch.einsum("btjd,hed->bthje", keys, p)  # P z_j per head
        return torch.einsum("bthrj,bthje->btre", pattern, values)


def _ahn_softmax(scores: Tensor, rows: Tensor, q: Tensor, n_slots: int) -> Tensor:
    """Ahn et al.'s softmax: normalized over the keys and the query row's own column.

    ``scores [batch, prefix, head, row, key]`` (invalid keys at -inf); the query row, right
    after the ``n_slots`` context slots, must be the only one (its value is masked, so its
    column enters the denominator only).
    """
    if rows.shape[2] != n_slots + 1:
        raise InputError(f"kernel 'softmax-ahn' needs one query row per prefix copy, got "
                         f"{rows.shape[2] - n_slots} rows after {n_slots} context slots")
    own = torch.einsum("btrd,hde,bte->bthr", rows, q, rows[:, :, n_slots])  # z_rᵀ Q z_query
    total = torch.logsumexp(torch.cat([scores, own[..., None]], dim=-1), dim=-1, keepdim=True)
    return (scores - total).exp()


class PQBlock(nn.Module):
    """One attention-only layer with residual hooks."""

    def __init__(self, cfg: PQConfig):
        super().__init__()
        self.attn = PQAttention(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, prefix, row, D]
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, rows: Tensor, n_keys: Tensor, n_slots: int) -> Tensor:
        """``Z + attention(Z)`` on per-prefix rows."""
        rows = self.hook_resid_pre(rows)
        update = self.attn(rows, n_keys, n_slots)
        return self.hook_resid_post(rows + self.hook_attn_out(update))
