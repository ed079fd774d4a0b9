import pytest
import torch
from helpers import small_batch, tiny_gpt, tiny_pq

from iclprobe import hooks, models


def all_hooks_clear(model):
    return all(not h._forward_hooks and not h._backward_hooks for h in model.hook_dict.values())


@pytest.mark.parametrize("make", [lambda: tiny_gpt("softmax", "interleaved"),
                                  lambda: tiny_gpt("linear", "paired"), tiny_pq])
def test_collect_residuals_matches_the_full_cache(make):
    model = make()
    b = small_batch(batch=10)
    resid = hooks.collect_residuals(model, b.xs, b.ys, batch_size=3)
    _, cache = model.run_with_cache(b.xs, b.ys)
    full = cache.accumulated_resid()  # [L+1, B, tok or prefix, ...]
    assert resid.shape == (model.cfg.n_layers + 1, 10, 8, model.cfg.d_model)
    if isinstance(model, models.PQTransformer):
        expected = full[:, :, :, 8]  # the query row of each prefix
    else:
        expected = full[:, :, model.readout_positions(8)]
    torch.testing.assert_close(resid, expected)
    sub = hooks.collect_residuals(model, b.xs, b.ys, layers=[2, 0])
    torch.testing.assert_close(sub, resid[[2, 0]])
    assert all_hooks_clear(model)


def test_residual_store_round_trip(tmp_path):
    model = tiny_gpt()
    b = small_batch(batch=7)
    store = hooks.ResidualStore.write(tmp_path / "store", model, b.xs, b.ys, batch_size=3,
                                      progress=False)
    assert len(store.shards) == 3 and store.shape == [3, 7, 8, 16]
    torch.testing.assert_close(hooks.ResidualStore(tmp_path / "store").load(),
                               hooks.collect_residuals(model, b.xs, b.ys))


@pytest.mark.parametrize(("index", "says"), [
    ("{", r"index.json: not valid JSON \(Expecting property name"),  # JSONDecodeError before
    ("[]", r"index.json: expected a JSON object with layers, shards and shape, got list"),
    ("{}", r"index.json: missing keys \['layers', 'shards', 'shape'\]"),  # KeyError before
    ('{"layers": [0], "shards": ["../x"], "shape": [1, 7, 8, 16]}',
     r"index.json: invalid shards=\['../x'\] \(layers: indices >= 0; shards: file names in "
     r"the store"),
    ('{"layers": [0], "shards": ["gone"], "shape": [1, 7, 8, 16]}',
     r"index.json: lists shards that are missing: \['gone'\]"),
])
def test_a_corrupt_residual_store_index_names_the_file(index, says, tmp_path):
    model = tiny_gpt()
    b = small_batch(batch=7)
    hooks.ResidualStore.write(tmp_path / "store", model, b.xs, b.ys, progress=False)
    (tmp_path / "store" / "index.json").write_text(index)
    with pytest.raises(ValueError, match=says):
        hooks.ResidualStore(tmp_path / "store")
    with pytest.raises(TypeError, match=r"ResidualStore: path must be a directory path \(str "
                                        r"or os.PathLike\), got NoneType None"):
        hooks.ResidualStore(None)


def test_a_corrupt_residual_shard_names_the_file(tmp_path):
    model = tiny_gpt()
    b = small_batch(batch=7)
    store = hooks.ResidualStore.write(tmp_path / "store", model, b.xs, b.ys, progress=False)
    (tmp_path / "store" / store.shards[0]).write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"resid-00000.safetensors: truncated or corrupt "
                                         r"residual shard"):
        store.load()


def test_run_first_layers():
    model = tiny_gpt()
    b = small_batch()
    _, cache = model.run_with_cache(b.xs, b.ys)
    torch.testing.assert_close(hooks.run_first_layers(model, b.xs, b.ys, 1),
                               cache["blocks.0.hook_resid_post"])
    torch.testing.assert_close(hooks.run_first_layers(model, b.xs, b.ys, 0),
                               cache["blocks.0.hook_resid_pre"])
    assert all_hooks_clear(model)


def test_zero_ablation_equals_zeroed_weights():
    model = tiny_gpt()
    b = small_batch()
    with torch.no_grad(), hooks.ablate(model, block=1):
        ablated = model(b.xs, b.ys)
    copy = tiny_gpt()
    with torch.no_grad():
        for p in (copy.blocks[1].attn.W_O, copy.blocks[1].attn.b_O, copy.blocks[1].mlp.W_out,
                  copy.blocks[1].mlp.b_out):
            p.zero_()
        torch.testing.assert_close(ablated, copy(b.xs, b.ys))
    with torch.no_grad(), hooks.ablate(model, block=0, head=1):
        head_ablated = model(b.xs, b.ys)
    copy = tiny_gpt()
    with torch.no_grad():
        copy.blocks[0].attn.W_O[1].zero_()
        torch.testing.assert_close(head_ablated, copy(b.xs, b.ys))
        assert (head_ablated - model(b.xs, b.ys)).abs().max() > 1e-4
    assert all_hooks_clear(model)


def test_pq_head_ablation_and_mean_ablation():
    model = tiny_pq()
    b = small_batch()
    with torch.no_grad(), hooks.ablate(model, block=2, head=0):
        ablated = model(b.xs, b.ys)
    copy = tiny_pq()
    with torch.no_grad():
        copy.blocks[2].attn.A[0].zero_()
        torch.testing.assert_close(ablated, copy(b.xs, b.ys))
    # mean ablation replaces the block's output with its batch mean
    with torch.no_grad(), hooks.ablate(model, block=2, kind="mean"):
        meaned = model(b.xs, b.ys)
        _, cache = model.run_with_cache(b.xs, b.ys)
    pre = cache["blocks.2.hook_resid_pre"]
    expected = pre + cache["blocks.2.hook_attn_out"].mean(0, keepdim=True)
    torch.testing.assert_close(meaned, model.readout(expected)[..., 0])


def test_patch_residual_from_another_run():
    model = tiny_gpt()
    a, b = small_batch(seed=0), small_batch(seed=1)
    _, cache_b = model.run_with_cache(b.xs, b.ys)
    with torch.no_grad(), hooks.patch_residual(model, 2, cache_b["blocks.1.hook_resid_post"]):
        patched = model(a.xs, a.ys)
    torch.testing.assert_close(patched, model(b.xs, b.ys))


def test_no_hook_left_behind_on_errors():
    model = tiny_gpt()
    b = small_batch()
    with pytest.raises(RuntimeError, match="boom"), hooks.ablate(model, block=0):
        raise RuntimeError("boom")
    assert all_hooks_clear(model)
    with pytest.raises(ValueError, match="source has shape"), \
            hooks.patch_residual(model, 1, torch.zeros(2, 2)):
        model(b.xs, b.ys)
    assert all_hooks_clear(model)


def test_bad_arguments():
    model = tiny_gpt()
    b = small_batch()
    with pytest.raises(ValueError, match=r"layers must be integers in 0..2 \(n_layers=2\), got \[3\]"):
        hooks.collect_residuals(model, b.xs, b.ys, layers=[3])
    with pytest.raises(ValueError, match=r"block must be an integer in 0..1, got 2"):
        with hooks.ablate(model, block=2):
            pass
    with pytest.raises(ValueError, match=r"head must be an integer in 0..1, got 5"):
        with hooks.ablate(model, block=0, head=5):
            pass
    with pytest.raises(ValueError, match="kind must be 'zero' or 'mean'"):
        with hooks.ablate(model, block=0, kind="resample"):
            pass
    with pytest.raises(TypeError, match=r"model must be an iclprobe model \(a Regressor"):
        hooks.collect_residuals(torch.nn.Linear(2, 2), b.xs, b.ys)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        hooks.collect_residuals(model, b.xs, b.ys, batch_size=0)
