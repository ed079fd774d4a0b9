"""Counting a cell on both evaluations: its own task, and its designed data with it.

The answer over both (`alignment.design.both`) is counted as `scoring` counts one
evaluation's answer, over the layers it answers (live on either). Whether it is right is
judged on the evidence of the evaluation it comes from (`scoring.is_right` with that
evaluation's reach of the truth: naming the truth, or, where the truth's iterate has
converged there, OLS or "cannot tell" among learners converged with it); an answer both
gave, or one made of both (their common or joint "cannot tell"), must be right on each
evaluation that answers the layer — a converged iterate on one is not one on the other. A
layer is separable where the truth is separable on either evaluation that answers it
(`scoring.separable_at`): the designed data add evidence, and a layer one evaluation
separates is one the two together can name.
"""

from __future__ import annotations

from iclprobe.alignment.design import Designed
from iclprobe.alignment.design.both import DESIGNED, OWN
from iclprobe.alignment.result import AlignResult
from iclprobe.alignment.views.answer import CANNOT_TELL, DEAD, RUNS
from iclprobe.constructions import scoring
from iclprobe.tasks import RegressionBatch

#: the views `both_counts` adds: the answer on the own task alone, and over both
OWN_VIEW, BOTH_VIEW = "answer, own task", "answer, both evaluations"


def both_counts(done: Designed, own_batch: RegressionBatch, designed_batch: RegressionBatch,
                truth: str | None, truth_columns: scoring.TruthColumns
                ) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    """The counts and per-layer labels of `OWN_VIEW` and `BOTH_VIEW` for one cell.

    ``designed_batch``: the sequences the designed alignment read (unused where the designed
    data are not, `Designed.used`).
    """
    own = done.own
    assert own.answer is not None  # the benchmark runs the fitted view
    reaches = [_reach(own, own_batch, truth, truth_columns)]
    used = done.used
    if used is not None:
        reaches.append(_reach(used, designed_batch, truth, truth_columns))
    counts = {OWN_VIEW: scoring.answer_counts(own.answer.layers, truth, reaches[0])}
    tally = {"true": 0, "false": 0, "cannot tell": 0, "none": 0}
    if truth is not None:
        tally.update(separable=0, true_separable=0)
    both = done.both()
    answers = [own.answer.layers] + ([used.answer.layers] if used is not None and
                                     used.answer is not None else [])  # `used` has one
    for layer, (a, where) in enumerate(both):
        if a.kind in DEAD:
            continue
        # the evaluations that answer the layer (as `scoring.answer_counts` counts them)
        answering = [k for k, said in enumerate(answers) if said[layer].kind not in DEAD]
        judged = [0] if where == OWN else [1] if where == DESIGNED else answering or [0]
        right = truth is not None and all(scoring.is_right(a, truth, reaches[k], layer)
                                          for k in judged)
        key = "true" if right else "false" if a.kind == RUNS else \
            "cannot tell" if a.kind == CANNOT_TELL else "none"
        tally[key] += 1
        if truth is not None and any(scoring.separable_at(reaches[k], layer)
                                     for k in answering):
            tally["separable"] += 1
            tally["true_separable"] += key == "true"
    counts[BOTH_VIEW] = tally
    return counts, {OWN_VIEW: [a.text for a in own.answer.layers],
                    BOTH_VIEW: [a.text for a, _ in both]}


def _reach(res: AlignResult, batch: RegressionBatch, truth: str | None,
           truth_columns: scoring.TruthColumns) -> dict[str, scoring.Reach]:
    """The truth's reach by the answer's metrics on ``res``'s data (none without a truth)."""
    if truth is None:
        return {}
    assert res.answer is not None
    reach = scoring.truth_reach(res, truth, batch, truth_columns)
    return {m: reach[m] for m in res.answer.by_metric if m in reach}
