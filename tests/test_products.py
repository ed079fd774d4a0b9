"""The batched products behind the learners and the similarity tables, against references.

`rowdot` and `similarities._cross` are written as one `bmm` on reshaped views for speed;
each is compared with the plain elementwise sum it stands for (numpy's, in float64), so a
wrong reshape or axis order fails here before it moves any benchmark count. Tolerances,
not bit equality: the order of a BLAS kernel's sums is not portable across machines.
"""

import numpy as np
import pytest
import torch

from iclprobe.algorithms.prefix import rowdot
from iclprobe.alignment.measuring.similarities import _cross


@pytest.mark.parametrize("shape", [(3, 5, 4), (2, 1, 7), (6, 3)])
def test_rowdot_is_the_sum_over_the_last_axis(shape):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(*shape, generator=g, dtype=torch.float64)
    b = torch.randn(*shape, generator=g, dtype=torch.float64)
    want = (a.numpy() * b.numpy()).sum(-1)
    np.testing.assert_allclose(rowdot(a, b).numpy(), want, rtol=1e-12, atol=1e-12)
    # broadcast operands take the general path, to the same sums
    np.testing.assert_allclose(rowdot(a, b[..., :1, :].expand_as(b)).numpy(),
                               (a.numpy() * b.numpy()[..., :1, :]).sum(-1), rtol=1e-12,
                               atol=1e-12)


def test_rowdot_of_no_positions_is_empty():
    a = torch.zeros(4, 0, 3, dtype=torch.float64)
    assert rowdot(a, a).shape == (4, 0)


def test_cross_is_the_per_sequence_product_of_layers_and_columns():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 5, 9, generator=g, dtype=torch.float64)[..., 2:]  # a window: a view
    b = torch.randn(11, 5, 9, generator=g, dtype=torch.float64)[..., 2:]
    want = np.einsum("lbt,kbt->lkb", a.numpy(), b.numpy())
    got = _cross(a, b)
    assert got.shape == (3, 11, 5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
