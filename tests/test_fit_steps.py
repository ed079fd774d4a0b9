"""Step sizes fitted along each family's continuum (`Family.continuum`, `measuring.fit_steps`)."""

import math

import pytest
import torch

from iclprobe import algorithms, tasks
from iclprobe.algorithms.families import Family, FamilyContext
from iclprobe.alignment import AlignConfig, align, align_layers
from iclprobe.alignment.measuring import fit_steps, refine
from iclprobe.alignment.measuring.candidates import family_iterates
from iclprobe.constructions.oracle import oracle
from iclprobe.errors import InputError, InputTypeError

CONTINUA = ["gd", "pgd", "newton", "momentum", "ridge", "online_gd"]


def _batch(cov="ill-conditioned", sequences=32, n_dims=3, n_points=9, kappa=100.0, seed=0):
    task = tasks.RegressionTask(n_dims=n_dims, n_points=n_points, cov=cov,
                                condition_number=kappa)
    return task.sample(sequences, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def _ctx(batch):
    stats = algorithms.prefix_stats(batch.xs, batch.ys)
    return FamilyContext(stats, batch.cov, (1, batch.xs.shape[1] - 1))


def _same(a, b):
    """Two variants (label, hyperparameters) equal, tensors element for element."""
    assert a[0] == b[0] and a[1].keys() == b[1].keys()
    for k, v in a[1].items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, b[1][k]), k
        else:
            assert v == b[1][k], k


@pytest.mark.parametrize("key", CONTINUA)
def test_the_continuum_holds_the_grid_and_interpolates_the_step_size_between(key):
    ctx = _ctx(_batch())
    family = algorithms.learner_info(key).fitted_family
    grid = family.grid(ctx)
    points = family.continuum.points(ctx)
    assert len(points) == len(grid)
    for rank, (variant, _) in enumerate(grid):
        _same(family.variant_at(ctx, rank), variant)  # a whole rank: the grid's own
        _same(family.continuum.at(ctx, *points[rank]), variant)  # its point, rebuilt
    # between two variants of one continuum, every hyperparameter that differs is at the
    # geometric interpolation of theirs: each is proportional to the multiplier
    inside = [r for r in range(len(points) - 1) if points[r][0] == points[r + 1][0]]
    assert inside
    for rank in inside[:: max(len(inside) // 4, 1)]:
        f = 0.3
        (_, a), (_, b) = grid[rank][0], grid[rank + 1][0]
        _, got = family.variant_at(ctx, rank + f)
        varying = [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor)
                                        else a[k] == b[k])]
        assert varying, (key, rank)
        for k in varying:
            x, y = torch.as_tensor(a[k], dtype=torch.float64), torch.as_tensor(b[k],
                                                                               dtype=torch.float64)
            want = torch.where(x > 0, x ** (1 - f) * y ** f, x)
            torch.testing.assert_close(torch.as_tensor(got[k], dtype=torch.float64), want,
                                       rtol=1e-12, atol=0)


def test_ranks_outside_one_continuum_are_refused_naming_the_rank():
    ctx = _ctx(_batch())
    gd = algorithms.learner_info("gd").fitted_family
    names = [name for name, _ in gd.continuum.points(ctx)]
    edge = next(r for r in range(len(names) - 1) if names[r] != names[r + 1])
    with pytest.raises(InputError, match=rf"rank {edge + 0.5} lies between two continua"):
        gd.variant_at(ctx, edge + 0.5)
    for rank in (-0.5, len(names) - 0.5, len(names)):
        with pytest.raises(InputError, match=rf"rank {rank} is not a variant of this family"):
            gd.variant_at(ctx, rank)
    with pytest.raises(InputTypeError, match=r"Family.continuum must be a families.Continuum "
                                             r"or None, got \(1, 2\)"):
        Family(lambda ctx: [("", {})], None, continuum=(1, 2))
    cg = algorithms.learner_info("cg").fitted_family  # a family without a continuum
    with pytest.raises(InputError, match="not a variant of this family.*integers"):
        cg.variant_at(ctx, 0.5)
    # each continuum's span of ranks: GD's rule, fixed step and summed loss, in turn
    assert gd.span(ctx, 0) == (0, edge) and gd.span(ctx, edge + 1)[0] == edge + 1
    assert cg.span(ctx, 0) == (0, 0)


def test_a_fitted_variant_runs_as_the_learner_at_that_step_size():
    # an independent run of GD at the interpolated multiplier, column for column
    batch = _batch()
    ctx = _ctx(batch)
    gd = algorithms.learner_info("gd").fitted_family
    rank, f = 3, 0.37
    (_, m0), (_, m1) = gd.continuum.points(ctx)[rank:rank + 2]
    it, columns, _ = family_iterates("gd", batch, ctx.stats, ctx.window, 4, False,
                                     fine={rank + f: (2, 5)}, grid=False)
    m = m0 ** (1 - f) * m1 ** f
    want = algorithms.gd(batch.xs, batch.ys, steps=(2, 5), lr="max", lr_scale=m,
                         normalize=True)
    torch.testing.assert_close(it.preds, want.preds, rtol=1e-12, atol=1e-12)
    assert it.hyper["variant_rank"] == [rank + f] * 2
    assert columns == [f"{m:.3g}/λmax, step 2", f"{m:.3g}/λmax, step 5"]


def test_the_parabolas_vertex():
    def f(x):
        return 1.0 - 2.0 * (x - 0.3) ** 2

    x, top = fit_steps._vertex(-1.0, f(-1.0), 0.0, f(0.0), 1.0, f(1.0))
    assert x == pytest.approx(0.3, abs=1e-12) and top == pytest.approx(f(0.3), abs=1e-12)
    x, top = fit_steps._vertex(0.5, f(0.5), 0.7, f(0.7), 1.0, f(1.0))  # all on one side
    assert x == pytest.approx(0.3, abs=1e-12) and top == pytest.approx(f(0.3), abs=1e-12)
    assert fit_steps._vertex(0.0, 0.0, 1.0, 1.0, 2.0, 3.0) is None  # convex: no maximum
    assert fit_steps._vertex(0.0, 0.0, 1.0, 1.0, 2.0, 1.0) is not None
    assert fit_steps._vertex(0.0, -math.inf, 1.0, 1.0, 2.0, 0.0) is None  # diverged


def _run_search(f, low, high, start):
    search = fit_steps._Search(0, low, high, {start: f(start)})
    while (x := search.ask()) is not None:
        search.told(x, f(x))
    return search


def test_a_search_answers_as_a_fresh_one_with_its_points_would():
    """`ask` is kept between `told`s (it is asked twice a round): after each point it is
    what a search holding the same points from the start would ask."""
    def f(x):
        return -(x - 0.37) ** 2

    search = fit_steps._Search(0, -1.0, 1.0, {0.0: f(0.0)})
    while (x := search.ask()) is not None:
        assert search.ask() == x
        fresh = fit_steps._Search(0, -1.0, 1.0, dict(search.values))
        fresh.evals = search.evals
        assert fresh.ask() == x
        search.told(x, f(x))
    assert search.best[0] == pytest.approx(0.37, abs=1e-3)


@pytest.mark.parametrize("peak", [0.3, -0.71, 0.999])
def test_the_search_finds_a_smooth_peak_to_the_rules_resolution(peak):
    def f(x):  # not a parabola: a cosine-like peak with a skew
        return math.cos(1.3 * (x - peak)) + 0.05 * (x - peak) ** 3

    search = _run_search(f, -1.0, 1.0, 0.0)
    rank, value = search.best
    assert f(peak) - value < 1e-6  # the answer's rule reads similarities to 1e-5
    assert search.evals <= fit_steps.MAX_EVALS + 2  # the two ends, then at most MAX_EVALS


def test_the_search_stops_at_an_end_when_the_peak_lies_beyond():
    search = _run_search(lambda x: -abs(x - 5.0), 0.0, 2.0, 1.0)
    assert search.best[0] == 2.0 and search.evals <= fit_steps.MAX_EVALS + 2


def test_a_search_is_bracketed_by_the_ranks_the_family_holds_at_its_step():
    """From a coarse grid column (no fine neighbours run at its step) the search spans the
    coarse neighbours, two ranks away; with a fine neighbour held, that one. (Heavy ball's
    grid is 2× apart in step size: its step 2 at 1.5/λ_max, which GD's step 2 at 1.2/λ_max
    is up to a scale, lies beyond the fine rank next to its grid's 1/λ_max, and a search
    between that rank's neighbours never reached it: GD was named through probes.)"""
    ctx = _ctx(_batch())
    key = "gd"
    family = algorithms.learner_info(key).fitted_family
    first, last = family.span(ctx, 4)
    places = {key: [(4.0, 3), (2.0, 3), (6.0, 3), (5.0, 2)]}  # rank 5 held at step 2 only
    scored = {key: torch.tensor([[0.9, 0.5, 0.6, 0.1]])}
    search = fit_steps._searches(places, scored, ctx)[(key, 0, 3)]
    assert (search.low, search.high) == (max(2.0, first), min(6.0, last))
    places[key].append((5.0, 3))
    scored[key] = torch.tensor([[0.9, 0.5, 0.6, 0.1, 0.7]])
    search = fit_steps._searches(places, scored, ctx)[(key, 0, 3)]
    assert (search.low, search.high) == (max(2.0, first), min(5.0, last))


def _said_of_gd_at_one_and_a_half(monkeypatch=None, **kw):
    """GD at 1.5/λ_max(S_t/t) on κ 1000 data (between GD's step sizes 1.41 and 1.68)."""
    if monkeypatch is not None:  # the fit switched off
        monkeypatch.setattr(fit_steps, "fitted", lambda *args, **kwargs: {})
    batch = _batch(n_dims=5, n_points=13, sequences=64, kappa=1000.0)
    it = algorithms.gd(batch.xs, batch.ys, steps=range(1, 7), lr="max", lr_scale=1.5,
                       normalize=True)
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    cfg = AlignConfig(n_boot=20, separation=False, metrics=("error_cosine",),
                      algorithms=("gd", "newton", "momentum", "ridge"))
    answer = align_layers(layers, batch, cfg, positions="last", **kw).answer
    assert answer is not None
    return answer


def test_a_step_size_between_the_fine_grids_is_fitted_and_named():
    answer = _said_of_gd_at_one_and_a_half()
    said = answer.layers[1:]
    assert [a.learner for a in said] == ["gd"] * 6 and {a.kind for a in said} == {"runs"}
    for step, a in enumerate(said[:5], start=1):  # near convergence the step trades off
        assert a.column == f"1.5/λmax, step {step}", a.column
    assert any(rank != int(rank) for rank, _ in answer.places["gd"][1:])


def test_without_the_fit_the_same_layers_are_not_all_named(monkeypatch):
    # the test above can fail: with the fine step sizes alone (1.41, 1.68) Newton and
    # heavy ball imitate these layers as well as GD's columns do
    said = _said_of_gd_at_one_and_a_half(monkeypatch).layers[1:]
    assert sum(a.kind == "runs" and a.learner == "gd" for a in said) <= 3, \
        [a.text for a in said]
    assert not any(a.kind == "runs" and a.learner != "gd" for a in said)


def test_through_probes_no_step_size_is_fitted():
    answer = _said_of_gd_at_one_and_a_half(probe_t_min=1)
    assert not answer.fine
    assert all(rank == int(rank) for places in answer.places.values() for rank, _ in places)



def test_a_noise_corrected_family_is_fitted_on_its_tables_scale():
    """Through probes fitted to held columns the tables are corrected for the probes' noise
    (a cosine divided by the layer's ceiling), but the searches evaluated their columns raw:
    against the corrected grid, 1 − ceiling apart, no fit beat a match, and no match was
    fitted (a review found every search of gpt-softmax ending empty). Given the same
    correction, the searches find what they find on the raw scale."""
    from iclprobe.alignment.measuring.candidates import build_candidates
    from iclprobe.alignment.measuring.similarities import similarity_values

    batch = _batch(n_dims=5, n_points=13, sequences=32, kappa=1000.0)
    stats, window = algorithms.prefix_stats(batch.xs, batch.ys), (1, 12)
    it = algorithms.gd(batch.xs, batch.ys, steps=range(1, 7), lr="max", lr_scale=1.5,
                       normalize=True)  # between GD's grid step sizes
    kw = {"t_min": 1, "t_max": 12, "over": "positions"}
    gd = build_candidates(["gd"], batch, stats, window, 6, None, {}, None)[0]["gd"]
    raw = similarity_values(it.preds, gd.preds, batch.ys, "error_cosine", **kw)
    ceiling = torch.linspace(0.95, 0.99, 6, dtype=torch.float64)[:, None]  # per layer

    def fits(scored, correct=None):
        return fit_steps.fitted({"gd": gd.places}, "error_cosine", {"gd": scored}, it.preds,
                                batch.ys, kw, batch, stats, window,
                                lambda asks: build_candidates(list(asks), batch, stats, window,
                                                              6, None, {}, None, asks)[0],
                                correct=correct)

    plain = fits(raw)
    assert plain and any(rank != int(rank) for rank in plain["gd"])  # fitted between
    assert fits(raw / ceiling) == {}  # the old comparison: raw against corrected
    same = fits(raw / ceiling, lambda table: table / ceiling)["gd"]  # up to the vertices'
    assert [(round(r, 9), s) for r, s in same.items()] == \
        [(round(r, 9), s) for r, s in plain["gd"].items()]  # rounding on another scale

def _search(step, value):
    return fit_steps._Search(step, 0.0, 2.0, {1.0: value})


def test_the_climb_goes_on_past_the_best_step_count_until_it_is_inside():
    """A lone match is searched on both sides; then beside the best where unsearched (the
    step counts within `PROBE_WITHIN` of a match need not be adjacent); a best with both
    neighbours searched, or `MAX_CLIMB` step counts, ends it."""
    ctx = _ctx(_batch())
    key = "gd"
    steps = algorithms.learner_info(key).fitted_family.steps
    places = {key: [(r, s) for s in range(1, 12) for r in (4.0, 5.0, 6.0)]}
    scored = {key: torch.linspace(0.0, 0.9, len(places[key]))[None]}
    lead = fit_steps._leads(scored)
    got = fit_steps._climbs({(key, 0, 5): _search(5, 0.9)}, places, scored, ctx, lead)
    assert sorted(s for _, _, s in got) == [4, 6]
    rival = {**scored, "newton": torch.tensor([[0.9 + 2 * fit_steps.CLIMB_WITHIN]])}
    assert fit_steps._climbs({(key, 0, 5): _search(5, 0.9)}, places, rival, ctx,
                             fit_steps._leads(rival)) == {}
    # each from its step's best grid column (rank 6: the table rises with the column)
    assert all(search.step == s and search.best[0] == 6.0 and search.low < 6.0 < search.high
               for (_, _, s), search in got.items())
    searched = {(key, 0, s): _search(s, v) for s, v in ((4, 0.95), (5, 0.9), (6, 0.8))}
    assert list(fit_steps._climbs(searched, places, scored, ctx, lead)) == [(key, 0, 3)]
    searched[(key, 0, 4)] = _search(4, 0.85)  # best inside: done
    assert fit_steps._climbs(searched, places, scored, ctx, lead) == {}
    gaps = {(key, 0, s): _search(s, v) for s, v in ((3, 0.89), (6, 0.9), (7, 0.8), (8, 0.85))}
    assert list(fit_steps._climbs(gaps, places, scored, ctx, lead)) == [(key, 0, 5)]
    many = {(key, 0, s): _search(s, 0.89 + 0.001 * s) for s in steps[2:fit_steps.MAX_CLIMB + 2]}
    assert fit_steps._climbs(many, places, scored, ctx, lead) == {}  # the best at an edge, capped
    fewer = dict(list(many.items())[1:])
    assert list(fit_steps._climbs(fewer, places, scored, ctx, lead)) == [
        (key, 0, steps[fit_steps.MAX_CLIMB + 2])]


def _said_of_heavy_ball(monkeypatch=None):
    """Heavy ball (β 1/2) at 0.6/λ_max(S_t/t), steps 2, 4, …, 12: between its grid's step
    sizes 1/2 and 0.71, where a step count makes up for a step size (step 5 at 0.47 comes
    within 3·10⁻³ of step 4 at 0.6 by the squared difference)."""
    if monkeypatch is not None:  # the climb switched off: the matched step count alone
        monkeypatch.setattr(fit_steps, "_climbs", lambda *args, **kwargs: {})
    batch = _batch(cov="isotropic", n_dims=6, n_points=19, sequences=64)
    it = algorithms.iterates("momentum", batch.xs, batch.ys, steps=range(2, 13, 2), lr="max",
                             lr_scale=0.6, beta=0.5)
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    cfg = AlignConfig(n_boot=20, separation=False, metrics=("error_cosine",),
                      algorithms=("gd", "newton", "momentum"))
    answer = align_layers(layers, batch, cfg, positions="all")
    assert answer.answer is not None
    return answer.answer.layers[1:]


def test_the_climb_finds_the_step_count_and_step_size_a_layer_runs():
    said = _said_of_heavy_ball()
    assert [a.text for a in said[1:]] == \
        [f"momentum (β 0.5, 0.6/λmax, step {2 * k})" for k in range(2, 7)]


def test_without_the_climb_other_step_counts_are_named(monkeypatch):
    # the test above can fail: from the matched step count alone the step size is fitted
    # there, and the grid's nearest step count is not the layer's
    said = _said_of_heavy_ball(monkeypatch)
    assert sum(a.text.endswith(f"step {2 * k})") and "0.6/λmax" in a.text
               for k, a in enumerate(said, start=1)) < len(said) - 1, [a.text for a in said]


def _said_through_probes_of_heavy_ball(monkeypatch=None):
    """A heavy-ball oracle (β ½, 0.6/λ_max, steps 2, 4, 6) read by probes fitted to the
    column each layer holds: its step-4 layer's nearest grid columns sit at steps 3 and 6–8
    (within 10⁻³ through probes, `PROBE_WITHIN`), not at 4 or 5."""
    if monkeypatch is not None:
        monkeypatch.setattr(fit_steps, "_climbs", lambda *args, **kwargs: {})
    task = tasks.RegressionTask(n_dims=6, n_points=19)
    model = oracle("momentum", 6, 3, lambda layer: 2 * layer, exact_readout=False, task=task,
                   lr="max", lr_scale=0.6, beta=0.5)
    cfg = AlignConfig(n_sequences=128, n_boot=20, separation=False, metrics=("error_cosine",),
                      algorithms=("gd", "newton", "momentum"), positions="all")
    return [a.text for a in align(model, cfg).answer.layers]


@pytest.mark.slow
def test_through_probes_the_climb_fills_the_step_counts_between():
    said = _said_through_probes_of_heavy_ball()
    # step 2 is GD's up to a scale, which a probe cannot see: "cannot tell" by right (with
    # the fits through probes on the tables' scale, the truth's own family leads)
    assert said[1] == "cannot tell momentum from gd", said
    assert said[2].startswith("momentum (") and said[2].endswith("step 4)"), said
    assert said[3] == "momentum (β 0.5, 0.6/λmax, step 6)", said


@pytest.mark.slow
def test_through_probes_without_the_climb_the_step_4_layer_fits_none(monkeypatch):
    # the test above can fail: searched at the step counts within 1e-3 alone (3, 6, 7, 8),
    # heavy ball's nearest column is 3e-4 from the layer, farther than GD's from it
    said = _said_through_probes_of_heavy_ball(monkeypatch)
    assert said[2] == "none of them (nearest momentum)", said


def _said_of_heavy_ball_between_octaves(cov, monkeypatch=None):
    """Heavy ball at β ½ and 1.5/λ_max, steps 2, 4, 6, 8: between its grid's step sizes 1
    and 2 (an octave apart), where β ¾'s grid comes nearer its early steps than β ½'s."""
    if monkeypatch is not None:  # each family matched on its best continuum alone
        for module in (refine, fit_steps):
            monkeypatch.setattr(module, "continuum_groups", lambda *args, **kwargs: None)
    batch = _batch(cov=cov, n_dims=4, n_points=17, sequences=64, kappa=50.0, seed=7)
    it = algorithms.iterates("momentum", batch.xs, batch.ys, steps=range(2, 9, 2), lr="max",
                             lr_scale=1.5, beta=0.5)
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    cfg = AlignConfig(n_boot=20, separation=False, metrics=("error_cosine",),
                      algorithms=("gd", "newton", "momentum"))
    answer = align_layers(layers, batch, cfg, positions="all").answer
    assert answer is not None
    return [a.text for a in answer.layers[1:]]


@pytest.mark.parametrize("cov", ["isotropic", "ill-conditioned"])
def test_every_continuum_of_a_family_is_refined_and_fitted(cov):
    said = _said_of_heavy_ball_between_octaves(cov)
    assert said[:3] == [f"momentum (β 0.5, 1.5/λmax, step {2 * k})" for k in (1, 2, 3)], said
    # at step 8, near convergence, another β's later step imitates it: heavy ball still
    assert said[3].startswith("momentum ("), said


def test_from_the_best_continuum_alone_the_first_step_is_matched_at_another_beta(monkeypatch):
    # the test above can fail: refined and fitted on β ¾'s continuum alone (its grid's best
    # at step 2), the layer is matched at β ¾, 0.38/λ_max, step 5 (0.999 by the error cosine)
    said = _said_of_heavy_ball_between_octaves("isotropic", monkeypatch)
    assert said[0].startswith("momentum (β 0.75, "), said
