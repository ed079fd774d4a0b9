"""Best-matching step per layer, its ties, and fits of matched step against layer.

Fu et al. 2024 (Fig. 3a): the best-matching Newton step grows linearly with depth, the
best GD step exponentially. Both lines are fitted — step ∝ layer and log₂ step ∝ layer —
so a report can say which explains the matched steps better. The matched steps lie on the
learner's step grid, and a doubling grid (GD's 1, 2, 4, …) bends a line: 3l rounded to it
reads 4, 8, 8, 16, 16, 16, 16, 32, which log₂ fits better. So each line is also rounded to
the grid and both fitted again (`Match.grid_bias`): a verdict for one line stands only
where the steps favour it by more than the other line, rounded, would. Ties (steps within ``tol``
of the best) are reported, as are layers whose best match does not beat the zero
predictor by more than its bootstrap interval: a layer that computes nothing matches any
learner's first tiny step, so by default fits use only the layers above the zero
predictor. A fit over fewer than three layers, or of a constant series, is undefined (no
slope, no R²) rather than a perfect line. `match_runs` is `align`'s stage: every run's
tables under every metric, matched, and which layers compute something.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import torch

from iclprobe._checks import check_type, is_int
from iclprobe._finite import all_finite
from iclprobe.algorithms.base import LEARNERS, learner_info
from iclprobe.alignment.evaluation import Evaluation
from iclprobe.alignment.measuring.layers import Layers
from iclprobe.alignment.measuring.liveness import live_layers
from iclprobe.alignment.measuring.runs import Learners
from iclprobe.alignment.measuring.similarities import Similarity, first_best, similarity
from iclprobe.errors import InputError, InputTypeError

MIN_FIT_LAYERS = 3


@dataclasses.dataclass
class Fit:
    """Least-squares line ``step ≈ slope · layer + intercept`` (log₂ step if ``log2``).

    ``slope``, ``intercept`` and ``r2`` are None when the fit is undefined; ``reason``
    then says why.
    """

    slope: float | None
    intercept: float | None
    r2: float | None
    layers: list[int]
    log2: bool
    reason: str | None = None

    @property
    def defined(self) -> bool:
        """Whether the line exists (enough layers, a varying series)."""
        return self.slope is not None

    def describe(self) -> str:
        """One line: slope and R², or why there is no fit."""
        scale = "log2(step)" if self.log2 else "step"
        if not self.defined:
            return f"{scale} vs layer: undefined ({self.reason})"
        span = f"layers {self.layers[0]}..{self.layers[-1]}" if self.layers else "no layers"
        return f"{scale} vs layer over {span}: slope {self.slope:.2f}, R² {self.r2:.2f}"


@dataclasses.dataclass
class Match:
    """Per layer: the best step, its value, the tied steps, and whether it beats zero."""

    learner: str
    metric: str
    best_step: list[int]
    best_value: list[float]
    ties: list[list[int]]
    above_zero: list[bool]
    fit: Fit | None  # on the learner's own step scale (log₂ for GD-like learners)
    fits: dict[str, Fit] = dataclasses.field(default_factory=dict)  # "linear", "log2"
    best_column: list[int] = dataclasses.field(default_factory=list)
    #: "linear": how much better log₂ fits the linear fit's line rounded to the step grid
    #: (R² of log₂ minus R² of the line); "log2": how much better the line fits the log₂
    #: fit's curve rounded to it; None where that fit or a refit is undefined
    grid_bias: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """As JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        """One row per layer."""
        rows = ["layer,best_step,best_value,ties,above_zero"]
        for layer, (s, v, t, z) in enumerate(zip(self.best_step, self.best_value, self.ties,
                                                 self.above_zero)):
            rows.append(f"{layer},{s},{v:.6g},{' '.join(map(str, t))},{z}")
        return "\n".join(rows) + "\n"


def fit_line(layers: Sequence[int], steps: Sequence[float]) -> tuple[float, float, float] | None:
    """Slope, intercept and R² of ordinary least squares; None if undefined.

    Undefined: fewer than two distinct layers, or a constant series (R² = 0/0).
    """
    x = torch.tensor(list(layers), dtype=torch.float64)
    y = torch.tensor(list(steps), dtype=torch.float64)
    if x.numel() != y.numel():
        raise InputError(f"layers and steps differ in length: {x.numel()} and {y.numel()}")
    if not all_finite(y):
        raise InputError(f"steps must be finite, got {list(steps)}")
    xc, yc = x - x.mean(), y - y.mean()
    sxx, ss_tot = (xc * xc).sum(), (yc * yc).sum()
    if x.numel() < 2 or sxx <= 0 or ss_tot <= 0:
        return None
    slope = (xc * yc).sum() / sxx
    intercept = y.mean() - slope * x.mean()
    ss_res = ((y - slope * x - intercept) ** 2).sum()
    return float(slope), float(intercept), float(1.0 - ss_res / ss_tot)


def fit_steps(layers: Sequence[int], steps: Sequence[int], log2: bool,
              min_layers: int = MIN_FIT_LAYERS) -> Fit:
    """The fit of ``steps`` (or log₂ steps) against ``layers``, undefined where it must be."""
    layers = list(layers)
    if log2:
        dropped = [layer for layer, s in zip(layers, steps) if s <= 0]
        pairs = [(layer, math.log2(s)) for layer, s in zip(layers, steps) if s > 0]
    else:
        dropped, pairs = [], [(layer, float(s)) for layer, s in zip(layers, steps)]
    used = [layer for layer, _ in pairs]
    if len(pairs) < min_layers:
        why = f"{len(pairs)} layer{'s' if len(pairs) != 1 else ''} to fit, {min_layers} needed"
        if dropped:
            why += f" (step 0 at layers {dropped} has no log2)"
        return Fit(None, None, None, used, log2, why)
    line = fit_line(used, [v for _, v in pairs])
    if line is None:
        return Fit(None, None, None, used, log2, "the matched steps are constant")
    return Fit(*line, used, log2)


def on_grid(values: Sequence[float], grid: Sequence[int]) -> list[int]:
    """Each value's nearest step of ``grid`` on a log scale (≤ 0: the smallest step > 0)."""
    positive = sorted(s for s in set(grid) if s > 0)
    if not positive:
        return [min(grid)] * len(values)
    return [min(positive, key=lambda s: abs(math.log2(s) - math.log2(v))) if v > 0
            else positive[0] for v in values]


def grid_bias(layers: Sequence[int], fits: dict[str, Fit], grid: Sequence[int]
              ) -> dict[str, float | None]:
    """`Match.grid_bias`: each defined line rounded to ``grid``, both lines fitted again."""
    out: dict[str, float | None] = {"linear": None, "log2": None}
    for scale, fit in fits.items():
        if not fit.defined:
            continue
        assert fit.slope is not None and fit.intercept is not None
        line = [fit.slope * layer + fit.intercept for layer in layers]
        rounded = on_grid([2.0 ** v for v in line] if fit.log2 else line, grid)
        lin, log = (fit_steps(layers, rounded, log2, len(layers)) for log2 in (False, True))
        if lin.defined and log.defined:
            assert lin.r2 is not None and log.r2 is not None
            out[scale] = log.r2 - lin.r2 if scale == "linear" else lin.r2 - log.r2
    return out


#: the R² margin within which two lines fit about equally
GROWTH_MARGIN = 0.02
GRID_BENDS = "both lines fit about equally on this step grid"


def growth_verdict(linear: Fit, log2: Fit, bias: dict[str, float | None] | None = None
                   ) -> str:
    """Which line explains the matched steps better ("" unless both are defined).

    ``bias`` (`Match.grid_bias`): a line wins only by more than the other line, rounded to
    the step grid, would lean its way (else `GRID_BENDS`).
    """
    if not (linear.defined and log2.defined):
        return ""
    assert linear.r2 is not None and log2.r2 is not None
    lead = log2.r2 - linear.r2  # > 0: log₂ fits better
    if abs(lead) < GROWTH_MARGIN:
        return "both lines fit about equally"
    other = (bias or {}).get("linear" if lead > 0 else "log2")
    if other is not None and abs(lead) < other + GROWTH_MARGIN:
        return GRID_BENDS
    return ("step ∝ layer explains better" if lead < 0 else
            "log₂ step ∝ layer (exponential growth) explains better")


#: `growth_verdict`'s verdicts as the screen's step-growth lines say them
GROWTH_WORDS = {"both lines fit about equally": "either line", GRID_BENDS: "either line on this "
                "grid", "step ∝ layer explains better": "linear", "log₂ step ∝ layer "
                "(exponential growth) explains better": "exponential"}


def _match_arguments(sim: Any, steps: Any, tol: Any, layers: Any, log2: Any, live: Any
                     ) -> tuple[list[int], list[int], list[bool] | None]:
    """`match_steps`' arguments checked: the steps, the layers fitted, ``live`` as a list."""
    check_type("match_steps", "sim", sim, Similarity, "a Similarity table (`similarity`)")
    given = list(sim.steps if steps is None else
                 steps.tolist() if isinstance(steps, torch.Tensor) else steps)
    if not all(is_int(s) and s >= 0 for s in given):
        raise InputError(f"match_steps: steps must be step counts, integers >= 0, got "
                         f"{given[:8]}{' ...' if len(given) > 8 else ''}")
    n_layers, n_steps = sim.values.shape
    if len(given) != n_steps:
        raise InputError(f"steps has {len(given)} entries, the table has {n_steps} columns")
    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise InputError(f"tol must be a number >= 0, got {tol!r}")
    layers = list(range(1, n_layers) if layers is None else layers)
    bad = [layer for layer in layers if not is_int(layer) or not 0 <= layer < n_layers]
    if bad:
        raise InputError(f"layers {bad} out of range: the table has layers 0..{n_layers - 1}")
    if not all_finite(sim.values):
        raise InputError(f"match_steps: the {sim.metric} table of {sim.learner} holds NaN or Inf")
    live = live.tolist() if isinstance(live, torch.Tensor) else live
    if live is not None and len(live) != n_layers:
        raise InputError(f"live has {len(live)} entries, the table has {n_layers} layers")
    if live is not None and not all(isinstance(v, bool) for v in live):
        raise InputTypeError(f"match_steps: live must hold a bool per layer, got {live!r:.60}")
    if log2 is not None and not isinstance(log2, bool):
        raise InputTypeError(f"match_steps: log2 must be a bool or None, got {log2!r}")
    return [int(s) for s in given], [int(x) for x in layers], \
        None if live is None else list(live)


def match_steps(sim: Similarity, steps: Sequence[int] | torch.Tensor | None = None,
                tol: float = 1e-3, layers: Sequence[int] | None = None,
                log2: bool | None = None, live: Sequence[bool] | None = None,
                fit_dead: bool = False, min_fit_layers: int = MIN_FIT_LAYERS) -> Match:
    """Best step per layer (the first maximum; ties within ``tol``) and step-vs-layer fits.

    Args:
        sim: a `Similarity` table.
        steps: the step counts of its columns (default: ``sim.steps``).
        tol: steps whose value is within ``tol`` of the best are reported as ties.
        layers: the layers the lines may be fitted over (default: 1..L, the blocks).
        log2: the scale of ``fit`` (default: the learner's registered ``step_scale``).
        live: per layer, whether it computes something (default: its best match clears
            the zero predictor's value beyond the bootstrap bound, ``above_zero``). Pass the
            error-cosine verdict when matching weight-cosine tables, whose zero reference
            (cosine with the zero vector) is 0 and says nothing.
        fit_dead: include layers that are not live in the fits.
        min_fit_layers: fewer layers than this give an undefined fit.
    """
    steps, layers, live = _match_arguments(sim, steps, tol, layers, log2, live)
    n_layers, n_steps = sim.values.shape
    sign = 1.0 if sim.higher_is_better else -1.0
    score = sign * sim.values  # higher is better from here on
    best = first_best(score)  # the first maximum, to round-off
    best_step = [steps[int(i)] for i in best]
    best_score = score.max(dim=1).values
    tied = (score >= (best_score - tol)[:, None]).tolist()
    ties = [[steps[k] for k in range(n_steps) if tied[layer][k]] for layer in range(n_layers)]
    rows = torch.arange(n_layers)
    bound = (sim.lower if sim.higher_is_better else sim.upper)[rows, best]
    above_zero = [bool(sign * bound[layer] > sign * sim.zero[best[layer]] + tol)
                  for layer in range(n_layers)]
    alive = list(above_zero if live is None else live)
    fit_layers = [layer for layer in layers if fit_dead or alive[layer]]
    fit_vals = [best_step[layer] for layer in fit_layers]
    fits = {"linear": fit_steps(fit_layers, fit_vals, False, min_fit_layers),
            "log2": fit_steps(fit_layers, fit_vals, True, min_fit_layers)}
    if log2 is None:
        info = LEARNERS.get(sim.learner)
        log2 = info is not None and info.step_scale == "log2"
    return Match(sim.learner, sim.metric, best_step, [float(sign * v) for v in best_score],
                 ties, above_zero if live is None else [bool(v) for v in live],
                 fits["log2" if log2 else "linear"], fits, [int(i) for i in best],
                 grid_bias(fit_layers, fits, steps))


@dataclasses.dataclass(frozen=True)
class Matched:
    """Every run's tables under every metric, matched, and which layers compute something.

    Attributes:
        live: per layer, whether it computes something (`liveness.live_layers`).
        sims: run -> metric -> its similarity table.
        matches: run -> metric -> the best step per layer, fitted over the live layers.
        error_matches: run -> its error-cosine match with no liveness applied: where the
            run beats the zero predictor, and the step that best matches each layer.
    """

    live: list[bool]
    sims: dict[str, dict[str, Similarity]]
    matches: dict[str, dict[str, Match]]
    error_matches: dict[str, Match]

    @property
    def matched(self) -> list[bool]:
        """Per layer: some run matches it better than the zero predictor does."""
        return [any(m.above_zero[layer] for m in self.error_matches.values())
                for layer in range(len(self.live))]


def match_runs(ev: Evaluation, layers: Layers, learners: Learners) -> Matched:
    """`align`'s stage: per run and metric, the similarity table and its best steps.

    Each table is on the metric's positions and sequences (`Evaluation.rows`, `t_min`,
    `over`), with the evaluation's bootstrap. Liveness comes from the error cosine for every
    metric: a match counts where the layer is live and the run beats the zero predictor
    there by the error cosine (the zero reference of other metrics, a cosine with the zero
    vector or a distance to 0, says nothing of a layer).
    """
    live = live_layers(layers.preds, ev.ys, ev.window, **ev.bootstrap)
    tol, fit_dead = ev.protocol.tie_tol, ev.cfg.fit_layers == "all"
    sims, matches, error_matches = {}, {}, {}
    for key, spec in ev.runs.items():
        tables = {m: similarity(layers.of(m), learners.of(m)[key], ev.ys[ev.rows(m)], m,
                                t_min=ev.t_min(m), t_max=ev.window[1], over=ev.over(m),
                                **ev.bootstrap)
                  for m in dict.fromkeys([*ev.cfg.metrics, "error_cosine"])}
        log2 = learner_info(spec.learner).step_scale == "log2"
        error_matches[key] = match_steps(tables["error_cosine"], tol=tol, log2=log2)
        above = [a and b for a, b in zip(live, error_matches[key].above_zero)]
        sims[key] = {m: tables[m] for m in ev.cfg.metrics}
        matches[key] = {m: match_steps(tables[m], tol=tol, log2=log2, live=above,
                                       fit_dead=fit_dead) for m in ev.cfg.metrics}
    return Matched(live, sims, matches, error_matches)
