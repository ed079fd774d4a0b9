"""`PQTransformer`: the linear transformer of Ahn et al. 2023 and von Oswald et al. 2023.

Tokens are rows ``z = (x, y)`` of width D = d + 1 (``(x, s, y)`` with ``n_state`` state
channels s, zero in the input, in a dense model); the query row is ``(x_q, 0)``. Per head,
``score(i, j) = z_iᵀ Q z_j`` (query row on the left, as Ahn et al.'s code) over the t
context rows only, and ``Z <- Z + (1/t) S Z Pᵀ``; the prediction is ``-Z[query, d]``.
Eq. 8 sparsity: ``P = [[B, 0], [0, 1]]``, ``Q = -[[A, 0], [0, 0]]``, so a layer computes
``w <- w - A ∇R(w)``: A = ηI, B = 0 is gradient descent, B = (γ/η) I is GD++.

Context rows are updated too, so their states depend on the prefix length t. All prefix
predictions therefore come from one batched forward over per-prefix copies of the
sequence, equal to running each truncated prefix alone (one causal pass is wrong from the
second layer on). Axis legend: ``batch``, ``prefix`` (t = 0..n-1), ``row`` (n context
slots, then the T query rows), ``key`` (context slots), ``head``, ``d_model`` (D = d + 1).
Rows ``j >= t`` of prefix t's context slots are zero padding and never keys.

``PQConfig.d_k`` selects the standard parametrization: each merged matrix is a product of
two ``d_k``-row factors (`iclprobe.models.pq_layers.PQAttention`); everything downstream
(`matrices`, `iclprobe.probes.preconditioners`, alignment) reads the products.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from iclprobe._checks import ConfigError
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models.base import ModuleList, Regressor
from iclprobe.models.config import PQConfig
from iclprobe.models.pq_layers import MatrixLike, PQBlock, as_matrices, per_layer_head, sparse_pq


class PQTransformer(Regressor):
    """Hooked PQ linear transformer (see the module docstring for the conventions).

    ``cfg.kernel`` acts on the scores ``s_rj = z_rᵀ Q z_j`` of a row r against the t context
    keys (q: the prefix's query row):

    - ``"linear"``: ``s_rj / t`` (Ahn et al.'s ``attention(..., activation=None)``);
    - ``"relu"``: ``relu(s_rj) / t`` (their ReLU attention);
    - ``"softmax"``: ``softmax_j(s_rj)`` over the t keys, no 1/t: the update is a convex
      combination of the values;
    - ``"softmax-ahn"``: Ahn et al.'s ``activation=softmax``: the softmax runs over all
      t + 1 columns, the query's own included (its value masked to zero), then / t:
      ``exp(s_rj) / (Σ_i exp(s_ri) + exp(s_rq)) / t``. The weights sum to less than 1/t and
      every row's update depends on the query, so each query gets its own copy of the
      context in `predict_queries`. `load_ahn` with ``kernel="softmax"`` uses this one.
    """

    family = "pq"
    exact_layer_readout = True  # a layer's query row holds its prediction: −Z[query, d]
    default_positions = "last"  # Ahn et al. train on the last position only
    curriculum = False
    head_hook = ("attn.hook_pattern", 2)  # [batch, prefix, head, row, key]
    block_output_hooks = ("hook_attn_out",)

    def __init__(self, cfg: PQConfig):
        super().__init__()
        if not isinstance(cfg, PQConfig):
            raise InputTypeError(f"cfg must be a PQConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.task: Any = None
        self.blocks: ModuleList[PQBlock] = ModuleList(PQBlock(cfg) for _ in range(cfg.n_layers))
        if torch.empty(0).device.type != "meta":  # sized only on meta: nothing to draw
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                for param in self.parameters():
                    nn.init.normal_(param, std=cfg.init_std)
        self.setup()

    # ------------------------------------------------------------------ forward
    def rows(
        self, xs: Tensor, ys: Tensor, queries: Tensor
    ) -> Float[Tensor, "batch prefix row d_model"]:
        """Per-prefix token rows: context slots ``(x_j, y_j)`` for j < t, then ``(q, 0)``."""
        b, n, d = xs.shape
        ctx = self._tokens(xs, ys[..., None])  # [batch, key, D]
        visible = torch.arange(n, device=xs.device)[None, :] < torch.arange(n, device=xs.device)[:, None]
        ctx = ctx[:, None] * visible[None, :, :, None]  # [batch, prefix, key, D]
        q_rows = self._tokens(queries, queries.new_zeros(*queries.shape[:-1], 1))
        return torch.cat([ctx, q_rows], dim=2)

    def _tokens(self, x: Tensor, y: Tensor) -> Tensor:
        """Rows ``(x, 0_state, y)`` from ``x [..., d]`` and ``y [..., 1]``."""
        if not self.cfg.n_state:
            return torch.cat([x, y], dim=-1)
        return torch.cat([x, x.new_zeros(*x.shape[:-1], self.cfg.n_state), y], dim=-1)

    def run_rows(self, rows: Tensor, n_keys: Tensor | None = None,
                 n_slots: int | None = None) -> Tensor:
        """All layers on per-prefix ``rows``.

        Prefix i has ``n_keys[i]`` keys (default: i) among the first ``n_slots`` rows
        (default: one slot per prefix).
        """
        n_slots = rows.shape[1] if n_slots is None else n_slots
        if n_keys is None:
            n_keys = torch.arange(rows.shape[1], device=rows.device)
        for block in self.blocks:
            rows = block(rows, n_keys, n_slots)
        return rows

    @staticmethod
    def readout(
        rows: Float[Tensor, "*batch prefix row d_model"],
    ) -> Float[Tensor, "*batch prefix query"]:
        """The no-training readout ``-Z[query, d]`` of every query row (any leading axes)."""
        return -rows[..., rows.shape[-3] :, -1]

    def readout_residual(self, resid: Tensor) -> Tensor:
        """``−Z[query, d]`` of query rows ``[..., d_model]``: the layer's own prediction."""
        return -resid[..., -1]

    def readout_rows(self, activation: Tensor, n_points: int) -> Tensor:
        """``[batch, prefix, row, D]`` → the query row of each prefix, ``[batch, prefix, D]``."""
        return activation[:, :, n_points]

    def set_readout_rows(self, activation: Tensor, rows: Tensor) -> Tensor:
        """A copy with ``rows`` written into the query row of each prefix."""
        if activation.shape[2] != activation.shape[1] + 1:
            raise InputError(f"readout rows can be written only into a full forward's "
                             f"[batch, prefix, n + 1, D] rows, got {tuple(activation.shape)}")
        expected = (activation.shape[0], activation.shape[1], activation.shape[-1])
        if tuple(rows.shape) != expected:
            raise InputError(f"rows must have shape {expected} for this tensor, got "
                             f"{tuple(rows.shape)}")
        out = activation.clone()
        out[:, :, activation.shape[1]] = rows.to(activation)
        return out

    def n_points_of(self, activation: Tensor) -> int:
        """Examples (= prefixes) in a ``[batch, prefix, row, D]`` hook tensor."""
        return activation.shape[1]

    # ------------------------------------------------------------------ training, alignment
    def train_options(self) -> frozenset[str]:
        """Ahn et al.'s constraints: Eq. 8 projection of a dense model, and B = 0."""
        return frozenset({"project_sparse", "zero_b"})

    def check_train_config(self, train_cfg: Any) -> None:
        """``project_sparse`` is for a dense model only."""
        if train_cfg.project_sparse and self.cfg.sparse:
            raise ConfigError("TrainConfig", "project_sparse", "TrainConfig.project_sparse "
                              "needs a dense PQ model (PQConfig.sparse=False); this one is "
                              "sparse by construction")
        if self.cfg.d_k is not None and not self.cfg.sparse and (
                train_cfg.project_sparse or train_cfg.zero_b):
            field = "project_sparse" if train_cfg.project_sparse else "zero_b"
            raise ConfigError("TrainConfig", field, f"TrainConfig.{field} sets entries of P, "
                              f"Q, which a dense factored model (PQConfig.d_k={self.cfg.d_k}) "
                              "holds as products W_Kᵀ W_Q, W_Oᵀ W_V; use d_k=None")
        if train_cfg.project_sparse and self.cfg.n_state:
            raise ConfigError("TrainConfig", "project_sparse", "TrainConfig.project_sparse: "
                              "Eq. 8's structure has no state channels (PQConfig.n_state="
                              f"{self.cfg.n_state})")

    def trainable_parameters(self, train_cfg: Any) -> list[nn.Parameter]:
        """With ``zero_b`` on a sparse model, B is left out (held at 0, L-BFGS stays consistent)."""
        frozen = train_cfg.zero_b and self.cfg.sparse
        return [p for name, p in self.named_parameters()
                if p.requires_grad and not (frozen and name.endswith("attn.B"))]

    @torch.no_grad()
    def apply_constraints(self, train_cfg: Any) -> None:
        """Eq. 8 projection of a dense model (``project_sparse``), and B = 0 (``zero_b``)."""
        d = self.cfg.n_dims
        for block in self.blocks:
            attn = block.attn
            if train_cfg.project_sparse:
                attn.P[:, :d, d] = 0.0
                attn.P[:, d, :d] = 0.0
                attn.P[:, d, d] = 1.0
                attn.Q[:, d, :] = 0.0
                attn.Q[:, :, d] = 0.0
            if train_cfg.zero_b:
                (attn.B if self.cfg.sparse else attn.P[:, :d, :d]).zero_()

    def claimed_learners(self, batch: Any) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Preconditioned GD with this model's own A_l, and with a_l Σ⁻¹ (Ahn et al.).

        A layer with the linear kernel and B = 0 computes ``w <- w − A_l ∇R(w)`` exactly,
        so layer l equals step l of ``pgd_own``. ``pgd_inv_cov`` uses Σ⁻¹ scaled by
        a_l = ⟨A_l, Σ⁻¹⟩/⟨Σ⁻¹, Σ⁻¹⟩ (Ahn et al.'s stationary points are A_l = a_l Σ⁻¹).
        """
        if self.cfg.n_state:
            return {}, ["pgd_own, pgd_inv_cov: not run, a layer with state channels is not "
                        "one step of preconditioned GD on (x, y)"]
        p, q = (m.detach().to(torch.float64) for m in self.matrices())
        d = self.cfg.n_dims
        a_own, b_own = -q[..., :d, :d].sum(1), p[..., :d, :d].sum(1)  # heads summed
        b_max = float(b_own.abs().max())
        notes = []
        if self.cfg.kernel != "linear" or b_max != 0.0:
            notes.append(f"pgd_own: a layer computes w <- w − A_l ∇R(w) exactly only with the "
                         f"linear kernel and B = 0 (this model: kernel {self.cfg.kernel}, "
                         f"max |B| {b_max:.3g}); read it as a reference")
        runs = {"pgd_own": {"learner": "pgd_schedule", "steps": "layers",
                            "label": "GD preconditioned by the model's own A_l",
                            "hyper": {"normalize": True, "preconds": a_own},
                            "compare_with": ("gd", "newton")}}
        if batch.cov.ndim == 2:
            inv = torch.linalg.inv(batch.cov.to(torch.float64))
            scale = (a_own * inv).sum((-1, -2)) / (inv * inv).sum()
            runs["pgd_inv_cov"] = {"learner": "pgd_schedule", "steps": "layers",
                                   "label": "GD preconditioned by a_l Σ⁻¹ (a_l fitted to A_l)",
                                   "hyper": {"normalize": True,
                                             "preconds": scale[:, None, None] * inv},
                                   "compare_with": ("gd", "newton")}
        else:
            notes.append("pgd_inv_cov: skipped, Σ differs per sequence in this data")
        return runs, notes

    def predict_queries(
        self,
        xs: Float[Tensor, "batch pos n_dims"],
        ys: Float[Tensor, "batch pos"],
        queries: Float[Tensor, "batch pos query n_dims"],
    ) -> Float[Tensor, "batch pos query"]:
        """Predict ``queries[:, t, j]`` from the t examples before position t."""
        self.check_queries(xs, ys, queries)
        rows, n_keys = self._query_pass(xs, ys, queries)
        n = xs.shape[1]
        return -self._query_rows(self.run_rows(rows, n_keys, n), queries)[..., -1]

    def _query_pass(self, xs: Tensor, ys: Tensor, queries: Tensor) -> tuple[Tensor, Tensor]:
        """Rows and keys per copy for a pass over ``queries`` (n context slots each).

        Ahn et al.'s softmax normalizes every row over the query's own column too, so each
        query needs its own copy of the context: the T queries then fold into the prefix
        axis, ``[batch, prefix * T, n + 1, D]``.
        """
        rows = self.rows(xs, ys, queries)
        n, t_q = xs.shape[1], queries.shape[2]
        n_keys = torch.arange(n, device=xs.device)
        if self.cfg.kernel == "softmax-ahn" and t_q > 1:
            ctx = rows[:, :, None, :n].expand(-1, -1, t_q, -1, -1)  # [batch, prefix, T, n, D]
            rows = torch.cat([ctx, rows[:, :, n:, None]], dim=3).flatten(1, 2)
            n_keys = n_keys.repeat_interleave(t_q)
        return rows, n_keys

    @staticmethod
    def _query_rows(rows: Tensor, queries: Tensor) -> Tensor:
        """The query rows of a `_query_pass`, ``[batch, pos, T, D]`` (folded or not)."""
        b, n, t_q, _ = queries.shape
        return rows[:, :, n:].reshape(b, n, t_q, rows.shape[-1])

    def query_residuals(
        self,
        xs: Float[Tensor, "batch pos n_dims"],
        ys: Float[Tensor, "batch pos"],
        queries: Float[Tensor, "batch pos query n_dims"],
        reduce: Callable[[Tensor], Tensor] | None = None,
    ) -> Float[Tensor, "layer batch pos query d_model"]:
        """Every layer's query rows (layer 0: ``(q, 0)`` as embedded), optionally reduced."""
        self.check_queries(xs, ys, queries)
        rows, n_keys = self._query_pass(xs, ys, queries)
        n = xs.shape[1]
        layers = [self._query_rows(rows, queries)]
        for block in self.blocks:
            rows = block(rows, n_keys, n)
            layers.append(self._query_rows(rows, queries))
        stacked = torch.stack(layers)
        return reduce(stacked) if reduce is not None else stacked

    def forward(
        self, xs: Float[Tensor, "batch pos n_dims"], ys: Float[Tensor, "batch pos"],
        last_only: bool = False,
    ) -> Float[Tensor, "batch pos"]:
        """Predict every ``ys[:, t]`` from examples ``0..t-1`` and ``xs[:, t]``.

        ``last_only=True`` computes the last position alone (``[batch, 1]``), all the
        in-context loss of Ahn et al. needs: one prefix copy instead of n.
        """
        if not last_only:
            return self.predict_queries(xs, ys, xs[:, :, None])[..., 0]
        self.check_inputs(xs, ys)
        n = xs.shape[1]
        ctx = self._tokens(xs, ys[..., None])
        ctx[:, -1] = 0.0  # slot n-1 is not context at the last prefix
        query = self._tokens(xs[:, -1:], xs.new_zeros(xs.shape[0], 1, 1))
        rows = torch.cat([ctx, query], dim=1)[:, None]  # [batch, 1, n + 1, D]
        rows = self.run_rows(rows, torch.tensor([n - 1], device=xs.device), n_slots=n)
        return -rows[:, :, n, -1]

    # ------------------------------------------------------------------ weights
    def matrices(self) -> tuple[Tensor, Tensor]:
        """Full ``P, Q [layer, head, D, D]``."""
        pairs = [block.attn.matrices() for block in self.blocks]
        return torch.stack([p for p, _ in pairs]), torch.stack([q for _, q in pairs])

    @torch.no_grad()
    def set_matrices(
        self,
        A: MatrixLike | None = None,
        B: MatrixLike | None = None,
        *,
        P: MatrixLike | None = None,
        Q: MatrixLike | None = None,
    ) -> PQTransformer:
        """Set the weights from per-layer (per-head) matrices; returns ``self``.

        Either ``A`` (and optionally ``B``, default 0) of shape ``[d, d]`` per layer and head,
        or dense ``P`` and ``Q`` of shape ``[D, D]`` (D = d + 1 + n_state). A sparse model
        accepts P, Q only with the Eq. 8 structure.
        """
        cfg, d = self.cfg, self.cfg.n_dims
        if (A is None) == (P is None and Q is None):
            raise InputError("give either A (and optionally B) or both P and Q")
        if A is not None:
            a = per_layer_head(A, "A", cfg, d)
            b = per_layer_head(B, "B", cfg, d) if B is not None else torch.zeros_like(a)
            p, q = sparse_pq(a, b)
        else:
            if P is None or Q is None:
                raise InputError("P and Q must be given together")
            width = cfg.d_model
            p, q = per_layer_head(P, "P", cfg, width), per_layer_head(Q, "Q", cfg, width)
            a, b = -q[..., :d, :d], p[..., :d, :d]
            if cfg.sparse and not all(map(torch.equal, (p, q), sparse_pq(a, b))):
                raise InputError(
                    "a sparse PQTransformer was given dense matrices: P must be [[B, 0], [0, 1]] "
                    "and Q must be -[[A, 0], [0, 0]] (use PQConfig(sparse=False) for dense P, Q)"
                )
        for layer, block in enumerate(self.blocks):
            if cfg.sparse:
                block.attn.load_merged(a[layer], b[layer])
            else:
                block.attn.load_merged(q[layer], p[layer])
        return self

    @classmethod
    def from_matrices(
        cls,
        A: MatrixLike | None = None,
        B: MatrixLike | None = None,
        *,
        P: MatrixLike | None = None,
        Q: MatrixLike | None = None,
        kernel: str = "linear",
        n_dims: int | None = None,
        d_k: int | None = None,
    ) -> PQTransformer:
        """Build a model from matrices (``[layer, head, ., .]``, ``[layer, ., .]`` or lists).

        ``A``/``B`` give a sparse model (Eq. 8); ``P``/``Q`` a dense one, of width
        ``n_dims + 1`` unless ``n_dims`` is given (the rest are state channels). ``d_k``: the
        factored parametrization (`PQConfig.d_k`), the factors taken by `factor`.
        """
        first = as_matrices(A if A is not None else P, "A" if A is not None else "P")
        if first.ndim not in (3, 4) or first.shape[-1] != first.shape[-2]:
            raise InputError(
                f"{'A' if A is not None else 'P'} must be square matrices [layer, (head,) k, k], "
                f"got shape {tuple(first.shape)}"
            )
        n_layers, n_heads = first.shape[0], first.shape[1] if first.ndim == 4 else 1
        width = first.shape[-1] - (0 if A is not None else 1)
        if n_dims is None or A is not None:
            n_dims = width
        if not 1 <= n_dims <= width:
            raise InputError(f"n_dims must be in 1..{width} for P of width {width + 1}, got "
                             f"{n_dims!r}")
        cfg = PQConfig(n_dims=n_dims, n_layers=n_layers, n_heads=n_heads,
                       sparse=A is not None, kernel=kernel, init_std=0.0,
                       n_state=width - n_dims, d_k=d_k)
        return cls(cfg).set_matrices(A, B, P=P, Q=Q)

