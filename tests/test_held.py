"""Probes fitted to the candidate column a layer holds best (``probe_target="column"``).

`probes.held_shares` against numpy's least squares with an intercept; `cross_fit` with
per-layer targets against scikit-learn's `Ridge` fitted fold by fold; and the point of it
on an oracle whose residual holds GD's prediction among distractor channels: fitted to y
the probes read each layer with an error of about √(p/N) of its error from y, fitted to
the column the layer holds they read it to round-off.
"""

import contextlib
import dataclasses

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from iclprobe import probes
from iclprobe.alignment import AlignConfig
from iclprobe.alignment.evaluation import model_evaluation
from iclprobe.alignment.measuring.held import held_targets, targets_for
from iclprobe.alignment.measuring.layers import layer_predictions
from iclprobe.constructions.oracle import oracle
from iclprobe.errors import InputError
from iclprobe.hooks import collect_residuals
from iclprobe.probes.decode import ALPHA_SCALE
from iclprobe.tasks import RegressionTask


def test_held_shares_are_numpys_least_squares_in_sample():
    g = torch.Generator().manual_seed(1)
    resid = torch.randn(3, 11, 7, 4, generator=g, dtype=torch.float64)
    targets = torch.randn(4, 11, 7, generator=g, dtype=torch.float64)
    targets[1] = resid[2] @ torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=torch.float64) - 4.0
    targets[3, :, 2:6] = 0.0  # 0 on the window: no share
    got = probes.held_shares(resid, targets, t_min=2, t_max=5)
    for layer in range(3):
        x = resid[layer, :, 2:6].reshape(-1, 4).numpy()
        design = np.concatenate([x, np.ones((len(x), 1))], 1)
        for k in range(3):
            y = targets[k, :, 2:6].reshape(-1).numpy()
            coef = np.linalg.lstsq(design, y, rcond=None)[0]
            want = ((design @ coef - y) ** 2).sum() / (y ** 2).sum()
            # the penalty ALPHA_SCALE x trace moves the fit by about that much, relatively
            assert got[layer, k].item() == pytest.approx(want, rel=1e-7, abs=1e-12)
        assert got[layer, 3].item() == float("inf")
    assert got[2, 1].item() < 1e-12  # an affine map of layer 2's residual
    assert ALPHA_SCALE <= 1e-9
    # outside the rows fitted, a residual may not be finite (a model valid only where it
    # is aligned); inside, it is refused
    resid[:, :, 0] = float("nan")
    torch.testing.assert_close(probes.held_shares(resid, targets, t_min=2, t_max=5), got)
    with pytest.raises(InputError, match=r"^held_shares: resid are not finite at positions "
                                         r"0..5 \(found NaN or Inf\)$"):
        probes.held_shares(resid, targets, t_min=0, t_max=5)
    with pytest.raises(InputError, match="targets must have shape"):
        probes.held_shares(resid, targets[:, :5])


def test_cross_fit_to_columns_is_sklearns_ridge_fold_by_fold():
    """Each layer's probe fitted to its own column: fold k read by Ridge fitted on the others
    (one α, so that GCV's choice is not in question), R² against the target."""
    g = torch.Generator().manual_seed(4)
    resid = torch.randn(2, 12, 6, 3, generator=g, dtype=torch.float64)
    ys = torch.randn(12, 6, generator=g, dtype=torch.float64)
    targets = torch.randn(2, 12, 6, generator=g, dtype=torch.float64)
    model = oracle("gd", 3, 1, lr=0.1, exact_readout=False, task=RegressionTask(3, 6))
    alpha = 0.05
    fit = probes.cross_fit(model, resid, ys, folds=3, t_min=1, alphas=torch.tensor([alpha]),
                           targets=targets)
    for layer in range(2):
        for a, b in fit.folds:
            train = [i for i in range(12) if not a <= i < b]
            x = resid[layer, train, 1:].reshape(-1, 3).numpy()
            y = targets[layer, train, 1:].reshape(-1).numpy()
            ref = Ridge(alpha=alpha).fit(x, y)
            want = ref.predict(resid[layer, a:b].reshape(-1, 3).numpy()).reshape(b - a, 6)
            np.testing.assert_allclose(fit.preds[layer, a:b].numpy(), want, rtol=1e-9,
                                       atol=1e-12)
        t = targets[layer, :, 1:]
        r2 = 1 - (fit.preds[layer, :, 1:] - t).pow(2).sum() / (t - t.mean()).pow(2).sum()
        assert fit.metrics.r2[layer] == pytest.approx(r2.item())
    with pytest.raises(InputError, match=r"targets must have shape \(2, 12, 6\)"):
        probes.cross_fit(model, resid, ys, folds=3, targets=targets[0])
    extra = [probes.fold_sums(resid[:, :4], ys[:4], 1)] * 3
    with pytest.raises(InputError, match="extra sums are fitted to y"):
        probes.cross_fit(model, resid, ys, folds=3, extra=extra, targets=targets)


def test_an_oracle_read_through_column_probes_is_read_to_round_off():
    """GD at steps 2l among x_t and tanh distractors, 64 sequences: the y-probes' reading
    leaves about p/N of it off the layer's prediction, the column-probes' nothing."""
    task = RegressionTask(n_dims=4, n_points=12)
    model = oracle("gd", 4, 3, lambda layer: 2 * layer, task=task, exact_readout=False,
                   lr="max", normalize=True)
    cfg = AlignConfig(n_sequences=64, seed=2, n_boot=20, algorithms=("gd", "newton", "momentum"))
    ev = model_evaluation(model, task, cfg, crossfit=True)
    batch = ev.batch
    truth = model.iterates(batch.xs, batch.ys).preds  # each layer's own prediction

    def off(preds: torch.Tensor, layer: int) -> float:
        """The share of the reading that no a·truth + b explains (scale-free)."""
        r, t = preds[layer, :, 1:].reshape(-1), truth[layer, :, 1:].reshape(-1)
        design = torch.stack([t, torch.ones_like(t)], 1)
        coef = torch.linalg.lstsq(design, r[:, None]).solution
        return float((r - (design @ coef)[:, 0]).pow(2).sum() / (r - r.mean()).pow(2).sum())

    by_y, *_ = layer_predictions(model, task, batch, cfg, None, window=ev.window)
    by_col, how, _, _, _, held = layer_predictions(
        model, task, batch, cfg, None, window=ev.window,
        targets=targets_for(ev))
    assert "fitted to the candidate's prediction its residual holds best" in how
    assert [h.split(" (")[0] for h in held[1:]] == ["gd"] * 3
    assert all(float(h.rsplit(": ", 1)[1].split()[0]) < 1e-12 for h in held[1:])
    for layer in (1, 2, 3):
        assert off(by_y, layer) > 1e-4  # p/N: 14 features, 48 x 11 rows per fold's fit
        assert off(by_col, layer) < 1e-12
    resid = collect_residuals(model, batch.xs, batch.ys)
    columns, _ = held_targets(ev, resid, 1)
    folds = probes.fold_features(resid, cfg.probe_folds, 1)  # the shortlists' covariance, as align's
    shared, _ = held_targets(ev, resid, 1, sum(folds[1:], folds[0]))
    torch.testing.assert_close(shared, columns, rtol=1e-9, atol=1e-12)
    ys = batch.ys.double()
    for layer in (1, 2, 3):  # each layer's own column, put on y's scale
        assert off(columns, layer) < 1e-20
        col, y = columns[layer, :, 1:].flatten(), ys[:, 1:].flatten()
        assert float((y - col) @ (col - col.mean())) == pytest.approx(0.0, abs=1e-8)
        assert float(col.mean()) == pytest.approx(float(y.mean()), abs=1e-12)


@pytest.mark.slow  # two aligns of a refined oracle: about 20 s on 2 cores
def test_align_through_column_probes_refines_and_names_the_oracles_learner():
    """Read through probes fitted to the column each layer holds, the families are refined
    and fitted as read exactly (`AlignResult.answer.fine`), the columns are recorded, and
    GD's oracle at 0.7/λ_max (between GD's grid step sizes) is named GD at its steps 4 and
    6 (its step 2 is heavy ball's too, up to a scale); fitted to y, nothing is refined."""
    from iclprobe.alignment import align

    task = RegressionTask(n_dims=4, n_points=12)
    model = oracle("gd", 4, 3, lambda layer: 2 * layer, task=task, exact_readout=False,
                   lr="max", normalize=True, lr_scale=0.7)
    cfg = AlignConfig(n_sequences=64, seed=2, n_boot=20, separation=False,
                      algorithms=("gd", "newton", "momentum"))
    res = align(model, cfg)
    assert res.answer is not None and res.answer.fine
    assert res.probes_info["target"] == "column" and len(res.probes_info["targets"]) == 4
    said = [a for a, live in zip(res.answer.layers, res.live) if live]
    assert [(a.kind, a.learner) for a in said[1:]] == [("runs", "gd")] * 2, res.answer.texts
    # step 2: heavy ball's step 2 is GD's up to a scale, which a probe's reading is blind to
    assert said[0].kind in ("runs", "cannot tell") and said[0].learner in ("gd", "momentum")
    assert said[0].kind == "cannot tell" or said[0].learner == "gd", res.answer.texts
    by_y = align(model, dataclasses.replace(cfg, probe_target="y"))
    assert by_y.answer is not None and not by_y.answer.fine
    assert "targets" not in by_y.probes_info


@pytest.mark.slow
def test_align_runs_each_candidates_grid_once_and_keeps_nothing(monkeypatch):
    """The probe targets' choice and the candidates' stage share one run of each grid
    (`kept.reusing_in_alignment`): the answer is the one of two runs each, number for
    number, and nothing is kept after `align` returns."""
    from iclprobe.alignment import align
    from iclprobe.alignment.measuring import candidates as cand
    from iclprobe.alignment.measuring import kept

    task = RegressionTask(n_dims=3, n_points=8)
    model = oracle("gd", 3, 2, lambda layer: 2 * layer, task=task, exact_readout=False,
                   lr="max", normalize=True)
    cfg = AlignConfig(n_sequences=48, seed=1, n_boot=10, separation=False,
                      algorithms=("gd", "newton", "ridge"))
    runs: list[str] = []
    real = cand._run_family
    monkeypatch.setattr(cand, "_run_family",
                        lambda *a: (a[7] is None and runs.append(a[0])) or real(*a))
    once = align(model, cfg)
    assert sorted(runs) == ["gd", "newton", "ridge"]  # the grids, once each
    assert kept._BLOCK.get() == kept._Block()  # closed: nothing kept, no handover
    runs.clear()
    monkeypatch.setattr(kept, "reusing_in_alignment", contextlib.nullcontext)  # nothing shared
    twice = align(model, cfg)
    assert sorted(runs) == ["gd", "gd", "newton", "newton", "ridge", "ridge"]
    assert once.answer is not None and twice.answer is not None
    assert once.answer.to_dict() == twice.answer.to_dict()
    assert once.probes_info["targets"] == twice.probes_info["targets"]


def test_a_column_that_diverges_on_a_later_sequence_is_never_a_target(monkeypatch):
    """The columns are ranked on the first sequences; the one a layer holds exactly there but
    that is not finite on the last sequence (a step size past a prefix's bound) is passed
    over for the next best, finite on every sequence — no error, and y where none is."""
    from iclprobe import algorithms
    from iclprobe.alignment.measuring import held
    from iclprobe.alignment.measuring.candidate import Candidate

    task = RegressionTask(n_dims=3, n_points=8)
    model = oracle("gd", 3, 2, lambda layer: 2 * layer, task=task, exact_readout=False,
                   lr="max", normalize=True)
    cfg = AlignConfig(n_sequences=64, seed=1, n_boot=10, algorithms=("gd",))
    ev = model_evaluation(model, task, cfg, crossfit=True)
    truth = model.iterates(ev.batch.xs, ev.batch.ys).preds.double()  # [layer, B, n]
    broken = truth[2].clone()
    broken[-1, 5] = float("nan")  # the last sequence, inside the window
    near = truth[2] + 1e-3 * torch.randn(truth[2].shape, generator=torch.Generator().manual_seed(0),
                                         dtype=torch.float64)
    cols = torch.stack([broken, near])
    fam = algorithms.Iterates(torch.tensor([4, 4]), cols, None, {}, "gd")
    cand = Candidate("gd", "GD", fam, None, ["broken", "near"], [0, 1], True)
    monkeypatch.setattr(held, "build_candidates", lambda *a, **k: ({"gd": cand}, []))
    resid = collect_residuals(model, ev.batch.xs, ev.batch.ys)
    ranked_part = probes.held_shares(resid[2:3, :8], cols[:, :8], 1)[0]
    assert float(ranked_part[0]) < float(ranked_part[1])  # first on the first sequences
    _, notes = held_targets(ev, resid, 1)
    assert notes[2].startswith("gd (near)")


def test_blocks_opened_in_two_threads_are_each_threads_own():
    """`kept`'s blocks were process globals each block saved and restored: an alignment's
    block in one thread and a `reusing_families` block in another, closed out of order,
    left the alignment's unbounded hand-over store open for every later call. Each
    context now has its own block."""
    import threading

    from iclprobe.alignment.measuring import kept

    steps = [threading.Event() for _ in range(4)]
    seen: dict[str, object] = {}

    def in_alignment():  # opens first, closes before the other thread's block does
        with kept.reusing_in_alignment():
            steps[0].set()
            steps[1].wait(10)
            seen["alignment"] = kept.kept(("a",), [], lambda: "run", peek=True)
            seen["alignment keeps"] = dict(kept._BLOCK.get().values or {})
        steps[2].set()

    def in_families():
        steps[0].wait(10)
        with kept.reusing_families(4):
            seen["families, open"] = kept._BLOCK.get().most
            steps[1].set()
            steps[2].wait(10)
            seen["families keeps"] = kept.kept(("b",), [], lambda: [1], peek=True)
        seen["families, closed"] = kept._BLOCK.get()

    threads = [threading.Thread(target=f) for f in (in_alignment, in_families)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["families, open"] == 4
    assert list(seen["alignment keeps"]) == [("a", kept._data_key([]))]  # its own value only
    assert seen["families keeps"] == [1]
    assert seen["families, closed"] == kept._Block()  # nothing left open in either thread
    assert kept._BLOCK.get() == kept._Block()  # nor here
    assert kept.kept(("c",), [], lambda: "fresh") == "fresh"
