"""`align`'s stages, each called alone on inputs the test builds, and composed."""

import dataclasses
import math

import pytest
import torch

from iclprobe import models, tasks
from iclprobe.alignment import align
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.evaluation import evaluation, model_evaluation
from iclprobe.alignment.measuring.candidates import measure_candidates
from iclprobe.alignment.measuring.layers import Layers, checked_layers, read_layers
from iclprobe.alignment.measuring.matching import Matched, match_runs, match_steps
from iclprobe.alignment.measuring.runs import Learners, run_learners, run_spec
from iclprobe.alignment.measuring.similarities import similarity
from iclprobe.alignment.measuring.timing import Timings
from iclprobe.alignment.pipeline import align_layers, run_stages
from iclprobe.alignment.protocols import ICLPROBE, RunSpec
from iclprobe.alignment.result import Views, build_result
from iclprobe.alignment.views.answer import answer_view, matched_by
from iclprobe.alignment.views.fitted import fitted_view
from iclprobe.alignment.views.protocol import protocol_view
from iclprobe.alignment.views.separation import separation_view
from iclprobe.probes import sample_queries

N_WEIGHT = 8
CFG = AlignConfig(algorithms=("newton", "gd"), metrics=("error_cosine", "weight_cosine"),
                  n_weight_sequences=N_WEIGHT, n_boot=20, separation=False, fitted=False)


@pytest.fixture(scope="module")
def batch():
    return tasks.RegressionTask(n_dims=3, n_points=10).sample(64, generator=5)


@pytest.fixture(scope="module")
def newton(batch):
    """Newton's iterates on ``batch``: step l is what layer l of an exact Newton model holds."""
    return run_spec(ICLPROBE.runs["newton"], batch, 0, True)


def newton_layers(newton, steps=(0, 1, 2, 3)) -> Layers:
    """Layers that are Newton steps: layer 0 holds 0 (the zero predictor)."""
    preds = torch.stack([torch.zeros_like(newton.preds[0])] + [newton.preds[s] for s in steps[1:]])
    weights = torch.stack([torch.zeros_like(newton.weights[0])]
                          + [newton.weights[s] for s in steps[1:]])[:, :N_WEIGHT]
    return Layers(preds, weights)


@pytest.fixture(scope="module")
def ev(batch):
    return evaluation(CFG, batch, "exact", weight_rows=N_WEIGHT)


# ------------------------------------------------------------------ the evaluation
def test_evaluation_checks_the_window_and_the_learners_before_any_work(batch):
    ev = evaluation(CFG, batch, "m", weight_rows=N_WEIGHT)
    assert list(ev.runs) == ["newton", "gd"] and ev.window == (1, 9)
    assert ev.weight_metrics == ["weight_cosine"]
    assert ev.rows("weight_cosine") == slice(0, N_WEIGHT) and ev.rows("error_cosine") == slice(None)
    assert ev.over("error_cosine") == "positions" and ev.t_min("weight_cosine") == 1
    last = evaluation(CFG, batch, "m", positions="last")
    assert last.window == (9, 9) and last.over("error_cosine") == "sequences"
    assert last.over("weight_cosine") == "positions"  # it has no form across sequences
    with pytest.raises(ValueError, match=r"t_min=5, t_max=12: need t_min <= t_max <= 9"):
        evaluation(dataclasses.replace(CFG, t_min=5, t_max=12), batch)  # past the data
    with pytest.raises(ValueError, match=r"algorithms: 'pgd_own' cannot be run on m; "
                                         r"available here: newton, gd"):
        evaluation(dataclasses.replace(CFG, algorithms=("newton", "pgd_own")), batch, "m")
    # a registered learner the protocol does not run is a candidate only: not in its tables
    fu = evaluation(dataclasses.replace(CFG, protocol="fu2024", algorithms=("gd", "ridge")),
                    batch, "m")
    assert list(fu.runs) == ["gd"]


def test_a_claimed_run_joins_the_runs_first_and_a_default_that_cannot_run_is_left_out(batch):
    own = RunSpec("gd", "GD, its own lr", (0, 1, 2), {"lr": 0.1})
    ev = evaluation(dataclasses.replace(CFG, algorithms=None, protocol="fu2024"), batch,
                    claimed={"gd_own": own})
    assert list(ev.runs) == ["gd_own", "newton", "gd", "online_gd", "ols"]
    assert ev.runs["gd_own"] is own and ev.claimed == ("gd_own",)


def test_a_models_evaluation_measures_weights_within_one_fold_and_says_so():
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 2)
    task = tasks.RegressionTask(n_dims=3, n_points=9)
    cfg = dataclasses.replace(CFG, algorithms=None, n_sequences=32, n_weight_sequences=16)
    ev = model_evaluation(model, task, cfg, "pq", crossfit=True)
    assert ev.weight_rows == 8 and ev.batch.xs.shape == (32, 9, 3) and ev.task is task
    assert "pgd_own" in ev.runs and ev.claimed[0] == "pgd_own"  # the PQ family's claim
    assert any("induced weights on 8 sequences" in note and "within one fold" in note
               for note in ev.notes)
    again = model_evaluation(model, task, cfg, "pq")
    torch.testing.assert_close(again.batch.xs, ev.batch.xs)  # seeded by cfg.seed
    assert again.weight_rows == 16


def test_an_alignment_says_when_its_resamples_are_too_few_for_its_intervals():
    # the weight metrics' 16 sequences widen the 95% level: 72 resamples needed, not 39
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)])
    model.task = tasks.RegressionTask(n_dims=3, n_points=9)
    cfg = dataclasses.replace(CFG, n_sequences=64, n_weight_sequences=16)
    for n_boot, said in ((60, "weight metrics' 95% intervals over 16 sequences "
                               "(--n-weight-sequences; they need 72)"), (72, None)):
        res = align(model, dataclasses.replace(cfg, n_boot=n_boot))
        few = [note for note in res.notes if "bootstrap resamples are too few" in note]
        assert (said in few[0]) if said else not few
    preds = dataclasses.replace(cfg, n_boot=60, metrics=("error_cosine",))
    assert not any("too few" in note for note in align(model, preds).notes)  # 64 need 40


# ------------------------------------------------------------------ measuring
def test_read_layers_reads_an_exact_model_and_its_induced_weights():
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 2)
    task = tasks.RegressionTask(n_dims=3, n_points=9)
    ev = model_evaluation(model, task, dataclasses.replace(CFG, n_sequences=16), "pq")
    timings = Timings()
    layers = read_layers(model, ev, None, timings)
    assert layers.preds.shape == (3, 16, 9) and layers.weights.shape == (3, N_WEIGHT, 9, 3)
    assert layers.probe_t_min is None and layers.probe_r2 == [] and "exact readout" in \
        layers.readout
    assert list(timings) == ["layer predictions (forward pass, probes)",
                             "induced weights (query tokens)"]
    with torch.no_grad():
        torch.testing.assert_close(layers.preds[-1].float(), model(ev.batch.xs, ev.batch.ys))


def test_the_induced_weights_queries_are_drawn_apart_from_the_evaluation_data(monkeypatch):
    """The queries come from a stream of their own (seed + 3), not the evaluation seed's.

    Drawn from the evaluation seed's stream, most of them were copies of the evaluation
    sequences' own examples (the same normal draws, in the same order); now none is.
    """
    from iclprobe.alignment.measuring import layers as layers_mod
    asked = []
    own = layers_mod.layer_weight_fn

    def recording(*args, **kwargs):
        read = own(*args, **kwargs)

        def record(xs, ys, queries):
            asked.append(queries)
            return read(xs, ys, queries)
        return record

    monkeypatch.setattr(layers_mod, "layer_weight_fn", recording)
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 2)
    task = tasks.RegressionTask(n_dims=3, n_points=9)
    ev = model_evaluation(model, task, dataclasses.replace(CFG, n_sequences=16, seed=4), "pq")
    layers = read_layers(model, ev, None, Timings())
    queries = torch.cat([q.reshape(-1, 3) for q in asked]).double()
    seen = ev.batch.xs.double().reshape(-1, 3)
    assert queries.shape[0] >= seen.shape[0] // 2  # enough queries to have met copies
    assert torch.cdist(queries, seen).min() > 1e-3  # no query is an example's copy
    again = sample_queries(tuple(layers.weights.shape[1:3]) + (CFG.queries_for(3), 3), None, 7)
    torch.testing.assert_close(queries, again.reshape(-1, 3).to(queries))  # seed + 3, reproducible


def test_checked_layers_refuse_what_is_not_finite_in_the_window_and_zero_the_rest(ev, newton):
    layers = newton_layers(newton)
    outside = layers.preds.clone().float()
    outside[2, :, 0] = math.nan  # t = 0 is outside the window 1..9
    checked = checked_layers(ev, dataclasses.replace(layers, preds=outside))
    assert checked.preds.dtype == torch.float64 and bool(torch.isfinite(checked.preds).all())
    assert checked.notes == ("layer predictions outside t = 1..9 are not finite (the model "
                             "is valid only where it is aligned); they are not used",)
    inside = outside.clone()
    inside[1, 0, 4] = math.inf
    with pytest.raises(ValueError, match=r"the layer predictions .* are not finite"):
        checked_layers(ev, dataclasses.replace(layers, preds=inside))
    with pytest.raises(ValueError, match=r"metrics \['weight_cosine'\] need layer_weights"):
        checked_layers(ev, dataclasses.replace(layers, weights=None))
    with pytest.raises(ValueError, match=r"layer_preds must have shape \[layer, 64, 10\]"):
        checked_layers(ev, dataclasses.replace(layers, preds=layers.preds[:, :5]))


def test_run_learners_runs_each_run_once_with_weights_on_the_weight_rows(ev, batch):
    learners = run_learners(ev, n_layers=3)
    assert list(learners.iterates) == ["newton", "gd"]
    assert all(it.weights is None for it in learners.iterates.values())
    for key, it in learners.iterates.items():
        alone = run_spec(ev.runs[key], batch, 3, False, learners.stats)
        torch.testing.assert_close(it.preds, alone.preds)
        assert it.name == key
        assert learners.with_weights[key].weights.shape[1] == N_WEIGHT
    assert learners.of("weight_cosine") is learners.with_weights
    assert learners.of("error_cosine") is learners.iterates


def test_match_runs_finds_the_newton_steps_the_layers_are(ev, newton):
    layers = checked_layers(ev, newton_layers(newton))
    matched = match_runs(ev, layers, run_learners(ev, 3))
    assert matched.live == [False, True, True, True]  # layer 0 is the zero predictor
    for metric in ("error_cosine", "weight_cosine"):
        assert matched.matches["newton"][metric].best_step[1:] == [1, 2, 3]
        assert matched.sims["newton"][metric].metric == metric
    assert matched.matched == [False, True, True, True]
    # the weight tables are on the weight rows, from the protocol's weight_t_min
    assert matched.sims["gd"]["weight_cosine"].n_sequences == N_WEIGHT


# ------------------------------------------------------------------ views and result
def hand_matched(ev, newton) -> tuple[Layers, Learners, Matched]:
    """The measuring stages' outputs, built from the tables directly."""
    layers = checked_layers(ev, newton_layers(newton))
    learners = run_learners(ev, 3)
    sims, matches, raw = {}, {}, {}
    for key, it in learners.iterates.items():
        sims[key] = {"error_cosine": similarity(layers.preds, it, ev.ys, n_boot=20)}
        raw[key] = match_steps(sims[key]["error_cosine"])
        matches[key] = {"error_cosine": raw[key]}
    return layers, learners, Matched([False, True, True, True], sims, matches, raw)


def test_protocol_view_pairs_the_runs_and_prefers_newton(ev, newton):
    ev = dataclasses.replace(ev, cfg=dataclasses.replace(CFG, metrics=("error_cosine",)))
    _, learners, matched = hand_matched(ev, newton)
    table = protocol_view(ev, matched, learners)["error_cosine"]
    assert list(table.scores) == ["newton", "gd"]
    (pair,) = table.pairs
    assert (pair.a, pair.b) == ("newton", "gd")
    assert pair.verdicts[0] == "computes nothing"
    assert pair.verdicts[1:] == ["prefers newton"] * 3


def test_fitted_and_separation_views_read_the_same_stages(ev, newton):
    ev = dataclasses.replace(ev, cfg=dataclasses.replace(CFG, metrics=("error_cosine",),
                                                         n_boot=10))
    layers, learners, matched = hand_matched(ev, newton)
    cands = measure_candidates(ev, layers, learners.stats)
    assert list(cands.members) == ["newton", "gd"] and list(cands.tables) == ["error_cosine"]
    said = answer_view(ev, matched.live, cands)
    assert said.layers[0].kind == "computes nothing"
    assert [a.learner for a in said.layers[1:]] == ["newton"] * 3  # Newton's own columns
    fitted, spectral = fitted_view(ev, learners.stats, matched.live, matched_by(said), cands)
    assert list(fitted) == ["error_cosine"] and spectral is None  # no weight metric
    assert fitted["error_cosine"].verdicts[0] == "computes nothing"
    separation = separation_view(ev, learners)
    assert separation.views[0].newton_steps == [3, 6, 9, 12, 15, 18]


def test_through_probes_the_ceilings_are_the_mean_over_the_noises_draws(ev, newton):
    # the stage passes every draw of the readout noise to the ceilings, the first once
    from iclprobe.alignment.measuring.candidates import noise_ceilings, read_as_probes

    ev = dataclasses.replace(ev, cfg=dataclasses.replace(CFG, metrics=("error_cosine",),
                                                         n_boot=10))
    layers, learners, _ = hand_matched(ev, newton)
    gen = torch.Generator().manual_seed(1)
    draws = 0.05 * torch.randn(3, *layers.preds.shape, generator=gen, dtype=torch.float64)
    probed = dataclasses.replace(layers, probe_t_min=1, noise=draws[0], more_noise=draws[1:],
                                 noise_features=6)
    cands = measure_candidates(ev, probed, learners.stats)
    xs, rows = ev.batch.xs.double(), (1, ev.window[1])
    clean = read_as_probes(layers.preds, None, xs, ev.ys, rows)
    one = [noise_ceilings(clean, {"preds": read_as_probes(layers.preds + d, None, xs, ev.ys,
                                                          rows)[0], "weights": None},
                          ev.ys, ["error_cosine"], cands.spec)["error_cosine"] for d in draws]
    assert cands.spec.ceilings is not None
    torch.testing.assert_close(cands.spec.ceilings["error_cosine"], torch.stack(one).mean(0))


def test_build_result_says_when_the_model_does_not_solve_the_task(ev, newton):
    layers, learners, matched = hand_matched(ev, newton)
    dead = dataclasses.replace(matched, live=[False] * 4)
    res = build_result(ev, layers, learners, dead, Views({}), {"learners": 1.0})
    assert res.meaningless.startswith("the model does not solve this task")
    assert res.name == "exact" and res.n_layers == 3 and res.readout == "given layer predictions"
    assert res.task == {"n_dims": 3, "n_points": 10, "cov": "given"}
    assert res.layer_error[0] == pytest.approx(res.zero_error)  # layer 0 holds 0
    assert list(res.learner_error_by_t)[0] == "newton (step 3)"  # the last layer's match
    assert build_result(ev, layers, learners, matched, Views({}), {}).meaningless is None


@pytest.mark.slow
def test_align_layers_is_the_stages_composed(ev, newton, batch):
    layers = newton_layers(newton)
    cfg = dataclasses.replace(CFG, fitted=True, separation=True)
    res = align_layers(layers.preds, batch, cfg, layers.weights, name="exact")
    by_hand = run_stages(dataclasses.replace(ev, cfg=cfg), layers, Timings())
    assert res.to_dict() == by_hand.to_dict()
    assert list(res.timings) == ["learners", "similarities, bootstrap, matching",
                                 "learner table, calibration",
                                 "candidates: fitted families and tables",
                                 "the answer, Newton vs GD", "separation views"]
