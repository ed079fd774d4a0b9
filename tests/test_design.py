"""The designed evaluation: data that tell the candidate learners apart (alignment.design)."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from helpers import designed_text

from iclprobe import algorithms, tasks
from iclprobe.alignment import AlignConfig, align
from iclprobe.alignment import design as D
from iclprobe.alignment.measuring.candidates import family_iterates
from iclprobe.cli import main
from iclprobe.constructions.oracle import oracle

CFG = AlignConfig(n_sequences=128, n_boot=50, separation=False)


def test_a_distributions_task_records_its_own_condition_number():
    # the rotated task's record said κ 100 (the field's default) for a κ 10 distribution
    task = D.Distribution(10.0, "geometric", 9, 0.5, "context", scale=1.3).task(4, 0)
    eig = task.to_dict()["eigenvalues"]
    assert task.to_dict()["condition_number"] == 10.0 == pytest.approx(max(eig) / min(eig))


def test_spectrum_has_its_condition_number_and_top():
    for shape in D.SHAPES:
        eig = D.spectrum(6, 100.0, shape, top=2.5)
        assert len(eig) == 6 and eig[0] == max(eig) == 2.5
        assert math.isclose(max(eig) / min(eig), 100.0, rel_tol=1e-12)
    lin = D.spectrum(4, 1000.0, "linear")
    steps = [a - b for a, b in zip(lin, lin[1:])]
    assert steps == pytest.approx([steps[0]] * 3, rel=1e-12)  # equal steps from 1 to 1/κ
    geo = D.spectrum(4, 1000.0, "geometric")
    assert [a / b for a, b in zip(geo, geo[1:])] == pytest.approx([10.0] * 3, rel=1e-12)
    with pytest.raises(ValueError, match="shape must be one of"):
        D.spectrum(4, 10.0, "split")


@pytest.mark.parametrize("cov", ["isotropic", "rotated", "ill-conditioned"])
def test_low_variance_queries_move_only_the_query(cov):
    # the context is the same draw as under "context"; the query is N(0, s Σ⁻¹), s = tr Σ / tr Σ⁻¹
    kw = dict(n_dims=3, n_points=5, cov=cov, condition_number=10.0, eigenvalues=None)
    if cov == "rotated":
        kw["eigenvalues"] = (4.0, 1.0, 0.25)
    low = tasks.RegressionTask(**kw, query="low-variance").sample(40000, generator=3,
                                                                   dtype=torch.float64)
    ctx = tasks.RegressionTask(**kw).sample(40000, generator=3, dtype=torch.float64)
    assert torch.equal(low.xs[:, :-1], ctx.xs[:, :-1]) and torch.equal(low.ws, ctx.ws)
    assert torch.allclose(low.ys, torch.einsum("bnd,bd->bn", low.xs, low.ws))
    if cov != "ill-conditioned":  # one Σ for the batch: its empirical covariance
        sigma = low.cov.double()
        inv = torch.linalg.inv(sigma)
        want = sigma.trace() / inv.trace() * inv
        x = low.xs[:, -1]
        assert torch.allclose(x.T @ x / len(x), want, atol=0.03 * float(want.abs().max()))
    energy = low.xs[:, -1].pow(2).sum(-1).mean() / ctx.xs[:, -1].pow(2).sum(-1).mean()
    assert abs(float(energy) - 1.0) < 0.05  # the same mean energy


def test_the_query_field_round_trips_and_is_checked():
    task = tasks.RegressionTask(n_dims=3, n_points=5, query="low-variance")
    assert tasks.RegressionTask.from_dict(task.to_dict()).query == "low-variance"
    assert "query" not in tasks.RegressionTask(n_dims=3, n_points=5).to_dict()
    with pytest.raises(ValueError, match="query"):
        tasks.RegressionTask(n_dims=3, n_points=5, query="far")


@pytest.fixture(scope="module")
def gd_oracle():
    model = oracle("gd", 4, 6, lambda layer: 2 * layer, lr="max", normalize=True,
                   task=tasks.RegressionTask(n_dims=4, n_points=9))
    return model, align(model, CFG, name="gd")


def _naive_gap(task, a, b, layer, places, n_layers, positions, seed):
    """The pair's separation by hand: every column's error cosine, in numpy."""
    batch = task.sample(64, generator=seed, dtype=torch.float64)
    stats = algorithms.prefix_stats(batch.xs, batch.ys)
    lo, hi = (task.n_points - 1,) * 2 if positions == "last" else (1, task.n_points - 1)
    # the grid, and the matched variants between its step sizes at their matched steps
    fine = {k: {r: tuple(sorted({s for r2, s in places[k] if r2 == r})) for r, _ in places[k]}
            for k in (a, b)}
    fams = {k: family_iterates(k, batch, stats, (lo, hi), n_layers, False, fine=fine[k])[0]
            for k in (a, b)}
    ys = batch.ys.numpy()[:, lo:hi + 1]

    def matched(x):
        col = list(zip(fams[x].hyper["variant_rank"], fams[x].steps.tolist())).index(
            tuple(places[x][layer]))
        return fams[x].preds[col].numpy()[:, lo:hi + 1]

    def best(values, y):  # the best error cosine of any column of y's family
        ex, out = values - ys, -np.inf
        for k in range(fams[y].preds.shape[0]):
            ey = fams[y].preds[k].numpy()[:, lo:hi + 1] - ys
            if positions == "last":  # one position: a cosine across the sequences
                den = np.linalg.norm(ex) * np.linalg.norm(ey)
                cos = float((ex * ey).sum() / den) if den > 0 else 0.0
            else:
                den = np.linalg.norm(ex, axis=1) * np.linalg.norm(ey, axis=1)
                cos = float(np.where(den > 0, (ex * ey).sum(1) / np.where(den > 0, den, 1),
                                     0).mean())
            out = max(out, cos)
        return out

    mix = (matched(a) + matched(b)) / 2
    gaps = [1 - best(matched(a), b), 1 - best(matched(b), a), 1 - best(mix, a),
            1 - best(mix, b)]
    return max(0.0, min(gaps))


@pytest.mark.parametrize("query", ["context", "low-variance"])
@pytest.mark.slow
def test_the_objective_is_the_learners_resemblance_by_hand(gd_oracle, query):
    model, res = gd_oracle
    pairs = {3: [("gd", "newton")], 5: [("gd", "newton"), ("gd", "cg")]}
    task = D.Distribution(100.0, "linear", 9, 0.0, query).task(4, 0)
    positions = "last" if query == "low-variance" else "all"
    got = D.separation(task, pairs, res.answer.places, 6, CFG, positions, 64, 0, model)
    by_hand = [min(_naive_gap(task, a, b, layer, res.answer.places, 6, positions, 0)
                   for a, b in ps) for layer, ps in pairs.items()]
    assert got == pytest.approx(sum(by_hand) / len(by_hand), rel=1e-9, abs=1e-12)
    same = D.separation(task, {3: [("gd", "gd")]}, res.answer.places, 6, CFG, positions, 64, 0)
    assert same == 0.0  # a learner imitates itself exactly


def test_a_variant_matched_on_the_own_task_that_is_none_here_is_not_separated(gd_oracle):
    """Ridge's grid reaches further on a spread spectrum: a λ matched there (rank 26 of a
    κ 1000 task's grid) is no variant on isotropic data (25 ranks), so the pair it is in
    is not separated there (0), and the other layers count as before; never an error."""
    from iclprobe.algorithms.families import FamilyContext

    model, res = gd_oracle
    task = D.Distribution(1.0, "linear", 9, 0.0, "context").task(4, 0)
    batch = task.sample(64, generator=0, dtype=torch.float64)
    stats = algorithms.prefix_stats(batch.xs, batch.ys)
    ctx = FamilyContext(stats, batch.cov, (1, 8))
    ridge = algorithms.learner_info("ridge").fitted_family
    top = len(ridge.grid(ctx)) - 1
    assert ridge.holds(ctx, top) and ridge.holds(ctx, top - 0.5)
    assert not ridge.holds(ctx, top + 1.2) and not ridge.holds(ctx, -0.5)
    with pytest.raises(ValueError, match="not a variant"):
        ridge.variant_at(ctx, top + 1.2)
    places = {**res.answer.places, "ridge": [(top + 1.2, 0)] * len(res.answer.places["gd"])}
    pairs = {3: [("gd", "ridge")], 5: [("gd", "newton")]}
    got = D.separation(task, pairs, places, 6, CFG, "all", 64, 0, model)
    alone = D.separation(task, {5: [("gd", "newton")]}, places, 6, CFG, "all", 64, 0, model)
    assert alone > 0 and got == pytest.approx(alone / 2, rel=1e-12)  # layer 3's pair: 0


@pytest.mark.parametrize("scale", [1.0, 1.3])  # an isotropic task; Σ = s·I after a rotation
def test_a_pair_with_a_learner_that_is_no_candidate_here_is_not_separated(gd_oracle, scale):
    """pgd matched on an anisotropic own task (a grid rank) is GD on isotropic data: its pair
    is not separated there (0), the other layers count as before; never an error (the
    family's grid raised NotACandidate while the matched variants were checked)."""
    model, res = gd_oracle
    task = D.Distribution(1.0, "geometric", 9, 0.0, "context", scale=scale).task(4, 0)
    places = {**res.answer.places, "pgd": [(3.0, k) for k in range(7)]}
    pairs = {3: [("gd", "pgd")], 5: [("gd", "newton")]}
    got = D.separation(task, pairs, places, 6, CFG, "all", 64, 0, model)
    alone = D.separation(task, {5: [("gd", "newton")]}, places, 6, CFG, "all", 64, 0, model)
    assert alone > 0 and got == pytest.approx(alone / 2, rel=1e-12)


def test_data_where_the_deepest_matched_learner_does_no_regression_separate_nothing(gd_oracle):
    """The oracle's last layer runs GD at 1/λ_max for 12 steps. On κ 1000 data with queries
    along the low-variance directions GD has barely moved there: its normalized error (by
    hand, from `algorithms.gd` on the same sample) is not below `OOD_ERROR`, where
    `align_designed` would find the model out of distribution, so the objective is 0 there;
    on the same spectrum with queries drawn as the context it regresses, and the objective
    is the pairs' separation by hand."""
    model, res = gd_oracle
    pairs = {3: [("gd", "newton")], 6: [("gd", "newton")]}
    errors = {}
    for query in ("low-variance", "context"):
        task = D.Distribution(1000.0, "geometric", 9, 0.0, query).task(4, 0)
        positions = "last" if query == "low-variance" else "all"
        batch = task.sample(64, generator=0, dtype=torch.float64)
        lo = 8 if positions == "last" else 1
        pred = algorithms.gd(batch.xs, batch.ys, steps=[12], lr="max", normalize=True,
                             weights=False).preds[0]
        y = batch.ys[:, lo:]
        errors[query] = float((pred[:, lo:] - y).pow(2).mean() / y.pow(2).mean())
        got = D.separation(task, pairs, res.answer.places, 6, CFG, positions, 64, 0, model)
        if errors[query] >= D.OOD_ERROR:
            assert got == 0.0
        else:
            by_hand = [_naive_gap(task, a, b, layer, res.answer.places, 6, positions, 0)
                       for layer, ((a, b),) in pairs.items()]
            assert got == pytest.approx(sum(by_hand) / 2, rel=1e-9, abs=1e-12) and got > 0
    assert errors["low-variance"] >= D.OOD_ERROR > errors["context"]


@pytest.mark.slow
def test_a_gate_whose_learner_fails_on_the_own_task_is_not_applied(gd_oracle, monkeypatch):
    """The gate's learner stands in for the model's output: where it does no regression on
    the model's own task (where the model does), it stands for nothing, and the search runs
    as without the gate (not every objective 0, the nearest distribution chosen)."""
    from iclprobe.alignment.design import search

    model, res = gd_oracle
    family = D.DesignFamily(condition_numbers=(1.0, 100.0), noise=(0.0, 0.5), n_sequences=32)
    monkeypatch.setattr(search, "regresses", lambda *a: True)
    open_ = D.design_evaluation(model, res, CFG, family)
    monkeypatch.setattr(search, "regresses", lambda *a: False)
    failing = D.design_evaluation(model, res, CFG, family)
    assert open_.objective > 0
    assert (failing.chosen, failing.objective, failing.own) == \
        (open_.chosen, open_.objective, open_.own)


def test_isotropic_data_offer_no_low_variance_queries():
    # on Σ ∝ I every direction is a low-variance one: the query would be drawn as the context
    family = D.DesignFamily()
    iso = D.Distribution(1.0, "geometric", 9, 0.0, "context")
    assert [o.query for o in family.options("query", iso, 4, 9, False)] == ["context"]
    ill = dataclasses.replace(iso, condition_number=100.0)
    assert [o.query for o in family.options("query", ill, 4, 9, False)] == \
        ["context", "low-variance"]
    # nor from the other factors: the spectrum tried from a low-variance current, and the
    # start from an own task whose queries are low-variance on isotropic Σ
    low = dataclasses.replace(ill, query="low-variance")
    got = {o.condition_number: o.query for o in family.options("spectrum", low, 4, 9, False)}
    assert got[1.0] == "context" and got[100.0] == "low-variance"
    task = tasks.RegressionTask(n_dims=4, n_points=9, query="low-variance")
    assert D.nearest_distribution(task, family).query == "context"


@pytest.mark.slow
def test_the_search_is_coordinate_ascent_and_reproducible(gd_oracle):
    model, res = gd_oracle
    family = D.DesignFamily(condition_numbers=(1.0, 100.0), noise=(0.0, 0.5), n_sequences=32)
    design = D.design_evaluation(model, res, CFG, family)
    again = D.design_evaluation(model, res, CFG, family)
    assert design.to_dict() == again.to_dict()  # same seed: same numbers, same choice
    # each distribution tried at its own scale: looked up here by the other fields
    tried = {dataclasses.replace(d, scale=1.0): v for d, v in design.tried}
    chosen = dataclasses.replace(design.chosen, scale=1.0)
    # the last factor (the query) took its best value with the others held
    last = [v for d, v in tried.items() if d != chosen and
            (d.condition_number, d.shape, d.n_points, d.noise_std) ==
            (chosen.condition_number, chosen.shape, chosen.n_points, chosen.noise_std)]
    assert last and all(v <= design.objective for v in last)
    # each factor keeps the best so far: never below where the search started
    start = D.nearest_distribution(model.task, family)
    assert tried[start] <= design.objective == tried[chosen]
    assert json.loads(json.dumps(design.to_dict()))["chosen"] == design.chosen.to_dict()
    assert "designed evaluation:" in design.sentence()


def _curvature(task, window):
    """The largest λ_max(S_t/t) over the evaluation sequences and the window, in numpy."""
    batch = task.sample(CFG.n_sequences, generator=torch.Generator().manual_seed(CFG.seed))
    xs = batch.xs.double().numpy()
    outer = np.einsum("bti,btj->btij", xs, xs)
    prefix = np.cumsum(outer, axis=1) - outer  # S_t: the examples before position t
    lo, hi = window
    return max(float(np.linalg.eigvalsh(prefix[:, k]).max()) / k
               for k in range(max(lo, 1), hi + 1))


@pytest.mark.parametrize("query, window", [("context", (1, 8)), ("low-variance", (8, 8))])
def test_the_designed_data_have_the_own_tasks_curvature(gd_oracle, query, window):
    """A fixed step size is a multiple of 1/(the largest λ_max(S_t/t)) over the evaluation
    sequences and the window (its bound, the families' fixed step sizes): on the designed
    data it is the own task's, so a model's fixed step size keeps its multiple. Σ's top
    eigenvalue kept instead, κ 1000 data have far less (‖x‖² ≈ tr Σ ≈ 1.7 against 4)."""
    model, res = gd_oracle
    family = D.DesignFamily(condition_numbers=(1000.0,), examples=(), noise=(0.0,),
                            queries=(query,), n_sequences=32)
    design = D.design_evaluation(model, res, CFG, family)
    chosen = design.chosen
    assert chosen.query == query  # aligned at its last position alone where low-variance
    own = _curvature(model.task, (1, 8))  # the own task: every position t >= 1
    kept = _curvature(dataclasses.replace(chosen, scale=1.0).task(4, design.seed), window)
    assert kept < own / 1.5 and chosen.scale > 1.2
    assert _curvature(chosen.task(4, design.seed), window) == pytest.approx(own, rel=1e-5)
    assert design.objective == dict(design.tried)[chosen]  # judged at that scale
    assert f"x and y × {chosen.scale:.3g}" in chosen.text


def test_a_pq_models_design_is_judged_on_the_data_it_is_aligned_on():
    # its own learner (pgd_own: the model's fixed preconditioner) is not relative to the
    # data: the objective moves with the scale, so each option is judged at its own
    from iclprobe import models

    model = models.load("pq-isotropic-1layer")
    res = align(model, CFG, name="pq")
    family = D.DesignFamily(condition_numbers=(10.0,), shapes=("geometric",), examples=(),
                            noise=(0.0,), queries=("low-variance",), n_sequences=32)
    design = D.design_evaluation(model, res, CFG, family)
    chosen = design.chosen
    assert chosen.scale != pytest.approx(1.0, abs=0.05)
    d = model.task.n_dims
    at = [D.separation(dataclasses.replace(chosen, scale=s).task(d, design.seed),
                       design.pairs, res.answer.places, res.n_layers, CFG, "last", 32,
                       design.seed, model) for s in (chosen.scale, 1.0)]
    assert design.objective == pytest.approx(at[0], rel=1e-9)
    assert at[1] != pytest.approx(at[0], rel=1e-3)  # unscaled, another objective


@pytest.mark.parametrize("query", ["context", "low-variance"])
def test_the_objective_does_not_depend_on_the_data_scale(gd_oracle, query):
    # every candidate's rule is relative to the data, and the error cosine to their scale:
    # so the search need not know the scale it will choose
    model, res = gd_oracle
    pairs = {3: [("gd", "newton")], 5: [("gd", "newton"), ("gd", "cg")]}
    positions = "last" if query == "low-variance" else "all"
    values = [D.separation(D.Distribution(100.0, "linear", 9, 0.5, query, scale=s).task(4, 0),
                           pairs, res.answer.places, 6, CFG, positions, 64, 0, model)
              for s in (1.0, 2.5)]
    assert values[0] > 1e-4 and values[1] == pytest.approx(values[0], rel=1e-9), values
    with pytest.raises(ValueError, match="scale must be a number > 0, got 0"):
        D.Distribution(1.0, "linear", 9, 0.0, "context", scale=0)


@pytest.mark.slow
def test_a_model_that_does_no_regression_there_is_out_of_distribution():
    # GD at a vanishing fixed step: its error is the zero predictor's on any data
    model = oracle("gd", 4, 3, lambda layer: layer, lr=1e-9, normalize=True,
                   task=tasks.RegressionTask(n_dims=4, n_points=9))
    there = D.Design(D.Distribution(10.0, "geometric", 9, 0.0, "context"), 1.0, 0.0, [], {}, 0)
    done = D.align_designed(model, CFG, "still", design=there)
    assert done.out_of_distribution and done.designed is not None
    assert "out of the model's distribution" in designed_text(done)


def test_a_design_no_better_than_the_own_task_is_not_aligned(gd_oracle):
    model, res = gd_oracle
    same = D.Design(D.Distribution(10.0, "geometric", 9, 0.0, "context"), 0.01, 0.01, [], {}, 0)
    done = D.align_designed(model, CFG, "gd", own=res, design=same)
    assert done.designed is None and not done.out_of_distribution
    assert designed_text(done).endswith("its answer there stands")


def test_a_model_whose_outputs_blow_up_there_is_out_of_distribution():
    # GD at a fixed step stable on its isotropic data, past its bound where Σ's top is 2
    # (the family keeps the model's own top; a design given by hand need not)
    model = oracle("gd", 4, 3, [0, 5, 10, 20], lr=0.14, normalize=True,
                   task=tasks.RegressionTask(n_dims=4, n_points=9))
    there = D.Design(D.Distribution(1000.0, "linear", 9, 0.0, "context", top=2.0), 1.0, 0.0,
                     [], {}, 0)
    done = D.align_designed(model, CFG, "blows", design=there)
    assert done.own.answer is not None  # aligned on its own task
    assert done.out_of_distribution and done.designed is None and "not finite" in done.why
    assert done.to_dict()["designed"] is None
    assert "out of the model's distribution" in designed_text(done)


@pytest.mark.slow  # two design searches and alignments through the CLI
def test_align_design_through_the_cli(capsys, tmp_path):
    assert main(["align", "ka-gd-oracle", "--design", "--n-sequences", "128", "--n-boot", "50",
                 "--no-separation", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "designed evaluation:" in out and "designed data" in out
    report = (tmp_path / "r" / "report.md").read_text()
    assert "### ka-gd-oracle on designed data" in report and "designed evaluation:" in report
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    chosen = summary["designed"]["ka-gd-oracle"]["design"]["chosen"]
    record = json.loads((tmp_path / "r" / "ka-gd-oracle" / "result.json").read_text())
    assert record["designed"] == summary["designed"]["ka-gd-oracle"]  # beside its own result
    assert main(["align", "ka-gd-oracle", "--design", "--n-sequences", "128", "--n-boot", "50",
                 "--no-separation", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["ka-gd-oracle"]["designed"]
    assert set(data["design"]["chosen"]) == {"condition_number", "shape", "n_points",
                                             "noise_std", "query", "top", "scale",
                                             "w_prior", "w_seed"}
    assert data["designed"]["answer"] is not None
    assert data["design"]["chosen"] == chosen  # a rerun chooses the same distribution


def test_design_without_the_fitted_view_is_a_usage_error(capsys):
    assert main(["align", "ka-gd-oracle", "--design", "--no-fitted"]) == 2
    err = capsys.readouterr().err
    assert "--design needs the fitted view" in err and "Traceback" not in err


@pytest.mark.slow  # a benchmark cell: its alignment, the design search and the designed one
def test_a_newton_construction_is_named_newton_on_its_designed_data():
    """The construction runs a fixed α (0.3 of its bound on its isotropic data): on κ 1000
    data with Σ's largest eigenvalue kept, α fell below the Newton family's smallest step
    size and layers 2–7 matched no learner (5 of 11 live layers named); scaled to the own
    task's curvature, α is the same multiple of the bound there, and Newton is named."""
    from iclprobe.constructions import benchmark as B

    cell = next(c for c in B.grid(setting="main") if c.kind == "newton construction"
                and c.protocol == "iclprobe" and c.data == "isotropic"
                and c.readout == "exact" and c.multiplier == 0.3)
    done = B.run_cell(cell, B.bench_config(), design=True)
    assert done.hyper["design"]["condition_number"] == 1000 and done.hyper["design"]["scale"] > 1
    answers = done.verdicts["answer"]
    named = [a for a in answers if a not in ("computes nothing", "matches no learner")]
    assert all(a.startswith("newton (") for a in named), answers  # no other learner named
    assert len(named) >= 9, answers


@pytest.mark.slow
def test_a_t_max_of_the_own_task_does_not_bound_the_designed_data():
    # the designed data are aligned over every position (`align_designed` drops t_max), and
    # fewer examples than the own t_max allows were refused by the search: "t_max=11: need
    # t_max <= 4 for 5 points"
    model = oracle("gd", 4, 6, lambda layer: 2 * layer, lr="max", normalize=True,
                   task=tasks.RegressionTask(n_dims=4, n_points=13))
    cfg = dataclasses.replace(CFG, t_max=11)
    res = align(model, cfg, name="gd")
    family = D.DesignFamily(condition_numbers=(1.0, 100.0), noise=(0.0,), n_sequences=32)
    design = D.design_evaluation(model, res, cfg, family)
    assert {d.n_points for d, _ in design.tried} >= {5, 7, 9, 13}


@pytest.mark.parametrize("query", ["context", "low-variance"])
def test_the_layers_learners_are_judged_live_as_align_judges_the_oracles_layers(gd_oracle, query):
    """An oracle's layers are its learner's columns, so on any data the gate's verdict per
    layer (its learner's matched column on the sequences align reads, by the liveness rule)
    is align's own liveness of those layers there; on κ 1000 data with queries along the
    low-variance directions GD's early steps have barely moved (some layers die), with
    queries drawn as the context every layer lives."""
    from iclprobe.alignment.design.keeps import live_learners

    model, res = gd_oracle
    pairs = D.contending_pairs(res)
    task = D.Distribution(1000.0, "geometric", 9, 0.0, query).task(4, 0)
    positions = D.search.designed_positions(task, "all")
    cfg = dataclasses.replace(CFG, positions=positions, t_max=None,
                              t_min=None if positions == "last" else CFG.t_min)
    got = live_learners(task, pairs, res.answer.places, 6, cfg, positions, model)
    there = align(model, cfg, name="gd", eval_task=task)
    assert got == {layer: there.live[layer] for layer in pairs}
    if query == "context":
        assert all(got.values())
    else:
        assert not all(got.values())


def test_a_distribution_where_a_layers_learner_dies_is_not_chosen(gd_oracle, monkeypatch):
    """The gate is the search's: with every distribution but the own task's leaving a layer's
    learner dead, no distribution separates anything (the own answer stands), where the
    same search without it chooses one."""
    from iclprobe.alignment.design import search
    from iclprobe.alignment.evaluation import evaluation_task

    model, res = gd_oracle
    family = D.DesignFamily(condition_numbers=(1.0, 100.0), noise=(0.0,), n_sequences=32)
    own = evaluation_task(model, CFG)
    seen = []

    def dying(task, pairs, *args):
        seen.append(task == own)
        return {layer: task == own or layer != max(pairs) for layer in pairs}

    open_ = D.design_evaluation(model, res, CFG, family)
    monkeypatch.setattr(search, "live_learners", dying)
    gated = D.design_evaluation(model, res, CFG, family)
    assert open_.objective > open_.own and gated.objective == 0.0
    assert seen[0] and not any(seen[1:]) and len(seen) > 1
    assert all(value == 0.0 for _, value in gated.tried)


@pytest.mark.slow
def test_the_held_out_online_gd_oracle_keeps_every_layer_on_its_designed_data():
    """The known-answer benchmark's held-out online GD oracle at 1.2/‖x‖², ill-conditioned: a
    design with label noise 0.5 separated its pairs most on the 64 judging sequences, but on
    the 256 sequences align reads its first passes did no regression, and two layers
    computed nothing there; the gate keeps every layer (all 8 named right)."""
    from iclprobe.constructions import benchmark

    cell = benchmark.Cell("online_gd oracle", "iclprobe", "ill-conditioned", "exact", 1.2,
                          "held-out")
    result = benchmark.run_cell(cell, benchmark.bench_config(), design=True)
    assert result.counts["answer"]["true"] == 8 == result.counts["answer"]["separable"]
    assert not result.hyper["out_of_distribution"]
