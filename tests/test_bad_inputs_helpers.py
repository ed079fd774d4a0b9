"""Bad input to the preconditioner analysis and to patch_residual: clear, named errors.

Each refused case used to give a silent NaN, a nonsense answer (a negative-definite
"optimum", a distance of 0 to a zero matrix) or torch's own error; valid inputs still give
the closed-form values.
"""

import math

import numpy as np
import pytest
import torch
from helpers import small_batch, tiny_gpt

from iclprobe import hooks, models, probes, tasks
from iclprobe.errors import InputError, InputTypeError

NAN, INF = float("nan"), float("inf")
EYE = torch.eye(3, dtype=torch.float64)
SIGMA = torch.diag(torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64))


def pq(n_layers: int = 3) -> models.PQTransformer:
    return models.PQTransformer(models.PQConfig(n_dims=3, n_layers=n_layers, init_std=0.2))


@pytest.mark.parametrize(("cov", "error", "message"), [
    (torch.full((3, 3), NAN), InputError, r"analyze_preconditioners: cov contains NaN or Inf"),
    (-torch.eye(3), InputError, r"analyze_preconditioners: cov must be positive definite, "
                                r"smallest eigenvalue = -1"),
    (torch.zeros(3, 3), InputError, r"cov must be positive definite, smallest eigenvalue = 0"),
    (torch.tensor([[1.0, 0.5, 0], [0, 1, 0], [0, 0, 1]]), InputError, r"cov must be symmetric"),
    (torch.eye(2), InputError, r"analyze_preconditioners: cov must be \[3, 3\] \(the model's "
                               r"n_dims is 3\), got shape \(2, 2\)"),
    (np.eye(3), InputTypeError, r"analyze_preconditioners: cov must be a torch tensor \[d, d\], "
                                r"got ndarray"),
])
def test_analyze_refuses_a_bad_covariance(cov, error, message):
    with pytest.raises(error, match=message):
        probes.analyze_preconditioners(pq(), cov)


def test_analyze_refuses_a_bad_n_context_and_prior():
    for n_context in (0, -2, True, 2.0):
        with pytest.raises(InputError, match=r"analyze_preconditioners.n_context must be a "
                                             rf"positive integer, got {n_context!r}"):
            probes.analyze_preconditioners(pq(1), torch.eye(3), n_context=n_context)
    for n_layers in (1, 3):  # the prior is read by one-layer models only: checked for all
        with pytest.raises(InputError, match=r"analyze_preconditioners.prior must be one of "
                                             r"\('standard', 'inverse-cov', 'rotated'\), got "
                                             r"'bogus'"):
            probes.analyze_preconditioners(pq(n_layers), torch.eye(3), n_context=5,
                                           prior="bogus")
    model = pq(1)
    model.task = tasks.RegressionTask(n_dims=3, n_points=1)  # no context example
    with pytest.raises(InputError, match=r"the model's task has n_points=1, no context example "
                                         r"before the query; the one-layer optimum needs "
                                         r"n_context >= 1: pass n_context"):
        probes.analyze_preconditioners(model)
    assert probes.analyze_preconditioners(model, n_context=2).n_context == 2


def test_analyze_refuses_a_zero_or_non_finite_layer():
    model = models.PQTransformer.from_matrices(A=[torch.eye(3), torch.zeros(3, 3)])
    with pytest.raises(InputError, match=r"analyze_preconditioners: the model's A_l is 0 or not "
                                         r"finite at layer\(s\) \[2\] .*an A_l of 0 is "
                                         r"0 · M for every M"):
        probes.analyze_preconditioners(model, torch.eye(3))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(NAN)
    with pytest.raises(InputError, match=r"not finite at layer\(s\) \[1, 2\] \(‖A_l‖_F² = "
                                         r"\[nan, nan\]\)"):
        probes.analyze_preconditioners(model, torch.eye(3))


@pytest.mark.parametrize(("args", "kwargs", "error", "message"), [
    ((-EYE, 5), {}, InputError, r"ahn_optimum: cov must be positive definite, smallest "
                                r"eigenvalue = -1"),
    ((torch.full((3, 3), NAN), 5), {}, InputError, r"ahn_optimum: cov contains NaN or Inf"),
    ((np.eye(3), 5), {}, InputTypeError, r"ahn_optimum: cov must be a torch tensor \[d, d\], "
                                         r"got ndarray: convert with torch.as_tensor"),
    ((torch.ones(2, 3), 5), {}, InputError, r"ahn_optimum: cov must be a square \[d, d\] "
                                            r"matrix with d >= 1, got shape \(2, 3\)"),
    ((torch.ones(3), 5), {}, InputError, r"cov must be a square \[d, d\] matrix"),
    ((EYE, 5), {"w_cov": torch.full((3, 3), NAN)}, InputError,
     r"ahn_optimum: w_cov contains NaN or Inf"),
    ((EYE, 5), {"w_cov": -EYE}, InputError, r"ahn_optimum: w_cov must be positive definite"),
    ((EYE, 5), {"w_cov": np.eye(3)}, InputTypeError, r"ahn_optimum: w_cov must be a torch "
                                                     r"tensor \[d, d\], got ndarray"),
    ((EYE, 5), {"noise_std": INF}, InputError, r"ahn_optimum.noise_std must be a number >= 0, "
                                               r"got inf \(not finite\)"),
    ((EYE, True), {}, InputError, r"ahn_optimum.n must be a positive integer, got True"),
    ((1e308 * EYE, 5), {}, InputError, r"ahn_optimum: the optimum overflows float64"),
])
def test_ahn_optimum_refuses(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        probes.ahn_optimum(*args, **kwargs)


def test_distance_refuses_a_zero_reference_and_bad_matrices():
    a = torch.diag(torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(InputError, match=r"distance: m is 0 .*the scale α = ⟨A, M⟩ / ⟨M, M⟩ "
                                         r"is undefined for M = 0"):
        probes.distance(a, torch.zeros(3, 3))
    with pytest.raises(InputError, match=r"distance: m\[1\] is 0"):  # which of a batch
        probes.distance(a, torch.stack([EYE, torch.zeros(3, 3)]))
    # A = 0 is 0 · M exactly (a B_l of 0 by construction): distance 0, α = 0, as before
    dist, alpha = probes.distance(torch.stack([a, torch.zeros(3, 3)]), EYE)
    assert dist[1] == 0 and alpha[1] == 0 and dist[0] > 0
    with pytest.raises(InputError, match=r"distance: m must be finite, found NaN or Inf"):
        probes.distance(a, torch.full((3, 3), INF))
    with pytest.raises(InputTypeError, match=r"distance: a must be a torch tensor "
                                             r"\[\.\.\., d, d\], got ndarray"):
        probes.distance(np.eye(3), EYE)
    with pytest.raises(InputError, match=r"distance: a must be square matrices \[\.\.\., d, d\] "
                                         r"with d >= 1, got shape \(3,\)"):
        probes.distance(torch.ones(3), EYE)
    with pytest.raises(InputError, match=r"A and M must be square matrices of one size, got "
                                         r"\(2, 3, 3\) and \(3, 3, 3\)"):
        probes.distance(torch.ones(2, 3, 3), torch.ones(3, 3, 3))
    with pytest.raises(InputError, match=r"distance: a and m overflow float64"):
        probes.distance(1e200 * EYE, 1e200 * EYE)


def test_definiteness_refuses_non_finite_and_non_square():
    with pytest.raises(InputError, match=r"definiteness: a must be finite, found NaN or Inf"):
        probes.definiteness(torch.full((2, 3, 3), NAN))
    with pytest.raises(InputError, match=r"definiteness: a must be square matrices "
                                         r"\[\.\.\., d, d\] with d >= 1, got shape \(2, 3\)"):
        probes.definiteness(torch.ones(2, 3))
    with pytest.raises(InputTypeError, match=r"definiteness: a must be a torch tensor"):
        probes.definiteness(np.eye(3))


def test_patch_residual_refuses_a_non_finite_or_non_tensor_source():
    model, b = tiny_gpt(), small_batch()
    for value in (NAN, INF):
        source = torch.zeros(4, 16, 16)
        source[1, 2, 3] = value
        with pytest.raises(InputError, match=r"patch_residual: source must be finite, found NaN "
                                             r"or Inf in a tensor of shape \(4, 16, 16\)"), \
                torch.no_grad(), hooks.patch_residual(model, 1, source):
            model(b.xs, b.ys)
    with pytest.raises(InputTypeError, match=r"patch_residual: source must be a torch.Tensor, "
                                             r"got ndarray"), \
            hooks.patch_residual(model, 1, np.zeros((4, 16, 16), dtype=np.float32)):
        model(b.xs, b.ys)
    assert all(not h._forward_hooks for h in model.hook_dict.values())  # none left attached


def test_valid_inputs_give_the_closed_forms():
    """Σ = diag(1, 1/2, 1/4), n = 4, Σ_w = I: A* = diag(n / ((n+1) σ_i + tr Σ)).

    The model's A is float32 (2 A* rounded), so its values match to float32's round-off.
    """
    n, sig = 4, [1.0, 0.5, 0.25]
    star = torch.diag(torch.tensor([n / ((n + 1) * s + sum(sig)) for s in sig],
                                   dtype=torch.float64))
    assert torch.allclose(probes.ahn_optimum(SIGMA, n), star, rtol=1e-14, atol=0)
    model = models.PQTransformer.from_matrices(A=(2 * star)[None].float())
    res = probes.analyze_preconditioners(model, SIGMA.float(), n_context=n)
    # min_α ‖A − αM‖ / ‖A‖ = sqrt(1 − cos²), cos = ⟨A, M⟩ / (‖A‖ ‖M‖), α = ⟨A, M⟩ / ‖M‖²
    a = [2 * n / ((n + 1) * s + sum(sig)) for s in sig]
    for m, dist, scale in ((1 / torch.tensor(sig), res.dist_to_inv_cov, res.scale),
                           (torch.ones(3), res.dist_to_identity, res.identity_scale)):
        dot, aa, mm = sum(x * y for x, y in zip(a, m.tolist())), sum(x * x for x in a), \
            float(m.square().sum())
        assert scale[0] == pytest.approx(dot / mm, rel=1e-6)
        assert dist[0] == pytest.approx(math.sqrt(max(0.0, 1 - dot**2 / (aa * mm))), abs=1e-6)
    assert res.dist_to_optimum == pytest.approx(0.0, abs=1e-6)
    assert res.rel_error_to_optimum == pytest.approx(1.0, rel=1e-6)  # ‖2A* − A*‖ / ‖A*‖
    assert res.min_sym_eigenvalue[0] == pytest.approx(min(a), rel=1e-6)
    assert res.skew_ratio == [0.0] and res.n_context == n
    # a patch of the model's own (finite) residual changes nothing
    gpt, b = tiny_gpt(), small_batch()
    with torch.no_grad():
        plain = gpt(b.xs, b.ys)
        with hooks.patch_residual(gpt, 1, hooks.run_first_layers(gpt, b.xs, b.ys, 1)):
            assert torch.equal(gpt(b.xs, b.ys), plain)


def test_align_notes_a_pq_model_whose_preconditioner_is_zero(tmp_path, capsys):
    """`analyze_preconditioners` refuses an A_l of 0 (no distance relative to it): align's
    definiteness line says so instead of ending the command after the alignment."""
    from iclprobe.cli import main

    pq = models.PQTransformer.from_matrices(A=[0.0 * torch.eye(3), 0.1 * torch.eye(3)])
    pq.save(tmp_path / "pq0", task=tasks.RegressionTask(n_dims=3, n_points=8, cov="rotated"))
    assert main(["align", str(tmp_path / "pq0"), "--n-sequences", "64"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "pq0: its preconditioners are not analysed: analyze_preconditioners: the model's " \
        "A_l is 0 or not finite at layer(s) [1]" in out
