"""Loading checkpoints: stored dtypes, non-finite weights, configs that do not fit the file."""

import json
import logging

import pytest
import torch
from helpers import gpt_parameters, small_batch, tiny_gpt
from safetensors.torch import load_file, save_file

import iclprobe._checks
from iclprobe import models
from iclprobe._checks import meminfo_available
from iclprobe.cli import main
from iclprobe.models import CheckpointError, GPTConfig


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m"
    tiny_gpt().save(path)
    return path


def restore(path, **changes):
    """Rewrite model.safetensors with some tensors replaced."""
    weights = path / "model.safetensors"
    state = load_file(str(weights))
    state.update(changes)
    save_file(state, str(weights))
    return state


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_integer_bool_and_complex_weights_are_refused(ckpt, dtype):
    w_q = load_file(str(ckpt / "model.safetensors"))["blocks.0.attn.W_Q"]
    restore(ckpt, **{"blocks.0.attn.W_Q": (w_q * 100).to(dtype)})
    with pytest.raises(CheckpointError, match=rf"model.safetensors: tensor 'blocks.0.attn.W_Q' is "
                                              rf"stored as {dtype}, but the model's is "
                                              "torch.float32: refusing a cast"):
        models.load(ckpt)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused(ckpt, bad):
    state = load_file(str(ckpt / "model.safetensors"))
    w = state["read_out.weight"].clone()
    w[0, 3] = bad
    restore(ckpt, **{"read_out.weight": w})
    with pytest.raises(CheckpointError, match="model.safetensors: tensor 'read_out.weight' holds 1 "
                                              "NaN or inf value"):
        models.load(ckpt)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_load_exactly_and_silently(ckpt, dtype, caplog):
    state = {k: v.to(dtype) for k, v in load_file(str(ckpt / "model.safetensors")).items()}
    save_file(state, str(ckpt / "model.safetensors"))
    with caplog.at_level(logging.WARNING):
        model = models.load(ckpt)
    assert not caplog.records
    for name, value in model.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, state[name].float()), name


def test_float64_weights_load_with_a_warning_naming_what_was_rounded(ckpt, caplog):
    state = load_file(str(ckpt / "model.safetensors"))
    exact = {k: v.double() for k, v in state.items()}  # float32 values: the cast is exact
    save_file(exact, str(ckpt / "model.safetensors"))
    with caplog.at_level(logging.WARNING):
        models.load(ckpt)
    assert not caplog.records
    finer = dict(exact)
    finer["blocks.1.mlp.W_in"] = exact["blocks.1.mlp.W_in"] + 1e-12
    save_file(finer, str(ckpt / "model.safetensors"))
    with caplog.at_level(logging.WARNING):
        model = models.load(ckpt)
    (record,) = caplog.records
    assert "1 tensor(s) rounded to the model's torch.float32: 'blocks.1.mlp.W_in' " \
           "(torch.float64, by up to" in record.getMessage()
    torch.testing.assert_close(model.blocks[1].mlp.W_in, finer["blocks.1.mlp.W_in"].float(),
                               rtol=0, atol=0)
    save_file({**exact, "read_in.bias": exact["read_in.bias"] + 1e39},
              str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor 'read_in.bias' \(torch.float64\) has "
                                              "values beyond the range of the model's"):
        models.load(ckpt)


@pytest.mark.parametrize(("field", "value"), [("n_layers", 3000), ("d_model", 1024),
                                             ("n_positions", 10**6), ("n_dims", 10**5)])
def test_a_config_far_larger_than_the_weight_file_is_refused_before_building(ckpt, field, value):
    meta = json.loads((ckpt / "config.json").read_text())
    meta["config"][field] = value
    (ckpt / "config.json").write_text(json.dumps(meta))
    params = gpt_parameters(GPTConfig(**meta["config"]))
    stored = sum(v.numel() for v in tiny_gpt().state_dict().values())  # what ckpt holds
    with pytest.raises(CheckpointError, match=f"config.json: the config describes a model of "
                                              f"{params:,} parameters .* but model.safetensors "
                                              f"holds {stored:,}$"):
        models.load(ckpt)


@pytest.mark.parametrize(("field", "value", "tensor"), [("n_heads", 16, r"blocks.\d.attn.W_[QKV]"),
                                                        ("n_dims", 50, "W_pos|read_in.weight")])
def test_a_small_config_mismatch_names_the_tensor(ckpt, field, value, tensor):
    meta = json.loads((ckpt / "config.json").read_text())
    meta["config"][field] = value
    (ckpt / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=f"model.safetensors: tensor '({tensor})' has shape"):
        models.load(ckpt)


def test_meminfo_is_read():
    assert meminfo_available("MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2048 * 1024
    assert meminfo_available("MemTotal: 100 kB\n") is None


@pytest.mark.parametrize(("sizes", "what"), [
    (["--n-layers", "1000000"], "training: a model with"),
    (["--d-model", "1048576"], "training: a model with"),
    (["--n-points", "10000000"], "training: a model with"),
    (["--batch-size", "1000000000"], "training: a model with"),
    (["--family", "pq", "--cov", "ill-conditioned", "--n-dims", "300000"],
     "training: a model with"),
    (["--family", "pq", "--n-dims", "300000"], "RegressionTask(n_dims=300000)"),
])
def test_train_refuses_absurd_sizes_before_allocating(tmp_path, capsys, monkeypatch, sizes,
                                                      what):
    # a fixed 16 GiB, so that a machine with more memory cannot start allocating
    monkeypatch.setattr(iclprobe._checks, "available_memory", lambda: 16 * 2**30)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--n-heads", "1", *sizes]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"iclprobe train: error: {what}"), err
    assert err.endswith("GiB of memory, but 16 GiB are available"), err
    assert not out.exists()


def test_loading_still_gives_the_same_model(ckpt):
    b = small_batch()
    with torch.no_grad():
        torch.testing.assert_close(models.load(ckpt)(b.xs, b.ys), tiny_gpt()(b.xs, b.ys),
                                   rtol=0, atol=0)
