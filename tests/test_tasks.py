import math

import pytest
import torch

from iclprobe.tasks import RegressionTask, ill_conditioned_eigenvalues, rotated_eigenvalues


def empirical_cov(xs: torch.Tensor) -> torch.Tensor:
    flat = xs.reshape(-1, xs.shape[-1]).double()
    return flat.T @ flat / flat.shape[0]


@pytest.mark.parametrize("cov", ["isotropic", "rotated", "given"])
def test_empirical_covariance_matches(cov):
    if cov == "given":
        a = torch.tensor([[2.0, 0.5, 0.0], [0.5, 1.0, 0.3], [0.0, 0.3, 0.5]], dtype=torch.float64)
        task = RegressionTask(n_dims=3, n_points=10, cov=a)
    else:
        task = RegressionTask(n_dims=5 if cov == "rotated" else 3, n_points=10, cov=cov, seed=3)
    batch = task.sample(10_000, generator=0)  # 10^5 draws of x
    sigma = task.covariance
    err = (empirical_cov(batch.xs) - sigma).abs().max().item()
    assert err < 0.03, err
    assert torch.allclose(batch.cov.double(), sigma.to(batch.cov.dtype).double(), atol=1e-6)


def test_rotated_default_spectrum_and_rotation_fixed_by_seed():
    task = RegressionTask(n_dims=5, n_points=4, cov="rotated", seed=11)
    eig = torch.linalg.eigvalsh(task.covariance)
    expected = torch.tensor(sorted([1, 1, 1 / 4, 1 / 16, 1]), dtype=torch.float64)
    assert torch.allclose(eig, expected, atol=1e-10)
    same = RegressionTask(n_dims=5, n_points=4, cov="rotated", seed=11)
    other = RegressionTask(n_dims=5, n_points=4, cov="rotated", seed=12)
    assert torch.equal(task.covariance, same.covariance)
    assert not torch.allclose(task.covariance, other.covariance)
    # The rotation is not trivial: Σ is not diagonal.
    off = task.covariance - torch.diag(torch.diagonal(task.covariance))
    assert off.abs().max() > 0.05


def test_inverse_cov_prior():
    task = RegressionTask(n_dims=5, n_points=2, cov="rotated", w_prior="inverse-cov", seed=2)
    ws = task.sample(100_000, generator=1).ws.double()
    emp = ws.T @ ws / ws.shape[0]
    target = torch.linalg.inv(task.covariance)
    assert ((emp - target).abs().max() / target.abs().max()).item() < 0.03


@pytest.mark.parametrize("kappa", [1.0, 10.0, 100.0])
@pytest.mark.parametrize("d", [4, 5])
def test_ill_conditioned_spectrum(kappa, d):
    task = RegressionTask(n_dims=d, n_points=3, cov="ill-conditioned", condition_number=kappa)
    batch = task.sample(6, generator=0, dtype=torch.float64)
    assert batch.cov.shape == (6, d, d)
    eig = torch.linalg.eigvalsh(batch.cov)
    assert torch.allclose(eig[:, -1] / eig[:, 0], torch.full((6,), kappa, dtype=eig.dtype))
    assert torch.allclose(eig.sum(-1), torch.full((6,), float(d), dtype=eig.dtype))
    assert torch.allclose(ill_conditioned_eigenvalues(d, kappa).sum(), torch.tensor(float(d),
                          dtype=torch.float64))


def test_ill_conditioned_eigenbasis_per_sequence_or_batch():
    per_seq = RegressionTask(n_dims=4, n_points=3, cov="ill-conditioned")
    covs = per_seq.sample(5, generator=0).cov
    assert not torch.allclose(covs[0], covs[1])
    per_batch = RegressionTask(n_dims=4, n_points=3, cov="ill-conditioned", eigenbasis="batch")
    b = per_batch.sample(50_000, generator=0)
    assert b.cov.shape == (4, 4)
    assert (empirical_cov(b.xs) - b.cov.double()).abs().max() < 0.06
    # Per-sequence covariances really drive the draws: whiten each sequence by its own Σ.
    b = per_seq.sample(2_000, generator=1, n_points=200, dtype=torch.float64)
    chol = torch.linalg.cholesky(b.cov)
    white = torch.linalg.solve_triangular(chol, b.xs.transpose(1, 2), upper=False)
    assert (empirical_cov(white.transpose(1, 2)) - torch.eye(4)).abs().max() < 0.02


def test_same_seed_same_batch_and_generator_is_explicit():
    task = RegressionTask(n_dims=4, n_points=6, cov="ill-conditioned", noise_std=0.1)
    a = task.sample(3, generator=torch.Generator().manual_seed(5))
    b = task.sample(3, generator=5)
    c = task.sample(3, generator=6)
    for t1, t2 in zip((a.xs, a.ys, a.ws, a.cov), (b.xs, b.ys, b.ws, b.cov)):
        assert torch.equal(t1, t2)
    assert not torch.equal(a.xs, c.xs)
    state = torch.get_rng_state()
    task.sample(3, generator=5)
    assert torch.equal(state, torch.get_rng_state())
    with pytest.raises(TypeError, match="generator must be a torch.Generator or an int seed"):
        task.sample(3, generator="5")


def test_labels_noise_and_curriculum():
    task = RegressionTask(n_dims=6, n_points=50, noise_std=0.5)
    b = task.sample(400, generator=0, dtype=torch.float64)
    resid = b.ys - torch.einsum("bnd,bd->bn", b.xs, b.ws)
    assert abs(resid.std().item() - 0.5) < 0.01
    clean = RegressionTask(n_dims=6, n_points=5).sample(3, generator=0, dtype=torch.float64)
    assert torch.allclose(clean.ys, torch.einsum("bnd,bd->bn", clean.xs, clean.ws))
    trunc = RegressionTask(n_dims=6, n_points=5, active_dims=2).sample(3, generator=0)
    assert torch.all(trunc.xs[..., 2:] == 0) and torch.all(trunc.ws[:, 2:] == 0)
    assert trunc.xs[..., :2].abs().sum() > 0
    small = task.sample(3, generator=0, n_points=7, active_dims=3)
    assert small.xs.shape == (3, 7, 6) and torch.all(small.xs[..., 3:] == 0)


def test_json_round_trip(tmp_path):
    sigma = torch.tensor([[1.0, 0.2], [0.2, 0.5]], dtype=torch.float64)
    for task in [
        RegressionTask(n_dims=2, n_points=5, cov=sigma, noise_std=0.1),
        RegressionTask(n_dims=5, n_points=21, cov="rotated", w_prior="inverse-cov", seed=4,
                       eigenvalues=(1, 2, 3, 4, 5)),
        RegressionTask(n_dims=4, n_points=9, cov="ill-conditioned", condition_number=7,
                       eigenbasis="batch", active_dims=3),
    ]:
        path = tmp_path / "task.json"
        path.write_text(task.to_json())
        back = RegressionTask.from_json(path)
        assert back.to_dict() == task.to_dict()
        a, b = task.sample(2, generator=3), back.sample(2, generator=3)
        assert torch.equal(a.xs, b.xs) and torch.equal(a.ys, b.ys)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(n_dims=0, n_points=3), "n_dims must be a positive integer, got 0"),
        (dict(n_dims=2, n_points=-1), "n_points must be a positive integer, got -1"),
        (dict(n_dims=2, n_points=3, cov="diagonal"), "cov must be one of"),
        (dict(n_dims=2, n_points=3, cov=torch.eye(3)), r"cov has shape \(3, 3\), expected \(2, 2\)"),
        (dict(n_dims=2, n_points=3, cov=torch.tensor([[1.0, 0.5], [0.0, 1.0]])), "symmetric"),
        (dict(n_dims=2, n_points=3, cov=torch.tensor([[1.0, 2.0], [2.0, 1.0]])),
         "positive definite"),
        (dict(n_dims=2, n_points=3, cov="ill-conditioned", condition_number=0.5),
         r"condition_number must be a number in \[1, 1e6\], got 0.5"),
        (dict(n_dims=2, n_points=3, w_prior="laplace"), "w_prior must be one of"),
        (dict(n_dims=2, n_points=3, noise_std=-1.0), "noise_std must be a number >= 0"),
        (dict(n_dims=2, n_points=3, active_dims=3), "active_dims must be <= n_dims=2, got 3"),
        (dict(n_dims=2, n_points=3, eigenbasis="row"), "eigenbasis must be one of"),
        (dict(n_dims=2, n_points=3, cov="rotated", eigenvalues=(1.0,)), "eigenvalues has 1"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RegressionTask(**kwargs)


def test_bad_sample_arguments():
    task = RegressionTask(n_dims=2, n_points=3)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        task.sample(0, generator=0)
    with pytest.raises(ValueError, match="active_dims must be in 1..2, got 5"):
        task.sample(2, generator=0, active_dims=5)
    with pytest.raises(ValueError, match="format_version"):
        RegressionTask.from_dict({**task.to_dict(), "format_version": 99})
    with pytest.raises(ValueError, match="unknown task fields"):
        RegressionTask.from_dict({**task.to_dict(), "bogus": 1})


def test_rotated_eigenvalue_pattern_repeats():
    eig = rotated_eigenvalues(7)
    assert eig.tolist() == [1, 1, 0.25, 0.0625, 1, 1, 1]
    assert math.isclose(float(eig.prod()), 1 / 64)
