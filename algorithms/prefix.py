"""Per-prefix sufficient statistics by cumulative sums, and their eigendecompositions.

Prefix t holds the examples ``0..t-1``: ``S_t = Σ_{j<t} x_j x_jᵀ`` and
``b_t = Σ_{j<t} x_j y_j``. Axis legend: ``batch``, ``pos`` (t = 0..n-1), ``n_dims``.
Everything is computed in float64; results are cast back by the callers.

Range: data far from 1 in magnitude (|x| ~ 1e±30 or beyond) would overflow or underflow
``S_t`` (and Newton's ``λ⁴``) even in float64. Such data are divided by a power of two per
batch (exact, so nothing is rounded) and the learners map their hyperparameters to the
scaled data: every learner here is covariant under ``x -> x/s``, ``y -> y/r`` (see
`power_of_two_scale`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor

from iclprobe._finite import all_finite
from iclprobe._linalg import sym_eigh
from iclprobe.errors import InputError, InputTypeError


class PrefixStats(NamedTuple):
    """Per-prefix moments and the eigendecomposition of ``S_t``.

    Eigenvalues below a relative tolerance are set to exactly 0, and so are the matching
    coordinates of ``b_t`` (which lie in S_t's range), so that every learner reaches the
    min-norm limit on rank-deficient prefixes (t < d) instead of amplifying round-off.

    The moments are those of ``xs / x_scale`` and ``ys / y_scale``, powers of two that are 1
    unless the data are extreme in magnitude (see `power_of_two_scale`).

    ``eigvecs``, ``xty_eig`` and ``query_eig`` are basis-dependent: each eigenvector's sign,
    and the basis inside a repeated eigenvalue's eigenspace, are the LAPACK build's choice.
    Nothing built from them here depends on that choice: every learner's weights are
    ``V g(Λ) Vᵀ b`` (`from_eigenbasis` of ``g(λ) · xty_eig``) and its predictions sums of
    ``g(λ_i) · query_eig_i · xty_eig_i``, in which signs cancel and g is constant on an
    eigenspace. Code that reads these fields must keep to such products.
    """

    gram: Float[Tensor, "batch pos n_dims n_dims"]  # S_t = Xᵀ X over the prefix
    xty: Float[Tensor, "batch pos n_dims"]  # b_t = Xᵀ y over the prefix
    counts: Float[Tensor, " pos"]  # t
    eigvals: Float[Tensor, "batch pos n_dims"]  # of S_t, ascending; 0 below the tolerance
    eigvecs: Float[Tensor, "batch pos n_dims n_dims"]  # columns
    xty_eig: Float[Tensor, "batch pos n_dims"]  # Vᵀ b_t (0 where the eigenvalue is 0)
    query_eig: Float[Tensor, "batch pos n_dims"]  # Vᵀ x_t, the query in the eigenbasis
    x_scale: float = 1.0  # the moments are of xs / x_scale (a power of two)
    y_scale: float = 1.0  # ... and of ys / y_scale


def check_real(name: str, value: Any, shape: str = "") -> Tensor:
    """``value`` if it is a tensor of real numbers (float or integer, not complex nor bool).

    ``shape`` (e.g. "[steps, d, d]") is named in the message. The learners never drop an
    imaginary part, as torch's cast to float64 would (with a warning).
    """
    if not isinstance(value, Tensor):
        raise InputTypeError(f"{name} must be a torch tensor{' ' + shape if shape else ''}, "
                             f"got {type(value).__name__}: convert with torch.as_tensor")
    if value.is_complex() or value.dtype == torch.bool:
        raise InputTypeError(f"{name} must hold real numbers (a float or integer tensor), got "
                             f"{value.dtype}")
    return value


def check_regression(xs: Tensor, ys: Tensor) -> None:
    """Validate ``xs [batch, pos, n_dims]`` and ``ys [batch, pos]``: shapes and finiteness."""
    check_real("xs", xs, "[batch, pos, n_dims]")
    check_real("ys", ys, "[batch, pos]")
    if xs.ndim != 3:
        raise InputError(f"xs must have shape [batch, pos, n_dims], got {tuple(xs.shape)}")
    if xs.shape[1] == 0:
        raise InputError(f"xs must hold at least one position, got shape {tuple(xs.shape)} "
                         "[batch, pos, n_dims]")
    if ys.shape != xs.shape[:2]:
        raise InputError(f"ys must have shape {tuple(xs.shape[:2])}, got {tuple(ys.shape)}")
    if not all_finite(xs) or not all_finite(ys):
        raise InputError("xs and ys must be finite (found NaN or Inf)")


def exclusive_cumsum(t: Tensor, dim: int = 1) -> Tensor:
    """``out[:, i] = Σ_{j<i} t[:, j]`` along ``dim``."""
    c = t.cumsum(dim)
    return torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c.narrow(dim, 0, c.shape[dim] - 1)],
                     dim)


#: Data whose largest magnitude lies in [2^-SAFE_LOG2, 2^SAFE_LOG2] are used as they are.
SAFE_LOG2 = 32


def power_of_two_scale(t: Tensor) -> float:
    """1, or the power of two s with max|t|/s in [1, 2) when max|t| is outside the safe range.

    Dividing by s is exact in floating point, so data in the safe range (all normal data)
    are never touched, and extreme data (|x| ~ 1e-200 or 1e200) lose nothing.
    """
    largest = t.abs().max().item() if t.numel() else 0.0
    if largest == 0.0 or 2.0**-SAFE_LOG2 <= largest <= 2.0**SAFE_LOG2:
        return 1.0
    return math.ldexp(1.0, math.frexp(largest)[1] - 1)


def scaled(xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor, float, float]:
    """``(xs / s_x, ys / s_y, s_x, s_y)`` in float64, the scales from `power_of_two_scale`.

    Detached: the learners are references, computed in place where it saves memory, and
    not differentiable (their results carry no gradient to ``xs`` or ``ys``).
    """
    check_regression(xs, ys)
    x, y = xs.detach().to(torch.float64), ys.detach().to(torch.float64)
    sx, sy = power_of_two_scale(x), power_of_two_scale(y)
    return (x / sx if sx != 1.0 else x), (y / sy if sy != 1.0 else y), sx, sy


def prefix_stats(xs: Tensor, ys: Tensor) -> PrefixStats:
    """Moments and eigendecompositions for every prefix of every sequence, in float64.

    Of ``xs / x_scale`` and ``ys / y_scale`` (powers of two, 1 unless the data are extreme).
    """
    x, y, sx, sy = scaled(xs, ys)
    gram = _exclusive_outer_cumsum(x, x)  # [batch, pos, n_dims, n_dims]
    xty = _exclusive_outer_cumsum(x, y[..., None])[..., 0]  # [batch, pos, n_dims]
    counts = torch.arange(xs.shape[1], dtype=torch.float64, device=xs.device)
    eigvals, eigvecs = sym_eigh(gram, "the prefix Gram matrices XᵀX")
    d = xs.shape[-1]
    rank_tol = eigvals[..., -1:].clamp(min=0.0) * (100 * d * torch.finfo(torch.float64).eps)
    nonzero = eigvals > rank_tol
    eigvals = torch.where(nonzero, eigvals, 0.0)
    # Vᵀ [b_t, x_t] in one batched product: [batch, pos, n_dims, 2]
    both = eigvecs.transpose(-1, -2) @ torch.stack([xty, x], -1)
    xty_eig = torch.where(nonzero, both[..., 0], 0.0)
    return PrefixStats(gram, xty, counts, eigvals, eigvecs, xty_eig, both[..., 1], sx, sy)


def given_stats(xs: Tensor, ys: Tensor, stats: PrefixStats | None, name: str) -> PrefixStats:
    """``stats`` when given (shared between learners on the same data), else computed.

    Given ones must be of ``xs`` and ``ys``: their shape, and (cheaply, O(batch · n_dims))
    their first example's ``b_1 = x_0 y_0`` and last query's norm ``‖x_{n-1}‖``, so that
    statistics of other data of the same shape are refused rather than read as these.
    ``name``: the learner, for the message.
    """
    if stats is None:
        return prefix_stats(xs, ys)
    check_real("xs", xs, "[batch, pos, n_dims]")
    check_real("ys", ys, "[batch, pos]")
    if stats.xty.shape != xs.shape or ys.shape != xs.shape[:2]:
        check_regression(xs, ys)  # ys' shape, named as such
        raise InputError(f"{name}: stats were computed for xs of shape "
                         f"{tuple(stats.xty.shape)}, not {tuple(xs.shape)}")
    x = xs[:, [0, -1]].detach().to(torch.float64) / stats.x_scale  # the statistics' scale
    y0 = ys[:, :1].detach().to(torch.float64) / stats.y_scale
    checks = [("first example's b_1 = x_0 y_0", stats.xty[:, 1], x[:, 0] * y0)] \
        if xs.shape[1] > 1 else []
    checks.append(("last query's norm ‖x_{n-1}‖", stats.query_eig[:, -1].norm(dim=-1),
                   x[:, 1].norm(dim=-1)))
    for what, held, given in checks:
        scale = float(given.abs().max()) if given.numel() else 0.0
        if all_finite(given) and torch.allclose(held, given, rtol=1e-9,
                                                                 atol=1e-12 * scale):
            continue
        check_regression(xs, ys)  # a NaN or Inf there is named as such
        gap = (held - given).abs().reshape(len(held), -1).amax(1)
        raise InputError(f"{name}: stats were computed from other data than these xs and ys: "
                         f"their {what} differs by {float(gap.max()):.3g} at sequence "
                         f"{int(gap.argmax())} (on the statistics' scale); pass "
                         "stats=prefix_stats(xs, ys) of these data, or none")
    return stats


def _exclusive_outer_cumsum(a: Tensor, b: Tensor) -> Tensor:
    """``out[:, t] = Σ_{j<t} a_j b_jᵀ`` for ``a [batch, pos, m]``, ``b [batch, pos, k]``.

    The products are written after a zero slot and summed in place: the same sums as
    `exclusive_cumsum` of the products, without its extra copy.
    """
    batch, n, m = a.shape
    out = torch.empty(batch, n, m, b.shape[-1], dtype=a.dtype, device=a.device)
    out[:, 0] = 0.0
    torch.mul(a[:, :-1, :, None], b[:, :-1, None, :], out=out[:, 1:])
    return out.cumsum_(1)


def safe_inverse(lam: Tensor) -> Tensor:
    """``1/λ`` where λ > 0, else 0 (the pseudo-inverse of a diagonal)."""
    return torch.where(lam > 0, 1.0 / torch.where(lam > 0, lam, 1.0), 0.0)


#: Learners run block by block of sequences, one block's ``[block, pos, n_dims]`` float64
#: tensor taking about this many bytes: the few such tensors a step touches then stay in a
#: core's cache (some 30% faster at Garg size than whole batches).
BLOCK_BYTES = 2**19


def stats_rows(stats: PrefixStats, rows: slice) -> PrefixStats:
    """The statistics of the sequences ``rows`` (``counts`` has no batch axis)."""
    return PrefixStats(stats.gram[rows], stats.xty[rows], stats.counts, stats.eigvals[rows],
                       stats.eigvecs[rows], stats.xty_eig[rows], stats.query_eig[rows],
                       stats.x_scale, stats.y_scale)


def by_blocks(stats: PrefixStats, run: Callable[[PrefixStats], tuple[Tensor, Tensor | None]]
              ) -> tuple[Tensor, Tensor | None]:
    """``run(block stats) -> (preds [step, block, pos], weights or None)`` block by block.

    The results are joined along the batch axis; every learner computes each sequence on its
    own, so they equal one run on the whole batch. Runs on the same statistics get the same
    block objects (`_blocks`), so what `spectral_terms` keeps for a block serves each run.
    """
    batch, n, d = stats.query_eig.shape
    rows = max(1, BLOCK_BYTES // max(1, n * d * stats.query_eig.element_size()))
    if batch <= rows:
        return run(stats)
    parts = [run(block) for block in _blocks(stats, rows)]
    preds = torch.cat([p for p, _ in parts], 1)
    weights = [w for _, w in parts if w is not None]
    return preds, (torch.cat(weights, 1) if weights else None)


#: the last statistics `by_blocks` split, and their blocks
_BLOCKS: list[tuple[PrefixStats, int, tuple[int, ...], list[PrefixStats]]] = []


def _blocks(stats: PrefixStats, rows: int) -> list[PrefixStats]:
    """``stats`` in blocks of ``rows`` sequences: the same objects for the same statistics.

    The statistics are known by their tensors (as `spectral_terms` knows them), held here
    so that their identity cannot pass to another's. New statistics drop the terms kept
    for others, so that what is kept holds one batch's tensors (and small unsplit ones').
    """
    for held, held_rows, versions, blocks in _BLOCKS:
        if held_rows == rows and _same_tensors(held, versions, stats):
            return blocks
    blocks = [stats_rows(stats, slice(lo, lo + rows))
              for lo in range(0, stats.query_eig.shape[0], rows)]
    _BLOCKS[:] = [(stats, rows, _versions(stats), blocks)]
    _TERMS[:] = []  # the terms kept hold no other batch's tensors than these
    return blocks


def forget_kept() -> None:
    """Drop the blocks and terms kept for the last statistics (`_blocks`, `spectral_terms`).

    `align` calls it when it is done: its batch's statistics (some 100 MB at Garg size)
    are then not held until another batch's replace them. Runs on them after this compute
    the terms again, to the same numbers.
    """
    _BLOCKS.clear()
    _TERMS.clear()


def _versions(stats: PrefixStats) -> tuple[int, ...]:
    """The version counters of the tensors `_same_tensors` compares.

    An in-place change counts one up, also one made through a view (a block's).
    """
    return tuple(t._version for t in stats[3:7])


def _same_tensors(held: PrefixStats, versions: tuple[int, ...], stats: PrefixStats) -> bool:
    """Whether ``stats`` holds ``held``'s eigvals, eigvecs, xty_eig and query_eig objects.

    Unchanged in place, too, since ``held`` was kept (at ``versions``).
    """
    return all(x is y for x, y in zip(held[3:7], stats[3:7])) and _versions(stats) == versions


def rowdot(a: Tensor, b: Tensor) -> Tensor:
    """``Σ_i a_i b_i`` over the last axis, as one batched product (no product tensor).

    Same-shaped operands are flattened to one ``bmm`` of row by column (half the time of
    the broadcasting product at Garg size, the same sums bit for bit).
    """
    if a.shape == b.shape and a.dim() >= 2 and a.numel() > 0:
        d = a.shape[-1]
        return torch.bmm(a.reshape(-1, 1, d), b.reshape(-1, d, 1)).view(a.shape[:-1])
    return (a.unsqueeze(-2) @ b.unsqueeze(-1))[..., 0, 0]


#: the terms of the last `TERMS_KEPT` statistics that do not depend on the step size
#: (`spectral_terms`): a batch's blocks (7 at Garg size) each keep theirs
_TERMS: list[tuple[PrefixStats, tuple[int, ...], tuple[Tensor, Tensor, Tensor]]] = []
TERMS_KEPT = 16


def spectral_terms(block: PrefixStats) -> tuple[Tensor, Tensor, Tensor]:
    """``β/λ``, ``g = (β/λ) q`` and ``Σ_i g_i`` of ``block``, kept for the next runs on it.

    `align` runs the closed-form learners at many step sizes on one batch's statistics
    (the families, then the step sizes fitted to each layer), block by block
    (`by_blocks`), and these terms were about a fifth of each run's time. Kept for the
    same statistics objects (their tensors held here, so that the identity cannot pass to
    another's) while their tensors are not changed in place (their version counters: a
    user's edit of a statistics' tensors is computed anew); the numbers are those a rerun
    gives, bit for bit.
    """
    for held, versions, terms in _TERMS:
        if _same_tensors(held, versions, block):
            return terms
    base = block.xty_eig * safe_inverse(block.eigvals)  # β/λ, 0 where λ = 0
    g = base * block.query_eig
    total = rowdot(g, torch.ones_like(g))  # exactly what a decay of 1 subtracts
    _TERMS[:] = [*_TERMS[1 - TERMS_KEPT:], (block, _versions(block), (base, g, total))]
    return base, g, total


def from_eigenbasis(stats: PrefixStats, coef: Tensor) -> Tensor:
    """Weights ``V u`` from eigenbasis coefficients ``u [..., batch, pos, n_dims]``."""
    return torch.einsum("bpij,...bpj->...bpi", stats.eigvecs, coef)


def ols_weights(stats: PrefixStats) -> Float[Tensor, "batch pos n_dims"]:
    """Min-norm least squares ``S_t⁺ b_t`` at every prefix (0 at t = 0), in the data's units."""
    w = from_eigenbasis(stats, stats.xty_eig * safe_inverse(stats.eigvals))
    return w * (stats.y_scale / stats.x_scale) if (stats.x_scale, stats.y_scale) != (1, 1) else w


def predict(weights: Tensor, xs: Tensor) -> Tensor:
    """``preds[..., b, t] = weights[..., b, t] · xs[b, t]`` for any leading axes."""
    return (weights * xs.to(weights.dtype)).sum(-1)


def ols_predictions(xs: Tensor, ys: Tensor) -> Float[Tensor, "batch pos"]:
    """Min-norm OLS prefix predictions in the dtype of ``xs``."""
    return predict(ols_weights(prefix_stats(xs, ys)), xs).to(xs.dtype)
