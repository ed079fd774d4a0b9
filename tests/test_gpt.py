import pytest
import torch
from einops import einsum
from helpers import assert_queries_match_substitution, small_batch, tiny_gpt
from transformer_lens import ActivationCache

from iclprobe import models

KINDS = [(a, lay) for a in ("softmax", "linear") for lay in ("interleaved", "paired")]


@pytest.mark.parametrize(("attention", "layout"), KINDS)
def test_causality(attention, layout):
    model = tiny_gpt(attention, layout)
    b = small_batch()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        base = model(b.xs, b.ys)
        n = b.xs.shape[1]
        for t in range(n):
            xs, ys = b.xs.clone(), b.ys.clone()
            xs[:, t + 1 :] = torch.randn(xs[:, t + 1 :].shape, generator=g)
            ys[:, t:] = torch.randn(ys[:, t:].shape, generator=g)
            torch.testing.assert_close(model(xs, ys)[:, t], base[:, t], atol=1e-6, rtol=0)
        # ...and the past does matter: the test above can fail.
        xs = b.xs.clone()
        xs[:, 0] += 1.0
        assert (model(xs, b.ys)[:, 1:] - base[:, 1:]).abs().min() > 1e-6


@pytest.mark.parametrize(("attention", "layout"), KINDS)
def test_predict_queries_equals_substitution(attention, layout):
    model = tiny_gpt(attention, layout)
    b = small_batch()
    queries = torch.randn(4, 8, 3, 3, generator=torch.Generator().manual_seed(1))
    assert_queries_match_substitution(model, b.xs, b.ys, queries, atol=1e-5)


def test_predict_queries_chunks(monkeypatch):
    import iclprobe.models.gpt as gpt

    model = tiny_gpt()
    b = small_batch()
    queries = torch.randn(4, 8, 5, 3)
    with torch.no_grad():
        full = model.predict_queries(b.xs, b.ys, queries)
        monkeypatch.setattr(gpt, "QUERY_CHUNK_ELEMENTS", 1)
        torch.testing.assert_close(model.predict_queries(b.xs, b.ys, queries), full)


HOOKS = [
    "hook_embed", "hook_pos_embed", "ln_final.hook_scale", "ln_final.hook_normalized",
] + [
    f"blocks.{layer}.{name}" for layer in range(2) for name in (
        "hook_resid_pre", "hook_resid_mid", "hook_resid_post", "ln1.hook_scale",
        "ln1.hook_normalized", "ln2.hook_scale", "ln2.hook_normalized", "attn.hook_q",
        "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
        "hook_attn_out", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out")
]


@pytest.mark.parametrize(("attention", "layout"), KINDS)
def test_run_with_cache_hooks_and_activation_cache(attention, layout):
    model = tiny_gpt(attention, layout)
    b = small_batch()
    preds, cache = model.run_with_cache(b.xs, b.ys)
    assert set(HOOKS) <= set(cache.keys())
    n_tok = 16 if layout == "interleaved" else 8
    assert cache["blocks.0.attn.hook_pattern"].shape == (4, 2, n_tok, n_tok)
    assert cache["blocks.1.ln2.hook_scale"].shape == (4, n_tok, 1)
    # Hooks observed (the unfused path) give the same predictions as the fused path.
    torch.testing.assert_close(preds, model(b.xs, b.ys), atol=1e-5, rtol=0)
    assert isinstance(cache, ActivationCache)
    ac = ActivationCache(dict(cache.items()), model)
    resid = ac.accumulated_resid()
    assert resid.shape == (3, 4, n_tok, 16)
    torch.testing.assert_close(resid[-1], cache["blocks.1.hook_resid_post"])
    normed = ac.accumulated_resid(apply_ln=True)
    torch.testing.assert_close(model.read_out(normed[-1])[..., 0][:, model.readout_positions(8)],
                               preds, atol=1e-5, rtol=0)
    # Raw per-head weights are the ones the forward uses.
    attn = model.blocks[0].attn
    q = einsum(cache["blocks.0.ln1.hook_normalized"], attn.W_Q, "b p m, h m e -> b p h e")
    torch.testing.assert_close(q + attn.b_Q, cache["blocks.0.attn.hook_q"], atol=1e-5, rtol=0)
    if attention == "linear":
        pattern = cache["blocks.0.attn.hook_pattern"]
        scores = cache["blocks.0.attn.hook_attn_scores"]
        keys = torch.arange(1, n_tok + 1, dtype=pattern.dtype)
        torch.testing.assert_close(pattern * keys[:, None], scores)


def test_hooks_do_not_leak_and_can_intervene():
    model = tiny_gpt()
    b = small_batch()
    base = model(b.xs, b.ys)
    zeroed = model.run_with_hooks(
        b.xs, b.ys, fwd_hooks=[("blocks.1.hook_mlp_out", lambda t, hook: torch.zeros_like(t))]
    )
    assert (zeroed - base).abs().max() > 1e-4
    torch.testing.assert_close(model(b.xs, b.ys), base)


def test_seeded_init_leaves_global_rng_alone():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    cfg = models.GPTConfig(n_dims=3, n_positions=5, n_layers=1, d_model=8, n_heads=2, seed=3)
    a, b = models.GPTRegressor(cfg), models.GPTRegressor(cfg)
    assert torch.equal(state, torch.get_rng_state())
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    c = models.GPTRegressor(models.GPTConfig(**{**cfg.to_dict(), "seed": 4}))
    assert not torch.equal(a.blocks[0].attn.W_Q, c.blocks[0].attn.W_Q)


def test_config_round_trip_and_validation(caplog):
    cfg = models.GPTConfig(n_dims=3, n_positions=5, attention="linear", layout="paired")
    assert models.GPTConfig.from_dict(cfg.to_dict()) == cfg
    d = cfg.to_dict()
    d["n_layers"] = 99
    assert cfg.n_layers == 8  # to_dict is a copy
    assert models.GPTConfig.from_dict({**cfg.to_dict(), "dropout": 0.1}) == cfg
    assert "dropout" in caplog.text
    with pytest.raises(ValueError, match="d_model=10 must be divisible by n_heads=4"):
        models.GPTConfig(n_dims=3, n_positions=5, d_model=10, n_heads=4)
    with pytest.raises(ValueError, match=r"layout must be one of \('interleaved', 'paired'\)"):
        models.GPTConfig(n_dims=3, n_positions=5, layout="stacked")
    with pytest.raises(ValueError, match=r"attention must be one of \('softmax', 'linear'\)"):
        models.GPTConfig(n_dims=3, n_positions=5, attention="relu")
    with pytest.raises(ValueError, match="n_layers must be a positive integer, got 0"):
        models.GPTConfig(n_dims=3, n_positions=5, n_layers=0)
    with pytest.raises(TypeError, match="cfg must be a GPTConfig"):
        models.GPTRegressor({"n_dims": 3})


def test_bad_inputs():
    model = tiny_gpt()
    b = small_batch(n_points=9)
    with pytest.raises(ValueError, match="xs has 9 points but the model has n_positions=8"):
        model(b.xs, b.ys)
    b = small_batch()
    with pytest.raises(ValueError, match=r"xs must have shape \[batch, pos, 3\], got \(4, 8, 2\)"):
        model(b.xs[..., :2], b.ys)
    with pytest.raises(ValueError, match=r"ys must have shape \(4, 8\)"):
        model(b.xs, b.ys[:, :5])
    with pytest.raises(ValueError, match=r"queries must have shape \[4, 8, T, 3\]"):
        model.predict_queries(b.xs, b.ys, torch.zeros(4, 8, 3))


def test_fewer_points_than_positions():
    model = tiny_gpt()
    b = small_batch()
    with torch.no_grad():
        torch.testing.assert_close(model(b.xs[:, :5], b.ys[:, :5]), model(b.xs, b.ys)[:, :5])


@pytest.mark.parametrize(("attention", "layout"), KINDS)
def test_last_only_forward(attention, layout):
    model = tiny_gpt(attention, layout)
    b = small_batch()
    with torch.no_grad():
        torch.testing.assert_close(model(b.xs, b.ys, last_only=True), model(b.xs, b.ys)[:, -1:],
                                   atol=1e-6, rtol=0)


def test_query_residuals_chunked_and_reduced(monkeypatch):
    import iclprobe.models.gpt as gpt

    model = tiny_gpt("softmax", "paired")
    b = small_batch()
    queries = torch.randn(4, 8, 5, 3, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model.query_residuals(b.xs, b.ys, queries)  # [L+1, B, n, T, d_model]
        assert full.shape == (3, 4, 8, 5, 16)
        torch.testing.assert_close(model.readout(full[-1]), model.predict_queries(b.xs, b.ys,
                                                                                  queries))
        monkeypatch.setattr(gpt, "QUERY_CHUNK_ELEMENTS", 1)  # one query per chunk
        reduced = model.query_residuals(b.xs, b.ys, queries, reduce=lambda r: r.sum(-1))
        torch.testing.assert_close(reduced, full.sum(-1))
