"""Probe power: judged where a probe's reading can separate the truth at all.

A probe reads a layer up to a scale and a part linear in x_t (``reading.reread``). Heavy
ball's second step is GD's at another step size times a number, so no probe can tell them
apart: the benchmark's probe-power target counts, of the layers the exact readout names
the truth at, those where the truth is separable as a probe reads it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from iclprobe import algorithms, tasks
from iclprobe.alignment.measuring.reading import probe_read, reread
from iclprobe.constructions import benchmark as B
from iclprobe.constructions import power as P
from iclprobe.constructions import scoring as S


def _batch() -> tasks.RegressionBatch:
    return tasks.RegressionTask(n_dims=4, n_points=12).sample(64, generator=3)


@pytest.mark.parametrize("beta", [0.5, 0.9])
def test_heavy_balls_second_step_is_gds_up_to_a_scale_so_probes_cannot_tell(beta):
    # w2 = (2 + β)η g − η² Σ g (heavy ball from 0) and w2' = 2η' g − η'² Σ g (GD):
    # at η' = 2η / (2 + β), w2 = (2 + β)²/4 · w2' exactly
    b = _batch()
    xs, ys = b.xs.double(), b.ys.double()
    eta = 0.07
    hb = algorithms.iterates("momentum", xs, ys, steps=[2], lr=eta, beta=beta).preds
    gd = algorithms.iterates("gd", xs, ys, steps=[2], lr=2 * eta / (2 + beta)).preds
    torch.testing.assert_close(hb, (2 + beta) ** 2 / 4 * gd, rtol=1e-10, atol=1e-12)
    assert (hb - gd).abs().max() > 1e-2  # an exact readout tells them apart
    rows = (1, xs.shape[1] - 1)
    torch.testing.assert_close(reread(hb, None, xs, ys, rows)[0],
                               reread(gd, None, xs, ys, rows)[0], rtol=1e-9, atol=1e-10)
    # the fourth step is not: a probe's reading still tells them apart
    hb4 = algorithms.iterates("momentum", xs, ys, steps=[4], lr=eta, beta=beta).preds
    gd4 = algorithms.iterates("gd", xs, ys, steps=[4], lr=2 * eta / (2 + beta)).preds
    assert (reread(hb4, None, xs, ys, rows)[0] - reread(gd4, None, xs, ys, rows)[0]
            ).abs().max() > 1e-3


def test_the_true_columns_are_read_as_the_candidates_are():
    # through probes the truth's columns must be re-read exactly as `build_candidates` re-reads
    # a family (`probe_read`: the readout fitted on every sequence's predictions, applied to
    # the weights of the first n_w); read exactly they are the raw columns
    b = _batch()
    xs, ys = b.xs.double(), b.ys.double()

    def truth(x, y, weights=False):
        return algorithms.iterates("momentum", x.double(), y.double(), steps=[1, 2, 4],
                                   lr=0.05, beta=0.5, weights=weights)

    metrics, n_w, rows = ["error_cosine", "weight_cosine"], 8, (2, xs.shape[1] - 1)
    raw = S._true_values(truth, b, metrics, n_w, None)
    full, first = truth(b.xs, b.ys), truth(b.xs[:n_w], b.ys[:n_w], weights=True)
    assert torch.equal(raw["error_cosine"], full.preds.double())
    assert torch.equal(raw["weight_cosine"], first.weights.double())
    read = S._true_values(truth, b, metrics, n_w, rows)
    preds, weights = probe_read(full, xs, ys, rows, first)
    torch.testing.assert_close(read["error_cosine"], preds.preds, rtol=0, atol=0)
    torch.testing.assert_close(read["weight_cosine"], weights.weights, rtol=0, atol=0)
    assert (read["error_cosine"] - raw["error_cosine"]).abs().max() > 1e-3  # re-read


def _result(readout: str, answers: list[str], through: list[str] | None = None
            ) -> B.CellResult:
    cell = B.Cell("momentum oracle", "iclprobe", "isotropic", readout, 0.5, beta=0.9)
    verdicts = {S.ANSWER: answers}
    if through is not None:
        verdicts[S.THROUGH_PROBES] = through
    return B.CellResult(cell, False, {}, verdicts, {})


def test_probe_power_is_judged_where_probes_can_separate_the_truth():
    named = "momentum (β 0.9, 0.5/λmax, step {})"
    exact = _result("exact", ["computes nothing", *(named.format(2 * i) for i in range(1, 6))])
    probe = ["computes nothing", "cannot tell momentum from gd", "cannot tell momentum from gd",
             *(named.format(2 * i) for i in range(3, 6))]
    sep, not_sep = S.SEPARABLE, S.NOT_SEPARABLE
    # layers 1-2 inseparable through probes: 3 of 3 where they can separate, 3 of 5 in all
    power, = P.probe_power([exact, _result("probe", probe, [not_sep] * 3 + [sep] * 3)])
    assert (power.named_exactly, power.named_by_probe, power.within, power.named_within) == \
        (5, 3, 3, 3)
    assert not power.short
    # a layer probes name is judged whatever its label; a dead reading is never excused
    named_too = _result("probe", [probe[0], named.format(2), "computes nothing", *probe[3:]],
                        [not_sep] * 6)
    power, = P.probe_power([exact, named_too])
    assert (power.named_by_probe, power.within, power.named_within) == (4, 5, 4)
    # separable there too: probes that cannot tell are short of the truth
    power, = P.probe_power([exact, _result("probe", probe, [sep] * 6)])
    assert (power.within, power.named_within, power.short) == (5, 3, True)
    # without the reach through probes (results of an older run): every named layer
    power, = P.probe_power([exact, _result("probe", probe)])
    assert (power.within, power.named_within, power.short) == (5, 3, True)
    assert power.to_dict()["within"] == 5
    # no judged layer left: short (no evidence)
    power, = P.probe_power([exact, _result("probe", probe[:1] + ["cannot tell gd from cg"] * 5,
                                           [not_sep] * 6)])
    assert (power.within, power.short) == (0, True)


@pytest.mark.slow
def test_a_heavy_ball_oracles_second_step_is_not_separable_through_probes():
    cfg = B.bench_config(n_sequences=128, n_boot=50)
    cell = B.Cell("momentum oracle", "iclprobe", "isotropic", "probe", 0.5, beta=0.9)
    result = B.run_cell(cell, cfg)
    through = result.verdicts[S.THROUGH_PROBES]
    assert through[1] == S.NOT_SEPARABLE  # heavy ball's step 2
    assert through[2] == S.SEPARABLE  # step 4 (a raw truth against re-read rivals: not)
    assert all(v == S.SEPARABLE for v in through[3:])  # steps 6-16
    exact = B.run_cell(dataclasses.replace(cell, readout="exact"), cfg)
    assert S.THROUGH_PROBES not in exact.verdicts
    power, = P.probe_power([exact, result])
    assert power.within < power.named_exactly and not power.short
