"""Ahn et al.'s files and attention, against a re-implementation of their code in numpy."""

import logging

import numpy as np
import pytest
import torch
from helpers import assert_queries_match_substitution

from iclprobe import models, tasks
from iclprobe.models import CheckpointError, PQConfig, PQTransformer


def their_attention(p, q, z, activation):
    """Their ``attention(P, Q, Z, activation)``: every row scores all N + 1 columns."""
    n = z.shape[1] - 1
    d = z.shape[2] - 1
    p_full = np.zeros((d + 1, d + 1))
    p_full[:d, :d], p_full[d, d] = p, 1.0
    q_full = np.zeros((d + 1, d + 1))
    q_full[:d, :d] = q
    attn = np.einsum("bni,ij,bmj->bnm", z, q_full, z)
    if activation == "softmax":  # over all N + 1 columns, the query's own included
        e = np.exp(attn - attn.max(axis=2, keepdims=True))
        attn = e / e.sum(axis=2, keepdims=True)
    elif activation == "relu":
        attn = np.maximum(attn, 0.0)
    mask = np.eye(n + 1)
    mask[n, n] = 0.0  # the query's value is masked
    key = np.einsum("ij,bnj->bni", p_full, z)
    return np.einsum("bnm,ml,bli->bni", attn, mask, key) / n


def their_prediction(allparam, xs, ys, activation):
    """Their ``Transformer_F`` on Z = [(x_i, y_i)_{i<N}, (x_N, 0)]: ``-Z[N, d]``."""
    allparam = allparam.double().numpy()
    xs, ys = xs.double().numpy(), ys.double().numpy()
    z = np.concatenate([xs, np.concatenate([ys[:, :-1], np.zeros_like(ys[:, :1])], 1)[..., None]],
                       axis=2)
    for layer in allparam:
        z = z + sum(their_attention(head[0], head[1], z, activation) for head in layer)
    return torch.from_numpy(-z[:, -1, -1])


def random_allparam(n_layers, n_heads, d, seed, scale=0.3):
    """float64 values that float32 holds exactly (the import stores float32 weights)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n_layers, n_heads, 2, d, d, generator=g) * scale).double()


@pytest.mark.parametrize("n_layers", [1, 2, 3])
@pytest.mark.parametrize("n_heads", [1, 2])
def test_softmax_ahn_equals_their_softmax_attention(n_layers, n_heads):
    d, n_points = 3, 10
    allparam = random_allparam(n_layers, n_heads, d, seed=10 * n_layers + n_heads)
    model = models.load_ahn(allparam, kernel="softmax").double()
    assert model.cfg.kernel == "softmax-ahn"
    b = tasks.RegressionTask(n_dims=d, n_points=n_points).sample(5, generator=1,
                                                                 dtype=torch.float64)
    with torch.no_grad():
        preds = model(b.xs, b.ys)
        last = model(b.xs, b.ys, last_only=True)[:, 0]
        ours_softmax = PQTransformer.from_matrices(A=-allparam[:, :, 1], B=allparam[:, :, 0],
                                                   kernel="softmax").double()
        other = ours_softmax(b.xs, b.ys)
    # Every prefix t (N = t context rows + the query x_t), by truncating the sequence.
    for t in (1, 2, 5, n_points - 1):
        theirs = their_prediction(allparam, b.xs[:, : t + 1], b.ys[:, : t + 1], "softmax")
        assert theirs.abs().max() > 1e-2
        torch.testing.assert_close(preds[:, t], theirs, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(last, preds[:, -1], atol=1e-10, rtol=1e-10)
    # Our own softmax (no query column, no 1/N) is a different model.
    assert (other[:, 1:] - preds[:, 1:]).abs().max() > 1e-2
    assert torch.all(preds[:, 0] == 0)


def test_softmax_ahn_queries_and_residuals():
    """Each query gets its own copy of the context (it enters every row's denominator)."""
    model = models.load_ahn(random_allparam(2, 2, 3, seed=4), kernel="softmax").double()
    b = tasks.RegressionTask(n_dims=3, n_points=6).sample(4, generator=2, dtype=torch.float64)
    queries = torch.randn(4, 6, 3, 3, generator=torch.Generator().manual_seed(3),
                          dtype=torch.float64)
    assert_queries_match_substitution(model, b.xs, b.ys, queries, atol=1e-10, rtol=1e-10)
    with torch.no_grad():
        resid = model.query_residuals(b.xs, b.ys, queries)
        assert resid.shape == (3, 4, 6, 3, 4)
        torch.testing.assert_close(-resid[-1, ..., -1], model.predict_queries(b.xs, b.ys, queries))
        _, cache = model.run_with_cache(b.xs, b.ys)
        pattern = cache["blocks.0.attn.hook_pattern"]  # [batch, prefix, head, row, key]
    # The query's own column takes a share of the mass: each row's weights sum below 1/t.
    sums = pattern[:, 1:].sum(-1) * torch.arange(1, 6, dtype=torch.float64)[None, :, None, None]
    assert torch.all(sums < 1) and torch.all(sums > 0)


@pytest.mark.parametrize("activation", ["linear", "relu"])
def test_load_ahn_linear_and_relu_equal_their_attention(activation):
    allparam = random_allparam(2, 2, 4, seed=7)
    model = models.load_ahn(allparam, kernel=activation).double()
    b = tasks.RegressionTask(n_dims=4, n_points=8).sample(5, generator=5, dtype=torch.float64)
    with torch.no_grad():
        preds = model(b.xs, b.ys)
    torch.testing.assert_close(preds[:, -1], their_prediction(allparam, b.xs, b.ys, activation),
                               atol=1e-10, rtol=1e-10)


def their_u_d(d, seed):
    """Their rotation and scaling: U from the SVD of a uniform matrix, D = diag(1, 1, 1/2, …)."""
    gaus = torch.empty(d, d).uniform_(-1, 1, generator=torch.Generator().manual_seed(seed))
    return torch.linalg.svd(gaus)[0], torch.diag(torch.tensor([1.0, 1.0, 0.5, 0.25, 1.0][:d]))


def test_history_file_loads_the_last_entry_and_their_task(tmp_path, caplog):
    hist = [random_allparam(3, 1, 5, seed=s).float() for s in range(4)]
    u, d = their_u_d(5, seed=0)
    torch.save({"hist": hist, "U": u, "D": d}, tmp_path / "variable_N_hist_3_20_0.pth")
    with caplog.at_level(logging.WARNING, logger="iclprobe.models.ahn"):
        model = models.load(tmp_path / "variable_N_hist_3_20_0.pth")
    assert "assuming N = 20" in caplog.text
    torch.testing.assert_close(model.blocks[2].attn.A, -hist[-1][2, :, 1])
    torch.testing.assert_close(model.blocks[0].attn.B, hist[-1][0, :, 0])
    first = models.load(tmp_path / "variable_N_hist_3_20_0.pth", ahn_index=0)
    torch.testing.assert_close(first.blocks[1].attn.A, -hist[0][1, :, 1])
    second = models.load_ahn(tmp_path / "variable_N_hist_3_20_0.pth", index=-3, n_context=9)
    torch.testing.assert_close(second.blocks[1].attn.A, -hist[1][1, :, 1])
    # Their data: x = U D z, w = U D⁻¹ u, so Σ = U D² Uᵀ and w ~ N(0, Σ⁻¹); N + 1 points.
    assert model.task.n_points == 21 and second.task.n_points == 10
    assert model.task.w_prior == "inverse-cov"
    torch.testing.assert_close(model.task.covariance, (u @ d @ d @ u.T).double(), atol=1e-6,
                               rtol=0)
    with pytest.raises(ValueError, match=r"index must be an integer in -4..3 .* got 4"):
        models.load_ahn(tmp_path / "variable_N_hist_3_20_0.pth", index=4)
    with pytest.raises(ValueError, match=r"ahn_index applies to Ahn et al.'s .pt/.pth files"):
        models.load(tmp_path, ahn_index=0)


def test_other_layouts_of_their_files(tmp_path):
    hist = [random_allparam(2, 1, 5, seed=s).float() for s in range(3)]
    torch.save({"hist_list": hist}, tmp_path / "train.pth")  # train.ipynb: no U, D
    model = models.load(tmp_path / "train.pth")
    torch.testing.assert_close(model.blocks[1].attn.A, -hist[-1][1, :, 1])
    assert model.task is None
    u, d = their_u_d(5, seed=1)
    one_run = {"hist_dict": {(0,): hist}, "U_dict": {(0,): u}, "D_dict": {(0,): d}}
    torch.save(one_run, tmp_path / "rotation.pth")  # the rotation notebooks, one seed
    model = models.load_ahn(tmp_path / "rotation.pth", n_context=20)
    torch.testing.assert_close(model.blocks[0].attn.A, -hist[-1][0, :, 1])
    torch.testing.assert_close(model.task.covariance, (u @ d @ d @ u.T).double(), atol=1e-6,
                               rtol=0)
    torch.save({**one_run, "hist_dict": {(0,): hist, (1,): hist}}, tmp_path / "runs.pth")
    with pytest.raises(CheckpointError, match=r"runs.pth: 'hist_dict' holds several runs "
                                              r"\[\(0,\), \(1,\)\]"):
        models.load(tmp_path / "runs.pth")


def test_bad_ahn_files_and_arguments(tmp_path):
    good = random_allparam(1, 1, 3, seed=0)
    with pytest.raises(ValueError, match=r"kernel must be one of \('linear', 'relu', 'softmax'\)"
                                         r" \(Ahn et al.'s activations\), got 'softmax-ahn'"):
        models.load_ahn(good, kernel="softmax-ahn")
    torch.save({"weights": good}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match=r"a.pt: no 'allparam', 'hist', 'hist_list' or "
                                              r"'hist_dict' in the file \(keys: \['weights'\]\)"):
        models.load(tmp_path / "a.pt")
    torch.save({"hist": [good, {"x": 1}]}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="a.pt: entry -1 is a dict, not an allparam tensor"):
        models.load(tmp_path / "a.pt")
    torch.save({"hist": []}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="non-empty list"):
        models.load(tmp_path / "a.pt")
    torch.save({"hist": [good * float("nan")]}, tmp_path / "a.pt")
    with pytest.raises(ValueError, match=r"a.pt: allparam \(entry -1\) contains NaN or Inf"):
        models.load(tmp_path / "a.pt")
    torch.save({"hist": [good], "U": torch.eye(3), "D": torch.eye(4)}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match=r"a.pt: D must be a \[3, 3\] or \[3\] tensor, "
                                              r"got \(4, 4\)"):
        models.load(tmp_path / "a.pt")
    torch.save({"hist": [good], "U": torch.eye(3), "D": torch.ones(3)}, tmp_path / "a.pt")
    with pytest.raises(ValueError, match="n_context must be a positive integer, got 0"):
        models.load_ahn(tmp_path / "a.pt", n_context=0)
    assert models.load_ahn(tmp_path / "a.pt", n_context=4).task.n_points == 5  # D as a vector


def test_softmax_ahn_config_and_internal_check():
    model = PQTransformer(PQConfig(n_dims=3, n_layers=1, kernel="softmax-ahn", init_std=0.2))
    rows = torch.zeros(2, 3, 5, 4)  # 3 slots, 2 query rows in one copy
    with pytest.raises(ValueError, match="'softmax-ahn' needs one query row per prefix copy, "
                                         "got 2 rows after 3 context slots"):
        model.run_rows(rows, torch.arange(3), 3)
