"""One answer per layer over the own task and the designed data (alignment.design.both)."""

import itertools

import pytest
from helpers import designed_text

from iclprobe import tasks
from iclprobe.alignment import AlignConfig
from iclprobe.alignment import design as D
from iclprobe.alignment.design.both import BOTH, DESIGNED, DISAGREE, OWN, both_answers, names
from iclprobe.alignment.views.answer_rule import CANNOT_TELL, NONE, RUNS, LayerAnswer
from iclprobe.constructions.oracle import oracle

DEAD = LayerAnswer("computes nothing")
NO_MATCH = LayerAnswer("matches no learner")  # live, and no candidate beats the zero predictor


def runs(x, column="step 3"):
    return LayerAnswer(RUNS, x, column, 0.99)  # a named learner has no runner-up


def cannot(x, *others):
    return LayerAnswer(CANNOT_TELL, x, "step 2", 0.98, list(others), others[0])


def none(nearest, runner_up="cg"):
    return LayerAnswer(NONE, nearest, "step 9", 0.7, runner_up=runner_up, resemblance=0.9)


# (own, designed) -> (kind, learner, the others as a set, where it comes from)
CASES = [
    (runs("gd"), DEAD, (RUNS, "gd", set(), OWN)),
    (DEAD, runs("gd"), (RUNS, "gd", set(), DESIGNED)),
    (DEAD, DEAD, ("computes nothing", None, set(), OWN)),
    (runs("gd", "step 3"), runs("gd", "step 4"), (RUNS, "gd", set(), BOTH)),
    (runs("gd"), cannot("momentum", "gd"), (RUNS, "gd", set(), OWN)),
    (cannot("gd", "newton", "ridge"), runs("gd"), (RUNS, "gd", set(), DESIGNED)),
    (runs("gd"), runs("newton"), (CANNOT_TELL, "gd", {"newton"}, DISAGREE)),
    (runs("gd"), cannot("newton", "cg"), (CANNOT_TELL, "gd", {"newton", "cg"}, DISAGREE)),
    (none("gd"), runs("gd"), (CANNOT_TELL, "gd", {"cg"}, DISAGREE)),  # with the runner-up
    # a learner's early iterate can be as near 0 as the zero predictor on one distribution:
    # "matches no learner" says no more than "computes nothing"
    (runs("gd"), NO_MATCH, (RUNS, "gd", set(), OWN)),
    (NO_MATCH, cannot("gd", "cg"), (CANNOT_TELL, "gd", {"cg"}, DESIGNED)),
    (NO_MATCH, none("gd"), (NONE, "gd", set(), DESIGNED)),
    (cannot("gd", "newton"), cannot("cg", "ridge"),
     (CANNOT_TELL, "gd", {"newton", "cg", "ridge"}, DISAGREE)),  # each ruled out the other's
    (runs("gd"), none("newton"), (CANNOT_TELL, "gd", {"newton"}, DISAGREE)),
    (none("gd"), none("newton"), (NONE, "gd", set(), BOTH)),
    (none("gd"), cannot("momentum", "newton"),
     (CANNOT_TELL, "gd", {"momentum", "newton"}, DISAGREE)),
    (cannot("gd", "newton", "momentum"), cannot("momentum", "gd"),
     (CANNOT_TELL, "gd", {"momentum"}, BOTH)),  # neither separated these two
    (cannot("gd", "newton"), cannot("gd", "momentum"),
     (CANNOT_TELL, "gd", {"newton", "momentum"}, DISAGREE)),  # one in common: every one
]


@pytest.mark.parametrize("own, designed, expected", CASES)
def test_each_rule_by_hand(own, designed, expected):
    (got, where), = both_answers([own], [designed])
    assert (got.kind, got.learner, set(got.others), where) == expected
    assert (got.source == DISAGREE) == (where == DISAGREE)
    if got.kind == CANNOT_TELL:
        assert got.learner not in got.others and len(names(got)) >= 2
        if where not in (OWN, DESIGNED) and got.learner != own.learner:  # made of both:
            assert got.column is None and got.value is None  # the own task's leads


POOL = [DEAD, NO_MATCH, runs("gd"), runs("newton"), runs("cg"), cannot("gd", "newton"),
        cannot("newton", "momentum", "gd"), cannot("cg", "ridge"), none("gd"),
        none("newton", "gd"), LayerAnswer(NONE, "gd")]  # no runner-up


@pytest.mark.parametrize("a, b", list(itertools.product(POOL, POOL)))
def test_a_learner_is_named_only_where_no_evaluation_contradicts_it(a, b):
    (got, where), = both_answers([a], [b])
    (swapped, _), = both_answers([b], [a])
    live = [x for x in (a, b) if x.kind not in ("computes nothing", "matches no learner")]
    if got.kind == RUNS:  # named by one, and the other names it or cannot tell it from others
        assert any(x.kind == RUNS and x.learner == got.learner for x in live)
        assert all(got.learner in names(x) and x.kind in (RUNS, CANNOT_TELL) for x in live)
    if any(x.kind == RUNS for x in live) and all(x.kind == RUNS for x in live) and \
            len({x.learner for x in live}) == 1:
        assert got.kind == RUNS  # both (or the one live) name the same learner
    if not live:
        assert got is a and where == OWN
    elif len(live) == 1:  # the other says nothing of what the layer runs
        assert got is live[0]
    # the rule treats the two evaluations alike but for which one leads (whose nearest
    # candidate "none of them" names), and which one's silence stands where both are
    silent = ("computes nothing", "matches no learner")
    assert (swapped.kind in silent and got.kind in silent) or swapped.kind == got.kind
    assert got.kind in (NONE, *silent) or set(names(swapped)) == set(names(got))


def test_without_designed_data_the_own_answer_stands():
    own = [DEAD, runs("gd"), cannot("gd", "newton")]
    assert both_answers(own, None) == [(a, OWN) for a in own]
    with pytest.raises(ValueError, match="designed must answer as many layers as own"):
        both_answers(own, own[:2])


# three candidates and few sequences: the two alignments in a few seconds
CFG = AlignConfig(n_sequences=64, n_boot=20, separation=False,
                  algorithms=("newton", "gd", "momentum"))


@pytest.fixture(scope="module")
def gd_on_designed_data():
    model = oracle("gd", 4, 6, lambda layer: 2 * layer, lr="max", normalize=True,
                   task=tasks.RegressionTask(n_dims=4, n_points=9))
    there = D.Design(D.Distribution(1000.0, "geometric", 9, 0.0, "context"), 1.0, 0.0, [],
                     {}, 0)
    return D.align_designed(model, CFG, "gd", design=there)


def test_a_designed_alignment_is_combined_layer_by_layer(gd_on_designed_data):
    done = gd_on_designed_data
    assert done.used is done.designed is not None
    want = done.both()
    for own, there, (a, where) in zip(done.own.answer.layers, done.designed.answer.layers,
                                      want):  # each layer from the two answers, by hand
        if own.kind == there.kind == RUNS and own.learner == there.learner:
            assert a is own and where == BOTH  # both name it: the own task's column
        elif there.kind in ("computes nothing", "matches no learner"):
            assert a is own and where == OWN
        elif own.kind in ("computes nothing", "matches no learner"):
            assert a is there and where == DESIGNED
    named = [a for a, _ in want if a.kind == RUNS]
    assert named and all(a.learner == "gd" for a in named)  # a GD oracle, on both
    assert any(w == BOTH for _, w in want)  # the case above is exercised
    record = done.to_dict()["both"]
    assert [r["answer"] for r in record] == [a.text for a, _ in want]
    assert [r["from"] for r in record] == [w for _, w in want]
    text = designed_text(done)
    assert "both" in text and "cannot tell where they disagree" in text
    assert done.both_sentence().startswith("what the layers run, among ")
    assert "gd (" in done.both_sentence()


def test_out_of_distribution_designed_data_leave_the_own_answer(gd_on_designed_data):
    import dataclasses

    ood = dataclasses.replace(gd_on_designed_data, out_of_distribution=True, why="test")
    assert ood.used is None
    assert ood.both() == [(a, OWN) for a in ood.own.answer.layers]


def _gd_columns(xs, ys, weights):
    """The GD oracle's true columns: 1/λ_max steps 0, 2, ..., 12 (its layers 0–6)."""
    from iclprobe import algorithms

    return algorithms.gd(xs, ys, steps=list(range(0, 13, 2)), lr="max", normalize=True,
                         weights=weights)


@pytest.mark.slow  # the truth's reach on both evaluations' data
@pytest.mark.parametrize("truth", ["gd", "newton"])
def test_the_benchmark_counts_the_answer_over_both(gd_on_designed_data, truth):
    import torch

    from iclprobe.constructions import benchmark as B
    from iclprobe.constructions import evaluations as E
    from iclprobe.constructions import scoring as S

    done = gd_on_designed_data
    own_batch = B.evaluation_batch(tasks.RegressionTask(n_dims=4, n_points=9), CFG)
    there = done.design.chosen.task(4, done.design.seed).sample(
        CFG.n_sequences, generator=torch.Generator().manual_seed(CFG.seed))
    counts, labels = E.both_counts(done, own_batch, there, truth, _gd_columns)
    alone, _ = S.score(done.own, truth, own_batch, _gd_columns)
    assert counts[E.OWN_VIEW] == alone[S.ANSWER]  # the own task's, as the benchmark counts it
    assert labels[E.BOTH_VIEW] == [a.text for a, _ in done.both()]
    live = sum(a.kind not in ("computes nothing", "matches no learner") for a, _ in done.both())
    both = counts[E.BOTH_VIEW]
    assert sum(both[k] for k in ("true", "false", "cannot tell", "none")) == live
    if truth == "gd":  # named at every live layer on both: right, and separable there
        assert both["true"] == both["separable"] == both["true_separable"] == live
    else:  # a GD oracle counted as Newton's: every name is a false attribution
        assert both["false"] == live and both["true"] == 0


def test_the_table_fits_the_screen_and_names_its_columns(gd_on_designed_data):
    import dataclasses

    done = gd_on_designed_data
    rows = done.lines()[-(sum(done.own.live) + 1):]
    assert rows[0].split() == ["layer", "own", "task", "designed", "data", "both"]
    # long columns (heavy ball's and GD++'s hyperparameters) fall back to the learners
    long = [dataclasses.replace(a, column="β 0.9, 1.23/λmax, η 0.123, γ 0.0456, step 128")
            if a.kind == RUNS else a for a in done.designed.answer.layers]
    wide = dataclasses.replace(done, designed=dataclasses.replace(
        done.designed, answer=dataclasses.replace(done.designed.answer, layers=long)))
    text = designed_text(wide)  # every line within 100 columns
    assert "step 128" not in text and " gd " in text
    # short answers keep the headers apart
    short = [dataclasses.replace(a, kind=CANNOT_TELL, learner="gd", others=["cg"])
             if a.kind == RUNS else a for a in done.designed.answer.layers]
    narrow = dataclasses.replace(done, designed=dataclasses.replace(
        done.designed, answer=dataclasses.replace(done.designed.answer, layers=short)))
    header = next(line for line in narrow.lines() if line.startswith("layer"))
    assert "designed data  both" in header
    # out of distribution: the designed answers shown as such, no answer over both
    ood = dataclasses.replace(done, out_of_distribution=True, why="test")
    lines = ood.lines()
    assert not any(line.startswith("both:") for line in lines)
    header = next(line for line in lines if line.startswith("layer"))
    assert header.split()[-1] == "distribution)"


def _reach(converged):
    """One metric's reach of a GD truth at one layer: OLS alike to it, or far."""
    from iclprobe.constructions.scoring import Reach

    return {"error_cosine": Reach({"ols": [0.0 if converged else 0.5], "newton": [0.5]},
                                  [0.01])}


@pytest.mark.parametrize("own, designed, converged, expected", [
    # "ols" named on the data where the iterate has not converged: false, whatever the other
    (cannot("gd", "ols"), runs("ols"), (True, False), "false"),
    (runs("ols"), cannot("gd", "ols"), (False, True), "false"),
    (runs("ols"), runs("ols"), (True, False), "false"),  # both: right on each, or not
    (runs("ols"), runs("ols"), (True, True), "true"),
    (cannot("gd", "ols"), runs("gd"), (True, False), "true"),  # the truth named
    (runs("gd"), runs("newton"), (False, False), "cannot tell"),
])
def test_the_answer_over_both_is_right_on_the_evidence_it_comes_from(
        own, designed, converged, expected, monkeypatch):
    from types import SimpleNamespace

    from iclprobe.constructions import evaluations as E

    done = SimpleNamespace(own=SimpleNamespace(answer=SimpleNamespace(layers=[own])),
                           used=SimpleNamespace(answer=SimpleNamespace(layers=[designed])),
                           both=lambda: both_answers([own], [designed]))
    reaches = iter([_reach(converged[0]), _reach(converged[1])])
    monkeypatch.setattr(E, "_reach", lambda *args: next(reaches))
    counts, _ = E.both_counts(done, None, None, "gd", None)
    both = counts[E.BOTH_VIEW]
    assert both[expected] == 1 and sum(both[k] for k in ("true", "false", "cannot tell",
                                                         "none")) == 1
    # separable on either: apart from newton (and from OLS where not converged) on each
    assert both["separable"] == 1 and both["true_separable"] == (expected == "true")


def test_a_table_without_live_layers_is_its_header():
    from iclprobe.alignment.design.designed import _table

    columns = [("own task", [DEAD]), ("designed data", [DEAD])]
    assert _table(columns, [], [], lambda a: a.short) == ["layer  own task  designed data"]


def test_the_sentence_keeps_each_evaluations_none_of_them_numbers_apart(gd_on_designed_data):
    import dataclasses

    done = gd_on_designed_data
    n = len(done.own.answer.layers)
    far = dataclasses.replace(none("newton"), value=0.4, resemblance=0.6)
    own = [DEAD] + [none("gd")] * 2 + [NO_MATCH] * (n - 3)  # numbers 0.7 and 0.9
    there = [DEAD] + [none("gd")] * 2 + [far] * (n - 3)
    live = [False] + [True] * (n - 1)
    mixed = dataclasses.replace(
        done, own=dataclasses.replace(done.own, answer=dataclasses.replace(
            done.own.answer, layers=own), live=live),
        designed=dataclasses.replace(done.designed, answer=dataclasses.replace(
            done.designed.answer, layers=there), live=live))
    assert [w for _, w in mixed.both()][1:] == [BOTH] * 2 + [DESIGNED] * (n - 3)
    text = mixed.both_sentence()
    assert text.count("none of them (") == 2  # one clause per evaluation, not one for both
    assert "on the own task: nearest gd at 1–2; similarity 0.700 to it" in text
    assert f"on the designed data: nearest newton at 3–{n - 1}; similarity 0.400 to it" in text
    # without the designed data in use, no evaluation is named
    ood = dataclasses.replace(mixed, out_of_distribution=True, why="test")
    assert "on the own task" not in ood.both_sentence()
