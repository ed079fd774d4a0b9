"""PQConfig.d_k: the factored (standard) parametrization of the PQ transformer."""

import re

import pytest
import torch
from test_pq import naive_pq

from iclprobe import alignment, models, probes, tasks, training
from iclprobe.cli import main
from iclprobe.constructions import newton_transformer
from iclprobe.models import PQConfig, PQTransformer
from iclprobe.models.pq_layers import balanced_factors, factor


def rotation(k, seed):
    return tasks.random_orthogonal(k, torch.Generator().manual_seed(seed)).float()


def batch(d=3, n=8, b=4, seed=0):
    return tasks.RegressionTask(n_dims=d, n_points=n, cov="rotated").sample(b, generator=seed)


def test_parameters_and_products():
    sparse = PQTransformer(PQConfig(n_dims=4, n_layers=2, n_heads=2, d_k=3, init_std=0.3))
    names = {n.split("attn.")[1]: p.shape for n, p in sparse.named_parameters()
             if n.startswith("blocks.0.")}
    assert names == {"W_K": (2, 3, 4), "W_Q": (2, 3, 4), "B": (2, 4, 4)}
    attn = sparse.blocks[1].attn
    a = attn.W_K.transpose(-1, -2) @ attn.W_Q  # [head, d, d]
    torch.testing.assert_close(probes.preconditioners(sparse).A_heads[1], a.detach())
    assert torch.linalg.matrix_rank(a[0].detach()) == 3  # rank <= d_k
    dense = PQTransformer(PQConfig(n_dims=3, n_layers=1, sparse=False, d_k=2, init_std=0.3))
    names = {n.split("attn.")[1]: p.shape for n, p in dense.named_parameters()}
    assert names == {"W_K": (1, 2, 4), "W_Q": (1, 2, 4), "W_V": (1, 2, 4), "W_O": (1, 2, 4)}
    p, q = dense.matrices()
    at = dense.blocks[0].attn
    torch.testing.assert_close(q, (at.W_K.transpose(-1, -2) @ at.W_Q)[None])
    torch.testing.assert_close(p, (at.W_O.transpose(-1, -2) @ at.W_V)[None])


@pytest.mark.parametrize("kernel", ["linear", "softmax-ahn", "relu"])
def test_gd_construction_in_factored_form_equals_the_unfactored(kernel):
    """A_l = W_Kᵀ W_Q with W_K = √η R, W_Q = √η R (R orthogonal) is ηI to round-off."""
    lr, d = 0.2, 3
    plain = PQTransformer(PQConfig(n_dims=d, n_layers=3, kernel=kernel))
    plain.set_matrices(A=[lr * torch.eye(d)] * 3)
    factored = PQTransformer(PQConfig(n_dims=d, n_layers=3, kernel=kernel, d_k=d, init_std=0.0))
    with torch.no_grad():
        for layer, block in enumerate(factored.blocks):
            r = rotation(d, layer) * lr**0.5
            block.attn.W_K.copy_(r[None])
            block.attn.W_Q.copy_(r[None])
    b = batch()
    with torch.no_grad():
        expected, got = plain(b.xs, b.ys), factored(b.xs, b.ys)
    assert expected[:, 1:].abs().mean() > 0.1
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)
    if kernel == "linear":
        torch.testing.assert_close(got.double(), naive_pq(factored, b.xs, b.ys), atol=1e-5,
                                   rtol=0)


def test_dense_newton_construction_in_factored_form():
    plain = newton_transformer(3, 4, a=0.01)
    p, q = plain.matrices()
    factored = PQTransformer.from_matrices(P=p[:, 0], Q=q[:, 0], n_dims=3, d_k=7)
    assert factored.cfg.d_k == 7 and factored.cfg.n_state == 3
    b = batch(n=9)
    with torch.no_grad():
        torch.testing.assert_close(factored(b.xs, b.ys), plain(b.xs, b.ys), atol=1e-6, rtol=0)
    fp, fq = factored.matrices()
    torch.testing.assert_close(fp, p)
    torch.testing.assert_close(fq, q)


def test_low_rank_blocks_factor_and_full_rank_ones_are_refused():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(2, 4, 2, generator=g)
    low = u @ u.transpose(-1, -2)  # two layers of rank 2
    model = PQTransformer.from_matrices(A=low, d_k=2)
    torch.testing.assert_close(probes.preconditioners(model).A, low, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"A has rank above PQConfig.d_k=2 \(singular value"):
        PQTransformer.from_matrices(A=[torch.eye(4)], d_k=2)


def test_low_rank_factors_come_from_the_block_alone():
    # The saved W_K, W_Q of a block of rank < k: any SVD of it (signs flipped, a tied
    # singular value's basis rotated, as another LAPACK may return) gives the same factors,
    # balanced (singular values S^½ each) and with the product the block.
    g = torch.Generator().manual_seed(3)
    basis = torch.linalg.qr(torch.randn(5, 3, generator=g, dtype=torch.float64))[0]
    other = torch.linalg.qr(torch.randn(5, 3, generator=g, dtype=torch.float64))[0]
    m = (basis * torch.tensor([2.0, 2.0, 0.5], dtype=torch.float64)) @ other.T  # 2 tied
    u, s, vh = torch.linalg.svd(m[None])
    turn = torch.eye(5, dtype=torch.float64)
    turn[:2, :2] = torch.tensor([[0.6, -0.8], [0.8, 0.6]], dtype=torch.float64)
    flip = torch.tensor([-1.0, 1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    left, right = balanced_factors(u, s, vh, 3)
    other_left, other_right = balanced_factors(u @ turn * flip, s, (turn.T @ vh) * flip[:, None], 3)
    torch.testing.assert_close(other_left, left, atol=1e-14, rtol=0)
    torch.testing.assert_close(other_right, right, atol=1e-14, rtol=0)
    torch.testing.assert_close(left[0].T @ right[0], m, atol=1e-14, rtol=0)
    root = torch.tensor([2.0, 2.0, 0.5], dtype=torch.float64).sqrt()
    torch.testing.assert_close(torch.linalg.svdvals(left[0]), root)
    torch.testing.assert_close(torch.linalg.svdvals(right[0]), root)


def test_low_rank_factors_have_no_round_off_directions():
    # by hand: diag(3, 0, 2, 0) at d_k = 2 is the axes 1 and 3, each scaled by its root
    want = torch.tensor([[3.0 ** 0.5, 0, 0, 0], [0, 0, 2.0 ** 0.5, 0]], dtype=torch.float64)
    for factor_ in factor(torch.diag(torch.tensor([3.0, 0, 2, 0], dtype=torch.float64))[None],
                          2, "A"):
        torch.testing.assert_close(factor_[0], want, atol=1e-15, rtol=0)
    # a block of rank 1 at d_k = 2: the second rows are 0, not the square root of a
    # round-off singular value along whatever null direction the SVD returned (~1e-9)
    row = torch.randn(1, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    left, right = factor(-(row.T @ row)[None], 2, "A")
    assert float(left[0, 1].abs().max()) == 0 and float(right[0, 1].abs().max()) == 0
    # a head far smaller than another of its layer is kept whole (rank judged per head)
    heads = torch.stack([torch.diag(torch.tensor([1.0, 0, 0], dtype=torch.float64)),
                         torch.diag(torch.tensor([1e-7, 0, 0], dtype=torch.float64))])
    left, right = factor(heads, 1, "A")
    torch.testing.assert_close(left.transpose(-1, -2) @ right, heads, atol=1e-22, rtol=0)


@pytest.mark.slow
def test_save_load_train_and_align(tmp_path):
    task = tasks.RegressionTask(n_dims=3, n_points=9, cov="rotated", w_prior="inverse-cov")
    model = PQTransformer(PQConfig(n_dims=3, n_layers=2, d_k=2, seed=1, init_std=0.1))
    before = probes.preconditioners(model).A.clone()
    cfg = training.TrainConfig(steps=30, batch_size=64, lr=0.02, loss="last", zero_b=True,
                               log_every=10, checkpoint_every=0)
    result = training.train(model, task, cfg, progress=False)
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert not torch.equal(probes.preconditioners(model).A, before)
    assert torch.all(model.blocks[0].attn.B == 0)  # zero_b holds B (not factored) at 0
    model.save(tmp_path / "m", task=task)
    back = models.load(tmp_path / "m")
    assert back.cfg == model.cfg and back.cfg.d_k == 2
    b = task.sample(3, generator=2)
    with torch.no_grad():
        assert torch.equal(back(b.xs, b.ys), model(b.xs, b.ys))
    _, cache = back.run_with_cache(b.xs, b.ys)
    assert cache["blocks.1.attn.hook_pattern"].shape == (3, 9, 1, 10, 9)
    res = alignment.align(back, alignment.AlignConfig(n_sequences=32, n_boot=20))
    assert "pgd_own" in res.similarities and len(res.layer_error) == 3
    assert res.layer_error[-1] < res.layer_error[0]  # trained layers predict


def test_bad_values_are_one_line_errors():
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match=r"^PQConfig.d_k must be a positive integer \(the "
                                             r"head width of the factored parametrization\) or "
                                             r"None \(unfactored\), got " + re.escape(repr(bad))
                                             + "$"):
            PQConfig(n_dims=3, d_k=bad)
    dense = PQTransformer(PQConfig(n_dims=3, sparse=False, d_k=2))
    task = tasks.RegressionTask(n_dims=3, n_points=5)
    for field in ("zero_b", "project_sparse"):
        with pytest.raises(ValueError, match=rf"^TrainConfig.{field} sets entries of P, Q, "
                                             r"which a dense factored model \(PQConfig.d_k=2\)"):
            training.train(dense, task, training.TrainConfig(steps=1, **{field: True}),
                           progress=False)


def test_cli_train_takes_d_k(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--family", "pq", "--n-dims", "3", "--n-points", "6", "--d-k", "2",
            "--steps", "3", "--batch-size", "8", "--out", str(out), "--w-prior", "rotated"]
    assert main(argv) == 0
    model = models.load(out / "checkpoint")
    assert model.cfg.d_k == 2 and model.task.w_prior == "rotated"
    capsys.readouterr()
    assert main([*argv[:-4], "--d-k", "0", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("iclprobe train: error: --d-k: PQConfig.d_k must be a positive "
                          "integer") and err.endswith("got 0")
