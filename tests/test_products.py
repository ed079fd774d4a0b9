"""The batched products behind the learners and the similarity tables, against references.

`rowdot`, `products._cross` and `products._cross_weights` are written as one `bmm` on
reshaped views for speed; each is compared with the plain elementwise sum it stands for
(numpy's, in float64), so a wrong reshape or axis order fails here before it moves any
benchmark count. Tolerances, not bit equality: the order of a BLAS kernel's sums is not
portable across machines.
`similarity_values` is compared with `similarity`'s values bit for bit: both run the same
kernels on the same chunks in one process, so equality is the claim (no BLAS order enters
between them).
"""

import numpy as np
import pytest
import torch

from iclprobe.algorithms.base import Iterates
from iclprobe.algorithms.prefix import rowdot
from iclprobe.alignment.measuring.products import _cross, _cross_weights
from iclprobe.alignment.measuring.similarities import _resampled, similarity, similarity_values
from iclprobe.errors import InputError


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


def test_cross_weights_is_the_per_position_product_of_layers_and_columns():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(3, 5, 9, 4, generator=g, dtype=torch.float64)[:, :, 2:]  # a window
    b = torch.randn(11, 5, 9, 4, generator=g, dtype=torch.float64)[:, :, 2:]
    want = np.einsum("lbtd,kbtd->lkbt", a.numpy(), b.numpy())
    got = _cross_weights(a, b)
    assert got.shape == (3, 11, 5, 7)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pos,m", [(1, 1), (4, 3)])
def test_resampled_is_each_resamples_weighted_mean(pos, m):
    g = torch.Generator().manual_seed(4)
    mom = torch.randn(3, 5, 7, pos, m, generator=g, dtype=torch.float64)  # [L, K, batch, ...]
    weights = torch.rand(6, 7, generator=g, dtype=torch.float64)  # [boot, batch]
    want = np.einsum("lkbtm,rb->lkrtm", mom.numpy(), weights.numpy())
    got = _resampled(mom, weights)
    assert got.shape == (3, 5, 6, pos, m)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("metric,over", [("error_cosine", "positions"), ("spd", "positions"),
                                         ("weight_cosine", "positions"), ("ilwd", "positions"),
                                         ("error_cosine", "sequences")])
def test_similarity_values_are_the_tables_values(metric, over):
    """The values alone equal the full table's, column chunks included (chunk 4 of 11)."""
    g = torch.Generator().manual_seed(2)
    ys = torch.randn(6, 9, generator=g, dtype=torch.float64)
    on_w = metric in ("weight_cosine", "ilwd")
    shape = (11, 6, 9, 3) if on_w else (11, 6, 9)
    cols = torch.randn(*shape, generator=g, dtype=torch.float64)
    layers = torch.randn(4, *shape[1:], generator=g, dtype=torch.float64)
    it = Iterates(torch.arange(11), cols if not on_w else cols[..., 0], cols if on_w else None,
                  {}, "x")
    kw = {"t_min": 2, "t_max": 7, "over": over, "chunk": 4}
    want = similarity(layers, it, ys, metric, n_boot=3, **kw).values
    got = similarity_values(layers, it, ys, metric, **kw)
    assert got.shape == (4, 11)
    assert torch.equal(got, want)


def test_similarity_values_check_their_arguments():
    it = Iterates(torch.arange(2), torch.zeros(2, 3, 5), None, {}, "x")
    with pytest.raises(InputError, match="layer_values must have shape"):
        similarity_values(torch.zeros(1, 3, 4), it, torch.ones(3, 5))
    with pytest.raises(InputError, match="needs the learner's weights"):
        similarity_values(torch.zeros(1, 3, 5), it, torch.ones(3, 5), "weight_cosine")
