"""One answer per layer from the two evaluations: the model's own task and its designed data.

The designed data are a second experiment on the same layers, and a learner a layer runs
fits it on both. Where the designed data separate two learners the own task could not,
the layer's answer is theirs; where they cannot tell apart two learners the own task
separated, the own task's answer stands: an evaluation's "cannot tell" that includes the
learner the other names does not contradict it. Per layer, with ``a`` the answer on the own
task and ``b`` on the designed data:

- a layer that computes nothing on one evaluation, or that no candidate matches better than
  the zero predictor there ("matches no learner"), takes the other's answer: neither says
  what the layer runs (a layer can die on data far from its training distribution, or
  come alive; a learner's early iterate can be as near 0 as the zero predictor on one
  distribution — the known-answer benchmark's Newton constructions at 0.4 and 0.8 of their
  α's bound, on the fresh slice's isotropic task, "match no learner" at one layer each
  there and are named Newton on their designed data);
- both name X, or one names X and the other cannot tell X from others: **runs X** (the
  column of the evaluation that named it; the own task's where both did);
- both "none of them": the own task's answer (its nearest candidate);
- both "cannot tell": **cannot tell** among the candidates both name, where two or more are
  left (the others one evaluation separated); else among every candidate either names,
  marked as a disagreement (each ruled out the other's);
- otherwise the evaluations **disagree** (X named on one, Y or "none of them" on the
  other, or "cannot tell" among candidates without X): "cannot tell" among
  every candidate either names — with both runners-up where only one is named — its
  ``source`` "the evaluations disagree". A disagreement is not resolved toward either
  claim; only where no second candidate is in play at all does the answer that finds none
  near stand (a learner the layer ran would fit it on both).

Where the designed data are not used (no distribution separates the candidates better,
the model is out of distribution there, or they cannot be read), the own task's answer is
the answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from iclprobe.alignment.views.answer_rule import CANNOT_TELL, DEAD, NONE, RUNS, LayerAnswer

#: where each layer's answer on both evaluations comes from
OWN, DESIGNED, BOTH, DISAGREE = "own task", "designed data", "both", "the evaluations disagree"
#: a layer that computes nothing, or that no candidate matches better than the zero
#: predictor: neither says what the layer runs
SILENT = DEAD


def both_answers(own: Sequence[LayerAnswer], designed: Sequence[LayerAnswer] | None
                 ) -> list[tuple[LayerAnswer, str]]:
    """Per layer, the answer over both evaluations and where it comes from (module docstring).

    ``designed`` None: the designed data are not read; every answer is the own task's.
    """
    if designed is None:
        return [(a, OWN) for a in own]
    if len(designed) != len(own):
        raise ValueError(f"designed must answer as many layers as own ({len(own)}), got "
                         f"{len(designed)}")
    return [_both(a, b) for a, b in zip(own, designed)]


def names(a: LayerAnswer) -> list[str]:
    """The candidates an answer names: the learner, and those it cannot be told from."""
    return [n for n in [a.learner, *a.others] if n is not None]


def _both(a: LayerAnswer, b: LayerAnswer) -> tuple[LayerAnswer, str]:
    if b.kind in SILENT:
        return a, OWN
    if a.kind in SILENT:
        return b, DESIGNED
    if a.kind == RUNS and b.kind == RUNS and a.learner == b.learner:
        return a, BOTH
    for x, y, where in ((a, b, OWN), (b, a, DESIGNED)):
        if x.kind == RUNS and y.kind == CANNOT_TELL and x.learner in names(y):
            return x, where
    if a.kind == NONE and b.kind == NONE:
        return a, BOTH
    if a.kind == CANNOT_TELL and b.kind == CANNOT_TELL:
        common = [n for n in names(a) if n in names(b)]
        if len(common) >= 2:
            return _cannot_tell(a, common, ""), BOTH
    return _disagree(a, b), DISAGREE


def _disagree(a: LayerAnswer, b: LayerAnswer) -> LayerAnswer:
    """"cannot tell" among every candidate either names (both runners-up where one is)."""
    either = list(dict.fromkeys(names(a) + names(b)))
    if len(either) < 2:  # both found the same nearest: with both runners-up
        either = list(dict.fromkeys(either + [n for n in (a.runner_up, b.runner_up) if n]))
    if len(either) < 2:  # one candidate in play, named on one and not near on the other:
        near = a if a.kind == NONE else b  # a learner the layer ran fits it on both
        return dataclasses.replace(near, source=DISAGREE)
    return _cannot_tell(a, either, DISAGREE)


def _cannot_tell(lead: LayerAnswer, among: list[str], why: str) -> LayerAnswer:
    """"cannot tell" among ``among`` (two at least), led by ``lead``'s learner where named.

    The lead's matched column and similarity are kept only where its learner leads.
    """
    first = lead.learner if lead.learner in among else among[0]
    same = first == lead.learner
    return dataclasses.replace(lead, kind=CANNOT_TELL, learner=first,
                               others=[n for n in among if n != first], between=[],
                               column=lead.column if same else None,
                               value=lead.value if same else None, source=why)
