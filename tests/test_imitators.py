"""Rivals fitted to the leader's match through probes (`measuring.imitators`).

Heavy ball's step 2 is ``(2 + β)η b̄ − η² S̄ b̄`` and GD's step 2 at ``η' = 2η/(2 + β)`` is
``(2 + β)²/4`` times less: one column once a probe reads it (`reading.reread` is blind to a
scale). A heavy-ball layer there is GD's as much as heavy ball's.
"""

import pytest
import torch

from iclprobe import algorithms, tasks
from iclprobe.alignment import AlignConfig, align_layers
from iclprobe.alignment import comparison as C
from iclprobe.alignment.measuring import imitators
from iclprobe.alignment.measuring.candidates import build_candidates, candidate_tables
from iclprobe.alignment.measuring.reading import reread
from iclprobe.alignment.measuring.table_spec import TableSpec

#: heavy ball's momentum and step size (× 1/λ_max of each prefix), on its grid; GD's
#: imitating step size 2η/(2 + β) is not on GD's (0.345 and 0.8/λ_max; at the second,
#: GD's grid imitates it best at step 3, so the fit searches the steps next to that too)
CASES = [(0.9, 0.5), (0.5, 1.0)]


def _batch(sequences=64):
    task = tasks.RegressionTask(n_dims=4, n_points=13)
    return task.sample(sequences, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def _heavy_ball(batch, beta, scale, steps=(2,)):
    return algorithms.momentum(batch.xs, batch.ys, steps=steps, lr="max", lr_scale=scale,
                               beta=beta).preds


@pytest.mark.parametrize("beta,scale", CASES)
def test_heavy_balls_second_step_is_gds_up_to_a_scale(beta, scale):
    # the closed form above, on every prefix (the step sizes are per prefix, the ratio not)
    batch = _batch()
    gd = algorithms.gd(batch.xs, batch.ys, steps=(2,), lr="max",
                       lr_scale=2 * scale / (2 + beta), normalize=True).preds
    torch.testing.assert_close(_heavy_ball(batch, beta, scale), (2 + beta) ** 2 / 4 * gd,
                               rtol=1e-10, atol=1e-12)
    rows = (1, batch.xs.shape[1] - 1)
    a, _ = reread(_heavy_ball(batch, beta, scale), None, batch.xs, batch.ys, rows)
    b, _ = reread(gd, None, batch.xs, batch.ys, rows)
    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)  # one column once read


def _members(batch, rows):
    stats = algorithms.prefix_stats(batch.xs, batch.ys)
    window = (1, batch.xs.shape[1] - 1)
    members, _ = build_candidates(["gd", "momentum"], batch, stats, window, 8, None, {}, rows)

    def run(fine):
        return build_candidates(list(fine), batch, stats, window, 8, None, {}, rows, fine)[0]

    return members, stats, window, run


@pytest.mark.parametrize("beta,scale", CASES)
def test_gds_step_size_is_fitted_to_imitate_heavy_balls_match(beta, scale):
    batch = _batch()
    rows = (1, batch.xs.shape[1] - 1)
    members, stats, window, run = _members(batch, rows)
    layer, _ = reread(_heavy_ball(batch, beta, scale), None, batch.xs, batch.ys, rows)
    spec = TableSpec(window, 1, "positions", 8, 0.95, 0)
    tables = {"error_cosine": candidate_tables(members, layer, None, batch.ys,
                                               ["error_cosine"], spec)["error_cosine"]}
    grid, _ = C.imitation(layer, members["gd"].preds, batch.ys, "error_cosine")
    assert grid[0] < 1 - 1e-6  # GD's grid of step sizes misses 2η/(2 + β)
    imitators.fit_imitators(members, tables, batch, stats, window, spec, run)
    fitted = members["gd"].imitators
    assert fitted is not None
    best, _ = C.imitation(layer, fitted, batch.ys, "error_cosine")
    assert best[0] > 1 - 1e-6  # ... and its fitted step size reaches it (the rule reads 1e-5)
    # imitators are a rival's: the leader's own family gets none for its own match
    assert members["momentum"].imitators is None


@pytest.mark.parametrize("beta,scale", [(0.5, 2.0), (0.5, 1.0)])
@pytest.mark.slow
def test_through_probes_that_layer_is_gd_or_heavy_ball(beta, scale):
    # without the imitators both layers are named heavy ball: GD's grid imitates them less
    batch = _batch(128)
    hb = _heavy_ball(batch, beta, scale, steps=(0, 2, 4))
    cfg = AlignConfig(n_boot=20, separation=False, metrics=("error_cosine",),
                      algorithms=("gd", "momentum", "newton"))
    said = align_layers(hb, batch, cfg, probe_t_min=1).answer.layers[1]
    assert said.kind == "cannot tell" and {said.learner, *said.others} >= {"gd", "momentum"}
    exact = align_layers(hb, batch, cfg).answer.layers[1]  # read exactly, the scale tells
    assert (exact.kind, exact.learner) == ("runs", "momentum")
