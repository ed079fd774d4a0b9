"""`HookedAdapter` with PQ-shaped hooks: ``[batch, prefix, row, D]``, one forward for all t.

``PlainPQ`` is Ahn et al.'s linear PQ transformer written here from its equations, a plain
``torch.nn.Module`` (no iclprobe class): per prefix t, rows are the t context examples
``(x_j, 0, y_j)`` (zeros in the other slots; the 0 is state channels, if any) and the query
row ``(x_t, 0, 0)`` last; each layer is
``Z ← Z + (1/t) (Z Q Kᵀ) K Pᵀ`` over the t context rows K. Wrapped in an adapter it must
read exactly as iclprobe's own `PQTransformer` with the same matrices.
"""

import pytest
import torch
from helpers import tiny_gpt
from torch import nn

from iclprobe import hooks, probes, tasks
from iclprobe.alignment import AlignConfig, align
from iclprobe.alignment.measuring.layers import layer_weight_fn
from iclprobe.constructions import gd_transformer, newton_transformer
from iclprobe.models import HookedAdapter

D, N = 3, 8
TASK = tasks.RegressionTask(n_dims=D, n_points=N)


class PlainLayer(nn.Module):
    def __init__(self, p: torch.Tensor, q: torch.Tensor):
        super().__init__()
        self.p, self.q = nn.Parameter(p.clone()), nn.Parameter(q.clone())

    def forward(self, z):  # [batch, prefix, n + 1, D]
        n = z.shape[2] - 1
        t = torch.arange(z.shape[1])
        keys = z[:, :, :n] * (torch.arange(n)[None, :] < t[:, None])[None, :, :, None]
        scores = z @ self.q @ keys.transpose(-1, -2)  # score(r, j) = z_rᵀ Q z_j
        return z + scores @ keys @ self.p.T / t.clamp(min=1)[None, :, None, None]


class PlainPQ(nn.Module):
    def __init__(self, ps, qs):
        super().__init__()
        self.embed = nn.Identity()
        self.blocks = nn.ModuleList(PlainLayer(p, q) for p, q in zip(ps, qs))

    def forward(self, xs, ys):
        b, n, d = xs.shape
        state = xs.new_zeros(b, n, self.blocks[0].p.shape[-1] - d - 1)  # (x, state, y) rows
        visible = (torch.arange(n)[None, :] < torch.arange(n)[:, None]).to(xs)  # [prefix, slot]
        ctx = torch.cat([xs, state, ys[..., None]], -1)[:, None] * visible[None, :, :, None]
        query = torch.cat([xs, state, xs.new_zeros(b, n, 1)], -1)[:, :, None]
        z = self.embed(torch.cat([ctx, query], dim=2))
        for block in self.blocks:
            z = block(z)
        return -z[:, :, n, -1]


def adapt(native, **kw):
    p, q = native.matrices()
    plain = PlainPQ(p[:, 0].detach(), q[:, 0].detach()).to(next(native.parameters()).dtype)
    n_layers = native.cfg.n_layers
    kw = {"readout": lambda r: -r[..., -1], "exact_readout": True, "resid_layout": "prefix",
          **kw}
    return HookedAdapter(plain, n_dims=native.cfg.n_dims, n_layers=n_layers,
                         d_model=native.cfg.d_model, task=TASK,
                         resid_hooks=["embed", *(f"blocks.{i}" for i in range(n_layers))],
                         **kw)


def natives():
    gen = torch.Generator().manual_seed(4)
    dense = newton_transformer(D, 4, a=0.01)  # state channels: D = 2d + 1
    with torch.no_grad():
        for p in dense.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=gen))  # no zero hides an error
    return [gd_transformer(D, 3, lr=0.1), dense]


@pytest.mark.parametrize("native", natives(), ids=["gd", "newton+noise"])
def test_a_pq_shaped_module_reads_as_the_native_model(native):
    native = native.double()
    model = adapt(native)
    b = TASK.sample(6, generator=1)
    xs, ys = b.xs.double(), b.ys.double()
    torch.testing.assert_close(model(xs, ys), native(xs, ys), rtol=0, atol=1e-12)
    for positions in ("readout", "all"):  # readout rows [L+1, B, n, D]; whole hooks
        torch.testing.assert_close(hooks.collect_residuals(model, xs, ys, positions=positions),
                                   hooks.collect_residuals(native, xs, ys, positions=positions),
                                   rtol=0, atol=1e-12)
    got, want = (probes.readout_predictions(m, xs, ys) for m in (model, native))
    assert want[-1].abs().max() > 0.1  # the last layer predicts something
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    queries = torch.randn(6, N, 4, D, generator=torch.Generator().manual_seed(2)).double()
    torch.testing.assert_close(model.predict_queries(xs, ys, queries),
                               native.predict_queries(xs, ys, queries), rtol=0, atol=1e-12)
    w_got, w_want = (probes.induced_weights(layer_weight_fn(m, None), xs, ys, n_queries=D + 2,
                                            generator=3) for m in (model, native))
    assert w_want.shape == (native.cfg.n_layers + 1, 6, N, D) and w_want[-1].abs().max() > 0.01
    torch.testing.assert_close(w_got, w_want, rtol=0, atol=1e-12)


def test_patching_a_readout_row_of_a_prefix_layout():
    native = gd_transformer(D, 3, lr=0.1).double()
    model = adapt(native)
    b = TASK.sample(4, generator=0)
    xs, ys = b.xs.double(), b.ys.double()
    rows = torch.randn(4, N, D + 1, generator=torch.Generator().manual_seed(5)).double()
    outs = []
    for m in (model, native):
        with hooks.patch_residual(m, 2, rows):
            outs.append(m(xs, ys))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-12)
    assert not torch.allclose(outs[0], native(xs, ys))


@pytest.mark.parametrize("readout", ["exact", "probe"])
def test_align_on_a_pq_adapter_gives_the_native_models_numbers(readout):
    native = gd_transformer(D, 3, lr=0.1)
    native.task = TASK
    model = adapt(native, exact_readout=readout == "exact")
    native.exact_layer_readout = readout == "exact"  # type: ignore[misc]
    cfg = AlignConfig(algorithms=("newton", "gd"), positions="all", n_sequences=48,
                      n_probe_sequences=64, n_probe_heldout=16, n_weight_sequences=6,
                      n_boot=20, separation=False, fitted=readout == "exact")
    ours, theirs = align(model, cfg), align(native, cfg)
    assert ours.readout == theirs.readout
    torch.testing.assert_close(torch.tensor(ours.layer_error), torch.tensor(theirs.layer_error),
                               rtol=0, atol=1e-5)
    for run in ("newton", "gd"):
        for metric, sim in theirs.similarities[run].items():
            torch.testing.assert_close(ours.similarities[run][metric].values, sim.values,
                                       rtol=0, atol=1e-4)
            assert ours.matches[run][metric].best_step == theirs.matches[run][metric].best_step
    for metric, table in theirs.comparisons.items():
        pair = next(p for p in table.pairs if {p.a, p.b} == {"newton", "gd"})
        mine = next(p for p in ours.comparisons[metric].pairs if {p.a, p.b} == {"newton", "gd"})
        assert mine.verdicts == pair.verdicts, metric
        torch.testing.assert_close(torch.tensor(mine.difference.value),
                                   torch.tensor(pair.difference.value), rtol=0, atol=1e-4)


def test_bad_layouts_are_named():
    native = gd_transformer(D, 2, lr=0.1)
    b = TASK.sample(4, generator=0)
    with pytest.raises(ValueError, match="resid_layout must be 'tokens' .* or 'prefix' .* got "
                                         "'rows'"):
        adapt(native, resid_layout="rows")
    with pytest.raises(ValueError, match="positions applies to resid_layout='tokens'"):
        adapt(native, positions="paired")
    with pytest.raises(TypeError, match="query_row must be an integer"):
        adapt(native, query_row="last")
    tokens = adapt(native, resid_layout="tokens", positions=(1, 0))
    with pytest.raises(ValueError, match=r"gave \(4, 8, 9, 4\), but 8 examples need \[batch, "
                                         r">= 8 tokens, d_model=4\] \(a \[batch, prefix, row, "
                                         r"d_model\] hook: resid_layout='prefix'\)"):
        hooks.collect_residuals(tokens, b.xs, b.ys)
    with pytest.raises(ValueError, match=r"needs \[batch, >= 8 prefixes, rows \(query_row=9 "
                                         r"among them\), d_model=4\]"):
        hooks.collect_residuals(adapt(native, query_row=9), b.xs, b.ys)
    gpt = HookedAdapter(tiny_gpt(), n_dims=3, n_layers=2, d_model=16, resid_layout="prefix")
    with pytest.raises(ValueError, match=r"gave \(4, 16, 16\), but resid_layout='prefix' .*"
                                         r"\(a \[batch, tok, d_model\] hook: resid_layout="
                                         r"'tokens'\)"):
        hooks.collect_residuals(gpt, b.xs, b.ys)
    with pytest.raises(ValueError, match="query_row applies to resid_layout='prefix'"):
        HookedAdapter(tiny_gpt(), n_dims=3, n_layers=2, d_model=16, positions="interleaved",
                      query_row=0)
