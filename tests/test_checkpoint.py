import json
import logging
import pickle
import re

import pytest
import torch
import yaml
from helpers import small_batch, tiny_gpt
from safetensors.torch import load_file, save_file

from iclprobe import models, tasks
from iclprobe.models import CheckpointError


def write_garg_run(path, n_dims, n_positions, n_embd, n_layer, n_head, seed, old_buffers,
                   first_n_layer=None):
    """A Garg et al. run directory around a real Hugging Face GPT2Model.

    ``first_n_layer`` writes Fu et al.'s ``model.use_first_n_layer`` into the config; the
    reference then computes as their model does: with k < n_layer, the read-out of
    Hugging Face's ``hidden_states[k]`` (no final LayerNorm), else of ``last_hidden_state``.
    """
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    hf_cfg = GPT2Config(n_positions=2 * n_positions, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        use_cache=False)
    backbone = GPT2Model(hf_cfg).eval()
    read_in, read_out = torch.nn.Linear(n_dims, n_embd), torch.nn.Linear(n_embd, 1)
    with torch.no_grad():  # perturb norms and biases too
        for p in backbone.parameters():
            p.add_(0.05 * torch.randn_like(p))
    state = {f"_read_in.{k}": v for k, v in read_in.state_dict().items()}
    state.update({f"_backbone.{k}": v for k, v in backbone.state_dict().items()})
    state.update({f"_read_out.{k}": v for k, v in read_out.state_dict().items()})
    if old_buffers:  # older transformers stored the causal mask as buffers
        for layer in range(n_layer):
            size = 2 * n_positions
            state[f"_backbone.h.{layer}.attn.bias"] = torch.ones(1, 1, size, size).tril().bool()
            state[f"_backbone.h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    path.mkdir()
    torch.save({"model_state_dict": state, "train_step": 100}, path / "state.pt")
    config = {"model": {"family": "gpt2", "n_dims": n_dims, "n_positions": n_positions,
                        "n_embd": n_embd, "n_layer": n_layer, "n_head": n_head},
              "training": {"curriculum": {"points": {"end": n_positions}}}}
    if first_n_layer is not None:
        config["model"]["use_first_n_layer"] = first_n_layer
    (path / "config.yaml").write_text(yaml.safe_dump(config))

    def reference(xs, ys):
        b, n, d = xs.shape
        ys_wide = torch.cat([ys[..., None], torch.zeros(b, n, d - 1)], dim=2)
        zs = torch.stack([xs, ys_wide], dim=2).reshape(b, 2 * n, d)
        out = backbone(inputs_embeds=read_in(zs), output_hidden_states=True)
        k = n_layer if first_n_layer is None else first_n_layer
        hidden = out.hidden_states[k] if k < n_layer else out.last_hidden_state
        return read_out(hidden)[:, ::2, 0]

    return reference


@pytest.mark.parametrize(
    "shape", [(3, 7, 32, 2, 4, False), (5, 11, 48, 3, 3, True)], ids=["small", "old-buffers"]
)
def test_garg_import_matches_hugging_face(tmp_path, shape):
    n_dims, n_positions, *_ = shape
    reference = write_garg_run(tmp_path / "run", *shape[:5], seed=shape[1], old_buffers=shape[5])
    model = models.load(tmp_path / "run")
    assert isinstance(model, models.GPTRegressor)
    assert model.task.n_dims == n_dims and model.task.n_points == n_positions
    b = tasks.RegressionTask(n_dims=n_dims, n_points=n_positions).sample(6, generator=0)
    with torch.no_grad():
        ours, theirs = model(b.xs, b.ys), reference(b.xs, b.ys)
        _, cache = model.run_with_cache(b.xs, b.ys)  # the unfused, hooked path agrees too
    assert (theirs - theirs.mean()).abs().max() > 1e-2  # not a constant predictor
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    hidden_last = model.ln_final(cache[f"blocks.{shape[3] - 1}.hook_resid_post"])
    torch.testing.assert_close(model.read_out(hidden_last)[:, ::2, 0], theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_fu_probing_run_reads_out_after_k_blocks(tmp_path, caplog, k):
    """Fu et al.'s ``use_first_n_layer: k``: k blocks, no final LayerNorm, as their model."""
    n_dims, n_positions, n_layer = 3, 7, 3
    reference = write_garg_run(tmp_path / "run", n_dims, n_positions, 32, n_layer, 4, seed=k,
                               old_buffers=False, first_n_layer=k)
    full = write_garg_run(tmp_path / "full", n_dims, n_positions, 32, n_layer, 4, seed=k,
                          old_buffers=False)
    with caplog.at_level(logging.INFO, logger="iclprobe.models.garg"):
        model = models.load(tmp_path / "run")
    assert model.cfg.n_layers == k and model.cfg.final_norm == (k == n_layer)
    if k < n_layer:  # the state holds all 3 blocks and ln_f; the unused ones are named
        assert f"the weights of {', '.join(f'block {i}' for i in range(k, 3))}, ln_f are unused" \
            in caplog.text
    b = tasks.RegressionTask(n_dims=n_dims, n_points=n_positions).sample(6, generator=0)
    with torch.no_grad():
        ours, theirs = model(b.xs, b.ys), reference(b.xs, b.ys)
        preds, cache = model.run_with_cache(b.xs, b.ys)
    assert (theirs - theirs.mean()).abs().max() > 1e-2
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    if k < n_layer:  # the test tells the truncated model from the full-depth one
        assert (full(b.xs, b.ys) - theirs).abs().max() > 0.05
        assert not any(name.startswith("ln_final.") for name in model.hook_dict)
        assert not any(name.startswith("ln_final.") for name in model.state_dict())
    # The no-training readout of the last residual, and TransformerLens's apply_ln, agree.
    last = cache[f"blocks.{k - 1}.hook_resid_post"]
    torch.testing.assert_close(model.readout(last)[:, ::2], preds, atol=1e-5, rtol=0)
    normed = cache.accumulated_resid(apply_ln=True)[-1]
    torch.testing.assert_close(model.read_out(normed)[:, ::2, 0], preds, atol=1e-5, rtol=0)


def test_fu_truncated_model_round_trip(tmp_path):
    write_garg_run(tmp_path / "run", 3, 5, 16, 3, 2, seed=0, old_buffers=True, first_n_layer=2)
    model = models.load(tmp_path / "run")
    model.save(tmp_path / "ckpt")
    meta = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert meta["config"]["final_norm"] is False and meta["config"]["n_layers"] == 2
    assert not any(k.startswith("ln_final") for k in load_file(str(tmp_path / "ckpt" /
                                                                   "model.safetensors")))
    back = models.load(tmp_path / "ckpt")
    assert back.cfg == model.cfg
    b = small_batch(n_points=5)
    with torch.no_grad():
        assert torch.equal(back(b.xs, b.ys), model(b.xs, b.ys))


@pytest.mark.parametrize("k", [4, 0, -1, "2", 1.5, True])
def test_fu_use_first_n_layer_out_of_range(tmp_path, k):
    write_garg_run(tmp_path / "run", 3, 5, 16, 3, 2, seed=0, old_buffers=False, first_n_layer=k)
    with pytest.raises(CheckpointError, match=r"config.yaml: model.use_first_n_layer must be an "
                                              rf"integer in 1..n_layer=3, got {re.escape(repr(k))}"):
        models.load(tmp_path / "run")


def test_garg_import_errors(tmp_path):
    write_garg_run(tmp_path / "run", 3, 5, 16, 1, 2, seed=0, old_buffers=False)
    run = tmp_path / "run"
    state = torch.load(run / "state.pt", weights_only=True)
    state["model_state_dict"]["_read_in.weight"] = torch.zeros(16, 4)
    torch.save(state, run / "state.pt")
    with pytest.raises(CheckpointError, match=r"state.pt: tensor 'read_in.weight' has shape "
                                              r"\(16, 4\), the model expects \(16, 3\)"):
        models.load(run)
    # A pickle with arbitrary objects is refused, never executed.
    with open(run / "state.pt", "wb") as fh:
        pickle.dump({"model_state_dict": {"x": object()}}, fh)
    with pytest.raises(CheckpointError, match="state.pt: truncated, corrupt or unsafe"):
        models.load(run)
    (run / "state.pt").write_bytes(b"\x80\x04garbage")
    with pytest.raises(CheckpointError, match="state.pt"):
        models.load(run)
    (run / "config.yaml").write_text("training: {}\n")
    with pytest.raises(CheckpointError, match="config.yaml: no 'model:' section"):
        models.load(run)


@pytest.mark.parametrize(("attention", "layout"), [("softmax", "interleaved"),
                                                    ("linear", "paired")])
def test_round_trip(tmp_path, attention, layout):
    model = tiny_gpt(attention, layout)
    sigma = torch.tensor([[1.0, 0.1, 0.0], [0.1, 2.0, 0.0], [0.0, 0.0, 0.5]])
    task = tasks.RegressionTask(n_dims=3, n_points=8, cov=sigma, noise_std=0.1)
    model.save(tmp_path / "ckpt", task=task)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        ".iclprobe", "config.json", "model.safetensors", "task.json"]
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["format_version"] == 1
    back = models.load(tmp_path / "ckpt")
    assert back.cfg == model.cfg
    assert back.task.to_dict() == task.to_dict()
    b = small_batch()
    with torch.no_grad():
        assert torch.equal(back(b.xs, b.ys), model(b.xs, b.ys))
    # Saving again replaces the checkpoint when asked to; model.task is the default task.
    with pytest.raises(FileExistsError, match="already holds iclprobe checkpoint output"):
        back.save(tmp_path / "ckpt")
    back.save(tmp_path / "ckpt", overwrite=True)
    assert models.load(tmp_path / "ckpt").task.to_dict() == task.to_dict()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporaries left


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    import iclprobe.models.files as ckpt

    model = tiny_gpt()
    model.save(tmp_path / "ckpt")
    b = small_batch()
    expected = model(b.xs, b.ys).detach()

    def crash(tensors, filename):
        with open(filename, "wb") as fh:
            fh.write(b"partial")
        raise KeyboardInterrupt("killed mid-save")

    other = tiny_gpt(seed=99)
    monkeypatch.setattr(ckpt, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        other.save(tmp_path / "ckpt", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert torch.equal(models.load(tmp_path / "ckpt")(b.xs, b.ys), expected)


def test_bad_checkpoints(tmp_path):
    model = tiny_gpt()
    ckpt = tmp_path / "ckpt"
    model.save(ckpt)
    with pytest.raises(FileNotFoundError, match="checkpoint 'no/such/dir' not found"):
        models.load("no/such/dir")
    weights = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors: truncated or corrupt"):
        models.load(ckpt)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["blocks.0.attn.W_Q"] = torch.zeros(2, 16, 4)
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor 'blocks.0.attn.W_Q' has shape \(2, 16, 4\), "
                                              r"the model expects \(2, 16, 8\)"):
        models.load(ckpt)
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors: file is missing"):
        models.load(ckpt)
    meta = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**meta, "format_version": 7}))
    with pytest.raises(CheckpointError, match="config.json: unknown format_version 7"):
        models.load(ckpt)
    (ckpt / "config.json").write_text(json.dumps({**meta, "family": "rnn"}))
    with pytest.raises(CheckpointError, match="config.json: unknown family 'rnn'"):
        models.load(ckpt)
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        models.load(ckpt)
    (ckpt / "config.json").unlink()  # a folder that is no checkpoint: what one holds, said
    with pytest.raises(CheckpointError, match=r"ckpt is not a checkpoint: it holds no config.json "
                                              r"\(an iclprobe checkpoint or `iclprobe train` "
                                              r"run\), no config.yaml"):
        models.load(ckpt)


def test_weights_file_is_plain_safetensors(tmp_path):
    model = tiny_gpt()
    model.save(tmp_path / "m")
    state = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert state["blocks.1.attn.W_O"].shape == (2, 8, 16)
