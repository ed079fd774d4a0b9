"""Closed-form ridge, batched over layers, with generalized cross-validation.

For centered features X (N × D) and targets y, one eigendecomposition of XᵀX = V diag(s) Vᵀ
per layer gives every α at once: w(α) = V diag(1/(s + α)) Vᵀ Xᵀy, and in z = Vᵀ Xᵀy
RSS(α) = ‖y‖² − Σ z² (2/(s + α) − s/(s + α)²), df(α) = Σ s/(s + α),
GCV(α) = (RSS/N) / (1 − df/N)².  Axis legend: ``layer``, ``row`` (N), ``feature`` (D).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from iclprobe._linalg import sym_eigh
from iclprobe.errors import InputError, InputTypeError, NonFinite
from iclprobe.probes.inputs import check_axes, check_tensors

DEFAULT_ALPHAS = torch.logspace(-6, 4, 21, dtype=torch.float64)


class RidgeFit(NamedTuple):
    """Per layer: coefficients, intercept, the chosen α and its GCV score."""

    coef: Tensor  # [layer, feature]
    intercept: Tensor  # [layer]
    alpha: Tensor  # [layer]
    gcv: Tensor  # [layer]


class RidgeSums(NamedTuple):
    """Uncentered sums over a block of rows, per layer (they add and subtract across blocks).

    Folds of a cross-fit share them: the training sums of fold k are the total minus fold
    k's, so K fits cost one pass over the rows.
    """

    n: float  # rows
    sx: Tensor  # [layer, feature]
    sy: Tensor  # [layer]
    sxx: Tensor  # [layer, feature, feature]
    sxy: Tensor  # [layer, feature]
    syy: Tensor  # [layer]

    def __add__(self, other: object) -> RidgeSums:  # type: ignore[override]
        assert isinstance(other, RidgeSums)
        return RidgeSums(self.n + other.n, self.sx + other.sx, self.sy + other.sy,
                         self.sxx + other.sxx, self.sxy + other.sxy, self.syy + other.syy)

    def __sub__(self, other: RidgeSums) -> RidgeSums:
        return RidgeSums(self.n - other.n, self.sx - other.sx, self.sy - other.sy,
                         self.sxx - other.sxx, self.sxy - other.sxy, self.syy - other.syy)


class FeatureSums(NamedTuple):
    """The features' part of `RidgeSums`: rows, sums and centred Gram matrix.

    No target changes them: computed once (`feature_sums`), they serve every fit of the
    same rows to another target (`ridge_sums`'s ``features``), the Gram matrix being the
    cost of the sums. The Gram matrix is centred on the block's own mean and blocks add by
    Chan et al.'s pairwise update, so a large offset never squares into ``cgram`` (what
    `held_shares` reads); ``sxx``, the uncentred form `RidgeSums` holds, has it again.
    """

    n: float  # rows
    sx: Tensor  # [layer, feature]
    cgram: Tensor  # [layer, feature, feature]: Σ (x − μ)(x − μ)ᵀ

    def __add__(self, other: object) -> FeatureSums:  # type: ignore[override]
        assert isinstance(other, FeatureSums)
        if not other.n or not self.n:  # an empty block adds nothing (and has no mean)
            return other if not self.n else self
        n = self.n + other.n
        gap = self.sx / self.n - other.sx / other.n  # [layer, feature]
        between = (self.n * other.n / n) * gap[:, :, None] * gap[:, None, :]
        return FeatureSums(n, self.sx + other.sx, self.cgram + other.cgram + between)

    @property
    def sxx(self) -> Tensor:
        """The uncentred Gram matrix ``XᵀX``, as `RidgeSums` holds it."""
        mean = self.sx / self.n
        return self.cgram + self.n * mean[:, :, None] * mean[:, None, :]


def feature_sums(x: Tensor) -> FeatureSums:
    """The `FeatureSums` of ``x [layer, row, feature]`` in float64, layer by layer."""
    sx, gram = [], []
    for layer in range(x.shape[0]):
        xl = x[layer].to(torch.float64)
        sx.append(xl.sum(0))
        xl = xl - sx[-1] / max(xl.shape[0], 1)  # never in place: x may be float64 already
        gram.append(xl.T @ xl)
    return FeatureSums(float(x.shape[1]), torch.stack(sx), torch.stack(gram))


def ridge_sums(x: Tensor, y: Tensor, features: FeatureSums | None = None) -> RidgeSums:
    """The sums of ``x [layer, row, feature]`` and ``y [row]`` or ``[layer, row]``, in float64.

    One layer at a time, so memory stays at one layer's float64 features. ``features``:
    `feature_sums` of the same ``x``, already computed (only the target's sums are then
    computed).
    """
    check_axes("x", x, "layer, row, feature")
    check_tensors(y=y)  # real: a complex y's imaginary part was dropped by the cast
    y = y.expand(x.shape[0], -1) if y.ndim == 1 else y
    if y.shape != x.shape[:2]:
        raise InputError(f"y must have shape [row] or {tuple(x.shape[:2])}, got {tuple(y.shape)}")
    if features is not None and (features.n != x.shape[1] or features.sx.shape != (
            x.shape[0], x.shape[2])):
        raise InputError(f"features must be the sums of {x.shape[1]} rows of {x.shape[0]} "
                         f"layers x {x.shape[2]} features, got {features.n:g} rows of "
                         f"{tuple(features.sx.shape)}")
    if features is not None:
        _check_same_rows(x, features)
    out: list[list[Tensor]] = [[], [], [], [], []]
    for layer in range(x.shape[0]):
        xl, yl = x[layer].to(torch.float64), y[layer].to(torch.float64)
        for i, v in enumerate((yl.sum(), xl.T @ yl, yl @ yl)):
            out[i].append(v)
        if features is None:
            out[3].append(xl.sum(0))
            out[4].append(xl.T @ xl)
    sy, sxy, syy = (torch.stack(v) for v in out[:3])
    if features is None:
        sx, sxx = torch.stack(out[3]), torch.stack(out[4])
    else:
        sx, sxx = features.sx, features.sxx
    return RidgeSums(float(x.shape[1]), sx, sy, sxx, sxy, syy)


def _check_same_rows(x: Tensor, features: FeatureSums) -> None:
    """Refuse ``features`` that are not the sums of ``x``'s own rows (as many rows are not).

    Their column sums must agree within 1e-5 of a bound on each column's Σ|x|,
    ``√(n Σ x²) ≥ Σ |x|`` (from the features themselves): ``x`` summed in its own dtype,
    float32 at least (half precision is summed in float32), whose error, at most ~4e-7 of
    Σ|x| in float32 (cascade sums), is 25 times under it; the sums of other rows differ by
    about √n times a value, this bound's 1e-5 · n times.
    """
    sums = x.sum(1, dtype=torch.promote_types(x.dtype, torch.float32)).to(torch.float64)
    sxx = features.cgram.diagonal(dim1=1, dim2=2) + features.sx.pow(2) / max(features.n, 1.0)
    tol = 1e-5 * (features.n * sxx.clamp(min=0)).sqrt()
    over = (features.sx.to(sums) - sums).abs() - tol
    if not bool((over <= 0).all()):
        layer, feature = divmod(int(over.nan_to_num(math.inf).flatten().argmax()), over.shape[1])
        raise InputError(
            f"features must be the sums of x's own rows: at layer {layer}, feature {feature} "
            f"they sum to {float(features.sx[layer, feature]):.6g} where x's rows sum to "
            f"{float(sums[layer, feature]):.6g} (tolerance {float(tol[layer, feature]):.3g})")


def _moments(sums: RidgeSums, fit_intercept: bool
             ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Means and centered Gram matrices (``XᵀX − N μ μᵀ``) from the sums."""
    n = sums.n
    if fit_intercept:
        mx, my = sums.sx / n, sums.sy / n
    else:
        mx, my = torch.zeros_like(sums.sx), torch.zeros_like(sums.sy)
    gram = sums.sxx - n * mx[:, :, None] * mx[:, None, :]
    xty = sums.sxy - n * mx * my[:, None]
    yy = sums.syy - n * my * my
    return mx, my, gram, xty, yy


def _finite_layers(sums: RidgeSums) -> list[bool]:
    """Per layer, whether every sum is finite."""
    parts = (sums.sx, sums.sy[:, None], sums.sxx.flatten(1), sums.sxy, sums.syy[:, None])
    return torch.cat([torch.isfinite(p) for p in parts], 1).all(1).tolist()


def ridge_gcv(x: Tensor, y: Tensor, alphas: Tensor | float | None = None,
              fit_intercept: bool = True) -> RidgeFit:
    """Ridge per layer on ``x [layer, row, feature]``, ``y [row]`` or ``[layer, row]``.

    ``alphas``: one α for all layers, or a grid from which GCV picks per layer (default
    1e-6 … 1e4). Computed in float64.
    """
    return ridge_from_sums(ridge_sums(x, y), alphas, fit_intercept)


def alpha_grid(alphas: Tensor | float | None) -> Tensor:
    """``alphas`` as a flat float64 grid (None: `DEFAULT_ALPHAS`), else an `InputError`.

    At least one α, each finite and >= 0 (a number, a sequence or a tensor of them).
    """
    try:
        grid = DEFAULT_ALPHAS if alphas is None else torch.as_tensor(alphas, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise InputTypeError(f"alphas must be a number or a tensor of numbers, got "
                             f"{alphas!r:.60}") from None
    grid = grid.reshape(-1)
    if grid.numel() == 0:
        raise InputError(f"alphas must hold at least one α (the grid GCV picks from; None: "
                         f"the default grid), got {alphas!r:.60}")
    if not bool((grid >= 0).all() & grid.isfinite().all()):
        raise InputError(f"alphas must be finite and >= 0, got {grid.tolist()}")
    return grid


def ridge_from_sums(sums: RidgeSums, alphas: Tensor | float | None = None,
                    fit_intercept: bool = True) -> RidgeFit:
    """`ridge_gcv` from precomputed sums (e.g. the training rows of one cross-fit fold)."""
    n_rows = sums.n
    grid = alpha_grid(alphas)
    bad = [layer for layer, ok in enumerate(_finite_layers(sums)) if not ok]
    if bad:
        raise NonFinite(f"the probes' sums of layers {bad} hold NaN or Inf: the residuals "
                         "at the fitted positions are not finite there, or their squares "
                         "overflow float64 (values beyond about 1e150): rescale them")
    mx, my, gram, xty, yy = _moments(sums, fit_intercept)
    s, v = sym_eigh(gram, "the probes' Gram matrix")
    s = s.clamp(min=0.0)
    z = (v.transpose(1, 2) @ xty[..., None])[..., 0]  # [layer, feature]
    den = s[:, None, :] + grid[None, :, None]  # [layer, alpha, feature]
    inv = torch.where(den > 0, 1.0 / torch.where(den > 0, den, 1.0), 0.0)
    rss = yy[:, None] - (z[:, None] ** 2 * (2 * inv - s[:, None] * inv**2)).sum(-1)
    df = (s[:, None] * inv).sum(-1) + (1.0 if fit_intercept else 0.0)
    gcv = (rss.clamp(min=0) / n_rows) / (1 - df / n_rows).clamp(min=1e-12) ** 2
    best = gcv.argmin(1)  # [layer]
    layers = torch.arange(gram.shape[0])
    chosen_inv = inv[layers, best]  # [layer, feature]
    coef = (v @ (z * chosen_inv)[..., None])[..., 0]
    intercept = my - (mx * coef).sum(-1)
    return RidgeFit(coef, intercept, grid[best], gcv[layers, best])


def ridge_at(sums: RidgeSums, alpha: Tensor, fit_intercept: bool = True) -> RidgeFit:
    """Ridge per layer at a given α per layer (``[layer]``, no search), from sums.

    The fit `ridge_from_sums` would make with its grid reduced to each layer's α (its GCV
    score included).
    """
    n_rows = sums.n
    alpha = torch.as_tensor(alpha, dtype=torch.float64).reshape(-1)
    if alpha.numel() != sums.sx.shape[0] or not bool((alpha >= 0).all()):
        raise InputError(f"alpha must hold one value >= 0 per layer ({sums.sx.shape[0]}), got "
                         f"{alpha.tolist()}")
    mx, my, gram, xty, yy = _moments(sums, fit_intercept)
    s, v = sym_eigh(gram, "the probes' Gram matrix")
    s = s.clamp(min=0.0)
    z = (v.transpose(1, 2) @ xty[..., None])[..., 0]  # [layer, feature]
    den = s + alpha[:, None]
    inv = torch.where(den > 0, 1.0 / torch.where(den > 0, den, 1.0), 0.0)
    rss = yy - (z**2 * (2 * inv - s * inv**2)).sum(-1)
    df = (s * inv).sum(-1) + (1.0 if fit_intercept else 0.0)
    gcv = (rss.clamp(min=0) / n_rows) / (1 - df / n_rows).clamp(min=1e-12) ** 2
    coef = (v @ (z * inv)[..., None])[..., 0]
    return RidgeFit(coef, my - (mx * coef).sum(-1), alpha, gcv)


def ridge_coef_at(sums: RidgeSums, alpha: Tensor, fit_intercept: bool = True
                  ) -> tuple[Tensor, Tensor]:
    """`ridge_at`'s coefficients and intercept alone, by a Cholesky solve where it holds.

    ``(XᵀX + αI) w = Xᵀy`` per layer; where α is 0 or the factorization fails (a Gram
    matrix far beyond α's scale), `ridge_at`'s eigendecomposition instead. A quarter of its
    time at probe sizes (no eigenvectors, no GCV score).
    """
    alpha = torch.as_tensor(alpha, dtype=torch.float64).reshape(-1)
    if alpha.numel() != sums.sx.shape[0] or not bool((alpha > 0).all()):
        fit = ridge_at(sums, alpha, fit_intercept)
        return fit.coef, fit.intercept
    mx, my, gram, xty, _ = _moments(sums, fit_intercept)
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype)
    chol, info = torch.linalg.cholesky_ex(gram + alpha[:, None, None] * eye)
    if bool((info != 0).any()):
        fit = ridge_at(sums, alpha, fit_intercept)
        return fit.coef, fit.intercept
    coef = torch.cholesky_solve(xty[..., None], chol)[..., 0]
    return coef, my - (mx * coef).sum(-1)
