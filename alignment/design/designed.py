"""A model aligned on its own task and on its designed data, side by side."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from iclprobe._text import WIDTH, wrap
from iclprobe.algorithms.numerics import Diverged
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.design.both import DESIGNED, DISAGREE, OWN, both_answers
from iclprobe.alignment.design.family import DesignFamily
from iclprobe.alignment.design.search import (
    OOD_ERROR,
    Design,
    checked_arguments,
    design_evaluation,
    designed_positions,
)
from iclprobe.alignment.result import AlignResult
from iclprobe.alignment.views.answer_rule import NONE, RUNS, LayerAnswer
from iclprobe.errors import InputError, NonFinite, TooFewRows
from iclprobe.models.base import Regressor


@dataclasses.dataclass
class Designed:
    """A model aligned on its own task and on the designed data (`align_designed`)."""

    own: AlignResult
    design: Design
    designed: AlignResult | None  # None: not finite there, or the own task is the best
    out_of_distribution: bool  # the model's output error there is near the zero predictor's
    why: str = ""  # where out of distribution: what the model did there
    #: why the designed data could not be read with the configuration (its probes' rows), if so
    not_read: str = ""

    def model_error(self, res: AlignResult) -> float:
        """The model output's normalized error over ``res``'s window (zero predictor: 1)."""
        if not res.zero_error > 0:
            raise InputError(f"{res.name}: the zero predictor's error is {res.zero_error!r} "
                             "on these data (every target 0?): no error to normalize by")
        return res.layer_error[-1] / res.zero_error

    @property
    def used(self) -> AlignResult | None:
        """The designed alignment where its answer is used (read, and in distribution)."""
        des = self.designed
        return des if des is not None and des.answer is not None and \
            not self.out_of_distribution else None

    def both(self) -> list[tuple[LayerAnswer, str]]:
        """Per layer, the answer over both evaluations and where it comes from.

        `both.both_answers`: a name one evaluation gives and the other does not contradict
        stands; where they contradict each other, "cannot tell". Where the designed data
        are not used, the own task's answer.
        """
        own = self.own.answer
        assert own is not None  # align_designed runs the fitted view
        used = self.used
        return both_answers(own.layers, used.answer.layers if used is not None and
                            used.answer is not None else None)

    def both_sentence(self) -> str:
        """The answer over both evaluations in words, over the layers live on either.

        A "none of them" clause keeps the numbers of each evaluation apart and names the
        one they come from, where the designed data are used.
        """
        own = self.own.answer
        assert own is not None  # align_designed runs the fitted view
        used = self.used
        live = [x or (used is not None and y) for x, y in
                zip(self.own.live, used.live if used is not None else self.own.live)]
        both = [a for a, _ in self.both()]
        on = None if used is None else [_numbers_from(a, mine) for a, mine in
                                        zip(both, own.layers)]
        return dataclasses.replace(own, layers=both).sentence(live, on)

    def lines(self) -> list[str]:
        """Both answers per live layer, side by side, the answer over both, the model's error.

        The sentences are wrapped to the screen's width (`iclprobe._text.WIDTH`).
        """
        sentences, table = self._sentences()
        return wrap(sentences) + table

    def _sentences(self) -> tuple[list[str], list[str]]:
        """`lines`' sentences (unwrapped) and its table of both answers."""
        own_a = self.own.answer
        assert own_a is not None
        des = self.designed
        there = f"{self.model_error(des):.3f}" if des is not None else "not finite"
        head = [self.design.sentence(),
                f"the model's error ÷ the zero predictor's (same sequences): "
                f"{self.model_error(self.own):.3f} on its own task, {there} on the designed data"]
        if des is None and self.not_read:
            return [self.design.sentence(), f"the designed data cannot be read with these "
                    f"settings ({self.not_read}): the answer on the model's own task stands"], []
        if des is None and not self.out_of_distribution:
            return [self.design.sentence(), "no distribution of the family separates the "
                    "candidates better than the model's own task: its answer there stands"], []
        if self.out_of_distribution:
            head.append(f"the designed data are out of the model's distribution ({self.why}): "
                        "it no longer does regression there, and its answer there is not used")
        if des is None or des.answer is None:
            return head, []
        shown = [i for i, live in enumerate(self.own.live) if live or des.live[i]]
        columns = [("own task", own_a.layers), ("designed data" + (
            " (out of distribution)" if self.out_of_distribution else ""), des.answer.layers)]
        marks = [""] * len(shown)
        if self.used is not None:
            both = self.both()
            columns.append(("both", [a for a, _ in both]))
            marks = [" (disagree)" if both[i][1] == DISAGREE else "" for i in shown]
            head.append("both: a learner one evaluation names and the other does not "
                        "contradict (it names it too, cannot tell it from others there, or "
                        "says nothing of the layer); cannot tell where they disagree")
        rows = _table(columns, shown, marks, lambda a: a.short)
        if max(len(r) for r in rows) > WIDTH:  # long columns: the learners without them
            rows = _table(columns, shown, marks,
                          lambda a: str(a.learner) if a.kind == RUNS else a.short)
        return head, rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields: the design and the designed alignment."""
        des = self.designed
        return {"design": self.design.to_dict(), "out_of_distribution": self.out_of_distribution,
                "why": self.why, "not_read": self.not_read,
                "model_error": {"own": self.model_error(self.own),
                                "designed": self.model_error(des) if des is not None else None},
                "designed": des.to_dict() if des is not None else None,
                "both": [{"answer": a.text, "from": where} for a, where in self.both()]}


def align_designed(model: Regressor, cfg: AlignConfig | None = None, name: str = "model",
                   own: AlignResult | None = None, family: DesignFamily | None = None,
                   progress: bool = False, design: Design | None = None) -> Designed:
    """Align ``model`` on its own task and on the designed data (`design_evaluation`).

    ``own``: its alignment on its own task with ``cfg``, where already computed.
    ``design``: a design already chosen (e.g. for another model of the same task), used
    instead of searching ``family``. The designed data are aligned with the same ``cfg``
    (at their last position where the queries are drawn apart), with probes fitted on them;
    where the design separates the candidates no better than the own task, they are not
    (``designed`` None, in distribution).
    """
    from iclprobe.alignment.pipeline import align

    cfg, family = checked_arguments(
        "align_designed", model, cfg, family, own=(own, AlignResult, "align's AlignResult"),
        design=(design, Design, "a Design"))
    if not cfg.fitted:
        raise InputError("the designed evaluation needs the fitted view (fitted=True)")
    own = own if own is not None else align(model, cfg, name=name)
    if design is None:
        design = design_evaluation(model, own, cfg, family, progress=progress)
    if not design.objective > design.own:  # the own task separates them at least as well
        return Designed(own, design, None, False, "")
    task = design.chosen.task(own_task_dims(own), design.seed)
    positions = designed_positions(task, cfg.positions)
    # saved probes are of the own task: refitted on these data, and `resolve_probes` says so
    designed_cfg = dataclasses.replace(cfg, positions=positions, t_max=None,  # at the last
                                       t_min=None if positions == "last" else cfg.t_min)
    try:
        designed = align(model, designed_cfg, name=name, eval_task=task)
    except (Diverged, NonFinite) as err:  # the model itself blows up on these data (an
        # oracle or a PQ model runs its learner, which stops where the iterates grow)
        return Designed(own, design, None, True, "its outputs are not finite, or grow without "
                        f"bound, there: {err}")
    except TooFewRows as err:  # shorter sequences: fewer rows for the probes than cfg's give
        return Designed(own, design, None, False, "", str(err))
    ood = not designed.layer_error[-1] < OOD_ERROR * designed.zero_error
    why = (f"its error there is not below {OOD_ERROR:g} × the zero predictor's" if ood else "")
    return Designed(own, design, designed, ood, why)


def _table(columns: list[tuple[str, list[LayerAnswer]]], shown: list[int], marks: list[str],
           cell: Callable[[LayerAnswer], str]) -> list[str]:
    """Rows of the answers side by side: a header, then one row per layer ``shown``."""
    cells = [[cell(answers[i]) for i in shown] for _, answers in columns]
    widths = [max([len(title), *map(len, col)]) + 2 for (title, _), col in zip(columns, cells)]
    rows = ["layer  " + "".join(f"{t:{w}}" for (t, _), w in zip(columns, widths)).rstrip()]
    for k, i in enumerate(shown):
        row = "".join(f"{col[k]:{w}}" for col, w in zip(cells, widths)).rstrip()
        rows.append(f"{i:>5}  {row}{marks[k]}")
    return rows


def own_task_dims(res: AlignResult) -> int:
    """The dimension d of the data ``res`` was aligned on."""
    d = res.task.get("n_dims")
    if not isinstance(d, int):
        raise InputError(f"{res.name}: its result names no n_dims")
    return d


def _numbers_from(answer: LayerAnswer, own: LayerAnswer) -> str:
    """The evaluation whose numbers a "none of them" answer over both carries ("" else).

    The own task's where its answer says the same (both "none of them" keep the own task's,
    as does a disagreement settled toward its "none of them"), else the designed data's.
    """
    if answer.kind != NONE:
        return ""
    same = (own.kind, own.learner, own.value, own.resemblance) == \
        (answer.kind, answer.learner, answer.value, answer.resemblance)
    return OWN if same else DESIGNED
