"""What collect_residuals returns can be patched back with patch_residual."""

import pytest
import torch
from helpers import small_batch, tiny_gpt, tiny_pq

from iclprobe import hooks, models

MAKERS = {"interleaved": lambda: tiny_gpt("softmax", "interleaved"),
          "paired": lambda: tiny_gpt("linear", "paired"), "pq": tiny_pq}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_all_positions_are_the_hooks_tensors_and_patch_back_identically(kind):
    model = MAKERS[kind]()
    b = small_batch(batch=5)
    every = hooks.collect_residuals(model, b.xs, b.ys, positions="all")
    _, cache = model.run_with_cache(b.xs, b.ys)  # every hook observed: unfused kernels
    for layer in range(model.cfg.n_layers + 1):
        torch.testing.assert_close(every[layer], cache[hooks.resid_hook_name(layer)])
    readout = hooks.collect_residuals(model, b.xs, b.ys)
    with torch.no_grad():
        plain = model(b.xs, b.ys)
        for layer in range(model.cfg.n_layers + 1):
            for source in (every[layer], readout[layer]):
                with hooks.patch_residual(model, layer, source):
                    assert torch.equal(model(b.xs, b.ys), plain), (layer, source.shape)


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_readout_rows_of_run_a_patched_into_run_b(kind):
    model = MAKERS[kind]()
    a, b = small_batch(batch=4, seed=1), small_batch(batch=4, seed=2)
    rows_a = hooks.collect_residuals(model, a.xs, a.ys)  # [L+1, B, n, d_model]
    last = model.cfg.n_layers
    with torch.no_grad():
        preds_a, preds_b = model(a.xs, a.ys), model(b.xs, b.ys)
        # at the last layer the readout rows are all the prediction reads: B becomes A
        with hooks.patch_residual(model, last, rows_a[last]):
            torch.testing.assert_close(model(b.xs, b.ys), preds_a, rtol=0, atol=0)
        if isinstance(model, models.PQTransformer):
            return
        # inside: B's other tokens stay; the rest of the network runs on the spliced stream
        for layer in range(last):
            spliced = hooks.run_first_layers(model, b.xs, b.ys, layer).clone()
            spliced[:, model.readout_positions(8)] = rows_a[layer]
            for block in model.blocks[layer:]:
                spliced = block(spliced)
            expected = model.readout(spliced[:, model.readout_positions(8)])
            with hooks.patch_residual(model, layer, rows_a[layer]):
                got = model(b.xs, b.ys)
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
            assert not torch.allclose(got, preds_b, atol=1e-3)


def test_patch_names_both_accepted_shapes():
    model = tiny_gpt()
    b = small_batch()
    with pytest.raises(ValueError, match=r"source has shape \(4, 3, 16\), but "
                                         r"blocks.0.hook_resid_post has \(4, 16, 16\) \(every "
                                         r"token\) or its readout rows \(4, 8, 16\)"), \
            torch.no_grad(), hooks.patch_residual(model, 1, torch.zeros(4, 3, 16)):
        model(b.xs, b.ys)
    with pytest.raises(ValueError, match=r"positions must be one of \('readout', 'all'\)"):
        hooks.collect_residuals(model, b.xs, b.ys, positions="tokens")
