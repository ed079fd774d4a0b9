"""Eigendecompositions of data matrices that survive rank-deficient, huge and tiny inputs.

LAPACK's symmetric eigensolver (``torch.linalg.eigh``) fails to converge on some inputs —
matrices with many repeated or vanishing eigenvalues, or with entries spanning hundreds of
orders of magnitude — and raises torch's ``_LinAlgError``. `sym_eigh` is the one place
iclprobe decomposes a Gram matrix: it scales each matrix by a power of two (exact, so a
well-behaved input gives what eigh gives; like eigh it reads the lower triangle), and
where eigh still
fails, decomposes the failing matrices by SVD (a symmetric PSD matrix's singular values
are its eigenvalues), then with a jitter of the scale's round-off if that fails too.
Non-finite input is refused: it is the caller's data, not a numerical accident.

Many small matrices (every prefix of every sequence) are split between torch's threads:
LAPACK decomposes a batch one matrix at a time on one core, and each small matrix is
decomposed by the same routine, at the same alignment in memory, in any part of a batch,
so the result is the same, bit for bit (tests/test_linalg.py checks it), in some 60% of
the time on 2 cores.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from iclprobe._finite import all_finite
from iclprobe.errors import InputError


def _power_of_two_scale(m: Tensor) -> Tensor:
    """Per matrix ``[..., 1, 1]``, a power of two near its largest absolute entry (1 if 0)."""
    top = m.abs().amax(dim=(-2, -1), keepdim=True)
    safe = torch.where(top > 0, top, torch.ones_like(top))
    return torch.exp2(torch.round(torch.log2(safe)))


def sym_eigh(m: Tensor, what: str = "matrix") -> tuple[Tensor, Tensor]:
    """Eigenvalues (ascending) and eigenvectors of symmetric ``m [..., k, k]``, robustly.

    Args:
        m: symmetric (up to round-off) real matrices; any float dtype (float64 advised).
        what: names the matrices in the error for non-finite input.

    Raises:
        ValueError: ``m`` holds NaN or Inf.
    """
    if not all_finite(m):
        raise InputError(f"{what} holds NaN or Inf: cannot decompose it")
    if m.numel() == 0:  # no dimensions (or no matrices): nothing to scale
        return torch.linalg.eigh(m)
    scale = _power_of_two_scale(m)
    sym = m / scale
    try:
        lam, vec = _batched_eigh(sym)
    except RuntimeError:  # _LinAlgError: LAPACK did not converge on some matrix
        lam, vec = _fallback(sym)
    return lam * scale[..., 0], vec


#: `_batched_eigh` splits batches of at least this many matrices of at most `SPLIT_SIZE`,
#: each part a multiple of `SPLIT_ALIGN` matrices long (64: 256 bytes at least)
SPLIT_BATCH, SPLIT_SIZE, SPLIT_ALIGN = 1024, 32, 64


def _batched_eigh(sym: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.linalg.eigh``, a large batch of small CPU matrices split between threads."""
    workers, k = torch.get_num_threads(), sym.shape[-1]
    flat = sym.reshape(-1, k, k)
    if workers < 2 or sym.device.type != "cpu" or k > SPLIT_SIZE or flat.shape[0] < SPLIT_BATCH:
        return torch.linalg.eigh(sym)
    # cut at multiples of `SPLIT_ALIGN` matrices: MKL's result for a matrix depends on its
    # address modulo 16 bytes (odd k at an odd cut moved eigenvectors by 1e-14, and by a
    # sign on rank-deficient prefixes), so every matrix keeps its unsplit alignment
    n = flat.shape[0]
    cuts = [n * i // workers // SPLIT_ALIGN * SPLIT_ALIGN for i in range(1, workers)]
    with ThreadPoolExecutor(workers) as pool:  # a pool per call: no idle threads held
        parts = list(pool.map(torch.linalg.eigh, flat.tensor_split(cuts)))
    # eigh's eigenvectors are column-major per matrix: laid out so, every product of them
    # takes the path (and the sums) it takes on eigh's own
    vec = torch.cat([vec.mT for _, vec in parts]).mT
    return torch.cat([lam for lam, _ in parts]).reshape(sym.shape[:-1]), vec.reshape(sym.shape)


def _fallback(sym: Tensor) -> tuple[Tensor, Tensor]:
    """One matrix at a time: eigh, else eigenpairs from the SVD, else eigh with a jitter."""
    sym = torch.tril(sym) + torch.tril(sym, -1).transpose(-1, -2)  # eigh's lower triangle
    flat = sym.reshape(-1, *sym.shape[-2:])
    lams, vecs = [], []
    eye = torch.eye(sym.shape[-1], dtype=sym.dtype, device=sym.device)
    for one in flat:
        try:
            lam, vec = torch.linalg.eigh(one)
        except RuntimeError:
            try:
                lam, vec = _svd_eigh(one)
            except RuntimeError:
                jitter = 64 * torch.finfo(sym.dtype).eps
                lam, vec = torch.linalg.eigh(one + jitter * eye)
                lam = lam - jitter
        lams.append(lam)
        vecs.append(vec)
    return (torch.stack(lams).reshape(sym.shape[:-1]),
            torch.stack(vecs).reshape(sym.shape))


def _svd_eigh(one: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenpairs of one symmetric matrix from its SVD, ascending.

    ``A = U S Vᵀ``; for each singular triple the eigenvalue is ``s · sign(uᵀ v)`` with
    eigenvector ``u`` (exact for a symmetric matrix; for a PSD one every sign is +).
    """
    u, s, vh = torch.linalg.svd(one)
    sign = torch.sign((u * vh.transpose(-1, -2)).sum(0))
    lam = s * torch.where(sign == 0, torch.ones_like(sign), sign)
    order = lam.argsort()
    return lam[order], u[:, order]
