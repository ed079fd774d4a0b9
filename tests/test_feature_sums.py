"""The residual's Gram matrix computed once: `FeatureSums`, and the fits that share it.

`align` forms each layer's Gram matrix for two fits of the same rows: the shares of the
columns each layer's probe target is chosen from (`held_shares`) and the cross-fitted
probes (`cross_fit`). Computed once per fold (`fold_features`), the Gram matrices must give
what each fit computes on its own, to round-off; and the readout noise, read for every
draw in one product (`_read_many`), what reading each draw alone gives.
"""

import numpy as np
import pytest
import torch
from helpers import tiny_gpt

from iclprobe import probes
from iclprobe.probes import crossfit
from iclprobe.probes.ridge import feature_sums, ridge_sums


def _features(gen: torch.Generator, offset: float = 0.0) -> torch.Tensor:
    """``[layer 2, batch 24, pos 7, width 5]`` in float64, one channel far from 0."""
    x = torch.randn(2, 24, 7, 5, generator=gen, dtype=torch.float64)
    x[..., 2] += offset
    return x


def test_blocks_add_up_to_the_centred_gram_matrix_of_every_row():
    """Chan's pairwise update against numpy's covariance of all rows.

    With an offset of 1e6 the uncentred route (XᵀX − N μ μᵀ) loses about 12 digits; the
    blocks, each centred on its own mean, agree with numpy to 1e-10.
    """
    x = _features(torch.Generator().manual_seed(0), offset=1e6).flatten(1, 2)  # [2, 168, 5]
    blocks = [feature_sums(x[:, a:b]) for a, b in ((0, 50), (50, 51), (51, 168))]
    total = blocks[0] + blocks[1] + blocks[2]
    assert total.n == 168
    for layer in range(2):
        rows = x[layer].numpy()
        want = np.cov(rows, rowvar=False, bias=True) * rows.shape[0]
        np.testing.assert_allclose(total.cgram[layer].numpy(), want, rtol=1e-10, atol=1e-8)
        np.testing.assert_allclose(total.sx[layer].numpy(), rows.sum(0), rtol=1e-14)
    naive = ridge_sums(x, x[0, :, 0]).sxx  # XᵀX, as the uncentred sums hold it
    torch.testing.assert_close(total.sxx, naive, rtol=1e-13, atol=0.0)


def test_ridge_sums_given_their_features_equal_the_sums_computed_whole():
    gen = torch.Generator().manual_seed(1)
    x = _features(gen, offset=3.0).flatten(1, 2)
    y = torch.randn(2, x.shape[1], generator=gen, dtype=torch.float64)
    whole, shared = ridge_sums(x, y), ridge_sums(x, y, feature_sums(x))
    for a, b in zip(whole, shared):
        torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-12, atol=1e-9)
    with pytest.raises(ValueError, match="features must be the sums of 168 rows of 2 layers "
                                         "x 5 features, got 10 rows"):
        ridge_sums(x, y, feature_sums(x[:, :10]))


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_held_shares_from_the_folds_gram_matrices_equal_the_shares_computed_whole(offset):
    """The shares of columns the layer holds (to round-off), nearly holds, and does not."""
    gen = torch.Generator().manual_seed(2)
    resid = _features(gen, offset)
    beta = torch.tensor([0.5, -1.0, 2.0, 1.5, 0.0], dtype=torch.float64)
    held = resid[1] @ beta + 3.0
    near = 0.01 * (1 + offset) * torch.randn(24, 7, generator=gen, dtype=torch.float64)
    columns = torch.stack([held, held + near,
                           torch.randn(24, 7, generator=gen, dtype=torch.float64)])
    folds = probes.fold_features(resid, 4, 2)
    total = folds[0] + folds[1] + folds[2] + folds[3]
    whole = probes.held_shares(resid, columns, 2)
    shared = probes.held_shares(resid, columns, 2, features=total)
    torch.testing.assert_close(shared, whole, rtol=1e-7, atol=1e-12)
    assert shared[1, 0] < 1e-9 < shared[1, 1] < 1e-3 < 0.5 < shared[1, 2]
    with pytest.raises(ValueError, match="features must be the sums of the 120 rows"):
        probes.held_shares(resid, columns, 2, features=folds[0])


def test_cross_fit_given_the_folds_features_equals_the_fit_computed_whole():
    gen = torch.Generator().manual_seed(3)
    resid = _features(gen, offset=2.0)
    ys = torch.randn(24, 7, generator=gen, dtype=torch.float64)
    targets = torch.randn(2, 24, 7, generator=gen, dtype=torch.float64)
    model = tiny_gpt()  # only named by the fit; the features are synthetic
    whole = probes.cross_fit(model, resid, ys, folds=4, t_min=1, targets=targets)
    shared = probes.cross_fit(model, resid, ys, folds=4, t_min=1, targets=targets,
                              features=probes.fold_features(resid, 4, 1))
    torch.testing.assert_close(shared.preds, whole.preds, rtol=1e-9, atol=1e-11)
    with pytest.raises(ValueError, match="features must be 4 FeatureSums"):
        probes.cross_fit(model, resid, ys, folds=4, t_min=1,
                         features=probes.fold_features(resid, 3, 1))


def test_the_readout_noise_read_in_one_product_equals_each_draw_read_alone():
    gen = torch.Generator().manual_seed(4)
    resid = _features(gen).float()  # a model's residuals are float32; the reads float64
    ys = torch.randn(24, 7, generator=gen, dtype=torch.float64)
    fit = probes.cross_fit(tiny_gpt(), resid, ys, folds=4, t_min=1)
    draws = probes.readout_noise(fit, resid).draws
    assert draws.shape == (3, 2, 24, 7)
    for k, (a, b) in enumerate(fit.folds):
        keep = [j for j in range(len(fit.sums)) if j != k]
        alpha = fit.fit_on(keep).alpha
        for r in range(3):
            coef, icpt = crossfit._half_difference(fit, keep[r:] + keep[:r], alpha)
            alone = torch.stack([torch.einsum("bnd,d->bn", layer.double(), c) + i
                                 for layer, c, i in zip(resid[:, a:b], coef, icpt)])
            torch.testing.assert_close(draws[r, :, a:b], alone, rtol=1e-12, atol=1e-13)


def test_features_of_other_rows_or_bad_folds_are_refused():
    """As many rows are not the same rows: sums of another window, or of another residual
    of the same shape, would read a held column as not held (0.03 instead of 1e-15)."""
    gen = torch.Generator().manual_seed(5)
    resid = _features(gen)
    column = resid[1] @ torch.tensor([0.5, -1.0, 2.0, 1.5, 0.0], dtype=torch.float64)
    other = probes.fold_features(resid, 4, 1)  # t = 1..6: as many rows as t = 0..5
    total = other[0] + other[1] + other[2] + other[3]
    with pytest.raises(ValueError, match="features must be the sums of resid's rows at "
                                         "t = 0..5: their sums differ at layer 0"):
        probes.held_shares(resid, column[None], 0, 5, features=total)
    x = resid.flatten(1, 2)
    with pytest.raises(ValueError, match="features must be the sums of x's own rows"):
        ridge_sums(x, x[0, :, 0], feature_sums(x + 1.0))
    with pytest.raises(ValueError, match=r"folds must be an integer in \[2, 24\], got 25"):
        probes.fold_features(resid, 25, 1)
    with pytest.raises(ValueError, match=r"t_min must be in \[0, 6\], got 7"):
        probes.fold_features(resid, 4, 7)
    with pytest.raises(ValueError, match="features must be 3 FeatureSums"):
        probes.cross_fit(tiny_gpt(), resid, torch.zeros(24, 7), folds=3, t_min=1,
                         features=other[0])
    empty = feature_sums(x[:, :0])
    assert empty.n == 0 and (empty + other[0]) is other[0] and (other[0] + empty) is other[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_residuals_pass_their_own_rows_check(dtype):
    """A half-precision residual (a model run in bf16) is checked against its own fold's
    features summed in float32: in its own dtype the sums of 32 · 8 rows round (or
    overflow) far past the tolerance and were refused as another fold's; the sums then
    equal those of the same values in float64."""
    g = torch.Generator().manual_seed(3)
    resid = (torch.randn(3, 64, 9, 16, generator=g) * 3 + 5).to(dtype)
    ys = torch.randn(64, 9, generator=g)
    features = probes.fold_features(resid, 2, 1)
    got = probes.fold_sums(resid[:, :32], ys[:32], 1, features[0])
    ref = probes.fold_sums(resid[:, :32].double(), ys[:32], 1)
    torch.testing.assert_close(got.sxy, ref.sxy, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(got.sx, ref.sx, rtol=1e-12, atol=1e-9)
    with pytest.raises(ValueError, match="features must be the sums of x's own rows: at layer"):
        probes.fold_sums(resid[:, 32:], ys[32:], 1, features[0])
