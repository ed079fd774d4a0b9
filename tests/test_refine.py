"""Step sizes between the grid's, run next to the layers' matches (`measuring.refine`)."""

import pytest
import torch

from iclprobe import algorithms, tasks
from iclprobe.algorithms import families
from iclprobe.algorithms.families import Family, FamilyContext
from iclprobe.alignment import AlignConfig, align_layers
from iclprobe.alignment.measuring import fit_steps, refine
from iclprobe.alignment.measuring.candidates import (
    Candidate,
    TableSpec,
    build_candidates,
    candidate_tables,
    family_iterates,
)
from iclprobe.errors import InputError


def _batch(cov="ill-conditioned", sequences=32, seed=0, n_points=9):
    task = tasks.RegressionTask(n_dims=3, n_points=n_points, cov=cov, condition_number=100.0)
    return task.sample(sequences, generator=torch.Generator().manual_seed(seed))


def _stats(batch):
    return algorithms.prefix_stats(batch.xs.double(), batch.ys.double())


def _cand(places):
    it = algorithms.Iterates(torch.tensor([s for _, s in places]),
                             torch.zeros(len(places), 1, 1), None, {}, "x")
    ranks = sorted({r for r, _ in places})
    return Candidate("x", "X", it, None, [""] * len(places),
                     [ranks.index(r) for r, _ in places], False, list(places))


def test_fine_asks_are_the_fine_variants_beside_each_match_at_its_steps():
    on = [True, False, True, False, False, True]  # ranks 1, 3 and 4 are fine
    steps = (0, 1, 2, 4, 8)
    cand = _cand([(r, s) for r in (0, 2, 5) for s in steps])
    # column 8: rank 2, step 4 -> both sides' fine runs, at steps 2, 4 and 8
    assert refine.fine_asks(cand, on, steps, [8]) == {1: (2, 4, 8), 3: (2, 4, 8),
                                                      4: (2, 4, 8)}
    # rank 0, step 0 (the edge of both): rank 1 alone, at steps 0 and 1
    assert refine.fine_asks(cand, on, steps, [0]) == {1: (0, 1)}
    # two matches beside one fine variant: the union of their steps
    # (column 6: rank 2, step 1)
    assert refine.fine_asks(cand, on, steps, [0, 6]) == {1: (0, 1, 2), 3: (0, 1, 2),
                                                         4: (0, 1, 2)}
    assert refine.fine_asks(cand, [True] * 6, steps, [8]) == {}  # no fine variants
    assert refine.fine_asks(cand, on, None, [8]) == {1: (4,), 3: (4,), 4: (4,)}


@pytest.mark.parametrize("key", ["gd", "newton", "momentum", "pgd"])
def test_the_merged_family_is_one_run_of_the_grid_and_those_fine_variants(key):
    # the grid run, then the fine variants alone, merged: what one run of both gives,
    # column for column (steps, places, descriptions, predictions and weights), the fine
    # columns after the grid's; each column's variant index is its variant's place by rank
    batch = _batch()
    stats = _stats(batch)
    grid = refine.grid_of(key, batch, stats, (1, 8))
    assert grid is not None and not all(on for _, on in grid)
    fine_ranks = [r for r, (_, on) in enumerate(grid) if not on][:3]
    fine = {fine_ranks[0]: (1, 2, 3), fine_ranks[1]: (0, 5), fine_ranks[2]: (4,)}
    coarse, _ = build_candidates([key], batch, stats, (1, 8), 4, slice(0, 5), {}, None)
    more, _ = build_candidates([key], batch, stats, (1, 8), 4, slice(0, 5), {}, None, {key: fine})
    got = refine.merged(coarse[key], more[key], [label for label, _ in grid])
    both, columns, _ = family_iterates(key, batch, stats, (1, 8), 4, False, fine=fine)
    w, _, _ = family_iterates(key, batch, stats, (1, 8), 4, True, slice(0, 5), fine=fine)
    places = list(zip(both.hyper["variant_rank"], both.steps.tolist()))  # in rank order
    order = [places.index(p) for p in got.places]  # the one run's column for each merged one
    assert sorted(order) == list(range(len(places)))
    assert got.places[:len(coarse[key].places)] == coarse[key].places  # the grid's first
    assert got.columns == [columns[i] for i in order]
    assert got.preds.steps.tolist() == both.steps[order].tolist()
    assert got.variant == [both.hyper["variant_index"][i] for i in order]
    torch.testing.assert_close(got.preds.preds, both.preds[order], rtol=0, atol=0)
    torch.testing.assert_close(got.weights.weights, w.weights[order], rtol=0, atol=0)
    assert got.preds.hyper["variant"] == [both.hyper["variant"][i] for i in order]
    # the tables merged column by column: the merged family's table (same resamples)
    layers = both.preds[:3].float() + 0.1
    spec = TableSpec((1, 8), 1, "positions", n_boot=20, confidence=0.9, seed=0)
    ys = batch.ys.double()
    t_grid, t_fine, t_all = (candidate_tables({key: c}, layers.double(), w.weights[:3], ys,
                                              ("error_cosine", "weight_cosine"), spec)
                             for c in (coarse[key], more[key], got))
    for metric in t_all:
        table = refine.merged_table(t_grid[metric][key], t_fine[metric][key], got)
        want = t_all[metric][key]
        assert table.steps == want.steps and table.labels == want.labels
        for name in ("values", "lower", "upper", "zero", "boots"):
            torch.testing.assert_close(getattr(table, name), getattr(want, name),
                                       rtol=1e-12, atol=1e-12)
    # a fine variant is its grid neighbours' neighbour at a step it ran at
    col = got.places.index((fine_ranks[0], 2))
    assert {got.places[k] for k in got.neighbors(col)} >= {(fine_ranks[0], 1),
                                                          (fine_ranks[0], 3)}


def test_a_fine_variants_columns_across_a_gap_in_its_steps_are_not_neighbours():
    # two matches far apart beside one fine variant: it runs at steps 3-5 and 51-81; its
    # step 5 and step 51 columns sit side by side but are no grid neighbours
    batch = _batch()
    stats = _stats(batch)
    grid = refine.grid_of("gd", batch, stats, (1, 8))
    r = next(r for r, (_, on) in enumerate(grid) if not on)
    fine = {r: (3, 4, 5, 51, 64, 81)}
    coarse, _ = build_candidates(["gd"], batch, stats, (1, 8), 4, None, {}, None)
    more, _ = build_candidates(["gd"], batch, stats, (1, 8), 4, None, {}, None, {"gd": fine})
    got = refine.merged(coarse["gd"], more["gd"], [label for label, _ in grid])
    near = {c: {got.places[k] for k in got.neighbors(got.places.index(c))}
            for c in ((r, 5), (r, 51))}
    assert near[(r, 5)] == {(r - 1, 5), (r + 1, 5), (r, 4)}
    assert near[(r, 51)] == {(r - 1, 51), (r + 1, 51), (r, 64)}


def test_a_family_whose_fine_grid_misses_a_grid_variant_is_refused():
    batch = _batch()
    ctx = FamilyContext(_stats(batch), batch.cov, (1, 8))
    fam = Family(lambda ctx: [("a", {}), ("b", {})], (0, 1), lambda ctx: [("a", {})])
    with pytest.raises(InputError, match="missing"):
        fam.grid(ctx)
    for fine in ([("b", {}), ("a", {})], [("a", {}), ("x", {}), ("x", {}), ("b", {})]):
        fam = Family(lambda ctx: [("a", {}), ("b", {})], (0, 1), lambda ctx, f=fine: f)
        with pytest.raises(InputError, match="distinct"):  # out of order; a label twice
            fam.grid(ctx)
    fam = Family(lambda ctx: [("a", {}), ("b", {})], (0, 1),
                 lambda ctx: [("a", {}), ("x", {}), ("b", {})])
    assert [on for _, on in fam.grid(ctx)] == [True, False, True]


def _said_of_gd_between_the_grids_step_sizes(answer_only=False, **kw):
    """What the answer says of GD at 0.84 × 1/λ_max(S_t/t), between the grid's 0.71 and 1.

    κ 100 data, aligned at the last position; the layers are GD's steps 1–6. ``kw``:
    `align_layers`' (probes' rows).
    """
    task = tasks.RegressionTask(n_dims=3, n_points=13, cov="ill-conditioned",
                                condition_number=100.0)
    # 256 sequences: on 64, with the bootstrap's expanded percentile intervals, heavy ball
    # is not separated from GD's step 3 (it was with torch.quantile's narrower ones)
    batch = task.sample(256, generator=torch.Generator().manual_seed(1))
    it = algorithms.gd(batch.xs.double(), batch.ys.double(), steps=range(1, 7), lr="max",
                       lr_scale=0.84, normalize=True)
    layers = torch.cat([torch.zeros_like(it.preds[:1]), it.preds])
    cfg = AlignConfig(n_boot=20, separation=False, metrics=("error_cosine",),
                      algorithms=("gd", "newton", "momentum", "ridge"))
    answer = align_layers(layers, batch, cfg, positions="last", **kw).answer
    assert answer is not None
    return answer if answer_only else [a.text for a in answer.layers[1:]]


@pytest.mark.slow
def test_a_layer_between_the_grids_step_sizes_is_matched_at_its_own():
    said = _said_of_gd_between_the_grids_step_sizes()
    # step 1: Newton's step 0 at a fitted α comes within the rule's resolution, and heavy
    # ball's step 1 is GD's step 1 itself (the searches climb to it, `fit_steps._climbs`):
    # "cannot tell" among them, GD included
    assert said[0].startswith("gd (") or (said[0].startswith("cannot tell")
                                          and "gd" in said[0].replace(",", "").split()), said
    assert said[1] == "gd (0.84/λmax, step 2)", said
    # from step 3 on heavy ball imitates it within 10⁻⁴ (step 3: 5·10⁻⁵ by the error cosine,
    # β ½ fitted at its step 2, once each of its continua is fitted, `fit_steps`), the
    # difference's interval reaching below the rule's resolution: "cannot tell" with GD,
    # never another learner
    assert all(t.startswith("gd (") or (t.startswith("cannot tell") and "gd" in t.split())
               for t in said), said


def test_without_the_fine_step_sizes_the_same_layers_read_cannot_tell(monkeypatch):
    # the test above can fail: with every family's grid alone (and no step size fitted
    # between its points, `fit_steps`), Newton imitates those layers as well as GD's grid does
    monkeypatch.setattr(fit_steps, "fitted", lambda *args, **kwargs: {})
    for fine, grid in (("GD_FINE", "GD_SCALES"), ("NEWTON_SCALES_FINE", "NEWTON_SCALES"),
                       ("NEWTON_FIXED_FINE", "NEWTON_FIXED"), ("MOMENTUM_FINE", "MOMENTUM_SCALES")):
        monkeypatch.setattr(families, fine, getattr(families, grid))  # nothing between
    said = _said_of_gd_between_the_grids_step_sizes()
    assert all(t.startswith("cannot tell gd from newton") for t in said[:3]), said


@pytest.mark.slow
def test_through_probes_the_grids_alone_are_read():
    # read exactly, GD's matches at layers 2-3 are a fine step size (0.84); through probes
    # (whose noise is larger than what the fine step sizes resolve) only the grids are run
    on_grid = {r for r, (_, on) in enumerate(families.GD.grid(FamilyContext(
        _stats(_batch()), _batch().cov, (1, 8)))) if on}
    exact = _said_of_gd_between_the_grids_step_sizes(answer_only=True)
    probed = _said_of_gd_between_the_grids_step_sizes(answer_only=True, probe_t_min=1)
    layers_noise = torch.zeros(7, 256, 13, dtype=torch.float64)  # a readout with noise
    noisy = _said_of_gd_between_the_grids_step_sizes(answer_only=True,
                                                     readout_noise=(layers_noise, None))
    assert exact.fine and not probed.fine and not noisy.fine
    assert {r for r, _ in exact.places["gd"][2:4]} - on_grid  # a fine variant matched
    assert all(r in on_grid for r, _ in probed.places["gd"])


def test_fine_and_fitted_runs_join_a_family_in_one_merge_as_in_two():
    # `joined` merges each family once; the result is the two merges in turn, column for
    # column (places, descriptions, variant indices, predictions and weights)
    batch = _batch()
    stats = _stats(batch)
    grid = refine.grid_of("gd", batch, stats, (1, 8))
    r = next(r for r, (_, on) in enumerate(grid) if not on)
    coarse, _ = build_candidates(["gd"], batch, stats, (1, 8), 4, slice(0, 5), {}, None)
    fine, _ = build_candidates(["gd"], batch, stats, (1, 8), 4, slice(0, 5), {}, None,
                               {"gd": {r: (2, 3)}})
    fit, _ = build_candidates(["gd"], batch, stats, (1, 8), 4, slice(0, 5), {}, None,
                              {"gd": {r + 0.4: (3,), r - 0.3: (2,)}})
    got, extra = refine.joined(coarse, fine, fit, batch=batch, stats=stats, window=(1, 8))["gd"]
    labels = refine.rank_labels("gd", batch, stats, (1, 8), [r + 0.4, r - 0.3])
    want = refine.merged(refine.merged(coarse["gd"], fine["gd"], labels), fit["gd"], labels)
    assert got.places == want.places and got.columns == want.columns
    assert got.variant == want.variant and len(extra.places) == 4  # 2 fine, 2 fitted
    assert got.preds.hyper["variant"] == want.preds.hyper["variant"]
    assert torch.equal(got.preds.preds, want.preds.preds)
    assert torch.equal(got.weights.weights, want.weights.weights)
    # the fitted variants sit between their neighbours by rank
    assert got.variant[got.places.index((r - 0.3, 2))] < got.variant[got.places.index((r, 2))]
    assert refine.joined(coarse, {}, batch=batch, stats=stats, window=(1, 8)) == {}


def test_each_continuums_best_column_and_those_near_the_layers_best():
    # per layer, the family's best column and each continuum's, against a loop over them;
    # the first of equal columns (as `first_best` picks a match)
    g = torch.Generator().manual_seed(3)
    scored = torch.rand(5, 12, generator=g, dtype=torch.float64)
    scored[2, 4:8] += 1.0
    scored[2, 4] = scored[2, 7] = scored[2, 4:8].max() + 0.01  # a tie: column 4 comes first
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    expect = set()
    for row in scored.tolist():
        expect.add(max(range(12), key=lambda c: (row[c], -c)))
        for group in (0, 1, 2):
            cols = [c for c in range(12) if groups[c] == group]
            expect.add(max(cols, key=lambda c: (row[c], -c)))
    assert refine.best_columns(scored, groups) == expect
    assert refine.best_columns(scored) == set(torch.argmax(scored, 1).tolist())
    near = refine.continuum_starts(scored, groups, 0.3)
    for row, got in zip(scored.tolist(), near):
        bests = [max((c for c in range(12) if groups[c] == group), key=lambda c: (row[c], -c))
                 for group in (0, 1, 2)]
        assert got == [c for c in bests if row[c] >= max(row) - 0.3]
    assert near[2] == [4]  # group 1 lifted by 1: the others are far below it


def test_a_columns_continuum_is_its_familys_and_one_continuum_is_none():
    batch = _batch()
    stats = _stats(batch)
    ctx = FamilyContext(stats, batch.cov, (1, 8))
    points = families.MOMENTUM.continuum.points(ctx)
    places = [(r, 2) for r in range(len(points))] + [(4.5, 3)]
    betas = sorted({name for name, _ in points}, key=[n for n, _ in points].index)
    got = refine.continuum_groups("momentum", ctx, places)
    assert got == [betas.index(name) for name, _ in points] + [betas.index(points[4][0])]
    assert len(set(got)) == len(families.MOMENTUM_BETAS) == 3
    assert refine.continuum_groups("ridge", ctx, [(0, 0)]) is None  # one continuum
    assert refine.continuum_groups("cg", ctx, [(0, 0)]) is None  # none
    assert refine.continuum_groups("pgd_own", ctx, [(0, 0)]) is None  # a model's claim
