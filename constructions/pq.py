"""Linear transformers whose layers provably run a learner: GD, preconditioned GD, Newton.

Axis legend: ``layer``, ``n_dims`` (d). Every builder returns a `PQTransformer` with the
linear kernel; its layer l's exact readout (−Z[query, y] of the query row) equals the
learner's step given by `layer_steps`, at every prefix t (checked to round-off in the
tests).

**GD** (von Oswald et al. 2023; Ahn et al. 2023, Eq. 8): ``P = [[0, 0], [0, 1]]``,
``Q = −[[A_l, 0], [0, 0]]`` makes layer l compute ``w ← w − A_l ∇R(w)`` with
``R(w) = (1/2t) Σ_j (wᵀx_j − y_j)²``: with ``A_l = ηI`` that is GD on the mean loss with
lr η (``algorithms.gd(lr=η, normalize=True)``), step l at layer l.

**Newton–Schulz** in linear attention. Tokens are ``(x, u, r)`` of width 2d + 1: the
covariate, d state channels u (0 in the input) and r (the label y for a context row, 0 for
the query row). With ``S̄ = S/t`` and a constant ``a``:

- layer 1: ``u_i ← u_i + (1/t) Σ_j (x_i·x_j) x_j`` — so u_i = S̄ x_i;
- layer 2: ``r_i ← r_i − a (1/t) Σ_j (u_i·x_j) r_j``;
- layer k + 2 (k ≥ 1): ``u_i ← u_i − 2^(k−2) a (1/t) Σ_j (u_i·x_j) u_j`` and
  ``r_i ← r_i − 2^(k−1) a (1/t) Σ_j (u_i·x_j) r_j`` (one head: scores u_i·x_j, values
  (u_j, r_j)).

Why: Newton–Schulz ``M_0 = α S``, ``M_{k+1} = 2M_k − M_k S M_k`` keeps M_k a polynomial in
S, so symmetric and commuting with S. Write ``u_i = M_k x_i / c_k`` with ``c_k = 2^k a/t``:
then ``M_k S M_k x_i = c_k² Σ_j u_j (x_j·u_i)`` gives the u update (``c_{k+1} = 2c_k``
removes the 2M_k term). With ``w_k = M_k b`` (b = Xᵀy) and ``r_i = y_i − x_iᵀ w_k`` (context)
or ``−x_qᵀ w_k`` (query), ``w_{k+1} = w_k + M_k (b − S w_k)`` and
``Σ_j (u_i·x_j) r_j = u_iᵀ (b − S w_k)`` give the r update. After layer l ≥ 2 the query
row holds ``r_q = −x_qᵀ w_{l−2}``: layer l is Newton step l − 2 with ``α_t = a/t²``
(``algorithms.newton(alpha=a / t**2)``); layers 0 and 1 predict 0. It converges while
``a λ_max(S̄)² < 2``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from iclprobe._checks import check_int, check_real
from iclprobe._finite import all_finite
from iclprobe.algorithms.prefix import check_real as real_tensor
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models.config import PQConfig
from iclprobe.models.pq import PQTransformer
from iclprobe.models.size import check_model_fits

#: Copies of a construction's matrices held while it is built (its own float64 ones, the
#: model's), checked against memory before any is allocated.
BUILD_COPIES = 3


def _check_fits(what: str, cfg: PQConfig) -> None:
    """Refuse a construction whose matrices and model cannot fit, measured on meta."""
    check_model_fits(PQTransformer, cfg, what, copies=BUILD_COPIES)


def gd_transformer(n_dims: int, n_layers: int, lr: float = 0.1) -> PQTransformer:
    """Layer l is step l of GD from w = 0 on the mean loss with learning rate ``lr``."""
    check_int("gd_transformer", "n_dims", n_dims)
    check_int("gd_transformer", "n_layers", n_layers)
    check_real("gd_transformer", "lr", lr, 0.0, low_open=True)
    _check_fits(f"gd_transformer({n_dims}, {n_layers})", PQConfig(n_dims=n_dims,
                                                                  n_layers=n_layers))
    return PQTransformer.from_matrices(A=[lr * torch.eye(n_dims)] * n_layers)


def pgd_transformer(preconds: Tensor | Sequence[Tensor]) -> PQTransformer:
    """Layer l is ``w ← w − A_l ∇R(w)`` with ``preconds[l - 1] = A_l`` (``[layer, d, d]``).

    Its reference learner is ``pgd_schedule(preconds=..., normalize=True)``; with one A for
    every layer, ``pgd(precond=A, lr=1)``.
    """
    a = real_tensor("preconds", preconds) if isinstance(preconds, Tensor) else \
        _stacked(preconds)
    if a.ndim != 3 or a.shape[-1] != a.shape[-2] or not all_finite(a):
        raise InputError(f"preconds must be finite square matrices [layer, d, d], got shape "
                         f"{tuple(a.shape)}")
    return PQTransformer.from_matrices(A=a.to(torch.float32))


def _stacked(preconds: Sequence[Tensor]) -> Tensor:
    """A sequence of ``[d, d]`` matrices, checked, as ``[layer, d, d]``."""
    if isinstance(preconds, (str, bytes)) or not hasattr(preconds, "__len__"):
        raise InputTypeError(f"preconds must be a [layer, d, d] tensor or a sequence of [d, d] "
                             f"tensors, got {type(preconds).__name__}")
    items = list(preconds)
    if not items:
        raise InputError("preconds must hold at least one [d, d] matrix (one per layer), "
                         "got none")
    for i, m in enumerate(items):  # real: a complex matrix's imaginary part was dropped
        real_tensor(f"preconds[{i}]", m, "[d, d]")
    shapes = [tuple(m.shape) for m in items]
    if len(set(shapes)) > 1:
        raise InputError(f"preconds must be matrices of one shape [d, d], got shapes {shapes}")
    return torch.stack([m.detach().to(torch.float32) for m in items])


def newton_transformer(n_dims: int, n_layers: int, a: float = 1e-3) -> PQTransformer:
    """Layer l ≥ 2 is Newton–Schulz step l − 2 with α_t = a/t² (see the module docstring).

    ``n_layers`` must be at least 2 (layer 1 builds S̄x, layer 2 takes the first step).
    """
    d = check_int("newton_transformer", "n_dims", n_dims)
    check_int("newton_transformer", "n_layers", n_layers, low=2)
    check_real("newton_transformer", "a", a, 0.0, low_open=True)
    # layer k + 2 scales by 2^k a: beyond float32's range the construction has no weights
    most = 3 + math.floor(math.log2(torch.finfo(torch.float32).max / a))
    if n_layers > most:
        raise InputError(f"newton_transformer: n_layers={n_layers} needs the coefficient "
                         f"2^(n_layers - 3)·a, beyond float32's range for a={a:g}: at most "
                         f"{most} layers (each layer squares the error: the iteration has "
                         "long converged)")
    _check_fits(f"newton_transformer({n_dims}, {n_layers})",
                PQConfig(n_dims=d, n_layers=n_layers, sparse=False, n_state=d))
    width = 2 * d + 1
    x, u, r = slice(0, d), slice(d, 2 * d), 2 * d
    eye = torch.eye(d, dtype=torch.float64)
    p = torch.zeros(n_layers, width, width, dtype=torch.float64)
    q = torch.zeros(n_layers, width, width, dtype=torch.float64)
    q[0, x, x] = eye  # score x_i·x_j
    p[0, u, x] = eye  # value x_j into u
    for layer in range(1, n_layers):
        q[layer, u, x] = eye  # score u_i·x_j (row's u against the key's x)
        # block `layer` moves r from w_{layer-2} to w_{layer-1} (w_{-1} = 0) with the current
        # u_k, k = max(layer - 2, 0), and (from block 2 on) u from u_k to u_{k+1}
        k = max(layer - 2, 0)
        p[layer, r, r] = -(2.0**k) * a
        if layer >= 2:
            p[layer, u, u] = -(2.0 ** (k - 1)) * a * eye
    return PQTransformer.from_matrices(P=p.float(), Q=q.float(), n_dims=d)


def newton_transformer_alpha(a: float, n_points: int) -> Tensor:
    """The α_t = a/t² per prefix (t = 0 gets a; its prefix has no examples) as ``[pos]``."""
    check_real("newton_transformer_alpha", "a", a, 0.0, low_open=True)
    check_int("newton_transformer_alpha", "n_points", n_points)
    t = torch.arange(n_points, dtype=torch.float64).clamp(min=1)
    return a / t**2


#: The known-answer models shipped by name (`iclprobe models`), and how each is built.
SHIPPED = {
    "ka-gd-pq": ("known answer: GD construction (Eq. 8), 8 layers, A_l = 0.2 I: layer l is "
                 "GD step l, lr 0.2, mean loss", lambda: gd_transformer(5, 8, lr=0.2)),
    "ka-newton-pq": ("known answer: Newton–Schulz in linear attention, 12 layers, a = 0.003: "
                     "layer l >= 2 is Newton step l - 2 with alpha_t = a/t^2",
                     lambda: newton_transformer(5, 12, a=3e-3)),
}
