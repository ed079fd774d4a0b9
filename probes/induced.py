"""Induced weights: the linear predictor a model (or layer, or learner) applies at prefix t.

Least squares on fresh queries x̃ ~ N(0, Σ) per prefix (Fu et al. Eq. 7–8; Akyürek et
al.'s ILWD), with the fit's R² telling how linear the predictor is; or the gradient
∂ŷ/∂x_q at the real query (von Oswald et al.). Axis legend: ``batch``, ``pos``, ``query``
(T), ``n_dims``; the predictor may return extra leading axes (e.g. ``layer``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, overload

import torch
from jaxtyping import Float
from torch import Tensor

from iclprobe.errors import InputError
from iclprobe.probes.inputs import check_axes
from iclprobe.tasks import as_generator
from iclprobe.tasks.covariance import check_covariance

PredictFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def sample_queries(shape: tuple[int, int, int, int], cov: Tensor | None,
                   generator: torch.Generator | int) -> Tensor:
    """Queries ``[batch, pos, T, d]`` from N(0, Σ) (Σ ``[d, d]``, ``[batch, d, d]`` or I)."""
    b, n, t, d = shape
    z = torch.randn(b, n, t, d, generator=as_generator(generator), dtype=torch.float64)
    if cov is None:
        return z
    cov = check_covariance(cov, d, "cov", batch=b, condition=False)
    chol = torch.linalg.cholesky(cov)
    if chol.ndim == 2:
        return z @ chol.T
    return torch.einsum("bntd,bed->bnte", z, chol)


@overload
def induced_weights(predict_fn: PredictFn, xs: Tensor, ys: Tensor, n_queries: int,
                    cov: Tensor | None = ..., generator: torch.Generator | int = ...,
                    return_r2: Literal[False] = ...) -> Tensor: ...


@overload
def induced_weights(predict_fn: PredictFn, xs: Tensor, ys: Tensor, n_queries: int,
                    cov: Tensor | None = ..., generator: torch.Generator | int = ...,
                    *, return_r2: Literal[True]) -> tuple[Tensor, Tensor]: ...


def induced_weights(predict_fn: PredictFn, xs: Tensor, ys: Tensor, n_queries: int,
                    cov: Tensor | None = None, generator: torch.Generator | int = 0,
                    return_r2: bool = False
                    ) -> Float[Tensor, "*lead batch pos n_dims"] | tuple[Tensor, Tensor]:
    """Least-squares weights w̃ with ``predict_fn(xs, ys, x̃) ≈ x̃ᵀ w̃`` at every prefix.

    Args:
        predict_fn: ``(xs, ys, queries [B, n, T, d]) -> [*lead, B, n, T]`` (a model's
            ``predict_queries``, a `LayerProbes`' ``predict_queries``, a learner's).
        xs, ys: the context, ``[B, n, d]`` and ``[B, n]``.
        n_queries: T ≥ d fresh queries per prefix.
        cov: Σ of the queries (default I).
        generator: the source of the queries (a generator or int seed).
        return_r2: also return the fit's uncentered R² per prefix (1: exactly linear).

    A prefix where ``predict_fn`` is not finite gets weights that are not finite, and no
    other prefix is touched: a model valid only at its trained length is read there (the
    caller, e.g. `align`, says which prefixes it uses).
    """
    check_axes("xs", xs, "batch, pos, n_dims")
    b, n, d = xs.shape
    if not isinstance(n_queries, int) or n_queries < d:
        raise InputError(f"n_queries must be an integer >= n_dims={d}, got {n_queries!r}")
    queries = sample_queries((b, n, n_queries, d), cov, generator)
    with torch.no_grad():
        preds = predict_fn(xs, ys, queries.to(xs.dtype)).to(torch.float64)
    if preds.shape[-3:] != (b, n, n_queries):
        raise InputError(f"predict_fn must return [..., {b}, {n}, {n_queries}], "
                         f"got {tuple(preds.shape)}")
    gram = queries.transpose(-1, -2) @ queries  # [B, n, d, d]
    rhs = torch.einsum("bntd,...bnt->...bnd", queries, preds)
    weights = torch.linalg.solve(gram, rhs.unsqueeze(-1)).squeeze(-1)
    if not return_r2:
        return weights.to(xs.dtype)
    fitted = torch.einsum("bntd,...bnd->...bnt", queries, weights)
    total = preds.pow(2).sum(-1)
    r2 = 1 - (preds - fitted).pow(2).sum(-1) / torch.where(total > 0, total, 1.0)
    return weights.to(xs.dtype), r2.to(xs.dtype)


def gradient_weights(predict_fn: PredictFn, xs: Tensor, ys: Tensor,
                     queries: Tensor | None = None) -> Float[Tensor, "batch pos n_dims"]:
    """``∂ŷ/∂x_q`` at each prefix's query (default: the real ``xs[:, t]``), von Oswald et al.

    Each prediction depends only on its own query, so one backward pass of the summed
    predictions gives every gradient at once.
    """
    q = (xs[:, :, None] if queries is None else queries).detach().clone().requires_grad_(True)
    if q.shape[2] != 1:
        raise InputError(f"queries must have shape [batch, pos, 1, n_dims], got {tuple(q.shape)}")
    with torch.enable_grad():
        preds = predict_fn(xs, ys, q)
        (grad,) = torch.autograd.grad(preds.sum(), q)
    return grad[:, :, 0]
