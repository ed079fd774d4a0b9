"""sym_eigh: Gram matrices that are rank-deficient, huge or tiny, and eigh's failures."""

import numpy as np
import pytest
import torch

import iclprobe._linalg as L
from iclprobe._linalg import sym_eigh
from iclprobe.probes.ridge import ridge_from_sums, ridge_sums


def _gram(rows, cols, rank, scale, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, rank, generator=g, dtype=torch.float64) @ \
        torch.randn(rank, cols, generator=g, dtype=torch.float64)
    return scale * (x.T @ x)


@pytest.mark.parametrize("scale", [1e-150, 1.0, 1e150])
@pytest.mark.parametrize("rank", [1, 3, 6])
def test_eigenvalues_match_numpy_at_any_scale_and_rank(scale, rank):
    m = _gram(10, 6, rank, scale)
    lam, vec = sym_eigh(m)
    ref = np.linalg.eigvalsh(m.numpy() / scale) * scale
    top = float(abs(ref).max())
    assert np.allclose(lam.numpy(), ref, rtol=0, atol=1e-10 * top)
    # V diag(λ) Vᵀ rebuilds the matrix (no basis convention enters a product)
    rebuilt = (vec * lam[None, :]) @ vec.T
    assert torch.allclose(rebuilt, m, rtol=0, atol=1e-10 * top)


def test_a_batch_where_eigh_fails_is_decomposed_one_by_one(monkeypatch):
    m = torch.stack([_gram(10, 5, 5, 1.0, seed=s) for s in range(3)])
    m[1] = _gram(10, 5, 2, 1.0, seed=7)  # rank-deficient, the one "failing"
    real = torch.linalg.eigh

    def flaky(a):
        # fail on the batch and on the rank-deficient matrix alone, as LAPACK may
        if a.ndim == 3 or torch.linalg.matrix_rank(a) < a.shape[-1]:
            raise torch.linalg.LinAlgError("linalg.eigh: failed to converge")
        return real(a)

    monkeypatch.setattr(L.torch.linalg, "eigh", flaky)
    lam, vec = sym_eigh(m)
    for k in range(3):
        ref = np.linalg.eigvalsh(m[k].numpy())
        assert np.allclose(lam[k].numpy(), ref, atol=1e-9 * abs(ref).max())
        assert torch.allclose((vec[k] * lam[k]) @ vec[k].T, m[k], atol=1e-9)


def test_empty_matrices_decompose_to_empty():
    lam, vec = sym_eigh(torch.zeros(3, 4, 0, 0, dtype=torch.float64))
    assert lam.shape == (3, 4, 0) and vec.shape == (3, 4, 0, 0)


def test_non_finite_input_is_refused_naming_it():
    m = _gram(8, 4, 4, 1.0)
    m[0, 0] = float("nan")
    with pytest.raises(ValueError, match="the probes' Gram matrix holds NaN or Inf"):
        sym_eigh(m, "the probes' Gram matrix")


def test_ridge_from_huge_tiny_and_rank_deficient_features_matches_lstsq():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 200, 6, generator=g, dtype=torch.float64)
    x[0] *= 1e120  # huge
    x[1] *= 1e-120  # tiny
    x[2, :, 3:] = x[2, :, :3]  # rank-deficient: duplicated columns
    w = torch.randn(6, generator=g, dtype=torch.float64)
    y = torch.stack([x[k] @ w for k in range(3)])
    fit = ridge_from_sums(ridge_sums(x, y), alphas=0.0, fit_intercept=False)
    for k in range(3):
        pred = x[k] @ fit.coef[k]
        assert torch.allclose(pred, y[k], rtol=1e-6, atol=1e-6 * float(y[k].abs().max()))


def test_ridge_names_the_layers_whose_sums_are_not_finite():
    x = torch.randn(3, 50, 4, dtype=torch.float64)
    x[2, 7, 1] = float("inf")
    with pytest.raises(ValueError, match=r"layers \[2\] hold NaN or Inf"):
        ridge_from_sums(ridge_sums(x, torch.randn(50, dtype=torch.float64)))


@pytest.mark.parametrize(("k", "count", "dtype"), [
    (1, 1029, torch.float64), (2, 1029, torch.float64), (3, 2049, torch.float64),
    (5, 1026, torch.float64), (5, 5250, torch.float64), (7, 1031, torch.float64),
    (8, 1029, torch.float64), (20, 1026, torch.float64), (32, 1029, torch.float64),
    (5, 1026, torch.float32), (13, 1029, torch.float32)])
def test_a_large_batch_split_between_threads_decomposes_as_one_batch(k, count, dtype,
                                                                     monkeypatch):
    """Prefix statistics decompose thousands of small Gram matrices: split between torch's
    threads, each matrix is decomposed by the same LAPACK routine at the same alignment in
    memory (MKL's result depends on a matrix's address modulo 16 bytes: at d = 5 an odd
    cut moved eigenvectors by 1e-14, by a sign where a prefix is rank-deficient), so every
    eigenvalue and eigenvector equals the unsplit batch's bit for bit (compared on this
    machine, where both run: no number is carried from elsewhere)."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(count, k, k + 3, generator=g, dtype=torch.float64)
    m = (x @ x.mT).to(dtype)
    m[::7] = 0.0  # rank-deficient prefixes, as at t = 0
    m[1::7] = m[1::7, :1].mT @ m[1::7, :1]  # rank 1
    real, calls = torch.linalg.eigh, []
    monkeypatch.setattr(torch.linalg, "eigh", lambda a: calls.append(a.shape[0]) or real(a))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        lam, vec = L._batched_eigh(m)
    finally:
        torch.set_num_threads(threads)
    cut = count // 2 // L.SPLIT_ALIGN * L.SPLIT_ALIGN
    assert sorted(calls) == sorted([cut, count - cut])  # two parts, cut at a multiple of 64
    ref_lam, ref_vec = real(m)
    assert torch.equal(lam, ref_lam) and torch.equal(vec, ref_vec)
    # and laid out as eigh lays them out (column-major): a product of another layout may
    # sum in another order
    assert vec.stride() == ref_vec.stride() and lam.stride() == ref_lam.stride()
