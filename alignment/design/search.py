"""The objective and the search of the designed evaluation (`iclprobe.alignment.design`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from iclprobe import algorithms
from iclprobe._checks import check_bytes, check_choice, check_real, check_seed, check_type
from iclprobe._text import WIDTH
from iclprobe.algorithms.families import FamilyContext, NotACandidate
from iclprobe.algorithms.numerics import Diverged
from iclprobe.alignment import comparison as C
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.design.family import (
    FACTORS,
    DesignFamily,
    Distribution,
    nearest_distribution,
)
from iclprobe.alignment.design.keeps import live_learners
from iclprobe.alignment.design.scale import (
    POSITIONS,
    designed_positions,
    matched_scale,
    own_curvature,
)
from iclprobe.alignment.evaluation import aligned_window, evaluation_task, family_runs
from iclprobe.alignment.measuring.candidates import family_iterates
from iclprobe.alignment.metrics import metric_info
from iclprobe.alignment.result import AlignResult
from iclprobe.alignment.views.answer_rule import CANNOT_TELL, NONE, RUNS
from iclprobe.errors import InputError
from iclprobe.models.base import Regressor
from iclprobe.tasks import RegressionTask

#: The metric the objective is computed with (the answer's reference metric).
METRIC = "error_cosine"
#: The model does regression on data where its output's normalized error is below this
#: fraction of the zero predictor's; elsewhere its answer there is out of distribution.
OOD_ERROR = 0.9

@dataclasses.dataclass
class Design:
    """The chosen distribution, and every one tried with its objective."""

    chosen: Distribution
    objective: float  # the chosen distribution's
    own: float  # on the model's own task
    tried: list[tuple[Distribution, float]]
    pairs: dict[int, list[tuple[str, str]]]  # live layer -> its contending pairs
    seed: int

    def __post_init__(self) -> None:
        check_type("Design", "chosen", self.chosen, Distribution, "a Distribution")
        for name in ("objective", "own"):  # separations: 1 − error cosine, clipped at 0
            check_real("Design", name, getattr(self, name), 0)

    def sentence(self) -> str:
        """The choice in words, with the objective beside the own task's."""
        return (f"designed evaluation: {self.chosen.text} (the candidates' matched columns "
                f"{self.objective:.3g} apart by error cosine, against {self.own:.3g} on the "
                f"model's own task; {len(self.tried)} distributions tried)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"chosen": self.chosen.to_dict(), "objective": self.objective, "own": self.own,
                "seed": self.seed, "pairs": {str(k): [list(p) for p in v]
                                             for k, v in self.pairs.items()},
                "tried": [{**d.to_dict(), "objective": v} for d, v in self.tried]}


def contending_pairs(res: AlignResult) -> dict[int, list[tuple[str, str]]]:
    """Per live layer, the pairs of candidates its answer turns on (module docstring)."""
    check_type("contending_pairs", "res", res, AlignResult, "align's AlignResult")
    if res.answer is None:
        raise InputError(f"{res.name}: the designed evaluation needs the answer (run align with "
                         "the fitted view on)")
    scores = res.answer.scores.get(METRIC) or next(iter(res.answer.scores.values()))
    out: dict[int, list[tuple[str, str]]] = {}
    for layer, (a, live) in enumerate(zip(res.answer.layers, res.live)):
        if not live or a.learner is None or a.kind not in (RUNS, CANNOT_TELL, NONE):
            continue
        rivals = a.others if a.kind == CANNOT_TELL else [a.runner_up or _runner_up(
            scores, a.learner, layer)]
        pairs = [(a.learner, r) for r in rivals if r is not None and r != a.learner]
        if pairs:
            out[layer] = pairs
    return out


def _runner_up(scores: Mapping[str, C.LearnerScore], learner: str, layer: int) -> str | None:
    """The candidate other than ``learner`` that matches ``layer`` best."""
    sign = 1.0 if metric_info(next(iter(scores.values())).metric).higher_is_better else -1.0
    others = [(sign * s.score.value[layer], k) for k, s in scores.items() if k != learner]
    return max(others)[1] if others else None


def separation(task: RegressionTask, pairs: Mapping[int, Sequence[tuple[str, str]]],
               places: Mapping[str, Sequence[tuple[float, int]]], n_layers: int,
               cfg: AlignConfig, positions: str, n_sequences: int, seed: int,
               model: Regressor | None = None, gate: bool = True) -> float:
    """The objective on ``task``: the mean over layers of its closest pair's separation.

    ``places``: per candidate, each layer's matched column as (variant, step) in its family
    (`Answer.places`). ``model``: whose family's claimed learners (a PQ model's
    ``pgd_own``) are run on these data. A pair one of whose learners is no candidate here
    (GD preconditioned by Σ⁻¹ on isotropic data is GD), diverges, or whose matched variant
    is none of its family on these data (a ridge λ beyond the grid of a less spread
    spectrum) is not separated (0). With ``gate``, nor is any pair on data where the learner
    matched at the deepest answered layer does no regression (`regresses`): the model, run
    there as that learner runs, would be judged out of distribution and its answer not used.
    """
    check_choice("separation", "positions", positions, POSITIONS)
    outside = sorted(layer for layer in pairs if not 0 <= layer <= n_layers)
    if outside:
        raise InputError(f"separation: pairs name layers {outside} of a model with layers "
                         f"0..{n_layers}")
    if not pairs:
        return 0.0
    batch = task.sample(n_sequences, generator=seed, dtype=torch.float64)
    xs, ys = batch.xs, batch.ys
    stats = algorithms.prefix_stats(xs, ys)
    window = aligned_window(cfg, positions, task.n_points)
    claims = family_runs(model, batch)[0] if model is not None else {}
    needed = sorted({c for ps in pairs.values() for p in ps for c in p})
    fams: dict[str, tuple[algorithms.Iterates, dict[tuple[int, int], int]] | None] = {}
    ctx = FamilyContext(stats, batch.cov, window)
    for key in needed:
        own = places.get(key, ())
        try:
            if key in algorithms.LEARNERS:  # a variant matched on the own task may be none here
                family = algorithms.learner_info(key).fitted_family
                own = [p for p in own if family.holds(ctx, p[0])]  # may raise NotACandidate
            it, _, _ = family_iterates(key, batch, stats, window, n_layers, False,
                                       claim=claims.get(key) if key not in algorithms.LEARNERS
                                       else None, fine=matched_fine(own))
        except (NotACandidate, Diverged):
            fams[key] = None
            continue
        at = {(r, int(k)): i for i, (r, k) in
              enumerate(zip(it.hyper["variant_rank"], it.steps.tolist()))}
        fams[key] = (it, at)
    kw = {"t_min": window[0], "t_max": window[1],
          "over": "sequences" if positions == "last" else "positions"}
    if gate and not regresses(pairs, places, fams, ys, window):
        return 0.0
    asks = {(layer, a, b): _pair_asks(a, b, layer, fams, places)
            for layer, ps in pairs.items() for a, b in ps}
    best = _imitations(asks, fams, ys, kw)
    per_layer = []
    for layer, ps in sorted(pairs.items()):
        per_layer.append(min(_pair_gap(best.get((layer, a, b))) for a, b in ps))
    return float(sum(per_layer) / len(per_layer))


def regresses(pairs: Mapping[int, Sequence[tuple[str, str]]],
              places: Mapping[str, Sequence[tuple[float, int]]], fams: Mapping[str, Any],
              ys: Tensor, window: tuple[int, int]) -> bool:
    """Whether the learner matched at the deepest answered layer does regression on ``ys``.

    Its matched column's normalized error over ``window`` below `OOD_ERROR` × the zero
    predictor's, the test `align_designed` puts the model's output to: a design where the
    model's own learner fails it (GD at a small step size on queries along the context's
    low-variance directions, where it has barely moved from 0) would have its answer
    discarded even for a model that runs that learner exactly. Where that column is not
    run here (no candidate, or its variant diverges), the pairs' own rule decides. A proxy
    of the model's output, judged on ``ys``'s sequences (the design's), not on the
    evaluation's: near the threshold the two can disagree. ``fams``: per candidate, its
    family's iterates and ``{(variant rank, step): column}`` (None: no candidate here).
    """
    layer = max(pairs)
    learner = pairs[layer][0][0]
    fam = fams.get(learner)
    if fam is None or learner not in places:
        return True
    col = fam[1].get(tuple(places[learner][layer]))
    if col is None:
        return True
    lo, hi = window
    y = ys[:, lo:hi + 1]
    err = (fam[0].preds[col][:, lo:hi + 1] - y).pow(2).mean()
    return bool(err < OOD_ERROR * y.pow(2).mean())


def matched_fine(places: Sequence[tuple[float, int]]) -> dict[float, tuple[int, ...]]:
    """The matched columns' variants and steps, to run where they are fine ones (`Family.fine`).

    A layer matched between the grid's step sizes (a fine variant, or a step size fitted on
    the family's continuum) is matched there on the design's data too.
    """
    out: dict[float, set[int]] = {}
    for rank, step in places:
        out.setdefault(rank, set()).add(int(step))
    return {r: tuple(sorted(s)) for r, s in out.items()}


Ask = tuple[Tensor, str]  # a column, and the family asked to imitate it


def _pair_asks(a: str, b: str, layer: int, fams: Mapping[str, Any],
               places: Mapping[str, Sequence[tuple[float, int]]]) -> list[Ask] | None:
    """What a pair's separation needs imitated (None: one of them is no candidate here).

    Each matched column by the other learner's family, and their average by both.
    """
    cols = []
    for x in (a, b):
        fx = fams.get(x)
        col = None if fx is None or x not in places else fx[1].get(tuple(places[x][layer]))
        if fx is None or col is None:  # no candidate here, or its matched variant diverges
            return None
        cols.append(fx[0].preds[col])
    mix = (cols[0] + cols[1]) / 2
    return [(cols[0], b), (cols[1], a), (mix, a), (mix, b)]


def _imitations(asks: Mapping[Any, list[Ask] | None], fams: Mapping[str, Any], ys: Tensor,
                kw: Mapping[str, Any]) -> dict[Any, list[float]]:
    """Each pair's asks answered (their best imitations), one table per family asked."""
    flat = [(key, j, ask) for key, qs in asks.items() if qs is not None
            for j, ask in enumerate(qs)]
    by_family: dict[str, list[tuple[Any, int, Tensor]]] = {}
    for key, j, (column, y) in flat:
        by_family.setdefault(y, []).append((key, j, column))
    out = {key: [math.nan] * len(qs) for key, qs in asks.items() if qs is not None}
    for y, rows in by_family.items():
        best, _ = C.imitation(torch.stack([c for _, _, c in rows]), fams[y][0], ys, METRIC, **kw)
        for (key, j, _), value in zip(rows, best):
            out[key][j] = value
    return out


def _pair_gap(best: list[float] | None) -> float:
    """How far apart a pair's matched columns are, as the answer would need them (0: none).

    1 − the best imitation of each matched column by the other learner's family, and of their
    average by either family (``best``: those four imitations; None: a learner of the pair
    is no candidate here): the answer calls a layer between two learners neither's only
    where a family cannot reach their mix (a split spectrum let GD's family reach the
    GD/Newton average).
    """
    if best is None:
        return 0.0
    gaps = [1.0 - v for v in best]
    if not all(math.isfinite(g) for g in gaps):
        return 0.0
    return max(0.0, min(gaps))


def design_evaluation(model: Regressor, res: AlignResult, cfg: AlignConfig | None = None,
                      family: DesignFamily | None = None, seed: int | None = None,
                      progress: bool = False) -> Design:
    """The distribution of ``family`` where the candidates' matched columns differ most.

    Args:
        model: the model ``res`` aligned (its layers are not run here: only its family's
            claimed learners and its dimension, positions and trained length are used).
        res: `align`'s result on the model's own task (its answer names the matched columns
            and the contending pairs).
        cfg: the configuration ``res`` was computed with (its window rules).
        family: the distributions to choose from (default `DesignFamily()`).
        seed: of every candidate distribution's sample and rotation (default ``cfg.seed``).
        progress: show a tqdm bar over the distributions tried.
    """
    cfg, family, seed, own_task = _design_arguments(model, res, cfg, family, seed)
    assert res.answer is not None  # checked there
    pairs, places = contending_pairs(res), res.answer.places
    fixed_n = res.positions == "last" and own_task.query == "context"
    designed_cfg = dataclasses.replace(cfg, t_max=None)  # as `align_designed` aligns them
    # a model aligned from a given position on: the designed sequences reach past it
    least_n = 2 if res.positions == "last" else \
        aligned_window(designed_cfg, "all", own_task.n_points)[0] + 1

    def objective(task: RegressionTask, judged: AlignConfig, gate: bool = True) -> float:
        positions = "last" if fixed_n else designed_positions(task, res.positions)
        return separation(task, pairs, places, res.n_layers, judged, positions,
                          family.n_sequences, seed, model, gate)

    def keeps_all(at: Distribution) -> bool:  # every kept layer's learner live (`keeps`)
        task = at.task(own_task.n_dims, seed)
        positions = "last" if fixed_n else designed_positions(task, res.positions)
        live = live_learners(task, pairs, places, res.n_layers, designed_cfg, positions, model)
        return all(live[layer] is not False for layer in keep)

    # every option at its own scale (`matched_scale`): a PQ model's preconditioner is fixed
    tried: dict[Distribution, tuple[Distribution, float]] = {}
    own = objective(own_task, cfg, gate=False)  # the gate's learner: a proxy of the output
    gate = not (own > 0 and objective(own_task, cfg) == 0)  # that fails on the own task: none
    keep = [layer for layer, live in live_learners(  # the layers whose learner is live there
        own_task, pairs, places, res.n_layers, cfg, "last" if fixed_n else res.positions,
        model).items() if live]
    mine = own_curvature(model, cfg, res.positions)
    current, unjudged = nearest_distribution(own_task, family), set()
    with tqdm(desc=f"{res.name}: designing the evaluation", disable=not progress, ncols=WIDTH,
              unit=" distributions", leave=False) as bar:  # closed before an error is told
        for factor in FACTORS:  # coordinate ascent: each factor's best, the others held
            options = family.options(factor, current, own_task.n_dims, own_task.n_points,
                                     fixed_n, least_n)
            for option in options:
                if option not in tried:
                    at = dataclasses.replace(option, scale=matched_scale(
                        model, cfg, res.positions, option, seed, mine))
                    tried[option] = (at, objective(at.task(own_task.n_dims, seed),
                                                   designed_cfg, gate))
                    unjudged |= {option} if tried[option][1] > 0 and keep else set()
                    bar.update()
            current = _best(options, tried, unjudged, keeps_all)
    chosen, value = tried[current]
    return Design(chosen, value, own, list(tried.values()), pairs, seed)


def _best(options: Sequence[Distribution], tried: dict[Distribution, tuple[Distribution, float]],
          unjudged: set[Distribution], keeps_all: Callable[[Distribution], bool]
          ) -> Distribution:
    """The option of largest objective (ties: the earlier) that keeps every layer live.

    Only a contender is put to the gate (`keeps`, the costly test: the evaluation's own
    sequences): the best not yet judged, until the best has been; one that fails gets
    objective 0 in ``tried`` (in place). The gate only lowers an objective, so the choice is
    that of gating every option; an option never the best of its factor keeps its pairs'
    separation, ungated, in ``tried``.
    """
    while True:
        best = max(options, key=lambda o: (tried[o][1], -list(options).index(o)))
        if best not in unjudged:
            return best
        unjudged.discard(best)
        if not keeps_all(tried[best][0]):
            tried[best] = (tried[best][0], 0.0)


def _design_arguments(model: Regressor, res: AlignResult, cfg: AlignConfig | None,
                      family: DesignFamily | None, seed: int | None
                      ) -> tuple[AlignConfig, DesignFamily, int, RegressionTask]:
    """`design_evaluation`'s arguments checked: the config, family and seed used, the own task."""
    check_type("design_evaluation", "res", res, AlignResult, "align's AlignResult")
    cfg, family = checked_arguments("design_evaluation", model, cfg, family)
    seed = cfg.seed if seed is None else check_seed("design_evaluation", "seed", seed)
    if res.answer is None or not res.answer.places:
        raise InputError(f"{res.name}: the designed evaluation needs the answer's matched "
                         "columns (run align with the fitted view on)")
    own_task = evaluation_task(model, cfg)
    _check_belongs(model, res, own_task, seed)
    n, d = own_task.n_points, own_task.n_dims  # the designed data's n is at most the own
    check_bytes(family.n_sequences * n * (d + 1 + 2 * d * d) * 8,  # data, prefix statistics
                f"DesignFamily.n_sequences={family.n_sequences}: judging a distribution")
    return cfg, family, seed, own_task


def checked_arguments(who: str, model: Regressor, cfg: AlignConfig | None,
                      family: DesignFamily | None, **given: tuple[Any, type, str]
                      ) -> tuple[AlignConfig, DesignFamily]:
    """The designed evaluation's common arguments checked, with the config and family used.

    ``given``: further arguments, name -> (value, its type, what it must be), checked where
    not None.
    """
    check_type(who, "model", model, Regressor, "an iclprobe model (a Regressor)")
    for name, (value, kind, what) in given.items():
        if value is not None:
            check_type(who, name, value, kind, what)
    cfg = AlignConfig() if cfg is None else check_type(who, "cfg", cfg, AlignConfig,
                                                       "an AlignConfig")
    family = DesignFamily() if family is None else check_type(who, "family", family,
                                                              DesignFamily, "a DesignFamily")
    return cfg, family


def _check_belongs(model: Regressor, res: AlignResult, task: RegressionTask, seed: int) -> None:
    """Refuse a result computed for another model or other data than ``model``'s ``task``."""
    d = res.task.get("n_dims")
    if d != task.n_dims:
        raise InputError(f"design_evaluation: res ({res.name}) was aligned on data of "
                         f"n_dims {d!r}, the model's evaluation task has n_dims {task.n_dims}: "
                         "pass align's result for this model and cfg")
    assert res.answer is not None  # checked by the caller
    claims = family_runs(model, task.sample(2, generator=seed))[0]
    foreign = [k for k in res.answer.places if k not in algorithms.LEARNERS and k not in claims]
    if foreign:
        raise InputError(f"design_evaluation: res ({res.name}) names candidates {foreign} that "
                         "are neither registered learners nor learners this model claims: it "
                         "is the result of another model, or of another cfg's data")
