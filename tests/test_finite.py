"""`all_finite` and `finite_rows` against torch's elementwise test, case by case.

Each answer is compared with ``torch.isfinite(t).all()`` (or ``.flatten(1).all(1)``) on
the same tensor: the sums they read first must never change it, including where finite
terms overflow their sum (the fallback's case) and on strided views.
"""

from __future__ import annotations

import pytest
import torch

from iclprobe._finite import all_finite, finite_rows


def _cases() -> list[torch.Tensor]:
    big = torch.finfo(torch.float32).max
    base = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(0))
    cases = [base, base.double(), base.half(), base[:, ::2, 1:].transpose(0, 2),
             torch.tensor([big, big]),  # finite terms, an infinite sum
             torch.tensor([65504.0, 65504.0], dtype=torch.float16),
             torch.tensor([float("inf"), -float("inf")]),  # a NaN sum
             torch.empty(0), torch.empty(3, 0), torch.arange(6), torch.ones(3, dtype=torch.bool),
             torch.tensor([1 + 2j, 3 - 1j]), torch.tensor([complex(1, float("nan"))]),
             torch.tensor(2.5), torch.tensor(float("nan"))]
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = base.clone()
        t[2, 3, 1] = bad
        cases += [t, t[:, ::2].transpose(0, 1), t.double()]
    return cases


@pytest.mark.parametrize("t", _cases(), ids=lambda t: f"{t.dtype}{tuple(t.shape)}")
def test_all_finite_is_isfinite_all(t: torch.Tensor) -> None:
    assert all_finite(t) is bool(torch.isfinite(t).all())


@pytest.mark.parametrize("t", [t for t in _cases() if t.ndim >= 1],
                         ids=lambda t: f"{t.dtype}{tuple(t.shape)}")
def test_finite_rows_is_isfinite_per_row(t: torch.Tensor) -> None:
    want = torch.isfinite(t) if t.ndim == 1 else torch.isfinite(t).flatten(1).all(1)
    assert torch.equal(finite_rows(t), want)


def test_finite_rows_mixed_rows_and_overflow() -> None:
    big = torch.finfo(torch.float64).max
    t = torch.zeros(5, 3, 2, dtype=torch.float64)
    t[1, 0, 0] = float("nan")
    t[2, :, 0] = big  # finite, its row's sum overflows
    t[3, 2, 1] = -float("inf")
    assert finite_rows(t).tolist() == [True, False, True, False, True]
    assert finite_rows(t[:, :, 1]).tolist() == [True, True, True, False, True]
