"""`probes.decodability`: learners' columns decoded from a layer's residual stream.

Checked against scikit-learn's `Ridge` fitted fold by fold (`cross_val_predict` with the
same contiguous folds of sequences), and on an oracle whose residual holds its learner's
prediction linearly: the true column is decoded to round-off, a rival's is not.
"""

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge
from sklearn.model_selection import PredefinedSplit, cross_val_predict

from iclprobe import algorithms
from iclprobe.constructions import oracle
from iclprobe.errors import InputError
from iclprobe.hooks import collect_residuals
from iclprobe.probes.decode import decodability
from iclprobe.tasks import RegressionTask


def test_decodability_is_sklearns_cross_fitted_ridge():
    """13 sequences in 3 contiguous folds of 4, 5 and 4 (`cross_fit`'s edges), fold by fold."""
    g = torch.Generator().manual_seed(0)
    resid = torch.randn(2, 13, 6, 5, generator=g, dtype=torch.float64)
    targets = torch.randn(3, 13, 6, generator=g, dtype=torch.float64)
    targets[0] = resid[1] @ torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64) + 0.7
    folds, t_min, t_max, alpha = 3, 2, 4, 0.3
    got = decodability(resid, targets, folds, t_min, t_max, alpha)
    fold_of = np.repeat([0] * 4 + [1] * 5 + [2] * 4, t_max - t_min + 1)
    for layer in range(2):
        x = resid[layer, :, t_min:t_max + 1].reshape(-1, 5).numpy()
        for k in range(3):
            y = targets[k, :, t_min:t_max + 1].reshape(-1).numpy()
            pred = cross_val_predict(Ridge(alpha=alpha), x, y, cv=PredefinedSplit(fold_of))
            want = ((pred - y) ** 2).sum() / (y ** 2).sum()
            assert got[layer, k].item() == pytest.approx(want, rel=1e-9)
    assert got[1, 0].item() < 1e-3  # an affine map of layer 1's residual, shrunk by alpha only


@pytest.mark.parametrize(("offset", "scale"), [(1e4, 1.0), (0.0, 1e-8), (0.0, 1e160),
                                               (1e5, 1e-3)])
def test_a_linear_map_of_the_residual_is_decoded_whatever_its_offset_and_scale(offset, scale):
    """Offsets and scales far from 1 are centred and scaled out, not squared into the fit."""
    g = torch.Generator().manual_seed(3)
    resid = torch.randn(1, 16, 5, 4, generator=g, dtype=torch.float64)
    resid[..., 0] += 1e5 if offset else 0.0  # a constant channel besides
    resid = resid * scale + offset
    held = resid[0] @ torch.tensor([0.5, -1.0, 2.0, 1.5], dtype=torch.float64) + 3.0 * scale
    other = torch.randn(16, 5, generator=g, dtype=torch.float64)
    got = decodability(resid, torch.stack([held, other]))
    assert got[0, 0].item() < 1e-9
    assert 0.5 < got[0, 1].item() < 2.0  # noise is not decodable


def test_an_oracles_layer_holds_its_learners_column_and_not_a_rivals():
    """GD's column at the layer's step is decoded exactly; heavy ball's nearest is not."""
    task = RegressionTask(n_dims=4, n_points=12)
    model = oracle("gd", 4, 3, lambda layer: 2 * layer, task=task, exact_readout=False,
                   lr="max", normalize=True)
    batch = task.sample(64, generator=0)
    resid = collect_residuals(model, batch.xs, batch.ys)
    xs, ys = batch.xs.double(), batch.ys.double()
    gd = algorithms.gd(xs, ys, steps=[4], lr="max", normalize=True).preds
    hb = algorithms.momentum(xs, ys, steps=list(range(1, 9)), lr="max", beta=0.5).preds
    own = decodability(resid[2:3], gd)  # layer 2 runs GD's step 4
    rival = decodability(resid[2:3], hb)
    assert own.item() < 1e-6  # float32 residuals: exact to their rounding
    assert rival.min().item() > 100 * own.item()


@pytest.mark.parametrize(("resid", "targets", "kw", "says"), [
    (torch.zeros(4, 3, 2), torch.ones(1, 4, 3), {},
     r"resid must have shape \[layer, batch, pos, d_model\], got \(4, 3, 2\)"),
    (torch.zeros(1, 4, 3, 2), torch.ones(1, 4, 2), {},
     r"targets must have shape \[K, 4, 3\], got \(1, 4, 2\)"),
    (torch.zeros(1, 1, 3, 2), torch.ones(1, 1, 3), {},
     r"decodability needs at least 2 sequences \(folds of sequences\), got resid with batch 1"),
    (torch.zeros(1, 4, 3, 2), torch.ones(1, 4, 3), {"folds": 5},
     r"folds must be an integer in \[2, 4\] \(the sequences\), got 5"),
    (torch.zeros(1, 4, 3, 2), torch.ones(1, 4, 3), {"t_min": 2, "t_max": 1},
     r"t_min and t_max must satisfy 0 <= t_min <= t_max < 3, got t_min=2, t_max=1"),
    (torch.zeros(1, 4, 3, 2), torch.zeros(1, 4, 3), {},
     r"targets \[0\] are 0 at every position t = 1..2: nothing to decode"),
    (torch.zeros(1, 4, 3, 2), torch.full((1, 4, 3), float("nan")), {},
     r"targets are not finite at positions 1..2 \(found NaN or Inf\)"),
    (torch.full((1, 4, 3, 2), float("inf")), torch.ones(1, 4, 3), {},
     r"resid are not finite at positions 1..2 \(found NaN or Inf\)"),
    (torch.zeros(1, 4, 3, 2), torch.ones(1, 4, 3), {"alpha": -1.0},
     r"alpha must be a finite number >= 0 \(or None\), got -1.0"),
    (torch.zeros(1, 4, 3, 2), torch.ones(1, 4, 3), {"alpha": float("inf")},
     r"alpha must be a finite number >= 0 \(or None\), got inf"),
    (torch.zeros(1, 4, 3, 2), torch.ones(1, 4, 3), {"alpha": True},
     r"alpha must be a finite number >= 0 \(or None\), got True"),
])
def test_decodability_refuses_bad_input(resid, targets, kw, says):
    with pytest.raises(InputError, match=f"^(decodability: )?{says}$"):
        decodability(resid, targets, **kw)


@pytest.mark.slow
def test_the_decoding_measurement_runs_a_cell(capsys, tmp_path):
    """bench/decode_probe.py on one cell: the ridge oracle, named at every live layer."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "decode_probe.py"
    spec = importlib.util.spec_from_file_location("decode_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "dec.json"
    assert module.main(["--kinds", "ridge oracle", "--limit", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["truth"] == "ridge" and row["named_exactly"]
    assert row["decoded_first"] == row["named_exactly"]  # ridge's own column is held exactly
    assert "decoding puts the truth's family first at" in capsys.readouterr().out
