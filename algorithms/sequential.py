"""Online GD: a learner whose iterates are not functions of S_t alone.

Axis legend: ``batch``, ``pos`` (prefix t), ``n_dims``. Batched over every prefix and
sequence. Online GD is sequential within a pass, but a pass over prefix t is an affine
map of w built from prefix t − 1's by one rank-one update: the maps are built once (a loop
over examples) and each pass is one batched matrix-vector product.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from iclprobe._finite import all_finite
from iclprobe.algorithms import families
from iclprobe.algorithms.base import Iterates, check_steps, register
from iclprobe.algorithms.numerics import (
    check_positive,
    finish,
    fixed_number,
    log2,
    out_dtype,
    rescale,
    scaled_number,
)
from iclprobe.algorithms.prefix import check_real, rowdot, safe_inverse, scaled
from iclprobe.errors import InputError
from iclprobe.tasks import as_generator


def _record(k_steps: Tensor, weights_at: dict[int, Tensor], x: Tensor, want: bool
            ) -> tuple[Tensor, Tensor | None]:
    w = torch.stack([weights_at[k] for k in k_steps.tolist()])  # [step, batch, pos, n_dims]
    return (w * x).sum(-1), (w if want else None)


def initial_weights(init: str | Tensor, shape: tuple[int, int, int],
                     generator: torch.Generator | int | None, device: torch.device) -> Tensor:
    """The starting w of every prefix, ``[batch, pos, n_dims]`` in float64."""
    if isinstance(init, Tensor):
        check_real("init", init, "[batch, pos, n_dims]")
        if init.shape != shape:
            raise InputError(f"init must have shape {list(shape)}, got {tuple(init.shape)}")
        if not all_finite(init):
            raise InputError("init must be finite (found NaN or Inf)")
        return init.to(device=device, dtype=torch.float64).clone()
    if init == "zero":
        return torch.zeros(shape, dtype=torch.float64, device=device)
    if init == "uniform":
        gen = as_generator(0 if generator is None else generator)
        return torch.rand(shape, generator=gen, dtype=torch.float64).to(device)
    raise InputError(f"init must be 'zero', 'uniform' or a [batch, pos, n_dims] tensor, "
                     f"got {init!r}")


def _pass_maps(x: Tensor, y: Tensor, eta: Tensor) -> tuple[Tensor, Tensor]:
    """One pass of online GD over each prefix as an affine map ``wᵀ -> wᵀ A_tᵀ + c_tᵀ``.

    Example j maps ``w -> (I − η_j x_j x_jᵀ) w + η_j y_j x_j``; a pass over prefix t applies
    examples 0..t−1 in order, so ``A_{t+1} = (I − η_t x_t x_tᵀ) A_t`` and likewise ``c_t``:
    one rank-one update per example builds every prefix's map. Returned flattened for
    batched row-vector products (the faster layout): ``A_tᵀ [batch·pos, n_dims, n_dims]``,
    ``c_tᵀ [batch·pos, 1, n_dims]``.
    """
    b, n, d = x.shape
    step = eta[..., None] * x  # η_j x_j, [batch, pos, n_dims]
    maps = torch.empty(b, n, d, d, dtype=x.dtype, device=x.device)  # A_tᵀ
    shifts = torch.empty(b, n, d, dtype=x.dtype, device=x.device)  # c_t
    maps[:, 0] = torch.eye(d, dtype=x.dtype, device=x.device)
    shifts[:, 0] = 0.0
    for j in range(n - 1):
        a_x = maps[:, j] @ x[:, j, :, None]  # A_jᵀ x_j, [batch, n_dims, 1]
        torch.addcmul(maps[:, j], a_x, step[:, j, None, :], value=-1.0, out=maps[:, j + 1])
        resid = (x[:, j] * shifts[:, j]).sum(-1) - y[:, j]  # x_jᵀ c_j − y_j, [batch]
        torch.addcmul(shifts[:, j], step[:, j], resid[:, None], value=-1.0, out=shifts[:, j + 1])
    return maps.view(b * n, d, d), shifts.view(b * n, 1, d)


#: Sequences per block: a block's pass maps (pos · n_dims² float64 per sequence) take
#: about 8 MB, so they are built and used while in cache, in memory reused between blocks.
BLOCK_BYTES = 2**23


def _passes(x: Tensor, y: Tensor, eta: Tensor, start: Tensor, k_max: int) -> Tensor:
    """Every prefix's ``w_k`` after k = 0..k_max passes, ``[k_max + 1, batch, pos, n_dims]``.

    Each pass is ``wᵀ <- wᵀ A_tᵀ + c_tᵀ`` for every prefix (see `_pass_maps`), block by
    block of sequences.
    """
    b, n, d = x.shape
    out = start.new_empty(k_max + 1, b, n, d)
    out[0] = start
    seqs = max(1, BLOCK_BYTES // max(1, n * d * d * x.element_size()))
    for lo in range(0, b, seqs):
        rows = slice(lo, lo + seqs)
        maps, shifts = _pass_maps(x[rows], y[rows], eta[rows])
        flat = out[:, rows].flatten(1, 2).unsqueeze(2)  # [k, sequences·pos, 1, n_dims], a view
        for k in range(1, k_max + 1):
            torch.baddbmm(shifts, flat[k - 1], maps, out=flat[k])
    return out


@register("online_gd", label="online GD", steps=range(1, 9), step_scale="log2",
          align_hyper={"lr": "normalized", "init": "zero"}, align=True, order=2, compare_with=(),
          family=families.ONLINE_GD)
def online_gd(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
              lr: float | str = "normalized", weights: bool = True,
              init: str | Tensor = "zero",
              generator: torch.Generator | int | None = None,
              lr_scale: float = 1.0) -> Iterates:
    """Online (single-example) GD; step k = k passes over the prefix's examples.

    Each update is ``w <- w − η_j x_j (x_jᵀ w − y_j)`` for j = 0..t−1 in order, with
    ``η_j = lr`` or, for ``lr="normalized"``, ``1/‖x_j‖²`` (Kaczmarz: each update fits
    example j exactly); ``lr_scale`` multiplies either (``lr="normalized", lr_scale=0.5``:
    relaxed Kaczmarz, ``η_j = 0.5/‖x_j‖²``). ``init``: "zero" (w = 0), "uniform" (each
    prefix's w drawn from
    U[0, 1)^d with ``generator``, as Fu et al.'s code draws ``torch.rand``), or a tensor
    ``[batch, pos, n_dims]``. Prefix t = 0 has no examples and predicts 0 in every case. A
    number lr is stable for ``lr < 2/max‖x_j‖²``; iterates that overflow raise a ValueError.
    """
    k_steps = check_steps(steps)
    x, y, sx, sy = scaled(xs, ys)
    if lr != "normalized":
        lr = check_positive(lr, "lr")
    lr_scale = check_positive(lr_scale, "lr_scale")
    rate = rescale(lr, sx, 2) * lr_scale if isinstance(lr, float) else 0.0
    b, n, d = x.shape
    w = initial_weights(init, (b, n, d), generator, xs.device)  # one w per prefix
    if (sx, sy) != (1.0, 1.0) and not (isinstance(init, str) and init == "zero"):
        w = w * (sx / sy)  # the start in the units of the scaled data (0 stays 0: sx / sy
        # may overflow on data scaled far apart, and 0 · inf is NaN)
    w[:, 0] = 0.0
    eta = safe_inverse(x.pow(2).sum(-1)) * lr_scale if lr == "normalized" else \
        torch.full_like(y, rate)
    passes = _passes(x, y, eta, w, int(k_steps.max()))  # [pass, batch, pos, n_dims]

    def unstable() -> str | None:
        top = x[:, :-1].pow(2).sum(-1).max().item() if n > 1 else 0.0
        if lr == "normalized":
            return None if lr_scale < 2 else (
                f"lr_scale={lr_scale!r} with lr='normalized' (relaxed Kaczmarz) diverges: "
                "each update overshoots its example; keep lr_scale below 2")
        if top == 0 or rate < 2.0 / top:
            return None
        largest = scaled_number(2.0 / top / lr_scale, -2 * log2(sx))
        return (f"lr={lr!r} diverges on these data (the iterates grow without bound): the "
                f"largest stable lr here is 2/max‖x_j‖² = {largest}")

    preds = torch.stack([rowdot(passes[k], x) for k in k_steps.tolist()])
    ws = passes[k_steps] if weights else None
    hyper = {"lr": lr, "init": init if isinstance(init, str) else "given",
             **({"lr_scale": lr_scale} if lr_scale != 1.0 else {})}
    return finish("online_gd", k_steps, preds, ws, hyper, out_dtype(xs), (sx, sy), unstable,
                  ys=ys if fixed_number(lr) or lr_scale >= 2 else None)  # growth: refused
