"""`HookedAdapter`: models iclprobe never built, aligned through their own hooks.

Two user models are written here, outside the package: (a) a tiny TransformerLens
``HookedRootModule`` regressor with its own ``HookPoint``s, and (b) Garg et al.'s
``TransformerModel``: a Hugging Face ``GPT2Model`` between a read-in and a read-out.
"""

import math
import re
from pathlib import Path

import pytest
import torch
from einops import rearrange
from helpers import assert_queries_match_substitution, small_batch, tiny_gpt
from torch import nn
from transformer_lens.hook_points import HookPoint

from iclprobe import hooks, models, probes, tasks
from iclprobe.alignment import AlignConfig, align
from iclprobe.alignment.measuring.layers import layer_predictions
from iclprobe.models import HookedAdapter
from iclprobe.models.garg import convert_garg_state

try:  # TransformerLens >= 4
    from transformer_lens import HookedRootModule
except ImportError:  # TransformerLens 3.x
    from transformer_lens.hook_points import HookedRootModule

N_DIMS, N_POINTS, D_MODEL, N_LAYERS = 3, 8, 16, 2
TASK = tasks.RegressionTask(n_dims=N_DIMS, n_points=N_POINTS)
SMALL = AlignConfig(n_sequences=48, n_probe_sequences=40, n_probe_heldout=16,
                    n_weight_sequences=6, n_boot=20, separation=False)


# ---------------------------------------------------------------------- (a) a TransformerLens model
class TinyBlock(nn.Module):
    """One causal single-head attention layer and an MLP, residual hooks as TL names them."""

    def __init__(self, m: int):
        super().__init__()
        self.qkv = nn.Linear(m, 3 * m)
        self.mlp = nn.Sequential(nn.Linear(m, 2 * m), nn.GELU(), nn.Linear(2 * m, m))
        self.hook_resid_pre = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x):
        x = self.hook_resid_pre(x)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(x.shape[-1])
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        x = x + scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return self.hook_resid_post(x + self.mlp(x))


class TinyHooked(HookedRootModule):
    """A user's hooked regressor: ``forward(tokens) -> [batch, tok]``, one output per token."""

    def __init__(self, seed: int = 3, token_dim: int = N_DIMS):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(token_dim, D_MODEL)
        self.blocks = nn.ModuleList(TinyBlock(D_MODEL) for _ in range(N_LAYERS))
        self.unembed = nn.Linear(D_MODEL, 1)
        self.setup()

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)[..., 0]


def interleave(xs, ys):
    """Garg et al.'s tokens x_1, (y_1, 0, ...), x_2, ... (written here, not iclprobe's)."""
    b, n, d = xs.shape
    ys_wide = torch.cat([ys[..., None], torch.zeros(b, n, d - 1)], dim=2)
    return torch.stack([xs, ys_wide], dim=2).reshape(b, 2 * n, d)


def adapt_tiny(**kw) -> tuple[TinyHooked, HookedAdapter]:
    tiny = TinyHooked().eval()
    kw = {"inputs": "interleaved", "readout": tiny.unembed, "task": TASK, **kw}
    return tiny, HookedAdapter(tiny, n_dims=N_DIMS, n_layers=N_LAYERS, d_model=D_MODEL, **kw)


TL_NAMES = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(N_LAYERS)]


def test_hooked_root_module_residuals_and_predictions_are_its_own():
    tiny, adapted = adapt_tiny()
    b = small_batch()
    names_before = {name: mod.name for name, mod in tiny.mod_dict.items()}
    with torch.no_grad():
        theirs, cache = tiny.run_with_cache(interleave(b.xs, b.ys))
        every = hooks.collect_residuals(adapted, b.xs, b.ys, positions="all")
        rows = hooks.collect_residuals(adapted, b.xs, b.ys)
        preds = adapted(b.xs, b.ys)
    own = torch.stack([cache[name] for name in TL_NAMES])  # [layer, batch, tok, d_model]
    assert every.shape == (N_LAYERS + 1, 4, 2 * N_POINTS, D_MODEL)
    torch.testing.assert_close(every, own, atol=0, rtol=0)
    torch.testing.assert_close(rows, own[:, :, ::2], atol=0, rtol=0)
    torch.testing.assert_close(preds, theirs[:, ::2], atol=0, rtol=0)
    torch.testing.assert_close(adapted(b.xs, b.ys, last_only=True), theirs[:, -2:-1])
    # the user's hook points keep their names, and serve the adapter under them
    assert {name: mod.name for name, mod in tiny.mod_dict.items()} == names_before
    _, cache = adapted.run_with_cache(b.xs, b.ys)
    torch.testing.assert_close(cache["blocks.1.hook_resid_post"], own[2])
    assert [adapted.resid_hook_name(layer) for layer in range(3)] == TL_NAMES


def test_hooked_root_module_queries_equal_substitution():
    tiny, adapted = adapt_tiny()
    b = small_batch()
    queries = torch.randn(4, N_POINTS, 3, N_DIMS, generator=torch.Generator().manual_seed(1))
    assert_queries_match_substitution(adapted, b.xs, b.ys, queries, atol=1e-5)
    with torch.no_grad():  # every layer's residual at query j of prefix t, against a loop
        got = adapted.query_residuals(b.xs, b.ys, queries)
        # in chunks of 40 tokens (2 sequences of 8 examples): the same numbers
        _, chunked = adapt_tiny(query_chunk_tokens=40)
        torch.testing.assert_close(chunked.query_residuals(b.xs, b.ys, queries), got)
        for t in range(N_POINTS):
            for j in range(3):
                xs = b.xs.clone()
                xs[:, t] = queries[:, t, j]
                _, cache = tiny.run_with_cache(interleave(xs, b.ys))
                want = torch.stack([cache[name][:, 2 * t] for name in TL_NAMES])
                torch.testing.assert_close(got[:, :, t, j], want, atol=1e-5, rtol=0)


def pair(xs, ys):
    """Token t = (x_{t-1}, y_{t-1}, x_t), zeros before the first example."""
    prev = torch.cat([torch.zeros(xs.shape[0], 1, N_DIMS + 1),
                      torch.cat([xs, ys[..., None]], -1)[:, :-1]], dim=1)
    return torch.cat([prev, xs], -1)


def with_bos(xs, ys):
    """Interleaved tokens after a beginning-of-sequence token (a row of ones)."""
    return torch.cat([torch.ones(xs.shape[0], 1, N_DIMS), interleave(xs, ys)], dim=1)


@pytest.mark.parametrize("kind", ["paired", "bos"])
def test_other_layouts_and_positions(kind):
    """``inputs="paired"``; a callable with ``positions=(stride, offset)`` (a BOS token)."""
    if kind == "paired":
        tiny = TinyHooked(token_dim=2 * N_DIMS + 1).eval()
        kw, tokens_of, rows = {"inputs": "paired"}, pair, slice(None)
    else:
        tiny = TinyHooked().eval()
        kw, tokens_of, rows = {"inputs": with_bos, "positions": (2, 1)}, with_bos, slice(1, None, 2)
    adapted = HookedAdapter(tiny, n_dims=N_DIMS, n_layers=N_LAYERS, d_model=D_MODEL,
                            readout=tiny.unembed, **kw)
    b = small_batch()
    with torch.no_grad():
        theirs, cache = tiny.run_with_cache(tokens_of(b.xs, b.ys))
        resid = hooks.collect_residuals(adapted, b.xs, b.ys)
        torch.testing.assert_close(adapted(b.xs, b.ys), theirs[:, rows], atol=0, rtol=0)
    torch.testing.assert_close(resid, torch.stack([cache[n][:, rows] for n in TL_NAMES]),
                               atol=0, rtol=0)
    queries = torch.randn(4, N_POINTS, 2, N_DIMS, generator=torch.Generator().manual_seed(4))
    assert_queries_match_substitution(adapted, b.xs, b.ys, queries, atol=1e-5)


def test_hooked_root_module_aligns_end_to_end():
    _, adapted = adapt_tiny(readout="probe")  # probes only: no readout needed to align
    res = align(adapted, SMALL, name="tiny")
    assert res.n_layers == N_LAYERS and len(res.probe_r2) == N_LAYERS + 1
    assert set(res.similarities["newton"]) == {"error_cosine", "weight_cosine"}
    # the layer errors are those of probes cross-fitted on the module's own residuals
    batch = TASK.sample(48, generator=torch.Generator().manual_seed(0))
    tiny = adapted.model
    with torch.no_grad():
        _, cache = tiny.run_with_cache(interleave(batch.xs, batch.ys))
    resid = torch.stack([cache[name][:, ::2] for name in TL_NAMES])
    preds = probes.cross_fit(adapted, resid, batch.ys, folds=SMALL.probe_folds).preds
    err = (preds - batch.ys.double()).pow(2).mean(1) / N_DIMS  # [layer, n]
    t_lo, t_hi = res.window
    torch.testing.assert_close(torch.tensor(res.layer_error, dtype=torch.float64),
                               err[:, t_lo:t_hi + 1].mean(-1), atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------- (b) a Hugging Face GPT-2
class GargModel(nn.Module):
    """Garg et al.'s ``TransformerModel``: read-in, Hugging Face GPT-2, read-out."""

    def __init__(self, n_dims: int, n_positions: int, n_embd: int, n_layer: int, n_head: int):
        super().__init__()
        from transformers import GPT2Config, GPT2Model

        cfg = GPT2Config(n_positions=2 * n_positions, n_embd=n_embd, n_layer=n_layer,
                         n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         use_cache=False)
        self._read_in = nn.Linear(n_dims, n_embd)
        self._backbone = GPT2Model(cfg)
        self._read_out = nn.Linear(n_embd, 1)

    def forward(self, xs, ys):
        out = self._backbone(inputs_embeds=self._read_in(interleave(xs, ys))).last_hidden_state
        return self._read_out(out)[:, ::2, 0]


HF_PATHS = ["_backbone.drop"] + [f"_backbone.h.{i}" for i in range(N_LAYERS)]


def garg_model(seed: int = 5) -> GargModel:
    torch.manual_seed(seed)
    garg = GargModel(N_DIMS, N_POINTS, D_MODEL, N_LAYERS, 2).eval()
    with torch.no_grad():  # perturb norms and biases too
        for p in garg.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return garg


def adapt_garg(garg: GargModel, **kw) -> HookedAdapter:
    kw = {"resid_hooks": HF_PATHS, "positions": "interleaved", "task": TASK,
          "readout": nn.Sequential(garg._backbone.ln_f, garg._read_out), **kw}
    return HookedAdapter(garg, n_dims=N_DIMS, n_layers=N_LAYERS, d_model=D_MODEL, **kw)


def test_hugging_face_residuals_are_its_hidden_states():
    garg = garg_model()
    adapted = adapt_garg(garg)
    b = small_batch()
    with torch.no_grad():
        hidden = garg._backbone(inputs_embeds=garg._read_in(interleave(b.xs, b.ys)),
                                output_hidden_states=True).hidden_states
    hooks_before = {n: list(m._forward_hooks.values()) for n, m in garg.named_modules()}
    with torch.no_grad():
        every = hooks.collect_residuals(adapted, b.xs, b.ys, positions="all")
        preds = adapted(b.xs, b.ys)
        theirs = garg(b.xs, b.ys)
    for layer in range(N_LAYERS):  # hidden_states[l], l < L: the output of block l - 1
        torch.testing.assert_close(every[layer], hidden[layer], atol=1e-6, rtol=0)
    # Hugging Face's last hidden state is after ln_f; iclprobe's layer L is before it
    assert (every[-1] - hidden[-1]).abs().max() > 0.1
    torch.testing.assert_close(garg._backbone.ln_f(every[-1]), hidden[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(preds, theirs, atol=1e-6, rtol=0)
    assert (theirs - theirs.mean()).abs().max() > 1e-2
    for inputs in (lambda xs, ys: {"ys": ys, "xs": xs}, lambda xs, ys: (xs, ys)):  # keywords
        with torch.no_grad():
            torch.testing.assert_close(adapt_garg(garg, inputs=inputs)(b.xs, b.ys), preds)
    # the routing hooks live only while the adapter runs (HF keeps hooks of its own)
    assert {n: list(m._forward_hooks.values()) for n, m in garg.named_modules()} == hooks_before


def test_hugging_face_residual_patched_through_the_adapter():
    """A hook's return value flows on: patching layer 1 everywhere gives the other run."""
    adapted = adapt_garg(garg_model())
    b, other = small_batch(), small_batch(seed=1)
    with torch.no_grad():
        source = hooks.collect_residuals(adapted, other.xs, other.ys, positions="all")[1]
        with hooks.patch_residual(adapted, 1, source):
            patched = adapted(b.xs, b.ys)
        want = adapted(other.xs, other.ys)
    assert (want - adapted(b.xs, b.ys)).abs().max() > 0.1
    torch.testing.assert_close(patched, want, atol=1e-6, rtol=0)


def test_hugging_face_queries_equal_substitution():
    garg = garg_model()
    adapted = adapt_garg(garg)
    b = small_batch()
    queries = torch.randn(4, N_POINTS, 3, N_DIMS, generator=torch.Generator().manual_seed(2))
    assert_queries_match_substitution(adapted, b.xs, b.ys, queries, atol=1e-5)
    with torch.no_grad():  # in chunks of 40 tokens: the same numbers
        torch.testing.assert_close(
            adapt_garg(garg, query_chunk_tokens=40).predict_queries(b.xs, b.ys, queries),
            adapted.predict_queries(b.xs, b.ys, queries))


def garg_state_of(gpt: models.GPTRegressor) -> dict[str, torch.Tensor]:
    """A `GPTRegressor`'s weights in Garg et al.'s layout (HF GPT-2 ``Conv1D`` = [in, out])."""
    sd, out = gpt.state_dict(), {}
    for ours, theirs in (("read_in", "_read_in"), ("read_out", "_read_out")):
        out.update({f"{theirs}.{k}": sd[f"{ours}.{k}"] for k in ("weight", "bias")})
    out["_backbone.wpe.weight"] = sd["W_pos"]
    out.update({"_backbone.ln_f.weight": sd["ln_final.w"], "_backbone.ln_f.bias": sd["ln_final.b"]})
    for i in range(gpt.cfg.n_layers):
        p, q = f"blocks.{i}.", f"_backbone.h.{i}."
        for ln, hf in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out.update({f"{q}{hf}.weight": sd[f"{p}{ln}.w"], f"{q}{hf}.bias": sd[f"{p}{ln}.b"]})
        out[f"{q}attn.c_attn.weight"] = torch.cat(
            [rearrange(sd[f"{p}attn.W_{n}"], "h m e -> m (h e)") for n in "QKV"], dim=1)
        out[f"{q}attn.c_attn.bias"] = torch.cat([sd[f"{p}attn.b_{n}"].flatten() for n in "QKV"])
        out[f"{q}attn.c_proj.weight"] = rearrange(sd[f"{p}attn.W_O"], "h e m -> (h e) m")
        out[f"{q}attn.c_proj.bias"] = sd[f"{p}attn.b_O"]
        for ours, hf in (("in", "c_fc"), ("out", "c_proj")):
            out[f"{q}mlp.{hf}.weight"] = sd[f"{p}mlp.W_{ours}"]
            out[f"{q}mlp.{hf}.bias"] = sd[f"{p}mlp.b_{ours}"]
    return out


@pytest.mark.slow
def test_hugging_face_copy_of_a_gpt_regressor_aligns_as_it_does():
    gpt = tiny_gpt()
    gpt.task = TASK
    state = garg_state_of(gpt)
    back = convert_garg_state(state, gpt.cfg)  # the conversion is right: it round-trips
    assert back.keys() == gpt.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in gpt.state_dict().items())
    garg = GargModel(N_DIMS, N_POINTS, D_MODEL, N_LAYERS, gpt.cfg.n_heads).eval()
    missing, unexpected = garg.load_state_dict(state, strict=False)
    assert missing == ["_backbone.wte.weight"] and not unexpected  # wte: unused, embeds fed
    # the bare backbone, fed the adapter's interleaved tokens through Garg's read-in
    adapted = HookedAdapter(
        garg._backbone, n_dims=N_DIMS, n_layers=N_LAYERS, d_model=D_MODEL,
        resid_hooks=["drop", "h.0", "h.1"], inputs="interleaved", read_in=garg._read_in,
        input_name="inputs_embeds", readout=nn.Sequential(garg._backbone.ln_f, garg._read_out),
        n_positions=N_POINTS, task=TASK)
    b = small_batch()
    queries = torch.randn(4, N_POINTS, 3, N_DIMS, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(adapted(b.xs, b.ys), gpt(b.xs, b.ys), atol=1e-5, rtol=0)
        torch.testing.assert_close(adapted.predict_queries(b.xs, b.ys, queries),
                                   gpt.predict_queries(b.xs, b.ys, queries), atol=1e-5, rtol=0)
    batch = TASK.sample(SMALL.n_sequences, generator=torch.Generator().manual_seed(SMALL.seed))
    ours = layer_predictions(adapted, TASK, batch, SMALL, None)[0]
    want = layer_predictions(gpt, TASK, batch, SMALL, None)[0]
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=0)
    res_hf, res_gpt = align(adapted, SMALL), align(gpt, SMALL)
    torch.testing.assert_close(torch.tensor(res_hf.layer_error), torch.tensor(res_gpt.layer_error),
                               atol=1e-5, rtol=0)
    assert res_gpt.similarities.keys() == res_hf.similarities.keys()
    for run, by_metric in res_gpt.similarities.items():
        for metric, sim in by_metric.items():  # weight_cosine: through predict_queries
            torch.testing.assert_close(res_hf.similarities[run][metric].values, sim.values,
                                       atol=1e-5, rtol=0)
            assert res_hf.matches[run][metric].best_step == res_gpt.matches[run][metric].best_step


# ---------------------------------------------------------------------- refusals
def test_bad_arguments():
    tiny = TinyHooked()
    garg = garg_model()
    sizes = {"n_dims": N_DIMS, "n_layers": N_LAYERS, "d_model": D_MODEL}
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got function"):
        HookedAdapter(lambda xs, ys: xs, inputs="interleaved", **sizes)
    with pytest.raises(TypeError, match=r"HookedAdapter.n_layers must be a positive integer, "
                                        r"got '2'"):
        HookedAdapter(tiny, n_dims=N_DIMS, n_layers="2", d_model=D_MODEL, inputs="interleaved")
    with pytest.raises(ValueError, match="inputs must be one of .* got 'tokens'"):
        HookedAdapter(tiny, inputs="tokens", **sizes)
    with pytest.raises(ValueError, match="read_in applies to the layout's tokens"):
        HookedAdapter(garg, resid_hooks=HF_PATHS, positions="interleaved",
                      read_in=garg._read_in, **sizes)
    with pytest.raises(ValueError, match="positions is required when inputs is not a layout"):
        HookedAdapter(garg, resid_hooks=HF_PATHS, **sizes)
    with pytest.raises(ValueError, match=r"HookedAdapter.readout_stride must be a positive "
                                         r"integer, got 0"):
        HookedAdapter(garg, resid_hooks=HF_PATHS, positions=(0, 1), **sizes)
    with pytest.raises(ValueError, match="resid_hooks is required for a GargModel"):
        HookedAdapter(garg, positions="interleaved", **sizes)
    with pytest.raises(ValueError, match=r"resid_hooks must name n_layers \+ 1 = 3 hooks"):
        HookedAdapter(garg, resid_hooks=HF_PATHS[1:], positions="interleaved", **sizes)
    with pytest.raises(ValueError, match="'_backbone.h.7' is not a hook or submodule"):
        HookedAdapter(garg, resid_hooks=[*HF_PATHS[:2], "_backbone.h.7"],
                      positions="interleaved", **sizes)
    with pytest.raises(TypeError, match="readout must be a module or callable .* got 'linear'"):
        HookedAdapter(tiny, inputs="interleaved", readout="linear", **sizes)
    with pytest.raises(ValueError, match="task has 8 points but the model has n_positions=4"):
        HookedAdapter(tiny, inputs="interleaved", n_positions=4, task=TASK, **sizes)


def test_bad_hooks_and_readouts_are_named_when_run():
    b = small_batch()
    garg = garg_model()
    sizes = {"n_dims": N_DIMS, "n_layers": N_LAYERS, "positions": "interleaved"}
    wide = HookedAdapter(garg, resid_hooks=HF_PATHS, d_model=8, **sizes)
    with pytest.raises(ValueError, match=r"gave \(4, 16, 16\), but 8 examples need .*d_model=8"):
        hooks.collect_residuals(wide, b.xs, b.ys)
    unused = HookedAdapter(garg, resid_hooks=[*HF_PATHS[:2], "_backbone.wte"], d_model=D_MODEL,
                           **sizes)
    with pytest.raises(ValueError, match=r"'_backbone.wte' \(layer 2\) ran 0 times"):
        hooks.collect_residuals(unused, b.xs, b.ys)
    probe_only = adapt_garg(garg, readout="probe")
    queries = torch.zeros(4, N_POINTS, 2, N_DIMS)
    with pytest.raises(ValueError, match="no readout .readout='probe'"):
        probe_only.predict_queries(b.xs, b.ys, queries)
    torch.testing.assert_close(probe_only(b.xs, b.ys), garg(b.xs, b.ys))  # the module's own
    flat = adapt_garg(garg, readout=lambda r: r)
    with pytest.raises(ValueError, match=r"readout must map residuals \(4, 8, 16\) to \(4, 8\)"):
        flat(b.xs, b.ys)
    with pytest.raises(ValueError, match=r"queries must have shape \[4, 8, T, 3\]"):
        adapt_garg(garg).predict_queries(b.xs, b.ys, queries[..., :2])
    with pytest.raises(TypeError, match="xs has dtype torch.float64"):
        adapt_garg(garg)(b.xs.double(), b.ys)


def test_a_module_run_twice_is_refused():
    class Looped(nn.Module):  # one block applied twice: a path cannot tell the two apart
        def __init__(self):
            super().__init__()
            self.embed, self.block = nn.Linear(N_DIMS, D_MODEL), nn.Linear(D_MODEL, D_MODEL)

        def forward(self, tokens):
            return self.block(self.block(self.embed(tokens)))

    adapted = HookedAdapter(Looped(), n_dims=N_DIMS, n_layers=1, d_model=D_MODEL,
                            inputs="interleaved", resid_hooks=["embed", "block"])
    b = small_batch()
    with pytest.raises(ValueError, match=r"'block' \(layer 1\) ran 2 times in one forward"):
        adapted(b.xs, b.ys)


def test_saving_an_adapter_is_refused(tmp_path):
    _, adapted = adapt_tiny()
    with pytest.raises(TypeError, match="a HookedAdapter cannot be saved .* TinyHooked"):
        adapted.save(tmp_path / "ckpt")
    with pytest.raises(TypeError, match="must be a registered iclprobe model family, got "
                                        "HookedAdapter"):
        models.save(adapted, tmp_path / "ckpt2")
    assert list(tmp_path.iterdir()) == []


def test_docs_examples_run(monkeypatch, tmp_path, capsys):
    """docs/adapters.md is copy-paste runnable: every Python block, in order."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "adapters.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/adapters.md block {i}", "exec"), {"__name__": f"doc{i}"})


def test_training_an_adapter_is_refused_before_any_step():
    # it trained the wrapped module in place (and crashed with readout="probe"); only
    # train(out=...) refused it
    from iclprobe.training import TrainConfig, train

    _, adapted = adapt_tiny()
    before = [p.detach().clone() for p in adapted.parameters()]
    with pytest.raises(TypeError, match="train: model is a HookedAdapter, which reads a model "
                                        "trained elsewhere.*train its module there"):
        train(adapted, TASK, TrainConfig(steps=3))
    assert all(torch.equal(a, b) for a, b in zip(before, adapted.parameters()))
