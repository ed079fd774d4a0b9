"""The fitted view: Newton and GD over their step sizes, and layers read as probes read them."""

import dataclasses

import numpy as np
import pytest
import torch

from iclprobe import algorithms, tasks
from iclprobe.algorithms import families
from iclprobe.algorithms.families import FamilyContext
from iclprobe.algorithms.prefix import prefix_stats
from iclprobe.alignment import AlignConfig, align_layers
from iclprobe.alignment.measuring.reading import reread


def _batch(sequences=96, seed=0, n_dims=4, n_points=14):
    task = tasks.RegressionTask(n_dims=n_dims, n_points=n_points)
    return task.sample(sequences, generator=torch.Generator().manual_seed(seed))


def test_reread_is_least_squares_on_the_prediction_the_query_and_1():
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(7, 9, 3, generator=g, dtype=torch.float64)
    ys = torch.randn(7, 9, generator=g, dtype=torch.float64)
    preds = torch.randn(4, 7, 9, generator=g, dtype=torch.float64)
    weights = torch.randn(4, 2, 9, 3, generator=g, dtype=torch.float64)
    read, read_w = reread(preds, weights, xs, ys, (2, 8))
    for k in range(4):  # numpy's lstsq on the rows t = 2..8, applied at every position
        feats = np.concatenate([preds[k, :, 2:].reshape(-1, 1), xs[:, 2:].reshape(-1, 3),
                                np.ones((49, 1))], 1)
        coef, *_ = np.linalg.lstsq(feats, ys[:, 2:].reshape(-1).numpy(), rcond=None)
        every = np.concatenate([preds[k].reshape(-1, 1), xs.reshape(-1, 3), np.ones((63, 1))],
                               1) @ coef
        np.testing.assert_allclose(read[k].reshape(-1).numpy(), every, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(read_w[k].numpy(), coef[0] * weights[k].numpy() + coef[1:4],
                                   rtol=1e-9, atol=1e-9)
    # predictions related by an affine map with x_t read the same
    moved = 2.5 * preds + torch.einsum("d,bnd->bn", torch.tensor([0.3, -1.0, 2.0],
                                                                 dtype=torch.float64), xs) + 0.7
    torch.testing.assert_close(reread(moved, None, xs, ys, (2, 8))[0], read, rtol=1e-8,
                               atol=1e-8)


def test_both_learners_get_the_same_flexibility_and_stay_stable():
    b = _batch()
    xs, ys = b.xs.double(), b.ys.double()
    stats = prefix_stats(xs, ys)
    window = (1, 13)
    ctx = FamilyContext(stats, b.cov, window)
    gd, newton = families.GD.variants(ctx), families.NEWTON.variants(ctx)
    # comparable flexibility: three rules each, at step sizes √2 apart where the step size
    # matters (GD from 1/2 of its bound up to the bound, Newton over [1/2, 2]); GD's
    # octaves below 1/2
    assert len(gd) == 3 * len(families.GD_SCALES) == 21 and len(newton) == 15
    ratios = [b / a for a, b in zip(families.GD_SCALES, families.GD_SCALES[1:])]
    assert all(r == pytest.approx(2 ** 0.5, rel=0.01) for r in ratios[2:])
    assert families.GD_SCALES[-1] == 2.0  # the bound itself: the top mode neither decays nor grows
    lam = stats.eigvals[:, 1:, -1]  # λ_max(S_t), t >= 1
    t = stats.counts[1:]
    for label, hyper in gd:  # no GD variant past its stability bound, η c λ_max <= 2
        lr = hyper["lr"]
        rate = hyper.get("lr_scale", 1.0) * torch.ones_like(lam) if lr == "max" else \
            lr[1:] * lam / (t if hyper["normalize"] else 1.0)
        assert float(rate.max()) <= 2.0 + 1e-9, label
    for label, hyper in newton:  # and Newton's, α λ_max² < 2 (2/‖SSᵀ‖_F: < 2 at rank >= 2)
        alpha = hyper["alpha"]
        if isinstance(alpha, str):
            fro = stats.eigvals[:, 1:].pow(4).sum(-1).sqrt()
            rate = hyper["alpha_scale"] * lam.pow(2) / fro
        else:
            rate = alpha[1:] * lam.pow(2)
        assert float(rate[:, 3:].max()) < 2.0, label  # rank >= 2 from t = 4 (d = 4)


@pytest.mark.parametrize("truth", ["gd", "newton"])
@pytest.mark.slow
def test_a_learner_off_every_protocol_grid_is_attributed_to_itself(truth):
    # GD at a fixed step 0.07 on the mean loss (0.6 of its bound here), Newton at
    # α = 0.6/‖SSᵀ‖_F: neither is a column of either protocol, nor a fitted variant
    b = _batch(seed=1)
    xs, ys = b.xs.double(), b.ys.double()
    if truth == "gd":
        it = algorithms.gd(xs, ys, steps=[1, 2, 4, 6], lr=0.07)
    else:
        it = algorithms.newton(xs, ys, steps=[1, 2, 3, 4], alpha="frobenius", alpha_scale=0.6)
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    weights = torch.cat([torch.zeros_like(it.weights[:1]), it.weights])
    res = align_layers(layers, b, AlignConfig(n_boot=30, separation=False), layer_weights=weights)
    for metric, pair in res.fitted.items():
        assert pair.verdicts[1:] == [f"prefers {truth}"] * 4, (metric, pair.verdicts)



@pytest.mark.slow
def test_gd_near_its_stability_bound_is_named_gd(monkeypatch):
    # GD at 0.9 of its stable step at the last position (η c λ_max = 1.8 for the batch's
    # largest: the known-answer benchmark's GD construction at 0.9), κ = 100 data, aligned
    # there: between the grid's 1.41 and 2 the top direction's factor (1 − η c λ)^k moves
    # fast with η, and with a grid ending at 1.41 no GD column came within Newton's
    # imitation of one
    task = tasks.RegressionTask(n_dims=5, n_points=21, cov="ill-conditioned",
                                condition_number=100.0)
    b = task.sample(64, generator=torch.Generator().manual_seed(0))
    xs, ys = b.xs.double(), b.ys.double()
    top = float(prefix_stats(xs, ys).eigvals[:, -1, -1].max()) / 20  # λ_max(S_t/t), t = 20
    lr = torch.zeros(21, dtype=torch.float64)
    lr[-1] = 0.9 * 2.0 / top
    it = algorithms.gd(xs, ys, steps=range(1, 8), lr=lr)
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    cfg = AlignConfig(n_boot=20, separation=False, metrics=("error_cosine",),
                      algorithms=("gd", "newton", "gd_plus_plus", "momentum", "ridge"))

    def named() -> list[str]:
        answer = align_layers(layers, b, cfg, positions="last").answer
        assert answer is not None
        return [a.text for a in answer.layers[1:]]

    assert all(a.startswith("gd (") for a in named())
    monkeypatch.setattr(families, "GD_SCALES", families.GD_SCALES[:6])  # ... up to 1.41
    monkeypatch.setattr(families, "GD_FINE", tuple(m for m in families.GD_FINE if m <= 1.41))
    assert not all(a.startswith("gd (") for a in named())


@pytest.mark.slow
def test_a_probed_layer_is_compared_with_learners_read_the_same_way():
    # a probe reads a GD layer as a·ŷ + bᵀx + c: against raw iterates it matches no GD step
    # as well as a rescaled one; read the same way, it is GD's again
    b = _batch(seed=2)
    xs, ys = b.xs.double(), b.ys.double()
    it = algorithms.gd(xs, ys, steps=[1, 2, 3], lr="max")
    shift = torch.einsum("d,bnd->bn", torch.tensor([0.05, -0.02, 0.0, 0.03],
                                                   dtype=torch.float64), xs)
    layers = torch.cat([torch.zeros_like(it.preds[:1]), 1.6 * it.preds + shift + 0.01])
    cfg = AlignConfig(n_boot=30, separation=False, metrics=("error_cosine",))
    probed = align_layers(layers, b, cfg, probe_t_min=1).fitted["error_cosine"]
    raw = align_layers(layers, b, cfg).fitted["error_cosine"]
    assert probed.verdicts[1:] == ["prefers gd"] * 3
    assert raw.verdicts[1:] != ["prefers gd"] * 3  # what the re-read repairs


def test_the_fitted_help_says_what_the_switch_turns_on():
    help_text = {f.name: f.metadata["help"] for f in dataclasses.fields(AlignConfig)}["fitted"]
    assert "per-layer answer over the candidates" in help_text and "Newton-vs-GD" in help_text


@pytest.mark.slow
def test_families_reused_on_the_same_data_give_the_same_answer(monkeypatch):
    """`reusing_families` runs each family once per batch, and changes no number."""
    from iclprobe.alignment.measuring import candidates as cand
    from iclprobe.alignment.measuring import kept

    b = _batch(sequences=48, seed=3)
    xs, ys = b.xs.double(), b.ys.double()
    it = algorithms.gd(xs, ys, steps=[1, 2, 4], lr="max", weights=True)
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    weights = torch.cat([torch.zeros_like(it.weights[:1]), it.weights])
    cfg = AlignConfig(n_boot=20, separation=False, metrics=("error_cosine", "weight_cosine"),
                      algorithms=("gd", "newton", "ridge"))
    plain = align_layers(layers, b, cfg, layer_weights=weights)
    runs = []
    real = cand._run_family
    # the grids' runs (the fine variants next to a layer's match are the model's: run anew)
    monkeypatch.setattr(cand, "_run_family",
                        lambda *a: (a[7] is None and runs.append(a[0])) or real(*a))
    with kept.reusing_families():
        first = align_layers(layers, b, cfg, layer_weights=weights)
        again = align_layers(2 * layers, b, cfg, layer_weights=2 * weights)  # another model
    assert sorted(runs) == ["gd", "newton", "ridge"]  # once each, on the first alignment
    assert first.answer.to_dict() == plain.answer.to_dict()
    assert again.answer.to_dict() != first.answer.to_dict()  # its own layers, read anew
    with kept.reusing_families():
        moved = dataclasses.replace(b, xs=b.xs + 1e-9)  # other data: run again
        align_layers(layers, moved, cfg, layer_weights=weights)
        fam = cand._family("ridge", moved, prefix_stats(moved.xs.double(), moved.ys.double()),
                           (1, 13), 3, None, None)
        fam[0].preds.zero_()  # the copy handed out is the user's to change
        fam[0].hyper.clear()
        again = cand._family("ridge", moved, prefix_stats(moved.xs.double(), moved.ys.double()),
                             (1, 13), 3, None, None)
        assert again[0].hyper and bool(again[0].preds.abs().sum() > 0)
    assert len(runs) == 7  # the three again, and ridge on a window of its own
    assert kept._BLOCK.get().values is None  # nothing kept outside the block


def test_gd_plus_plus_asked_for_runs_in_the_tables_on_data_of_any_scale():
    # asked for by name, GD++ joins the learner tables at its rule relative to the data
    # (η = 1/λ_max(S_t/t), γ = η/4 per prefix): on x and y × 10 its old fixed η = 0.1
    # diverged, and align stopped with "lr=0.1, gamma=0.01 make the iterates diverge"
    b = tasks.RegressionTask(n_dims=4, n_points=9).sample(
        64, generator=torch.Generator().manual_seed(0))
    b = dataclasses.replace(b, xs=b.xs * 10, ys=b.ys * 10)
    it = algorithms.gd(b.xs.double(), b.ys.double(), steps=range(1, 5), lr="max")
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    cfg = AlignConfig(n_boot=20, separation=False, metrics=("error_cosine",),
                      algorithms=("gd", "newton", "gd_plus_plus"))
    res = align_layers(layers, b, cfg)
    assert list(res.comparisons["error_cosine"].scores) == ["gd", "newton", "gd_plus_plus"]
    assert res.answer is not None
    assert [a.text for a in res.answer.layers[1:]] == [f"gd (1/λmax, step {k})"
                                                      for k in range(1, 5)]


def test_a_restricted_candidate_set_says_which_learners_it_leaves_out():
    # Newton layers with Newton left out: the answer can name a kept learner, and says so
    b = tasks.RegressionTask(n_dims=4, n_points=9).sample(
        64, generator=torch.Generator().manual_seed(0))
    it = algorithms.newton(b.xs.double(), b.ys.double(), steps=range(3))
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    cfg = AlignConfig(n_boot=20, separation=False, metrics=("error_cosine",),
                      algorithms=("gd", "cg", "ols"))
    res = align_layers(layers, b, cfg)
    assert res.answer is not None and res.answer.candidates == ["gd", "cg", "ols"]
    left = [i.name for i in algorithms.candidate_learners() if i.name not in ("gd", "cg", "ols")]
    note = next(n for n in res.answer.notes if n.startswith("candidates restricted"))
    assert f"{', '.join(left)} left out" in note and "newton" in left
    full = align_layers(layers, b, dataclasses.replace(cfg, algorithms=None))
    assert full.answer is not None
    assert not any(n.startswith("candidates restricted") for n in full.answer.notes)


def test_the_data_digest_reads_every_dtype_and_tells_values_and_dtypes_apart():
    """`kept`'s key digests the bytes of any dtype: bfloat16 data (a bfloat16 model's
    sequences) raised "unsupported ScalarType BFloat16" in ``Tensor.numpy()``."""
    from iclprobe.alignment.measuring.kept import _data_key

    x = torch.linspace(-2, 3, 12, dtype=torch.bfloat16).reshape(3, 4)
    assert _data_key([x]) == _data_key([x.clone()])
    changed = x.clone()
    changed[2, 1] += 1
    assert _data_key([changed]) != _data_key([x])
    same_bytes = x.view(torch.float16)  # the same 24 bytes read as another dtype
    assert _data_key([same_bytes]) != _data_key([x])
    assert _data_key([x.T]) != _data_key([x])  # another shape and order
    for t in (torch.ones(2, dtype=torch.bool), torch.arange(3), torch.zeros(0, 3),
              torch.tensor(1.5, dtype=torch.float64), torch.ones(2, dtype=torch.complex64)):
        assert _data_key([t]) == _data_key([t.clone()])
