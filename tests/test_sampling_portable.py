"""Seeded samples are a function of the generator's draws and the task alone.

No decomposition's conventions may reach the data: an eigenvector's sign, or the basis that
LAPACK picks inside a repeated eigenvalue's eigenspace (Ahn et al.'s rotated spectrum
(1, 1, 1/4, 1/16, 1) has eigenvalue 1 three times), differ between builds. The references
here are computed without any eigendecomposition: the symmetric square root by the
Denman–Beavers iteration, the per-sequence eigenbasis by numpy's QR with the sign fix.
"""

import numpy as np
import pytest
import torch

from iclprobe.tasks import RegressionTask, ill_conditioned_eigenvalues, rotated_eigenvalues
from iclprobe.tasks.covariance import random_orthogonal


def denman_beavers(cov: torch.Tensor, iters: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ^{1/2} and Σ^{-1/2} by Y_{k+1} = (Y_k + Z_k⁻¹)/2, Z_{k+1} = (Z_k + Y_k⁻¹)/2."""
    y, z = cov.clone(), torch.eye(cov.shape[-1], dtype=cov.dtype)
    for _ in range(iters):
        y, z = (y + torch.linalg.inv(z)) / 2, (z + torch.linalg.inv(y)) / 2
    return y, z


def draws(seed: int, batch: int, n: int, d: int, per_sequence_basis: bool = False):
    """The generator's draws in `sample`'s order: [basis], z, u (then noise)."""
    gen = torch.Generator().manual_seed(seed)
    gauss = torch.randn(batch, d, d, generator=gen, dtype=torch.float64) \
        if per_sequence_basis else None
    z = torch.randn(batch, n, d, generator=gen, dtype=torch.float64)
    u = torch.randn(batch, d, generator=gen, dtype=torch.float64)
    return gauss, z, u


def rotated_cov(d: int = 5, seed: int = 0) -> torch.Tensor:
    rot = random_orthogonal(d, torch.Generator().manual_seed(seed))
    return rot @ torch.diag(rotated_eigenvalues(d)) @ rot.T


def given_cov(d: int = 4) -> torch.Tensor:
    a = torch.randn(d, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    return a @ a.T + 0.5 * torch.eye(d, dtype=torch.float64)


@pytest.mark.parametrize("kind", ["isotropic", "rotated", "tensor"])
@pytest.mark.parametrize("prior", ["standard", "inverse-cov"])
def test_a_fixed_covariance_samples_its_symmetric_square_root(kind, prior):
    # x = Σ^{1/2} z and (inverse-cov prior) w = Σ^{-1/2} u, from the same draws z, u
    d = 4 if kind == "tensor" else 5
    cov = {"isotropic": "isotropic", "rotated": "rotated", "tensor": given_cov(d)}[kind]
    task = RegressionTask(n_dims=d, n_points=7, cov=cov, w_prior=prior)
    batch = task.sample(6, generator=11, dtype=torch.float64)
    root, inv_root = denman_beavers(task.covariance)
    _, z, u = draws(11, 6, 7, d)
    torch.testing.assert_close(batch.xs, z @ root.T, rtol=0, atol=1e-12)
    w = u if prior == "standard" else u @ inv_root.T
    torch.testing.assert_close(batch.ws, w, rtol=0, atol=1e-12)
    torch.testing.assert_close(batch.ys, torch.einsum("bnd,bd->bn", z @ root.T, w),
                               rtol=0, atol=1e-11)


def test_isotropic_samples_are_the_draws_exactly():
    task = RegressionTask(n_dims=3, n_points=4)
    _, z, u = draws(5, 2, 4, 3)
    batch = task.sample(2, generator=5, dtype=torch.float64)
    assert torch.equal(batch.xs, z) and torch.equal(batch.ws, u)


def test_ill_conditioned_uses_the_factor_it_was_built_from():
    # Σ_b = V_b D V_bᵀ, V_b the sign-fixed QR of the first draws (unique); x = V_b D^{1/2} z
    d, n, b = 4, 6, 5
    task = RegressionTask(n_dims=d, n_points=n, cov="ill-conditioned", condition_number=50.0,
                          w_prior="inverse-cov")
    batch = task.sample(b, generator=2, dtype=torch.float64)
    gauss, z, u = draws(2, b, n, d, per_sequence_basis=True)
    eig = ill_conditioned_eigenvalues(d, 50.0).numpy()
    for i in range(b):
        q, r = np.linalg.qr(gauss[i].numpy())
        v = q * np.where(np.diag(r) < 0, -1.0, 1.0)
        np.testing.assert_allclose(batch.cov[i].numpy(), (v * eig) @ v.T, atol=1e-12)
        np.testing.assert_allclose(batch.xs[i].numpy(), z[i].numpy() @ (v * np.sqrt(eig)).T,
                                   atol=1e-12)
        np.testing.assert_allclose(batch.ws[i].numpy(), (v / np.sqrt(eig)) @ u[i].numpy(),
                                   atol=1e-12)


def test_another_eigenbasis_of_the_same_eigenspaces_samples_the_same():
    # Σ = U D Uᵀ with D = (1, 1, 1/4, 1/16, 1): rotate U inside the 3-dim eigenspace of 1, or
    # flip the sign of any eigenvector: the same Σ (to round-off), so the same samples
    d = 5
    eig = rotated_eigenvalues(d)
    u = random_orthogonal(d, torch.Generator().manual_seed(0))
    ones = (eig == 1.0).nonzero().flatten()
    inner = random_orthogonal(len(ones), torch.Generator().manual_seed(9))
    turned = u.clone()
    turned[:, ones] = u[:, ones] @ inner
    flipped = u * torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    reference = RegressionTask(n_dims=d, n_points=9, cov="rotated", w_prior="inverse-cov")
    base = reference.sample(16, generator=4, dtype=torch.float64)
    for basis in (u, turned, flipped):
        cov = basis @ torch.diag(eig) @ basis.T
        other = RegressionTask(n_dims=d, n_points=9, cov=cov, w_prior="inverse-cov")
        batch = other.sample(16, generator=4, dtype=torch.float64)
        torch.testing.assert_close(batch.xs, base.xs, rtol=0, atol=1e-12)
        torch.testing.assert_close(batch.ws, base.ws, rtol=0, atol=1e-12)


def test_the_named_covariance_given_as_a_tensor_or_saved_samples_the_same(tmp_path):
    task = RegressionTask(n_dims=5, n_points=8, cov="rotated", seed=3, w_prior="inverse-cov")
    as_tensor = RegressionTask(n_dims=5, n_points=8, cov=task.covariance, w_prior="inverse-cov")
    reloaded = RegressionTask.from_json(as_tensor.to_json())
    path = tmp_path / "task.json"
    path.write_text(task.to_json())
    saved = RegressionTask.from_json(path)
    ref = task.sample(4, generator=1, dtype=torch.float64)
    for other in (as_tensor, reloaded, saved):
        batch = other.sample(4, generator=1, dtype=torch.float64)
        torch.testing.assert_close(batch.xs, ref.xs, rtol=0, atol=1e-12)
        torch.testing.assert_close(batch.ws, ref.ws, rtol=0, atol=1e-12)
