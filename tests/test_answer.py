"""What a layer runs: the answer over every candidate learner, on layers built by hand."""

import dataclasses
import functools

import pytest
import torch

from iclprobe import algorithms, tasks
from iclprobe.alignment.measuring.candidates import TableSpec, build_candidates, candidate_tables
from iclprobe.alignment.measuring.similarities import similarity
from iclprobe.alignment.views.answer import CANNOT_TELL, NONE, RUNS, LayerAnswer, answer, combine
from iclprobe.alignment.views.continua import evidence
from iclprobe.alignment.views.margins import probe_margins

KEYS = ("newton", "gd", "cg", "ols", "ridge", "momentum")


@functools.cache
def _setup(cov="ill-conditioned", sequences=96, seed=3):
    task = tasks.RegressionTask(n_dims=3, n_points=10, cov=cov)
    batch = task.sample(sequences, generator=torch.Generator().manual_seed(seed))
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    cands, _ = build_candidates(KEYS, batch, stats, (1, 9), 3, None, {}, None)
    spec = TableSpec((1, 9), 1, "positions", 60, 0.95, 0)
    return batch, cands, spec


def _answer(layers, batch, cands, spec, metrics=("error_cosine", "spd")):
    ys = batch.ys.double()
    tables = candidate_tables(cands, layers, None, ys, metrics, spec)
    return answer(tables, cands, {"preds": layers, "weights": None}, ys, spec,
                  [True] * layers.shape[0], 1e-3)


def _column(it, label):
    return it.preds[[i for i, c in enumerate(label) if c][0]]


def test_a_layer_that_is_a_learners_column_is_named_with_its_step():
    batch, cands, spec = _setup()
    gd, newton = cands["gd"], cands["newton"]
    k_gd = gd.columns.index("0.5/λmax, step 3")
    k_newton = newton.columns.index("1/‖SSᵀ‖, step 3")
    layers = torch.stack([gd.preds.preds[k_gd], newton.preds.preds[k_newton]]).float().double()
    res = _answer(layers, batch, cands, spec)
    assert [a.kind for a in res.layers] == [RUNS, RUNS]
    assert res.layers[0].learner == "gd" and res.layers[0].column == "0.5/λmax, step 3"
    assert res.layers[1].learner == "newton" and res.layers[1].column == "1/‖SSᵀ‖, step 3"
    assert res.layers[0].text == "gd (0.5/λmax, step 3)"
    assert res.candidates == list(KEYS) and res.metrics == ["error_cosine", "spd"]


@pytest.mark.parametrize("step", [2, 3])
def test_a_layer_between_two_learners_is_neither(step):
    # an average of a GD and a Newton iterate (the benchmark averages equal step counts)
    batch, cands, spec = _setup()
    gd = cands["gd"].preds.preds[cands["gd"].columns.index(f"0.5/λmax, step {step + 1}")]
    newton = cands["newton"].preds.preds[cands["newton"].columns.index(f"1/‖SSᵀ‖, step {step}")]
    alone = _answer(torch.stack([gd, newton]), batch, cands, spec)
    assert [a.learner for a in alone.layers] == ["gd", "newton"]
    res = _answer(((gd + newton) / 2)[None], batch, cands, spec)
    assert res.layers[0].kind == CANNOT_TELL, res.layers[0].text
    assert {"gd", "newton"} <= {res.layers[0].learner, *res.layers[0].others}


def test_a_layer_far_from_every_learner_is_none_of_them_with_the_nearest():
    batch, cands, spec = _setup()
    gd = cands["gd"].preds.preds[cands["gd"].columns.index("1/λmax, step 3")]
    g = torch.Generator().manual_seed(0)
    off = gd + 0.1 * batch.ys.double().std() * torch.randn(gd.shape, generator=g,
                                                            dtype=torch.float64)
    res = _answer(off[None], batch, cands, spec)
    a = res.layers[0]
    assert a.kind == NONE and a.learner is not None and a.runner_up is not None
    assert a.value < a.resemblance  # farther from its nearest than the runner-up's match is
    assert a.detail().startswith(f"none of them: nearest {a.learner}")


def test_a_converged_layer_cannot_be_told_from_ols():
    batch, cands, spec = _setup(cov="isotropic")
    ols = cands["ols"].preds.preds[0]
    res = _answer(ols[None].float().double(), batch, cands, spec)
    a = res.layers[0]
    assert a.kind == CANNOT_TELL and "ols" in [a.learner, *a.others], a.text


def test_layers_that_are_not_live_compute_nothing():
    batch, cands, spec = _setup()
    ys = batch.ys.double()
    layers = cands["gd"].preds.preds[:2]
    tables = candidate_tables(cands, layers, None, ys, ("error_cosine",), spec)
    res = answer(tables, cands, {"preds": layers, "weights": None}, ys, spec, [False, True], 1e-3)
    assert res.layers[0].kind == "computes nothing" and res.layers[0].text == "computes nothing"


def _said(kind, learner=None, others=(), metric="error_cosine"):
    return LayerAnswer(kind, learner, "step 1" if kind == RUNS else None, 0.9, list(others),
                       "gd", 0.95, metric)


@pytest.mark.parametrize("error, spd, weight, want", [
    (("runs", "gd"), ("runs", "gd"), ("runs", "gd"), ("runs", "gd")),
    (("runs", "gd"), ("cannot tell", "gd", ["cg"]), ("none of them", "newton"), ("runs", "gd")),
    (("runs", "gd"), ("runs", "gd"), ("runs", "momentum"), ("cannot tell", "gd")),
    (("runs", "gd"), ("none of them", "gd"), ("runs", "gd"), ("cannot tell", "gd")),
    (("cannot tell", "gd", ["newton"]), ("runs", "gd"), ("runs", "gd"), ("cannot tell", "gd")),
    (("none of them", "gd"), ("none of them", "cg"), ("runs", "gd"), ("none of them", "gd")),
])
def test_the_prediction_metrics_lead_and_a_weight_metric_can_only_object(error, spd, weight,
                                                                          want):
    def make(spec_, metric):
        kind, learner, *rest = spec_
        return _said(kind, learner, rest[0] if rest else (), metric)

    out = combine({"error_cosine": [make(error, "error_cosine")],
                   "spd": [make(spd, "spd")],
                   "weight_cosine": [make(weight, "weight_cosine")]})[0]
    assert (out.kind, out.learner) == want


def test_a_weight_metrics_cannot_tell_list_does_not_lengthen_the_answers():
    # A CG oracle's layer past d steps, on the held-out slice: the error cosine and spd
    # cannot tell CG from OLS (its iterate is OLS's) and put Newton, heavy ball and GD
    # 1e-3 below it; the weight cosine's 16 sequences cannot separate those three either.
    preds = [_said(CANNOT_TELL, "cg", ["ols"], m) for m in ("error_cosine", "spd")]
    weight = _said(CANNOT_TELL, "cg", ["ols", "newton", "momentum", "gd"], "weight_cosine")
    out = combine({"error_cosine": [preds[0]], "spd": [preds[1]],
                   "weight_cosine": [weight]})[0]
    assert (out.kind, out.learner, out.others) == (CANNOT_TELL, "cg", ["ols"])
    assert out.source == ""  # nor does its best make the metrics "disagree"
    out = combine({"error_cosine": [preds[0]], "spd": [preds[1]],
                   "weight_cosine": [dataclasses.replace(weight, learner="newton")]})[0]
    assert (out.others, out.source) == (["ols"], "")
    # what a weight metric names still joins the list it blocks
    named = _said(RUNS, "momentum", (), "weight_cosine")
    out = combine({"error_cosine": [_said(RUNS, "gd")], "spd": [_said(RUNS, "gd", (), "spd")],
                   "weight_cosine": [named]})[0]
    assert (out.kind, out.learner, out.others) == (CANNOT_TELL, "gd", ["momentum"])
    # the prediction metrics' runners-up only where no second candidate is named yet: the
    # error cosine names GD, spd finds "none of them" (nearest GD, runner-up Newton)
    none = dataclasses.replace(_said(NONE, "gd", (), "spd"), runner_up="newton")
    out = combine({"error_cosine": [_said(RUNS, "gd")], "spd": [none]})[0]
    assert (out.kind, out.learner, out.others) == (CANNOT_TELL, "gd", ["newton"])
    both = combine({"error_cosine": [_said(CANNOT_TELL, "gd", ["momentum"])], "spd": [none]})
    assert both[0].others == ["momentum"]  # spd's runner-up, Newton, is not added


@pytest.mark.parametrize("between, lead_learner, want", [
    ([], "gd", "runs"),  # spd could not separate gd from newton: no objection
    (["newton"], "gd", "cannot tell"),  # spd found the layer between gd and newton
    (["gd"], "newton", "cannot tell"),  # ... seen from newton's side
    (["cg"], "newton", "runs"),  # between newton and cg says nothing against gd
])
def test_a_prediction_metric_that_finds_the_layer_between_two_blocks_the_name(
        between, lead_learner, want):
    # The known-answer benchmark's average of GD's and Newton's predictions, read by probes
    # on designed data: the error cosine named Newton, while spd found a mix of Newton's and
    # GD's matched columns fitting the layer better than Newton's alone.
    others = ["newton", "cg"] if lead_learner == "gd" else ["gd", "cg"]
    spd = dataclasses.replace(_said(CANNOT_TELL, lead_learner, others, "spd"), between=between)
    out = combine({"error_cosine": [_said(RUNS, "gd")], "spd": [spd]})[0]
    assert out.kind == want
    assert out.learner == "gd"


def test_the_answer_is_json_ready_and_names_its_candidates():
    batch, cands, spec = _setup()
    layers = cands["cg"].preds.preds[1:3]
    res = _answer(layers, batch, cands, spec)
    out = res.to_dict()
    assert out["candidates"] == list(KEYS) and len(out["layers"]) == 2
    assert set(out["scores"]["error_cosine"]) == set(KEYS)
    assert dataclasses.asdict(res.layers[0]) == out["layers"][0]


def test_none_of_them_prints_its_two_numbers_apart():
    """Both numbers can round to 1.000; printed so, "none of them" would read as a tie."""
    close = LayerAnswer(NONE, learner="gd", column="1/λmax, step 3", value=0.99961,
                        runner_up="newton", resemblance=0.99994, metric="error_cosine")
    assert "error cosine 0.9996, while newton's matched column is at 0.9999" in close.detail()
    far = dataclasses.replace(close, value=0.831, resemblance=0.979)
    assert "0.831, while newton's matched column is at 0.979" in far.detail()


def test_the_probes_noise_widens_the_separation_it_could_have_made():
    # a layer that is GD's column is named GD; read with a noise sample that carries it a
    # quarter of the way to Newton's column and back, its lead over Newton moves by more
    # than the lead's interval leaves, so the answer no longer names it
    batch, cands, spec = _setup()
    gd = cands["gd"].preds.preds[cands["gd"].columns.index("0.5/λmax, step 3")]
    newton = cands["newton"].preds.preds[cands["newton"].columns.index("1/‖SSᵀ‖, step 3")]
    layers, ys = gd[None], batch.ys.double()
    tables = candidate_tables(cands, layers, None, ys, ("error_cosine",), spec)
    clean = answer(tables, cands, {"preds": layers, "weights": None}, ys, spec, [True], 1e-3)
    assert clean.layers[0].kind == RUNS and clean.layers[0].learner == "gd"
    push = 0.25 * (newton - gd)[None]
    noisy = [{"preds": layers + push, "weights": None}, {"preds": layers - push, "weights": None}]
    widened = answer(tables, cands, {"preds": layers, "weights": None}, ys, spec, [True], 1e-3,
                     noisy=noisy)
    assert widened.layers[0].kind == CANNOT_TELL and "newton" in widened.layers[0].others
    # the margin is the lead's change under the sample, by hand: error cosine over positions
    ev = evidence(tables["error_cosine"])
    margins = probe_margins("gd", [0], ev.best, ev.sign, cands, "error_cosine", ys, spec,
                            layers, [layers + push, layers - push])

    def cos(a, b):  # error cosine: per sequence over the window's positions, then the mean
        ea, eb = (a - ys)[:, 1:10], (b - ys)[:, 1:10]
        return float(((ea * eb).sum(-1) / (ea.norm(dim=-1) * eb.norm(dim=-1))).mean())

    col = {k: c.preds.preds[ev.best[k][0]] for k, c in cands.items()}

    def lead(v):
        return cos(v, col["gd"]) - cos(v, col["newton"])

    by_hand = max(abs(lead(gd + s * push[0]) - lead(gd)) for s in (1, -1))
    assert margins["newton"][0] == pytest.approx(by_hand, rel=1e-6)
    # an exact readout: no sample, no margin
    assert probe_margins("gd", [0], ev.best, ev.sign, cands, "error_cosine", ys, spec, layers,
                         []) == {}


def _decided(value: float, lead: float, imitation: float, margin: float, slack: float = 0.0):
    """GD's answer at a layer GD matches at ``value``, heavy ball ``lead`` below it.

    ``imitation``: heavy ball's best imitation of GD's match (also the runner-up's
    resemblance); ``margin``: the probes' noise margin; ``slack``: the correction's.
    """
    from types import SimpleNamespace

    from iclprobe.alignment.views import answer_rule as R
    from iclprobe.alignment.views.continua import Evidence

    g = torch.Generator().manual_seed(0)
    own = value + 1e-6 * torch.randn(100, generator=g, dtype=torch.float64)
    rival = own - lead + 1e-6 * torch.randn(100, generator=g, dtype=torch.float64)
    values = {"gd": value, "momentum": value - lead}
    ev = Evidence({k: [0] for k in values}, {}, {k: torch.tensor([v]) for k, v in values.items()},
                  {}, 1.0, 0.95, 100)
    tables = {k: SimpleNamespace(values=torch.tensor([[v]])) for k, v in values.items()}
    cands = {k: SimpleNamespace(columns=["step 3"]) for k in tables}
    sticks = R._Yardsticks({"momentum": {0: imitation}}, {0: imitation}, {0: own}, {0: value},
                           {"momentum": {0: rival}}, {"momentum": {0: False}},
                           {"momentum": {0: margin}}, {0: slack})
    return R._decide("error_cosine", ev, tables, cands, 0, "gd", sticks)


@pytest.mark.parametrize(("imitation", "named"), [(0.999996, False), (0.999, True)])
def test_through_probes_a_rival_imitating_the_match_to_round_off_is_not_separated(imitation,
                                                                                  named):
    # The fresh slice's heavy-ball oracle at layer 1 read by probes (its numbers): the
    # noise ceiling carried the layer past a perfect match (1.0005) and GD led heavy ball
    # by 3.5e-5, while heavy ball imitates GD's match to 4e-6 once both are read on
    # [prediction, x_t, 1]. Read exactly no layer is closer to X than a perfect match, so
    # it could not be named there; capped at 1, it is not named through probes either.
    from iclprobe.alignment.views import answer_rule as R

    said = _decided(1.0005, 3.5e-5, imitation, 2.6e-6)
    assert (said.kind == RUNS) is named, said.text
    if not named:
        assert said.kind == CANNOT_TELL and said.others == ["momentum"]
    assert R._at_most_perfect("spd", 3e-4) == 0.0 and R._at_most_perfect("spd", -1.0) == -1.0


def test_the_correction_slack_is_the_size_of_the_noise_correction():
    # the share √(2/p) of the correction: a squared norm of noise with p = 8 features
    ceilings = {"error_cosine": torch.tensor([0.998, 1.0], dtype=torch.float64),
                "spd": torch.tensor([0.01, 0.0], dtype=torch.float64)}
    spec = TableSpec((1, 9), 1, "positions", 60, 0.95, 0, ceilings=ceilings, noise_features=8)
    assert spec.slack("error_cosine", 0) == pytest.approx((1 / 0.998 - 1) / 2, rel=1e-12)
    assert spec.slack("error_cosine", 1) == 0.0 and spec.slack("spd", 0) == pytest.approx(0.005)
    assert spec.slack("weight_cosine", 0) == 0.0  # no ceiling measured for it
    assert dataclasses.replace(spec, noise_features=1).slack("spd", 0) == pytest.approx(0.01)
    assert dataclasses.replace(spec, noise_features=None).slack("spd", 0) == 0.0
    assert TableSpec((1, 9), 1, "positions", 60, 0.95, 0).slack("error_cosine", 0) == 0.0


def test_a_prediction_metrics_ceiling_is_the_mean_over_every_draw_of_the_noise():
    # one draw's ceiling is as uncertain as the correction it makes (a squared norm of the
    # probes' few-featured error); the draws of every split of the folds are averaged
    from iclprobe.alignment.measuring.candidates import noise_ceilings

    gen = torch.Generator().manual_seed(0)
    ys = torch.randn(12, 9, generator=gen, dtype=torch.float64)
    clean = ys + 0.3 * torch.randn(3, 12, 9, generator=gen, dtype=torch.float64)
    draws = [clean + s * torch.randn(3, 12, 9, generator=gen, dtype=torch.float64)
             for s in (0.05, 0.1, 0.2)]
    weights = torch.randn(3, 4, 9, 2, generator=gen, dtype=torch.float64)
    spec = TableSpec((1, 8), 1, "positions", 2, 0.95, 0)
    metrics = ["error_cosine", "spd", "weight_cosine"]
    noisy = {"preds": draws[0], "weights": weights + 0.1}
    one = [noise_ceilings((clean, weights), {"preds": d, "weights": weights + 0.1}, ys,
                          metrics, spec) for d in draws]
    every = noise_ceilings((clean, weights), noisy, ys, metrics, spec, draws[1:])
    for metric in ("error_cosine", "spd"):
        torch.testing.assert_close(every[metric],
                                   torch.stack([c[metric] for c in one]).mean(0))
        assert not torch.allclose(every[metric], one[0][metric])  # the draws differ
    # the induced weights' noise is measured once (its own pass over the query tokens)
    torch.testing.assert_close(every["weight_cosine"], one[0]["weight_cosine"])


@pytest.mark.parametrize(("slack", "kind"), [(0.0, NONE), (5e-4, CANNOT_TELL)])
def test_through_probes_none_of_them_allows_the_corrections_slack(slack, kind):
    # The main slice's GD oracle at 1/λmax, layer 4, read by probes (its numbers): the
    # paired difference separates GD from heavy ball, but the layer's corrected similarity
    # to GD's match (0.99957) falls short of heavy ball's imitation of it (0.99990) by less
    # than the correction's slack; without it the GD layer reads "none of them". (Naming
    # it, by letting the slack into the closeness test too, named the GD/Newton average's
    # late layers GD on the benchmark's designed data.)
    assert _decided(0.99957, 1e-4, 0.99990, 4e-6, slack).kind == kind


def _metric_np(metric, a, b, ys):
    """Error cosine (higher is better) or spd over positions 1…9, written out in numpy."""
    import numpy as np
    a, b, ys = (np.asarray(v)[:, 1:10] for v in (a, b, ys))
    if metric == "spd":
        return float(np.mean(((a - b) ** 2).mean(-1)))
    ra, rb = a - ys, b - ys
    return float(np.mean((ra * rb).sum(-1) / np.sqrt((ra * ra).sum(-1) * (rb * rb).sum(-1))))


@pytest.mark.parametrize("metric", ["error_cosine", "spd"])
def test_a_familys_reach_is_its_best_column_or_mix(metric):
    """`families_reach`: the best of a family's columns and of their mixes with grid neighbours.

    Against a numpy loop over every column and every such mix, for several families at once
    (each read from its own part of the rows' mix table), a metric where higher is better
    and one where lower is. A row between two of GD's adjacent step counts is reached
    exactly by their mix, which no single column reaches; a rival's reach of a learner's
    iterate is judged so by the known-answer benchmark's separability.
    """
    from iclprobe.alignment.views.continua import MIX_WEIGHTS, families_reach

    batch, cands, spec = _setup()
    ys = batch.ys.double()
    gd = cands["gd"]
    steps = gd.preds.steps.tolist()
    col = next(k for k in range(1, len(steps)) if steps[k] == 3 and gd.columns[k].startswith("1/"))
    between = 0.65 * gd.preds.preds[col] + 0.35 * gd.preds.preds[col - 1]  # steps 3 and 2
    rows = torch.stack([between, cands["newton"].preds.preds[7], cands["momentum"].preds.preds[20]])
    fams = {k: cands[k] for k in ("gd", "ridge", "ols", "momentum")}
    got = families_reach(rows, fams, ys, metric, **spec.kw(metric))
    sign = 1.0 if metric == "error_cosine" else -1.0
    for key, fam in fams.items():
        for r, row in enumerate(rows):
            singles = torch.tensor([sign * _metric_np(metric, row, c, ys) for c in fam.preds.preds],
                                   dtype=torch.float64)
            best = int(torch.argmax(singles))
            mixes = [sign * _metric_np(metric, row, (1 - w) * fam.preds.preds[best]
                                       + w * fam.preds.preds[k], ys)
                     for k in fam.neighbors(best) for w in MIX_WEIGHTS]
            assert sign * got[key][r] == pytest.approx(max([float(singles.max()), *mixes]),
                                                       abs=1e-12)
    # the families' tables computed already (the benchmark's refined families) are used
    tables = {k: sign * similarity(rows, fam.of(metric), ys, metric, n_boot=2, check=False,
                                   labels=False, **spec.kw(metric)).values
              for k, fam in fams.items()}
    assert families_reach(rows, fams, ys, metric, tables, **spec.kw(metric)) == got
    tables["ols"] = tables["ols"] + 0.5  # one column, no mixes: its reach is its table's
    moved = families_reach(rows, fams, ys, metric, tables, **spec.kw(metric))
    assert [sign * v for v in moved["ols"]] == pytest.approx([sign * v + 0.5 for v in got["ols"]])
    exact = 1.0 if metric == "error_cosine" else 0.0  # row 0: GD's step 3 and its neighbour
    assert got["gd"][0] == pytest.approx(exact, abs=1e-12)
    single = max(sign * _metric_np(metric, rows[0], c, ys) for c in gd.preds.preds)
    assert sign * exact - single > 1e-7


def test_separable_needs_more_than_the_rules_precision():
    """A truth its family reaches better than every rival by less than PRECISION is not separable."""
    from iclprobe.alignment.views.answer_rule import PRECISION
    from iclprobe.constructions.scoring import Reach

    reach = Reach({"gd": [0.5 * PRECISION, 2 * PRECISION, 2 * PRECISION], "ols": [1.0] * 3},
                  [1e-9, 1e-9, 3 * PRECISION])
    assert [reach.separable(i) for i in range(3)] == [False, True, False]


def _cell_counts(said, truth, gaps, width=1e-14):
    from iclprobe.constructions.scoring import Reach, answer_counts

    reach = {m: Reach({k: [g] for k, g in gaps.items()}, [width])
             for m in ("error_cosine", "spd")}
    return answer_counts([said], truth, reach)


@pytest.mark.parametrize(("said", "key"), [
    (_said(CANNOT_TELL, "cg", ["ols"]), "true"),
    (_said(CANNOT_TELL, "ols", ["cg"]), "true"),
    (_said(RUNS, "ols"), "true"),
    (_said(RUNS, "cg"), "true"),
    (_said(CANNOT_TELL, "cg", ["ols", "newton"]), "cannot tell"),  # Newton has not converged
    (_said(RUNS, "newton"), "false"),
    (_said(NONE, "cg"), "none"),
])
def test_a_converged_iterate_is_any_converged_learners(said, key):
    """A CG oracle past d steps: its iterate is OLS's (gap 0), Newton's family reaches it only
    to 2e-3 (the held-out slice's CG cells). "cannot tell" among the learners that have all
    converged is right, and the layer is separable: Newton and heavy ball can be told from
    them."""
    counts = _cell_counts(said, "cg", {"ols": 0.0, "newton": 2e-3, "momentum": 4e-3})
    assert counts[key] == 1 and sum(counts[k] for k in ("true", "false", "cannot tell",
                                                         "none")) == 1
    assert counts["separable"] == 1 and counts["true_separable"] == (key == "true")


def test_convergence_widens_neither_an_unconverged_truth_nor_a_layer_nothing_tells_apart():
    from iclprobe.alignment.views.answer_rule import PRECISION

    # every candidate converged with the truth: right, but nothing to tell apart
    alike = _cell_counts(_said(CANNOT_TELL, "cg", ["ols", "newton"]), "cg",
                         {"ols": 0.0, "newton": 0.5 * PRECISION})
    assert (alike["true"], alike["separable"]) == (1, 0)
    # GD short of OLS by more than its interval, heavy ball imitating it: not converged, so
    # "cannot tell" stays "cannot tell", and the layer is not separable
    near = _cell_counts(_said(CANNOT_TELL, "gd", ["momentum"]), "gd",
                        {"ols": 1e-9, "momentum": 0.0, "newton": 1e-3})
    assert (near["cannot tell"], near["separable"]) == (1, 0)
    # OLS within the interval under one metric only: not converged, so neither right nor
    # separable (spd holds CG and OLS equal, so no answer could name CG either)
    from iclprobe.constructions.scoring import Reach, answer_counts, separable_at
    reach = {"error_cosine": Reach({"ols": [0.0], "newton": [1e-3]}, [1e-14]),
             "spd": Reach({"ols": [1e-9], "newton": [1e-3]}, [1e-14])}
    mixed = answer_counts([_said(CANNOT_TELL, "cg", ["ols"])], "cg", reach)
    assert (mixed["cannot tell"], mixed["separable"]) == (1, 0)
    # a candidate alike to the converged iterate by one metric and beyond it by another:
    # no answer is right ("cannot tell" without it is not what that metric allows, with it
    # is not among converged learners), so the layer is not separable
    torn = {"error_cosine": Reach({"ols": [0.0], "newton": [1e-3], "gd": [1e-2]}, [1e-14]),
            "spd": Reach({"ols": [0.0], "newton": [1e-6], "gd": [1e-2]}, [1e-14])}
    assert not separable_at(torn, 0)
    torn["spd"].gaps["newton"] = [2e-3]
    assert separable_at(torn, 0)
    assert not separable_at({"error_cosine": Reach({}, [1e-14])}, 0)  # no rival: nothing told
    # no truth: "cannot tell" is counted as such, never as named right
    assert answer_counts([_said(CANNOT_TELL, "cg", ["ols"])], None, {})["cannot tell"] == 1


@pytest.mark.parametrize(("metric", "gain", "mixed"), [
    ("error_cosine", 3e-6, False), ("error_cosine", 1e-3, True), ("weight_cosine", 3e-6, True)])
def test_a_mix_is_a_better_fit_only_beyond_the_rules_precision(metric, gain, mixed):
    """The mix test's floor is the rule's `PRECISION` on predictions: a rival that moves X's
    match a little toward a layer off X's grid (a gain of a few 1e-6) does not make the layer
    "between" X and it; a layer between the two (a gain of 1e-3) is. On induced weights, which
    can only object, any gain past round-off does. The layer is built on the mix of X's and
    Y's columns at w = 0.35, so that mix reaches it exactly and the gain is ``gain``."""
    from iclprobe.alignment.measuring.candidates import Candidate
    from iclprobe.alignment.metrics import error_cosine, weight_cosine
    from iclprobe.alignment.views.continua import PRECISION, WEIGHT_MIX_FLOOR, mixes

    assert WEIGHT_MIX_FLOOR < 3e-6 < PRECISION < 1e-3
    on_w = metric == "weight_cosine"
    batch, _, spec = _setup()
    ys = batch.ys.double()
    it = algorithms.iterates("gd", batch.xs.double(), ys, steps=[3], lr="max", weights=on_w)
    base = it.weights[0] if on_w else it.preds[0]
    away = torch.randn(base.shape, generator=torch.Generator().manual_seed(5), dtype=base.dtype)

    def shortfall(delta):
        layer = base + 0.35 * delta * away
        return 1.0 - float(weight_cosine(layer, base, 1, 9) if on_w else
                           error_cosine(layer, base, ys, 1, 9))

    delta = (gain / (shortfall(1e-3) / 1e-6)) ** 0.5  # the shortfall is quadratic in δ
    assert shortfall(delta) == pytest.approx(gain, rel=0.05)

    def one(key, col):
        cols = algorithms.Iterates(torch.zeros(1, dtype=torch.long),
                                   col[None, ..., 0] if on_w else col[None],
                                   col[None] if on_w else None, {}, key)
        return Candidate(key, key, cols, cols if on_w else None, ["step 0"], [0], False)

    cands = {"x": one("x", base), "y": one("y", base + delta * away)}
    layers = (base + 0.35 * delta * away)[None]
    tables = candidate_tables(cands, layers if not on_w else layers[..., 0],
                              layers if on_w else None, ys, [metric], spec)[metric]
    _, _, _, said = mixes("x", 0, evidence(tables), cands, metric, ys, spec, layers)
    assert said["y"] is mixed


@pytest.mark.parametrize(("slack", "kind"), [(0.0, RUNS), (1.2e-4, CANNOT_TELL)])
def test_through_probes_the_closeness_test_leaves_the_corrections_slack_unsettled(slack, kind):
    # The held-out slice's GD oracle at 1.5/λmax, layer 2, read by probes fitted on 1024
    # more sequences (its numbers, the roles turned around: heavy ball led there): the
    # corrected similarity went past a perfect match and led the truth's family by 8e-5,
    # while the truth's own column imitates the leader's match to 2e-5. The correction is
    # uncertain by its slack (√(2/p) of it, 1.2e-4 there); a layer the correction could
    # carry that far is not closer to the match than the rival's imitation.
    assert _decided(1.00026, 8e-5, 0.99996, 1.7e-5, slack).kind == kind
