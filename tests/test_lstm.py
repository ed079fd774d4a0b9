"""The LSTM family: causality, query predictions, hooks against plain torch, files, CLI."""

import json
import logging

import pytest
import torch
from helpers import assert_queries_match_substitution, small_batch
from transformer_lens import ActivationCache

from iclprobe import hooks, models, probes, tasks, training
from iclprobe.cli import main
from iclprobe.models.lstm import LSTMConfig, LSTMRegressor

LAYOUTS = ("interleaved", "paired")


def tiny_lstm(layout: str = "interleaved", **kw) -> LSTMRegressor:
    cfg = dict(n_dims=3, n_positions=8, n_layers=2, d_model=12, layout=layout, seed=7)
    cfg.update(kw)
    model = LSTMRegressor(LSTMConfig(**cfg))
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    with torch.no_grad():  # larger weights than PyTorch's init, so no gate sits near 0.5
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_causality(layout):
    model = tiny_lstm(layout)
    b = small_batch()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        base = model(b.xs, b.ys)
        for t in range(b.xs.shape[1]):
            xs, ys = b.xs.clone(), b.ys.clone()
            xs[:, t + 1 :] = torch.randn(xs[:, t + 1 :].shape, generator=g)
            ys[:, t:] = torch.randn(ys[:, t:].shape, generator=g)
            torch.testing.assert_close(model(xs, ys)[:, : t + 1], base[:, : t + 1], atol=1e-6,
                                       rtol=0)
        ys = b.ys.clone()  # ...and a label does reach every later prediction
        ys[:, 0] += 1.0
        assert (model(b.xs, ys)[:, 1:] - base[:, 1:]).abs().min() > 1e-6
        torch.testing.assert_close(model(b.xs, b.ys, last_only=True), base[:, -1:])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_predict_queries_equals_substitution(layout):
    model = tiny_lstm(layout)
    b = small_batch()
    queries = torch.randn(4, 8, 3, 3, generator=torch.Generator().manual_seed(1))
    assert_queries_match_substitution(model, b.xs, b.ys, queries, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_query_residuals_equal_substitution(layout, monkeypatch):
    import iclprobe.models.lstm as lstm

    monkeypatch.setattr(lstm, "QUERY_CHUNK_ELEMENTS", 1)  # one query per chunk
    model = tiny_lstm(layout)
    b = small_batch()
    queries = torch.randn(4, 8, 2, 3, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = model.query_residuals(b.xs, b.ys, queries)  # [layer, B, n, T, d_model]
        reduced = model.query_residuals(b.xs, b.ys, queries, reduce=lambda r: r.sum(-1))
        for t in range(8):
            for j in range(2):
                xs = b.xs.clone()
                xs[:, t] = queries[:, t, j]
                want = hooks.collect_residuals(model, xs, b.ys)[:, :, t]
                torch.testing.assert_close(got[:, :, t, j], want, atol=1e-5, rtol=0)
    assert got.shape == (3, 4, 8, 2, 12)
    torch.testing.assert_close(reduced, got.sum(-1))


def _plain_lstm_states(model: LSTMRegressor, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's hidden states by torch.nn.LSTMCell steps with the model's weights."""
    x, out = model.read_in(tokens), []
    out.append(x)
    for block in model.blocks:
        cell = torch.nn.LSTMCell(model.cfg.d_model, model.cfg.d_model)
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).data.copy_(getattr(block.lstm, f"{name}_l0"))
        h = c = x.new_zeros(x.shape[0], model.cfg.d_model)
        seq = []
        for t in range(x.shape[1]):
            h, c = cell(x[:, t], (h, c))
            seq.append(h)
        x = torch.stack(seq, 1)
        out.append(x)
    return out


def test_hooks_equal_a_plain_torch_lstm():
    model = tiny_lstm(n_layers=3)
    b = small_batch()
    with torch.no_grad():
        preds, cache = model.run_with_cache(b.xs, b.ys)
        tokens = model.tokens(b.xs, b.ys)
        want = _plain_lstm_states(model, tokens)
        # one multi-layer torch.nn.LSTM holding the same weights gives the same output
        stacked = torch.nn.LSTM(12, 12, num_layers=3, batch_first=True)
        for k, block in enumerate(model.blocks):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(stacked, f"{name}_l{k}").data.copy_(getattr(block.lstm, f"{name}_l0"))
        top = stacked(model.read_in(tokens))[0]
    assert isinstance(cache, ActivationCache)
    torch.testing.assert_close(cache["hook_embed"], want[0])
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], want[0])
    for layer in range(1, 4):
        torch.testing.assert_close(cache[f"blocks.{layer - 1}.hook_resid_post"], want[layer],
                                   atol=1e-5, rtol=0)
    torch.testing.assert_close(top, want[3], atol=1e-5, rtol=0)
    readout = model.read_out(want[3][:, ::2])[..., 0]
    torch.testing.assert_close(preds, readout, atol=1e-5, rtol=0)
    resid = hooks.collect_residuals(model, b.xs, b.ys)  # [L+1, B, n, d_model] at the x tokens
    torch.testing.assert_close(resid, torch.stack(want)[:, :, ::2], atol=1e-5, rtol=0)
    torch.testing.assert_close(cache.accumulated_resid(), torch.stack(want), atol=1e-5, rtol=0)


def test_cell_states_equal_the_recurrence():
    model = tiny_lstm()
    b = small_batch()
    block = model.blocks[0]
    with torch.no_grad():
        x = model.embed(b.xs, b.ys)
        h, (h_n, c_n) = block.lstm(x)
        cells = block.cell_states(x, h)
        prefix = block.lstm(x[:, :5])[1][1][0]  # torch's own c after 5 tokens
    torch.testing.assert_close(cells[:, -1], c_n[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(cells[:, 4], prefix, atol=1e-6, rtol=0)


def test_save_load_round_trip(tmp_path):
    model = tiny_lstm("paired", n_layers=3)
    task = tasks.RegressionTask(n_dims=3, n_points=8)
    model.save(tmp_path / "m", task=task)
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    assert meta["family"] == "lstm" and meta["config"] == model.cfg.to_dict()
    loaded = models.load(tmp_path / "m")
    assert isinstance(loaded, LSTMRegressor) and loaded.cfg == model.cfg
    assert loaded.task.to_dict() == task.to_dict()
    b = small_batch()
    with torch.no_grad():
        assert torch.equal(loaded(b.xs, b.ys), model(b.xs, b.ys))


def test_from_dict_drops_unknown_keys(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = LSTMConfig.from_dict({"n_dims": 3, "n_positions": 5, "n_head": 4})
    assert cfg == LSTMConfig(n_dims=3, n_positions=5)
    assert "n_head" in caplog.text


@pytest.mark.parametrize(("field", "value", "match"), [
    ("n_dims", 0, "LSTMConfig.n_dims must be a positive integer, got 0"),
    ("n_positions", -2, "LSTMConfig.n_positions must be a positive integer, got -2"),
    ("n_layers", 1.5, "LSTMConfig.n_layers must be a positive integer, got 1.5"),
    ("d_model", True, "LSTMConfig.d_model must be a positive integer, got True"),
    ("layout", "rows", r"LSTMConfig.layout must be one of \('interleaved', 'paired'\), "
                       "got 'rows'"),
    ("seed", "0", r"LSTMConfig.seed must be an integer seed in \[0, 2\*\*63\), got '0'"),
])
def test_bad_config_values(field, value, match):
    with pytest.raises((TypeError, ValueError), match=match):  # a wrong type: TypeError
        LSTMConfig(**{"n_dims": 3, "n_positions": 5, field: value})


def test_bad_inputs():
    model = tiny_lstm()
    b = small_batch(n_points=9)
    with pytest.raises(ValueError, match="xs has 9 points but the model has n_positions=8"):
        model(b.xs, b.ys)
    with pytest.raises(TypeError, match="cfg must be an LSTMConfig, got GPTConfig"):
        LSTMRegressor(models.GPTConfig(n_dims=3, n_positions=8))
    b = small_batch()
    with pytest.raises(ValueError, match=r"queries must have shape \[4, 8, T, 3\]"):
        model.predict_queries(b.xs, b.ys, torch.zeros(4, 8, 3))


def test_init_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    a = LSTMRegressor(LSTMConfig(n_dims=3, n_positions=8, seed=3))
    assert torch.equal(torch.rand(1), before)
    b = LSTMRegressor(LSTMConfig(n_dims=3, n_positions=8, seed=3))
    c = LSTMRegressor(LSTMConfig(n_dims=3, n_positions=8, seed=4))
    assert torch.equal(a.blocks[1].lstm.weight_hh_l0, b.blocks[1].lstm.weight_hh_l0)
    assert not torch.equal(a.read_in.weight, c.read_in.weight)


def test_layer_probes_read_the_lstm():
    model = tiny_lstm()
    task = tasks.RegressionTask(n_dims=3, n_points=8)
    lp = probes.LayerProbes(alpha=1e-6, target="model").fit(model, task, n_sequences=200,
                                                            generator=0, n_heldout=100)
    # the read-out is linear in the last hidden state: that layer's probe recovers it
    assert lp.metrics_.r2[-1] > 1 - 1e-6
    b = small_batch()
    with torch.no_grad():
        torch.testing.assert_close(lp.predict(b.xs, b.ys)[-1], model(b.xs, b.ys), atol=1e-4,
                                   rtol=0)
        queries = torch.randn(4, 8, 2, 3, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(lp.predict_queries(b.xs, b.ys, queries)[-1],
                                   model.predict_queries(b.xs, b.ys, queries), atol=1e-4, rtol=0)


def test_train_setup_for_the_lstm():
    model = tiny_lstm()
    task = tasks.RegressionTask(n_dims=3, n_points=8)
    cfg = training.TrainConfig(steps=2, curriculum_every=1, curriculum_dims=(2, 1),
                             curriculum_points=(4, 2), log_every=1, checkpoint_every=0)
    result = training.train(model, task, cfg, progress=False)
    assert [row["n_points"] for row in result.history] == [4, 6]
    with pytest.raises(ValueError, match="TrainConfig.zero_b does not apply to LSTMRegressor"):
        training.train(model, task, training.TrainConfig(steps=1, zero_b=True), progress=False)
    with pytest.raises(ValueError, match="task.n_points=9 is more than the model's "
                                         "n_positions=8"):
        training.train(model, tasks.RegressionTask(n_dims=3, n_points=9),
                     training.TrainConfig(steps=1), progress=False)


def test_cli_trains_an_lstm(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--family", "lstm", "--n-dims", "3", "--n-points", "6", "--n-layers", "2",
            "--d-model", "8", "--layout", "paired", "--steps", "3", "--log-every", "1",
            "--out", str(out)]
    assert main(argv) == 0
    assert "step 3: loss" in capsys.readouterr().out
    model = models.load(out)
    assert isinstance(model, LSTMRegressor)
    assert model.cfg == LSTMConfig(n_dims=3, n_positions=6, n_layers=2, d_model=8,
                                   layout="paired")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    bad = ["train", "--family", "lstm", "--n-heads", "2", "--out", str(tmp_path / "x")]
    assert main(bad) == 2
    assert "not applicable to --family lstm: --n-heads" in capsys.readouterr().err


def test_ablate_an_lstm_layer():
    model = tiny_lstm(n_layers=2)
    b = small_batch()
    with torch.no_grad():
        with hooks.ablate(model, block=0, kind="zero"):
            got = model(b.xs, b.ys)
        # layer 1 then runs on zero inputs: h is the same function of its own state alone
        h = model.blocks[1].lstm(torch.zeros(4, 16, 12))[0]
        torch.testing.assert_close(got, model.readout(h[:, ::2]))
    with pytest.raises(ValueError, match="LSTMRegressor has no attention heads to ablate"):
        with hooks.ablate(model, block=0, head=0):
            pass


def test_shipped_lstm_learned_in_context():
    # its documented curve is checked exactly in test_pretrained.py
    model = models.load("lstm")
    assert isinstance(model, LSTMRegressor)
    batch = model.task.sample(1000, generator=777)
    with torch.no_grad():
        err = (model(batch.xs, batch.ys) - batch.ys).pow(2).mean(0) / model.task.n_dims
    worst = err[16:].max().item()
    # far below the zero predictor, and its error falls with t
    assert worst < 0.5 and err[16:].mean() < 0.5 * err[:2].mean()


@pytest.mark.slow
def test_shipped_lstm_layers_resemble_one_pass_of_online_gd():
    from iclprobe.alignment.pipeline import AlignConfig, align

    cfg = AlignConfig(algorithms=("newton", "gd", "online_gd"), metrics=("error_cosine",),
                      n_sequences=256, separation=False)
    res = align(models.load("lstm"), cfg, name="lstm")
    assert res.live == [False, True, True, True, True]
    best = {k: res.matches[k]["error_cosine"] for k in ("newton", "gd", "online_gd")}
    # depth adds no steps: every live layer matches the same step of each learner
    for match in best.values():
        assert len(set(match.best_step[1:])) == 1 and match.fit.slope is None
    assert best["online_gd"].best_step[1:] == [1] * 4  # one normalized pass
    for layer in (2, 3, 4):
        assert best["online_gd"].best_value[layer] > best["gd"].best_value[layer] + 0.02
        assert best["online_gd"].best_value[layer] > best["newton"].best_value[layer] + 0.02
    pair = next(p for p in res.comparisons["error_cosine"].pairs
                if (p.a, p.b) == ("newton", "online_gd"))
    assert pair.verdicts[2:] == ["prefers online_gd"] * 3
