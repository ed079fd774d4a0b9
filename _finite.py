"""Whether tensors are finite, from their sums: one reduction, no tensor of flags.

``torch.isfinite(t).all()`` writes a flag per element and then reads them: on the
residual streams `align` checks (tens of millions of elements) that is most of a check's
time. A sum is finite only where every term is (a NaN or an infinity makes it NaN or
infinite), so a finite sum answers at once; a sum that is not finite (which finite terms
give only by overflowing the dtype's range) falls back to the elementwise test, so the
answer is exactly ``torch.isfinite(t).all()``'s.
"""

from __future__ import annotations

import torch
from torch import Tensor


def all_finite(t: Tensor) -> bool:
    """``bool(torch.isfinite(t).all())``: whether every element of ``t`` is finite.

    True for an empty tensor; integer and boolean tensors are finite.
    """
    if not (t.is_floating_point() or t.is_complex()):
        return True
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def finite_rows(t: Tensor) -> Tensor:
    """``torch.isfinite(t).flatten(1).all(1)``: whether each ``t[i]`` is finite throughout.

    ``[t.shape[0]]``; ``t`` has at least one dimension.
    """
    if not (t.is_floating_point() or t.is_complex()):
        return torch.ones(t.shape[0], dtype=torch.bool, device=t.device)
    if t.ndim == 1:
        return torch.isfinite(t)
    ok = torch.isfinite(t.sum(tuple(range(1, t.ndim))))  # no copy of a strided view
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:, 0]
        ok[bad] = torch.isfinite(t[bad]).flatten(1).all(1)
    return ok
