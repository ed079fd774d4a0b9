"""The PQ transformer's layers: `PQAttention` (per-head P, Q or sparse A, B) and `PQBlock`.

Rows are laid out per prefix copy, ``[batch, prefix, row, D]`` (see `iclprobe.models.pq`);
the first ``n_slots`` rows are context slots, of which prefix i uses ``n_keys[i]`` as keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from iclprobe._finite import all_finite
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models._tl import HookPoint, observed
from iclprobe.models.config import PQConfig

MatrixLike = Tensor | Sequence[Any]


def sparse_pq(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 8: ``P = [[B, 0], [0, 1]]`` and ``Q = -[[A, 0], [0, 0]]`` from ``A, B [..., d, d]``."""
    d = a.shape[-1]
    corner = torch.zeros(d + 1, d + 1, dtype=b.dtype, device=b.device)
    corner[d, d] = 1.0
    pad = (0, 1, 0, 1)  # one zero column and row
    return nn.functional.pad(b, pad) + corner, -nn.functional.pad(a, pad)


def factor(m: Tensor, d_k: int, name: str) -> tuple[Tensor, Tensor]:
    """Factors ``L, R [head, d_k, k]`` with ``Lᵀ R = m`` for blocks ``m [head, k, k]``.

    ``d_k >= k``: ``L = [I; 0]``, ``R = [m; 0]`` (exact). ``d_k < k``: the balanced factors
    ``Lᵀ = U S^½ Vᵀ E`` and ``R = Eᵀ V S^½ Vᵀ`` of ``m = U S Vᵀ`` (each of singular values
    ``S^½``), with ``E`` an orthonormal basis of m's row space chosen from its projector
    (`_range_basis`); rows past m's rank are 0. Every
    piece is a function of m alone — no sign or basis that LAPACK's SVD chose reaches the
    weights. Exact to round-off when m has rank <= d_k; a block of higher rank is a
    ValueError.
    """
    heads, size = m.shape[0], m.shape[-1]
    if d_k >= size:
        eye = torch.eye(d_k, size, dtype=m.dtype, device=m.device).expand(heads, -1, -1)
        return eye.clone(), nn.functional.pad(m, (0, 0, 0, d_k - size))
    u, s, vh = torch.linalg.svd(m.to(torch.float64))
    dropped = s[:, d_k:].max()
    if dropped > RANK_TOL * float(s.max().clamp(min=1e-300)):
        raise InputError(f"{name} has rank above PQConfig.d_k={d_k} (singular value "
                         f"{float(dropped):.3g} beyond the first {d_k}): a factored layer "
                         f"holds blocks of rank <= d_k only")
    left, right = balanced_factors(u, s, vh, d_k)
    return left.to(m.dtype), right.to(m.dtype)


#: singular values at most this fraction of the blocks' largest are round-off, not rank
RANK_TOL = 1e-6


def balanced_factors(u: Tensor, s: Tensor, vh: Tensor, d_k: int) -> tuple[Tensor, Tensor]:
    """`factor`'s ``L, R [head, d_k, k]`` from an SVD ``u, s, vh`` of the blocks (float64).

    Built from ``U S^½ Vᵀ``, ``V S^½ Vᵀ`` and the projector ``V Vᵀ`` over each block's
    first d_k singular values above ``RANK_TOL`` of its own largest (a head far smaller
    than another is kept whole): sums over singular pairs that are the same for every SVD
    of m (a pair's signs cancel, and within a tied singular value any basis gives the same
    sum). Only a tie at the d_k-th value, which `factor` allows at round-off below the
    blocks' largest, is cut where LAPACK's basis says.
    """
    own = RANK_TOL * s.amax(-1, keepdim=True).clamp(min=1e-300)
    kept = (s > own) & (torch.arange(s.shape[-1]) < d_k)  # [head, k]
    root = torch.where(kept, s.clamp(min=0).sqrt(), 0.0)
    v = vh.transpose(-1, -2) * kept[:, None, :]
    left_full = (u * root[:, None, :]) @ vh  # U S^½ Vᵀ  [head, k, k]
    right_full = (v * root[:, None, :]) @ vh  # V S^½ Vᵀ
    basis = _range_basis(v @ vh, kept.sum(-1).tolist(), d_k)  # E [head, k, d_k]
    return (left_full @ basis).transpose(-1, -2), basis.transpose(-1, -2) @ right_full


def _range_basis(proj: Tensor, ranks: list[int], d_k: int) -> Tensor:
    """Orthonormal ``E [head, k, d_k]`` spanning each projector's range (``ranks``), then 0s.

    Gram–Schmidt (twice, for round-off) over the projector's columns ``P e_1, P e_2, …``:
    each next basis vector is the first column (in index order) whose remainder keeps at
    least half the norm² of the largest remainder. A choice made from the projector alone:
    only a remainder within round-off of half the largest could tip it.
    """
    heads, size = proj.shape[0], proj.shape[-1]
    out = proj.new_zeros(heads, size, d_k)
    for h, rank in enumerate(ranks):
        rest = proj[h].clone()  # [k, k]: the columns' remainders
        for i in range(rank):
            norms = (rest * rest).sum(0)
            j = int(torch.nonzero(norms >= 0.5 * norms.max())[0])
            e = rest[:, j] / norms[j].sqrt()
            for _ in range(2):  # remove e from every remainder (twice: round-off)
                rest = rest - e[:, None] * (e @ rest)[None, :]
            out[h, :, i] = e
    return out


class PQAttention(nn.Module):
    """One layer's heads: parameters A, B (sparse) or P, Q (dense), ``[head, ., .]``.

    With ``cfg.d_k`` set (the standard, factored parametrization) the merged matrices are
    products of per-head factors of ``d_k`` rows: sparse ``A = W_Kᵀ W_Q`` (``W_K, W_Q
    [head, d_k, d]``; B stays one matrix), dense ``Q = W_Kᵀ W_Q`` and ``P = W_Oᵀ W_V``
    (``[head, d_k, D]`` each). Scores are then ``z_iᵀ Q z_j = (W_K z_i)·(W_Q z_j)``: the
    row being updated (the query row) meets ``W_K``, following ``Q = W_Kᵀ W_Q``.
    """

    def __init__(self, cfg: PQConfig):
        super().__init__()
        self.cfg = cfg
        h, d, k = cfg.n_heads, cfg.n_dims, cfg.d_k
        width = d if cfg.sparse else cfg.d_model  # the blocks A, B, or P, Q (D = d + 1 + n_state)
        if k is not None:
            self.W_K = nn.Parameter(torch.zeros(h, k, width))  # [head, d_k, width]
            self.W_Q = nn.Parameter(torch.zeros(h, k, width))
        if cfg.sparse:
            if k is None:
                self.A = nn.Parameter(torch.zeros(h, d, d))  # preconditioner, Q = -[[A, 0], [0, 0]]
            self.B = nn.Parameter(torch.zeros(h, d, d))  # P = [[B, 0], [0, 1]]
        elif k is None:
            self.P = nn.Parameter(torch.zeros(h, width, width))  # value matrix
            self.Q = nn.Parameter(torch.zeros(h, width, width))  # merged key-query matrix
        else:
            self.W_V = nn.Parameter(torch.zeros(h, k, width))  # P = W_Oᵀ W_V
            self.W_O = nn.Parameter(torch.zeros(h, k, width))
        self.hook_attn_scores = HookPoint()  # [batch, prefix, head, row, key]
        self.hook_pattern = HookPoint()  # [batch, prefix, head, row, key]

    def key_query(self) -> Tensor:
        """The merged key-query block, ``[head, ., .]``: A (sparse) or Q (dense)."""
        if self.cfg.d_k is None:
            return self.A if self.cfg.sparse else self.Q
        return self.W_K.transpose(-1, -2) @ self.W_Q

    def matrices(self) -> tuple[Tensor, Tensor]:
        """Full ``P, Q [head, D, D]`` (for a sparse layer, built from A and B)."""
        if self.cfg.sparse:
            return sparse_pq(self.key_query(), self.B)
        if self.cfg.d_k is None:
            return self.P, self.Q
        return self.W_O.transpose(-1, -2) @ self.W_V, self.key_query()

    @torch.no_grad()
    def load_merged(self, key_query: Tensor, value: Tensor) -> None:
        """Set the heads from merged blocks ``[head, ., .]``: A, B (sparse) or Q, P (dense).

        A factored layer takes factors of them (`factor`); a block of rank above ``d_k``
        is a ValueError.
        """
        k, sparse = self.cfg.d_k, self.cfg.sparse
        if k is None:
            (self.A if sparse else self.Q).copy_(key_query)
            (self.B if sparse else self.P).copy_(value)
            return
        pairs = [((self.W_K, self.W_Q), key_query, "A" if sparse else "Q")]
        if sparse:
            self.B.copy_(value)
        else:
            pairs.append(((self.W_O, self.W_V), value, "P"))
        for (left, right), merged, name in pairs:
            wl, wr = factor(merged, k, name)
            left.copy_(wl)
            right.copy_(wr)

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


def as_matrices(m: MatrixLike | None, name: str) -> Tensor:
    """A float32 tensor from a tensor or (nested) lists of tensors or numbers, all finite."""
    if m is None:
        raise InputError(f"{name} is required")
    if isinstance(m, (list, tuple)):
        parts = [as_matrices(x, name) for x in m]
        if len({p.shape for p in parts}) > 1:
            raise InputError(f"{name}: matrices of different shapes {[tuple(p.shape) for p in parts]}")
        return torch.stack(parts) if parts else torch.zeros(0)
    if isinstance(m, Tensor):
        t = m.detach().to(torch.float32)
    elif isinstance(m, (int, float)):
        t = torch.tensor(float(m))
    else:
        raise InputTypeError(f"{name} must be a tensor or a list of matrices, "
                             f"got {type(m).__name__}")
    if not all_finite(t):
        raise InputError(f"{name} must be finite (in float32), found NaN or Inf")
    return t


def per_layer_head(m: MatrixLike, name: str, cfg: PQConfig, k: int) -> Tensor:
    """``m`` as ``[layer, head, k, k]``, accepting ``[layer, k, k]`` when there is one head."""
    t = as_matrices(m, name)
    if t.ndim == 3 and cfg.n_heads == 1:
        t = t[:, None]
    expected = (cfg.n_layers, cfg.n_heads, k, k)
    if t.shape != expected:
        hint = ""
        if t.ndim >= 2 and t.shape[-1] != t.shape[-2]:
            hint = " (blocks must be square)"
        elif cfg.sparse and t.shape[-1] == cfg.n_dims + 1 and name in "AB":
            hint = " (a sparse model takes d x d blocks A, B, not dense (d+1) x (d+1) matrices)"
        raise InputError(
            f"{name} must have shape [n_layers={cfg.n_layers}, n_heads={cfg.n_heads}, {k}, {k}]"
            f", got {tuple(t.shape)}{hint}"
        )
    return t
