import numpy as np
import pytest
import torch
from helpers import assert_queries_match_substitution
from transformer_lens import ActivationCache

from iclprobe import models, tasks
from iclprobe.models import PQConfig, PQTransformer


def batch(d=3, n=10, b=4, seed=0, cov="isotropic"):
    return tasks.RegressionTask(n_dims=d, n_points=n, cov=cov).sample(b, generator=seed)


def gd_reference(xs, ys, lr, steps):
    """k steps of GD on R(w) = (1/2t) sum_i (w.x_i - y_i)^2 from 0, each prefix, looped."""
    xs, ys = xs.double().numpy(), ys.double().numpy()
    b, n, d = xs.shape
    out = np.zeros((b, n))
    for s in range(b):
        for t in range(1, n):
            x, y, w = xs[s, :t], ys[s, :t], np.zeros(d)
            for _ in range(steps):
                w = w - lr * x.T @ (x @ w - y) / t
            out[s, t] = xs[s, t] @ w
    return torch.from_numpy(out)


def naive_pq(model: PQTransformer, xs, ys):
    """Each truncated prefix alone, per sequence, with numpy: Z <- Z + (1/t) k(Z Q Z_ctx^T) Z_ctx P^T."""
    p_all, q_all = (m.detach().double().numpy() for m in model.matrices())
    kernel = model.cfg.kernel
    xs, ys = xs.double().numpy(), ys.double().numpy()
    b, n, d = xs.shape
    out = np.zeros((b, n))
    for s in range(b):
        for t in range(1, n):
            z = np.concatenate([np.c_[xs[s, :t], ys[s, :t]], np.r_[xs[s, t], 0.0][None]])
            for p_layer, q_layer in zip(p_all, q_all):
                update = np.zeros_like(z)
                for p, q in zip(p_layer, q_layer):
                    scores = z @ q @ z[:t].T  # [t + 1, t]
                    if kernel == "softmax":
                        e = np.exp(scores - scores.max(1, keepdims=True))
                        pattern = e / e.sum(1, keepdims=True)
                    else:
                        pattern = (np.maximum(scores, 0) if kernel == "relu" else scores) / t
                    update += pattern @ z[:t] @ p.T
                z = z + update
            out[s, t] = -z[t, d]
    return torch.from_numpy(out)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_gd_construction_equals_gd(k):
    b = batch()
    model = PQTransformer.from_matrices(A=[0.05 * torch.eye(3)] * k)
    with torch.no_grad():
        preds = model(b.xs, b.ys)
    expected = gd_reference(b.xs, b.ys, 0.05, k)
    assert expected[:, 1:].abs().min() > 0  # a non-trivial comparison
    torch.testing.assert_close(preds.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", ["linear", "softmax", "relu"])
@pytest.mark.parametrize("sparse", [True, False])
def test_batched_forward_equals_each_prefix_alone(kernel, sparse):
    cfg = PQConfig(n_dims=3, n_layers=3, n_heads=2, sparse=sparse, kernel=kernel, seed=1,
                   init_std=0.2)
    model = PQTransformer(cfg)
    b = batch(n=7)
    with torch.no_grad():
        preds = model(b.xs, b.ys)
        _, cache = model.run_with_cache(b.xs, b.ys)  # the scores path, hooks observed
    expected = naive_pq(model, b.xs, b.ys)
    assert expected[:, 1:].abs().max() > 1e-2
    torch.testing.assert_close(preds.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.readout(cache["blocks.2.hook_resid_post"])[..., 0], preds,
                               atol=1e-5, rtol=1e-5)
    assert torch.all(preds[:, 0] == 0)  # no context, no update


def causal_single_pass(model, xs, ys):
    """The tempting shortcut: one causal pass over the whole sequence (wrong from layer 2)."""
    p_all, q_all = model.matrices()
    z = torch.cat([xs, ys[..., None]], -1).double()
    n = z.shape[1]
    causal = torch.ones(n, n).tril(-1).double()  # row t attends to rows j < t
    inv_t = torch.cat([torch.zeros(1), 1 / torch.arange(1, n)]).double()
    for p_layer, q_layer in zip(p_all.double(), q_all.double()):
        update = torch.zeros_like(z)
        for p, q in zip(p_layer, q_layer):
            scores = z @ q @ z.transpose(1, 2) * causal * inv_t[:, None]
            update = update + scores @ z @ p.T
        z = z + update
    return -(z[..., -1] - ys.double())  # remove the row's own label


def test_single_causal_pass_is_wrong_from_layer_two():
    b = batch()
    one = PQTransformer.from_matrices(A=[0.05 * torch.eye(3)])
    two = PQTransformer.from_matrices(A=[0.05 * torch.eye(3)] * 2)
    with torch.no_grad():
        torch.testing.assert_close(causal_single_pass(one, b.xs, b.ys), one(b.xs, b.ys).double(),
                                   atol=1e-6, rtol=0)
        gap = (causal_single_pass(two, b.xs, b.ys) - two(b.xs, b.ys).double()).abs().max()
    assert gap > 1e-3


def test_gd_plus_plus_construction():
    lr, gamma, k = 0.1, 0.05, 3
    b = batch(n=8)
    model = PQTransformer.from_matrices(A=[lr * torch.eye(3)] * k,
                                        B=[gamma / lr * torch.eye(3)] * k)
    with torch.no_grad():
        preds = model(b.xs, b.ys).double()
    xs, ys = b.xs.double().numpy(), b.ys.double().numpy()
    expected = np.zeros(ys.shape)
    for s in range(xs.shape[0]):
        for t in range(1, xs.shape[1]):
            x, r, xq, pred = xs[s, :t].copy(), ys[s, :t].copy(), xs[s, t].copy(), 0.0
            for _ in range(k):
                grad = x.T @ r / t  # with the current covariates and residual labels
                pred, r = pred + lr * xq @ grad, r - lr * x @ grad  # the GD update
                transform = np.eye(3) - gamma * x.T @ x / t  # then x <- (I - gamma S/t) x
                x, xq = x @ transform.T, transform @ xq
            expected[s, t] = pred
    torch.testing.assert_close(preds, torch.from_numpy(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", ["linear", "softmax"])
def test_predict_queries_equals_substitution(kernel):
    model = PQTransformer(PQConfig(n_dims=3, n_layers=2, n_heads=2, kernel=kernel,
                                   init_std=0.3))
    b = batch(n=6)
    queries = torch.randn(4, 6, 3, 3, generator=torch.Generator().manual_seed(2))
    assert_queries_match_substitution(model, b.xs, b.ys, queries, atol=1e-6, rtol=1e-6)


def test_hooks_and_activation_cache():
    model = PQTransformer(PQConfig(n_dims=3, n_layers=3, init_std=0.2))
    b = batch(n=5)
    preds, cache = model.run_with_cache(b.xs, b.ys)
    names = {f"blocks.{layer}.{h}" for layer in range(3) for h in (
        "hook_resid_pre", "hook_resid_post", "attn.hook_attn_scores", "attn.hook_pattern",
        "hook_attn_out")}
    assert names <= set(cache.keys())
    assert cache["blocks.0.hook_resid_pre"].shape == (4, 5, 6, 4)  # batch, prefix, row, d+1
    resid = ActivationCache(dict(cache.items()), model).accumulated_resid()
    assert resid.shape == (4, 4, 5, 6, 4)
    layer_preds = model.readout(resid)[..., 0]  # [layer, batch, prefix]
    assert torch.all(layer_preds[0] == 0)  # the embedded query row carries y = 0
    torch.testing.assert_close(layer_preds[-1], preds)


def test_round_trip_and_ahn_import(tmp_path):
    model = PQTransformer(PQConfig(n_dims=4, n_layers=2, n_heads=2, init_std=0.2, seed=3))
    task = tasks.RegressionTask(n_dims=4, n_points=9, cov="rotated", w_prior="inverse-cov")
    model.save(tmp_path / "pq", task=task)
    back = models.load(tmp_path / "pq")
    assert isinstance(back, PQTransformer) and back.cfg == model.cfg
    assert back.task.to_dict() == task.to_dict()
    b = task.sample(3, generator=0)
    with torch.no_grad():
        assert torch.equal(back(b.xs, b.ys), model(b.xs, b.ys))

    # Ahn et al.'s parameter tensor: [layer, head, 2, d, d], P block then Q block (= -A).
    allparam = torch.randn(2, 2, 2, 4, 4, generator=torch.Generator().manual_seed(0)) * 0.2
    torch.save({"allparam": allparam}, tmp_path / "ahn.pt")
    imported = models.load(tmp_path / "ahn.pt")
    a, b_blocks = imported.blocks[1].attn.A, imported.blocks[1].attn.B
    torch.testing.assert_close(a, -allparam[1, :, 1])
    torch.testing.assert_close(b_blocks, allparam[1, :, 0])
    # Their forward on Z = [(x_i, y_i)_{i<N}, (x_q, 0)], prediction -Z[N, d], in numpy.
    z = torch.cat([b.xs, torch.cat([b.ys[:, :-1], torch.zeros(3, 1)], 1)[..., None]], -1)
    z = z.double().numpy()
    n_ctx, d = z.shape[1] - 1, 4
    for layer in range(2):
        residues = 0
        for head in range(2):
            p_full = np.zeros((d + 1, d + 1))
            p_full[:d, :d], p_full[d, d] = allparam[layer, head, 0].double().numpy(), 1
            q_full = np.zeros((d + 1, d + 1))
            q_full[:d, :d] = allparam[layer, head, 1].double().numpy()
            mask = np.eye(n_ctx + 1)
            mask[n_ctx, n_ctx] = 0
            attn = np.einsum("bni,ij,bmj->bnm", z, q_full, z)
            key = np.einsum("ij,bnj->bni", p_full, z)
            residues = residues + np.einsum("bnm,ml,bli->bni", attn, mask, key) / n_ctx
        z = z + residues
    with torch.no_grad():
        ours = imported(b.xs, b.ys)[:, -1].double()
    torch.testing.assert_close(ours, torch.from_numpy(-z[:, n_ctx, d]), atol=1e-5, rtol=0)


def test_bad_matrices_and_inputs():
    with pytest.raises(ValueError, match=r"A must be square matrices \[layer, \(head,\) k, k\]"):
        PQTransformer.from_matrices(A=torch.zeros(2, 3, 4))
    model = PQTransformer(PQConfig(n_dims=3, n_layers=2))
    with pytest.raises(ValueError, match=r"A must have shape \[n_layers=2, n_heads=1, 3, 3\], "
                                         r"got \(2, 1, 4, 4\).*not dense"):
        model.set_matrices(A=torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match=r"B must have shape .* \(2, 1, 3, 2\) \(blocks must be square"):
        model.set_matrices(A=torch.zeros(2, 3, 3), B=torch.zeros(2, 3, 2))
    dense_p = torch.randn(2, 4, 4)
    with pytest.raises(ValueError, match="sparse PQTransformer was given dense matrices"):
        model.set_matrices(P=dense_p, Q=torch.randn(2, 4, 4))
    b = batch(d=4)
    with pytest.raises(ValueError, match=r"xs must have shape \[batch, pos, 3\], got \(4, 10, 4\)"):
        model(b.xs, b.ys)
    with pytest.raises(ValueError, match="allparam must have shape"):
        models.load_ahn(torch.zeros(2, 1, 3, 3, 3))
    with pytest.raises(ValueError, match="PQConfig.kernel must be one of"):
        PQConfig(n_dims=3, kernel="cosine")
    dense = PQTransformer(PQConfig(n_dims=3, n_layers=1, sparse=False))
    dense.set_matrices(A=[torch.eye(3)])  # A/B are a special case of a dense P, Q
    p, q = dense.matrices()
    assert p[0, 0, 3, 3] == 1 and torch.equal(q[0, 0, :3, :3], -torch.eye(3))


def test_seeded_init_leaves_global_rng_alone():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = PQTransformer(PQConfig(n_dims=3, seed=5))
    assert torch.equal(state, torch.get_rng_state())
    b = PQTransformer(PQConfig(n_dims=3, seed=5))
    assert torch.equal(a.blocks[0].attn.A, b.blocks[0].attn.A)


@pytest.mark.parametrize("kernel", ["linear", "softmax"])
def test_last_only_forward(kernel):
    model = PQTransformer(PQConfig(n_dims=3, n_layers=3, n_heads=2, kernel=kernel, init_std=0.2))
    b = batch(n=7)
    with torch.no_grad():
        torch.testing.assert_close(model(b.xs, b.ys, last_only=True), model(b.xs, b.ys)[:, -1:],
                                   atol=1e-6, rtol=1e-6)
