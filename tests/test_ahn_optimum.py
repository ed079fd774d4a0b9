"""w_prior='rotated' (w ~ N(0, Σ_w)), the one-layer optimum for any Σ_w, and definiteness."""

import pytest
import torch

from iclprobe import models, probes, tasks
from iclprobe.cli import main


def mc_least_squares_optimum(task, n, n_samples, seed):
    """Naive reference: the A minimizing the sample loss of ŷ = x_qᵀ A (Xᵀy / n), by OLS."""
    b = task.sample(n_samples, generator=seed, n_points=n + 1, dtype=torch.float64)
    h = torch.einsum("bnd,bn->bd", b.xs[:, :n], b.ys[:, :n]) / n
    features = torch.einsum("bi,bj->bij", b.xs[:, n], h).reshape(n_samples, -1)
    sol = torch.linalg.lstsq(features, b.ys[:, n:]).solution
    return sol.reshape(task.n_dims, task.n_dims)


def test_rotated_prior_has_its_own_covariance_and_is_portable():
    task = tasks.RegressionTask(n_dims=4, n_points=5, cov="rotated", w_prior="rotated", seed=3)
    w_cov = task.w_covariance
    # Σ_w = V D Vᵀ with V the second orthogonal draw of the seed, D the rotated eigenvalues
    g = torch.Generator().manual_seed(3)
    first = tasks.random_orthogonal(4, g)
    v = tasks.random_orthogonal(4, g)
    eig = tasks.rotated_eigenvalues(4)
    torch.testing.assert_close(w_cov, v @ torch.diag(eig) @ v.T)
    torch.testing.assert_close(task.covariance, first @ torch.diag(eig) @ first.T)
    assert (w_cov - task.covariance).norm() > 0.5  # unrelated to Σ
    # w = V D^{1/2} u from the same u the standard prior draws
    standard = tasks.RegressionTask(n_dims=4, n_points=5, cov="rotated", seed=3)
    b, s = task.sample(6, generator=1, dtype=torch.float64), standard.sample(
        6, generator=1, dtype=torch.float64)
    torch.testing.assert_close(b.ws, s.ws @ (v * eig.sqrt()).T)
    torch.testing.assert_close(b.xs, s.xs)
    big = task.sample(100_000, generator=2, n_points=1, dtype=torch.float64).ws
    assert (big.T @ big / len(big) - w_cov).abs().max() < 0.02
    back = tasks.RegressionTask.from_json(task.to_json())
    torch.testing.assert_close(back.w_covariance, w_cov)
    assert torch.equal(back.sample(3, generator=0).ws, task.sample(3, generator=0).ws)


def test_w_covariance_of_the_other_priors():
    iso = tasks.RegressionTask(n_dims=3, n_points=4)
    torch.testing.assert_close(iso.w_covariance, torch.eye(3, dtype=torch.float64))
    rot = tasks.RegressionTask(n_dims=3, n_points=4, cov="rotated", w_prior="inverse-cov")
    torch.testing.assert_close(rot.w_covariance, torch.linalg.inv(rot.covariance))
    ill = tasks.RegressionTask(n_dims=4, n_points=4, cov="ill-conditioned", w_prior="inverse-cov")
    assert ill.w_covariance is None
    with pytest.raises(ValueError, match=r"RegressionTask.w_prior must be one of \('standard', "
                                         r"'inverse-cov', 'rotated'\), got 'flat'"):
        tasks.RegressionTask(n_dims=3, n_points=4, w_prior="flat")


def test_optimum_formula_reduces_to_the_known_cases():
    cov = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]], dtype=torch.float64)
    n, d = 7, 3
    eye = torch.eye(d, dtype=torch.float64)
    gamma = (n + 1) / n * cov + torch.trace(cov) / n * eye
    torch.testing.assert_close(probes.ahn_optimum(cov, n, w_cov=eye), torch.linalg.inv(gamma))
    torch.testing.assert_close(probes.ahn_optimum(cov, n, w_cov=torch.linalg.inv(cov)),
                               n / (n + d + 1) * torch.linalg.inv(cov))
    torch.testing.assert_close(probes.ahn_optimum(cov, n, "inverse-cov"),
                               n / (n + d + 1) * torch.linalg.inv(cov))
    with pytest.raises(ValueError, match="prior 'rotated' needs w_cov"):
        probes.ahn_optimum(cov, n, "rotated")
    with pytest.raises(ValueError, match=r"w_cov must have Σ's shape \(3, 3\), got \(2, 2\)"):
        probes.ahn_optimum(cov, n, w_cov=torch.eye(2))


@pytest.mark.parametrize("noise_std", [0.0, 0.7])
def test_optimum_for_an_unrelated_prior_matches_monte_carlo(noise_std):
    """A* = (((n+1)/n) Σ + ((tr(Σ Σ_w) + σ²)/n) Σ_w⁻¹)⁻¹ is the sample-loss minimizer."""
    task = tasks.RegressionTask(n_dims=3, n_points=6, cov="rotated", w_prior="rotated",
                                eigenvalues=(1.0, 0.25, 2.0), noise_std=noise_std, seed=1)
    n = 5
    closed = probes.ahn_optimum(task.covariance, n, "rotated", w_cov=task.w_covariance,
                                noise_std=noise_std)
    mc = mc_least_squares_optimum(task, n, 400_000, seed=7)
    rel = float((mc - closed).norm() / closed.norm())
    assert rel < 0.035  # the Monte Carlo error at 400,000 samples is 1-2% (seeds 7-9)
    # ... and the formula's parts matter: without Σ_w, or without the noise, it is off
    for wrong in (probes.ahn_optimum(task.covariance, n),  # Σ_w = I
                  probes.ahn_optimum(task.covariance, n, w_cov=torch.linalg.inv(
                      task.covariance), noise_std=noise_std)):
        assert float((mc - wrong).norm() / wrong.norm()) > 0.3
    if noise_std:
        quiet = probes.ahn_optimum(task.covariance, n, w_cov=task.w_covariance)
        assert float((mc - quiet).norm() / quiet.norm()) > 0.06


def test_analysis_uses_the_tasks_prior_and_reports_definiteness():
    task = tasks.RegressionTask(n_dims=3, n_points=9, cov="rotated", w_prior="rotated")
    opt = probes.ahn_optimum(task.covariance, 8, w_cov=task.w_covariance)
    model = models.PQTransformer.from_matrices(A=opt[None].float())
    model.task = task
    res = probes.analyze_preconditioners(model)
    assert res.dist_to_optimum == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(torch.tensor(res.sym_eigenvalues[0], dtype=torch.float64),
                               torch.linalg.eigvalsh(opt), atol=1e-6, rtol=1e-6)
    assert res.positive_definite == [True] and res.skew_ratio[0] < 1e-6
    skewed = torch.tensor([[1.0, 3.0, 0.0], [-3.0, 1.0, 0.0], [0.0, 0.0, -0.5]])
    pd = probes.definiteness(skewed[None])
    torch.testing.assert_close(pd.eigenvalues[0], torch.tensor([-0.5, 1.0, 1.0],
                                                               dtype=torch.float64))
    skew = torch.tensor(18.0).sqrt() / skewed.norm()
    assert float(pd.skew_ratio[0]) == pytest.approx(float(skew))
    model = models.PQTransformer.from_matrices(A=[torch.eye(3), skewed])
    model.task = task
    line = probes.analyze_preconditioners(model).summary("m")
    assert line == "m: λ_min(sym A_l) 1, -0.5; max ‖skew‖/‖A‖ 0.943: not PD at layer 2"


def test_align_prints_the_definiteness_line(tmp_path, capsys):
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 2)
    path = model.save(tmp_path / "pq", task=tasks.RegressionTask(n_dims=3, n_points=7))
    assert main(["align", str(path), "--n-sequences", "32", "--n-boot", "20"]) == 0
    out = capsys.readouterr().out
    assert "pq: λ_min(sym A_l) 0.3, 0.3; max ‖skew‖/‖A‖ 0.000: positive definite" in out


def test_analysis_takes_a_named_rotated_prior_from_the_task_or_from_w_cov():
    # prior="rotated" had no Σ_w to read (it always failed); the task's rotation or w_cov gives it
    task = tasks.RegressionTask(n_dims=3, n_points=9, cov="rotated", w_prior="rotated", seed=2)
    opt = probes.ahn_optimum(task.covariance, 8, w_cov=task.w_covariance)
    model = models.PQTransformer.from_matrices(A=opt[None].float())
    model.task = task
    named = probes.analyze_preconditioners(model, prior="rotated")
    assert named.dist_to_optimum == pytest.approx(0.0, abs=1e-6)
    standard = probes.analyze_preconditioners(model, prior="standard")
    assert standard.dist_to_optimum > 0.05  # Σ_w = I: another optimum
    model.task = tasks.RegressionTask(n_dims=3, n_points=9, cov="rotated", seed=2)
    with pytest.raises(ValueError, match="prior 'rotated' needs w_cov.*has prior 'standard'"):
        probes.analyze_preconditioners(model, prior="rotated")
    given = probes.analyze_preconditioners(model, prior="rotated", w_cov=task.w_covariance)
    assert given.dist_to_optimum == pytest.approx(0.0, abs=1e-6)
    deep = models.PQTransformer.from_matrices(A=[opt.float()] * 2)  # no optimum: still checked
    deep.task = task
    with pytest.raises(TypeError, match="w_cov"):
        probes.analyze_preconditioners(deep, w_cov="x")
    with pytest.raises(ValueError, match="w_cov"):
        probes.analyze_preconditioners(deep, w_cov=-torch.eye(3, dtype=torch.float64))
