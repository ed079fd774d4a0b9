"""The known-answer benchmark: how often `align` names the wrong learner.

Each cell aligns one known-answer model (`constructions`) under one protocol, evaluation
data and readout. Its truths: GD and Newton (oracles and the PQ constructions), ridge,
conjugate gradient, heavy-ball momentum and online GD (oracles), and two models whose
right answer is "cannot tell" or "none of them" (the average of GD's and Newton's
predictions, and GD preconditioned by a fixed random SPD matrix). `scoring` counts, per
view, the live layers that get the true learner, a false attribution or neither. A cell
whose model runs at or beyond its learner's stability bound on the evaluation data is
reported as ``diverges`` and not counted. ``bench/known_answers.py`` runs the grid;
docs/known-answers.md explains how to read it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

from iclprobe import algorithms, tasks
from iclprobe.algorithms.prefix import prefix_stats
from iclprobe.alignment.design import DesignFamily, align_designed
from iclprobe.alignment.measuring.layers import probe_rows
from iclprobe.alignment.pipeline import AlignConfig, AlignResult, align, evaluation_task
from iclprobe.constructions import evaluations, scoring
from iclprobe.constructions.oracle import oracle
from iclprobe.constructions.pq import gd_transformer, newton_transformer, newton_transformer_alpha
from iclprobe.errors import InputError
from iclprobe.models.base import Regressor
from iclprobe.tasks.covariance import random_orthogonal

KINDS = ("gd oracle", "newton oracle", "gd construction", "newton construction")
#: Truths beyond Newton and GD (oracles, under the iclprobe protocol: the answer's view
#: does not depend on a protocol's step rule), and the two cells with no learner to name.
NEW_KINDS = ("ridge oracle", "cg oracle", "momentum oracle", "online_gd oracle",
             "blend oracle", "random pgd oracle")
#: Kinds of the "hard" slice only: GD oracles run long (steps 500–16000 at 0.3/λ_max per
#: prefix), models aligned at their last position (the Newton construction diverges at
#: shorter prefixes; a GD oracle on κ = 1000 data).
HARD_KINDS = ("gd oracle long", "gd oracle last", "newton construction last")
TRUTH: dict[str, str | None] = {
    "gd oracle": "gd", "newton oracle": "newton", "gd construction": "gd",
    "newton construction": "newton", "gd oracle long": "gd", "gd oracle last": "gd",
    "newton construction last": "newton", "ridge oracle": "ridge", "cg oracle": "cg",
    "momentum oracle": "momentum", "online_gd oracle": "online_gd", "blend oracle": None,
    "random pgd oracle": None}
#: GD steps of a long oracle's 8 layers: 500 at layer 1 to 16000 at layer 8 (geometric)
LONG_STEPS = tuple([0] + [round(500 * 2 ** (5 * (layer - 1) / 7)) for layer in range(1, 9)])
PROTOCOLS = ("iclprobe", "fu2024")
DATA = ("isotropic", "ill-conditioned")
READOUTS = ("exact", "probe")
METRICS = ("error_cosine", "weight_cosine", "spd", "ilwd")  # every built-in metric
N_LAYERS = 8
#: further sequences the probe cells' cross-fitted probes are fitted on where they are
#: fitted to y (align's ``probe_extra_sequences``; ``probe_target="y"``): the probes' own
#: error shrinks with their rows (docs/known-answers.md, "Probes fitted on more
#: sequences"); probes fitted to the column a layer holds best need none
PROBE_EXTRA_SEQUENCES = 1024
RANDOM_PGD_KAPPA = 20.0  # condition number of the random preconditioner


@dataclasses.dataclass(frozen=True)
class Setting:
    """The data and step sizes of a slice of the grid."""

    n_dims: int
    n_points: int
    seed: int  # of the evaluation data (and of the oracles' rotations)
    condition_number: float  # κ of the ill-conditioned evaluation data
    oracle_multipliers: tuple[float, ...]  # of each protocol's rule
    construction_fractions: tuple[float, ...]  # of the stability bound on the batch
    ridge_lams: tuple[float, ...] = ()  # λ of the ridge oracles
    momentum_betas: tuple[float, ...] = (0.5, 0.9)
    online_scales: tuple[float, ...] = ()  # relaxations of online GD's Kaczmarz steps


#: The slice views are chosen on, and held-out ones they are judged on as well (other
#: seed, d, n, κ and step multipliers). "held-out" informed one choice (Newton's step-size
#: multiples √2 apart, after its 0.7 × 1/‖SSᵀ‖_F fell between octave-spaced ones), so
#: "fresh", added after that choice and used for none, is the clean test.
SETTINGS = {
    "main": Setting(5, 21, 0, 100.0, (0.5, 1.0, 2.0), (0.3, 0.6, 0.9), (0.1, 1.0, 10.0),
                    online_scales=(0.5, 1.0, 1.5)),
    "held-out": Setting(4, 17, 7, 50.0, (0.7, 1.5), (0.45, 0.75), (0.3, 3.0),
                        online_scales=(0.7, 1.2)),
    "fresh": Setting(6, 19, 11, 30.0, (0.6, 1.3), (0.4, 0.8), (0.05, 20.0),
                     online_scales=(0.6, 1.3)),
    # held out too, cells found off the grid (`hard_cells`): d = 10 and d = 3, κ = 1000
    "hard-d10": Setting(10, 21, 13, 1000.0, (0.3,), (0.15, 0.5)),
    "hard-d3": Setting(3, 9, 17, 1000.0, (1.0,), (0.15, 0.5)),
}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One alignment of the grid."""

    kind: str
    protocol: str
    data: str
    readout: str
    multiplier: float  # of the protocol's rule, the stability bound, λ (ridge), steps (CG)
    setting: str = "main"  # a key of SETTINGS
    condition_number: float | None = None  # κ of the data, where not the setting's
    beta: float | None = None  # heavy ball's momentum

    @property
    def truth(self) -> str | None:
        """The learner the model runs (None: no learner; "cannot tell" or "none" is right)."""
        return TRUTH[self.kind]


@dataclasses.dataclass
class CellResult:
    """The counts of a cell per view (or ``diverges``)."""

    cell: Cell
    diverges: bool
    counts: dict[str, dict[str, int]]  # view -> {"true", "false", "none", ...}
    verdicts: dict[str, list[str]]  # view -> the label per layer
    hyper: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {**dataclasses.asdict(self.cell), "truth": self.cell.truth,
                "diverges": self.diverges, "counts": self.counts, "verdicts": self.verdicts,
                "hyper": {k: v for k, v in self.hyper.items() if not isinstance(v, torch.Tensor)}}


def grid(kinds: tuple[str, ...] = KINDS + NEW_KINDS, protocols: tuple[str, ...] = PROTOCOLS,
         data: tuple[str, ...] = DATA, readouts: tuple[str, ...] = READOUTS,
         multipliers: tuple[float, ...] | None = None, setting: str = "main"
         ) -> Iterator[Cell]:
    """Every cell of the benchmark (or of the slice the arguments choose)."""
    if setting.startswith("hard"):
        yield from hard_cells(setting, protocols, readouts)
        return
    for kind, d, readout in itertools.product(kinds, data, readouts):
        for protocol in (protocols if kind in KINDS else ("iclprobe",)):
            for m, beta in _multipliers(kind, SETTINGS[setting], multipliers):
                yield Cell(kind, protocol, d, readout, m, setting, beta=beta)


def _multipliers(kind: str, spec: Setting, given: tuple[float, ...] | None
                 ) -> list[tuple[float, float | None]]:
    """A kind's (multiplier, β) pairs in a setting."""
    if given is not None:
        return [(m, None) for m in given]
    if kind == "momentum oracle":
        return [(m, b) for b in spec.momentum_betas for m in spec.oracle_multipliers]
    by_kind = {"ridge oracle": spec.ridge_lams, "online_gd oracle": spec.online_scales,
               "cg oracle": (0.5, 0.75, 1.0), "blend oracle": (1.0,), "random pgd oracle": (1.0,)}
    mults = by_kind.get(kind) or (spec.oracle_multipliers if "oracle" in kind
                                  else spec.construction_fractions)
    return [(m, None) for m in mults]


def hard_cells(setting: str, protocols: tuple[str, ...] = PROTOCOLS,
               readouts: tuple[str, ...] = READOUTS) -> Iterator[Cell]:
    """The cells of a "hard" slice: each kind off the grid, × protocols × readouts."""
    spec = SETTINGS[setting]
    chosen: list[tuple[str, str, float, float | None]] = []  # kind, data, multiplier, κ
    if setting == "hard-d10":
        chosen += [("gd oracle long", "ill-conditioned", spec.oracle_multipliers[0], k)
                   for k in (10.0, 1000.0)]
    else:
        chosen += [("gd oracle last", "ill-conditioned", spec.oracle_multipliers[0], None)]
    chosen += [("newton construction last", "isotropic", f, None)
               for f in spec.construction_fractions]
    for (kind, data, m, kappa), protocol, readout in itertools.product(chosen, protocols,
                                                                        readouts):
        yield Cell(kind, protocol, data, readout, m, setting, kappa)
    if setting == "hard-d10":  # dead layers read by probes under fu2024 (Newton's 0 and 1)
        for readout in readouts:
            yield Cell("newton construction", "fu2024", "ill-conditioned", readout, 0.3, setting)


def random_spd(n_dims: int, kappa: float, seed: int) -> torch.Tensor:
    """A fixed SPD matrix with eigenvalues geometric from 1 to κ, in a Haar-random basis."""
    q = random_orthogonal(n_dims, torch.Generator().manual_seed(seed))
    eig = kappa ** torch.linspace(0.0, 1.0, n_dims, dtype=torch.float64)
    return (q * eig) @ q.T


def oracle_spec(cell: Cell, n_dims: int, seed: int) -> tuple[str, Any, dict[str, Any]]:
    """The oracle's learner, step of each layer, and hyperparameters."""
    truth, m = cell.truth, cell.multiplier
    if cell.kind == "gd oracle long":  # the rule at 0.3/λ_max per prefix, run long
        return "gd", list(LONG_STEPS), {"lr": "max", "normalize": True, "lr_scale": m}
    if truth in ("gd", "newton"):
        return truth, (lambda layer: 3 * layer) if truth == "gd" else (lambda layer: layer), \
            _oracle_hyper(truth, cell.protocol, m)
    if cell.kind == "ridge oracle":
        return "ridge", lambda layer: 0, {"lam": m}
    if cell.kind == "cg oracle":  # step ⌊m·l⌋: at m = 1/2 every layer is short of d steps
        return "cg", lambda layer: int(m * layer), {}
    if cell.kind == "momentum oracle":
        return "momentum", lambda layer: 2 * layer, {"lr": "max", "lr_scale": m, "beta": cell.beta}
    if cell.kind == "online_gd oracle":
        return "online_gd", lambda layer: layer, {"lr": "normalized", "lr_scale": m}
    if cell.kind == "blend oracle":  # from step 1: at step 0 it is Newton's at α/2
        return "gd_newton_blend", lambda layer: layer + 1, {"lr": "max", "lr_scale": m}
    precond = random_spd(n_dims, RANDOM_PGD_KAPPA, seed + 101)
    return "pgd", lambda layer: 3 * layer, {"precond": precond.tolist(), "lr": "max", "lr_scale": m}


def _oracle_hyper(truth: str, protocol: str, m: float) -> dict[str, Any]:
    """The protocol's rule for the true learner, times m."""
    if truth == "gd":
        return {"lr": "max", "normalize": True, "lr_scale": m} if protocol == "iclprobe" \
            else {"lr": 0.01 * m, "normalize": False}
    return {"alpha": "frobenius", "alpha_scale": m}  # both protocols' α: 1/‖SSᵀ‖_F


def diverges(truth: str, hyper: dict[str, Any], xs: torch.Tensor, t_min: int) -> bool:
    """Whether the learner's rule is unstable on these data.

    Unstable: at or on its stability bound (GD: η c λ_max ≥ 2; Newton–Schulz:
    α λ_max² ≥ 2) at most (sequence, prefix ≥ t_min) pairs (GD at 2/λ_max sits on it
    everywhere), or beyond it at some prefix of most sequences (Newton at 4/‖SSᵀ‖_F, on
    every rank-deficient prefix). A bound met only at rank-1 prefixes (2/‖SSᵀ‖_F at
    t = 1) is not divergence. Other learners' oracles run within their bounds.
    """
    if truth not in ("gd", "newton"):
        return False
    lam = prefix_stats(xs.double(), torch.zeros(xs.shape[:2], dtype=torch.float64)).eigvals
    lam = lam[:, max(t_min, 1):]
    top = lam[..., -1]
    if truth == "gd":
        t = torch.arange(max(t_min, 1), xs.shape[1], dtype=torch.float64)
        if hyper["lr"] == "max":
            rate = torch.full_like(top, hyper["lr_scale"])
        else:
            rate = hyper["lr"] * top / (t if hyper["normalize"] else 1.0)
    else:
        numerator = 1.0 if hyper["alpha"] == "frobenius" else 2.0
        rate = hyper["alpha_scale"] * numerator * top**2 / lam.pow(4).sum(-1).sqrt()
    on_bound = float((rate >= 2.0 - 1e-6).double().mean())
    beyond = float((rate > 2.0 + 1e-6).any(-1).double().mean())
    return on_bound > 0.5 or beyond > 0.5


def _stability_bound(kind: str, xs: torch.Tensor, positions: str) -> float:
    """The largest stable constant of a construction on this batch (lr, or Newton's a)."""
    stats = prefix_stats(xs.double(), torch.zeros(xs.shape[:2], dtype=torch.float64))
    t = torch.arange(xs.shape[1], dtype=torch.float64).clamp(min=1)
    top = stats.eigvals[..., -1] / t  # λ_max(S_t / t)
    top = top[:, -1:] if positions == "last" else top[:, 1:]
    if kind == "gd construction":
        return float(2.0 / top.max())
    return float(2.0 / top.pow(2).max())


def evaluation_batch(task: tasks.RegressionTask, cfg: AlignConfig) -> tasks.RegressionBatch:
    """The sequences `align` evaluates a model of ``task`` on under ``cfg``."""
    eval_task = evaluation_task(SimpleNamespace(task=task), cfg)  # type: ignore[arg-type]
    return eval_task.sample(cfg.n_sequences, generator=torch.Generator().manual_seed(cfg.seed))


@dataclasses.dataclass
class Built:
    """A cell's model, what it runs, and the AlignConfig it is aligned under."""

    model: Regressor
    hyper: dict[str, Any]
    diverges: bool
    cfg: AlignConfig
    truth_columns: Any  # (xs, ys, weights) -> Iterates: each layer's own column


def build(cell: Cell, cfg: AlignConfig) -> Built:
    """The cell's model, its hyperparameters, whether it diverges, its AlignConfig."""
    spec = SETTINGS[cell.setting]
    d = spec.n_dims
    task = tasks.RegressionTask(n_dims=d, n_points=spec.n_points)
    cfg = dataclasses.replace(cfg, protocol=cell.protocol, data=cell.data, seed=spec.seed,
                              condition_number=cell.condition_number or spec.condition_number)
    exact = cell.readout == "exact"
    if "oracle" in cell.kind:
        learner, steps, hyper = oracle_spec(cell, d, spec.seed)
        model = oracle(learner, d, N_LAYERS, steps, task=task, exact_readout=exact,
                       seed=spec.seed, **hyper)
        cfg = dataclasses.replace(cfg, positions="last" if cell.kind.endswith("last") else "all")
        batch = evaluation_batch(task, cfg)
        t_min = batch.xs.shape[1] - 1 if cfg.positions == "last" else \
            1 if cell.protocol == "iclprobe" else 0
        unstable = cell.truth is not None and diverges(cell.truth, hyper, batch.xs, t_min)
        return Built(model, hyper, unstable, cfg, model.iterates)
    positions = "last" if cell.kind in ("gd construction", "newton construction last") \
        else "all"
    cfg = dataclasses.replace(cfg, positions=positions)
    batch = evaluation_batch(task, cfg)
    value = cell.multiplier * _stability_bound(cell.kind, batch.xs, positions)
    inside = torch.zeros(spec.n_points, dtype=torch.float64)  # where the model is aligned
    inside[-1 if positions == "last" else 0:] = 1.0
    if cell.kind == "gd construction":
        pq, hyper = gd_transformer(d, N_LAYERS, lr=value), {"lr": value}

        def columns(xs: torch.Tensor, ys: torch.Tensor, weights: bool = False
                    ) -> algorithms.Iterates:
            return algorithms.iterates("gd", xs.double(), ys.double(), steps=range(N_LAYERS + 1),
                                       lr=value * inside, normalize=True, weights=weights)
    else:
        pq, hyper = newton_transformer(d, N_LAYERS + 4, a=value), {"a": value}
        alpha = newton_transformer_alpha(value, spec.n_points) * inside

        def columns(xs: torch.Tensor, ys: torch.Tensor, weights: bool = False
                    ) -> algorithms.Iterates:
            it = algorithms.iterates("newton", xs.double(), ys.double(),
                                     steps=[0, 0, *range(N_LAYERS + 3)], alpha=alpha,
                                     weights=weights)
            zero = torch.zeros_like(it.preds[:2])  # layers 0 and 1 predict 0
            w = None if it.weights is None else torch.cat([torch.zeros_like(it.weights[:2]),
                                                           it.weights[2:]])
            return algorithms.Iterates(it.steps, torch.cat([zero, it.preds[2:]]), w, it.hyper)
    pq.task = task
    pq.exact_layer_readout = exact  # type: ignore[misc]
    return Built(pq, hyper, False, cfg, columns)


def run_cell(cell: Cell, cfg: AlignConfig, design: bool = False,
             named: list[int] | None = None) -> CellResult:
    """Align the cell's model and count its verdicts and answers per view (`scoring`).

    ``named``: for a probe cell, the layers its exact twin's answer names the truth at
    (`named_layers`): the truth's separability through probes is measured only where the
    probes miss one of them (None: where they miss the truth at any live layer).

    ``design``: count the alignment on the designed data instead (`alignment.design`; n
    kept, as a construction's truth is written for its own length), or on its own task
    where the model is out of distribution there (that answer is not used).
    """
    built = build(cell, cfg)
    if built.diverges:
        return CellResult(cell, True, {}, {}, built.hyper)
    try:
        res: AlignResult = align(built.model, built.cfg)
    except InputError:
        # a model sized on the evaluation batch can diverge on fresh probes' data (an
        # oracle's learner raises `Diverged`, a construction's residuals are not finite):
        # not counted
        if built.cfg.probe_fit != "fresh":
            raise
        return CellResult(cell, True, {}, {}, built.hyper)
    batch = evaluation_batch(built.model.task, built.cfg)  # type: ignore[arg-type]
    hyper, own_batch, done = built.hyper, batch, None
    if design:
        done = align_designed(built.model, built.cfg, own=res,
                              family=DesignFamily(examples=()))
        if done.used is not None:
            res = done.used
            task = done.design.chosen.task(SETTINGS[cell.setting].n_dims, done.design.seed)
            batch = task.sample(built.cfg.n_sequences,
                                generator=torch.Generator().manual_seed(built.cfg.seed))
        hyper = {**hyper, "design": done.design.chosen.to_dict(),
                 "out_of_distribution": done.out_of_distribution}
    t_min = probe_rows(built.model, None)  # the benchmark's probes: align's own
    rows = None if t_min is None else (max(res.window[0], t_min), res.window[1])
    counts, verdicts = scoring.score(res, cell.truth, batch, built.truth_columns, rows, named)
    if done is not None:  # the own task's answer and the answer over both, beside it
        more = evaluations.both_counts(done, own_batch, batch, cell.truth, built.truth_columns)
        counts.update(more[0])
        verdicts.update(more[1])
    return CellResult(cell, False, counts, verdicts, hyper)


def named_layers(result: CellResult) -> list[int]:
    """The layers whose judged answer names the cell's truth (none: no truth, or diverging)."""
    truth = result.cell.truth
    if truth is None or result.diverges:
        return []
    return [i for i, v in enumerate(result.verdicts.get(scoring.JUDGED, []))
            if scoring.names_truth(v, truth)]


def bench_config(n_sequences: int = 256, n_boot: int = 100,
                 probe_target: str = "column") -> AlignConfig:
    """The AlignConfig the benchmark runs.

    Every built-in metric; the candidates are the registered learners (a PQ construction's
    own preconditioned GD restates its truth); no separation views; cross-fitted probes
    fitted to ``probe_target`` (align's), those fitted to y also on
    `PROBE_EXTRA_SEQUENCES` further sequences.
    """
    learners = tuple(i.name for i in algorithms.candidate_learners())
    return AlignConfig(n_sequences=n_sequences, n_boot=n_boot, metrics=METRICS,
                       algorithms=learners, separation=False, probe_target=probe_target,
                       probe_extra_sequences=PROBE_EXTRA_SEQUENCES if probe_target == "y"
                       else 0)
