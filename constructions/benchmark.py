"""The known-answer benchmark: how often `align` names the wrong learner.

Each cell aligns one known-answer model (`constructions`) under one protocol, evaluation
data and readout, and counts, per metric, the live layers whose Newton-vs-GD verdict is
the true learner preferred (``true``), the other one preferred (``false``: a false
attribution) or neither (``none``: leans, indistinguishable). Layers that compute nothing
are not counted. A cell whose known-answer model runs at or beyond its learner's
stability bound on the evaluation data (e.g. Newton at 2 × fu2024's α = 4/‖SSᵀ‖_F) is
reported as ``diverges`` and not counted. ``bench/known_answers.py`` runs the grid and
prints the confusion matrix; docs/known-answers.md explains how to read it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

from iclprobe import tasks
from iclprobe.algorithms.prefix import prefix_stats
from iclprobe.alignment.comparison import PairVerdict, combined
from iclprobe.alignment.config import DEFAULT_METRICS
from iclprobe.alignment.metrics import metric_info
from iclprobe.alignment.pipeline import AlignConfig, align, evaluation_task
from iclprobe.constructions.oracle import oracle
from iclprobe.constructions.pq import gd_transformer, newton_transformer
from iclprobe.models.base import Regressor

KINDS = ("gd oracle", "newton oracle", "gd construction", "newton construction")
#: Kinds of the "hard" slice only: GD oracles run long (steps 500–16000 at 0.3/λ_max per
#: prefix), models aligned at their last position (the Newton construction diverges at
#: shorter prefixes; a GD oracle on κ = 1000 data).
HARD_KINDS = ("gd oracle long", "gd oracle last", "newton construction last")
TRUTH = {"gd oracle": "gd", "newton oracle": "newton", "gd construction": "gd",
         "newton construction": "newton", "gd oracle long": "gd", "gd oracle last": "gd",
         "newton construction last": "newton"}
#: GD steps of a long oracle's 8 layers: 500 at layer 1 to 16000 at layer 8 (geometric)
LONG_STEPS = tuple([0] + [round(500 * 2 ** (5 * (layer - 1) / 7)) for layer in range(1, 9)])
PROTOCOLS = ("iclprobe", "fu2024")
DATA = ("isotropic", "ill-conditioned")
READOUTS = ("exact", "probe")
METRICS = ("error_cosine", "weight_cosine", "spd", "ilwd")  # every built-in metric
N_LAYERS = 8


@dataclasses.dataclass(frozen=True)
class Setting:
    """The data and step sizes of a slice of the grid."""

    n_dims: int
    n_points: int
    seed: int  # of the evaluation data (and of the oracles' rotations)
    condition_number: float  # κ of the ill-conditioned evaluation data
    oracle_multipliers: tuple[float, ...]  # of each protocol's rule
    construction_fractions: tuple[float, ...]  # of the stability bound on the batch


#: The slice views are chosen on, and held-out ones they are judged on as well (other
#: seed, d, n, κ and step multipliers). "held-out" informed one choice (Newton's step-size
#: multiples √2 apart, after its 0.7 × 1/‖SSᵀ‖_F fell between octave-spaced ones), so
#: "fresh", added after that choice and used for none, is the clean test.
SETTINGS = {
    "main": Setting(5, 21, 0, 100.0, (0.5, 1.0, 2.0), (0.3, 0.6, 0.9)),
    "held-out": Setting(4, 17, 7, 50.0, (0.7, 1.5), (0.45, 0.75)),
    "fresh": Setting(6, 19, 11, 30.0, (0.6, 1.3), (0.4, 0.8)),
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
    multiplier: float  # of the protocol's rule (oracles) or of the stability bound
    setting: str = "main"  # a key of SETTINGS
    condition_number: float | None = None  # κ of the data, where not the setting's

    @property
    def truth(self) -> str:
        """The learner the model runs."""
        return TRUTH[self.kind]


@dataclasses.dataclass
class CellResult:
    """The verdict counts of a cell, per metric (or ``diverges``)."""

    cell: Cell
    diverges: bool
    counts: dict[str, dict[str, int]]  # "VIEW METRIC" -> {"true", "false", "none"}
    verdicts: dict[str, list[str]]  # "VIEW METRIC" -> the Newton-vs-GD verdict per layer
    hyper: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {**dataclasses.asdict(self.cell), "truth": self.cell.truth,
                "diverges": self.diverges, "counts": self.counts, "verdicts": self.verdicts,
                "hyper": {k: v for k, v in self.hyper.items() if not isinstance(v, torch.Tensor)}}


def grid(kinds: tuple[str, ...] = KINDS, protocols: tuple[str, ...] = PROTOCOLS,
         data: tuple[str, ...] = DATA, readouts: tuple[str, ...] = READOUTS,
         multipliers: tuple[float, ...] | None = None, setting: str = "main"
         ) -> Iterator[Cell]:
    """Every cell of the benchmark (or of the slice the arguments choose)."""
    spec = SETTINGS[setting]
    if setting.startswith("hard"):
        yield from hard_cells(setting, protocols, readouts)
        return
    for kind, protocol, d, readout in itertools.product(kinds, protocols, data, readouts):
        mults = multipliers or (spec.oracle_multipliers if "oracle" in kind
                                else spec.construction_fractions)
        for m in mults:
            yield Cell(kind, protocol, d, readout, m, setting)


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


def _oracle_hyper(truth: str, protocol: str, m: float) -> dict[str, Any]:
    """The protocol's rule for the true learner, times m."""
    if truth == "gd":
        return {"lr": "max", "normalize": True, "lr_scale": m} if protocol == "iclprobe" \
            else {"lr": 0.01 * m, "normalize": False}
    return {"alpha": "frobenius" if protocol == "iclprobe" else "2/frobenius",
            "alpha_scale": m}


def diverges(truth: str, hyper: dict[str, Any], xs: torch.Tensor, t_min: int) -> bool:
    """Whether the learner's rule is unstable on these data.

    Unstable: at or on its stability bound (GD: η c λ_max ≥ 2; Newton–Schulz:
    α λ_max² ≥ 2) at most (sequence, prefix ≥ t_min) pairs (GD at 2/λ_max sits on it
    everywhere), or beyond it at some prefix of most sequences (Newton at 4/‖SSᵀ‖_F, on
    every rank-deficient prefix). A bound met only at rank-1 prefixes (2/‖SSᵀ‖_F at
    t = 1) is not divergence.
    """
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


def _evaluation_batch(task: tasks.RegressionTask, cfg: AlignConfig) -> tasks.RegressionBatch:
    """The sequences `align` evaluates a model of ``task`` on under ``cfg``."""
    eval_task = evaluation_task(SimpleNamespace(task=task), cfg)  # type: ignore[arg-type]
    return eval_task.sample(cfg.n_sequences, generator=torch.Generator().manual_seed(cfg.seed))


def build(cell: Cell, cfg: AlignConfig) -> tuple[Regressor, dict[str, Any], bool, AlignConfig]:
    """The model, its hyperparameters, whether it diverges, and the cell's AlignConfig."""
    spec = SETTINGS[cell.setting]
    d = spec.n_dims
    task = tasks.RegressionTask(n_dims=d, n_points=spec.n_points)
    cfg = dataclasses.replace(cfg, protocol=cell.protocol, data=cell.data, seed=spec.seed,
                              condition_number=cell.condition_number or spec.condition_number)
    exact = cell.readout == "exact"
    if "oracle" in cell.kind:
        hyper = _oracle_hyper(cell.truth, cell.protocol, cell.multiplier)
        steps: Any = (lambda layer: 3 * layer) if cell.truth == "gd" else (lambda layer: layer)
        if cell.kind == "gd oracle long":  # the rule at 0.3/λ_max per prefix, run long
            hyper = {"lr": "max", "normalize": True, "lr_scale": cell.multiplier}
            steps = list(LONG_STEPS)
        model = oracle(cell.truth, d, N_LAYERS, steps, task=task, exact_readout=exact,
                       seed=spec.seed, **hyper)
        cfg = dataclasses.replace(cfg, positions="last" if cell.kind.endswith("last") else "all")
        batch = _evaluation_batch(task, cfg)
        t_min = batch.xs.shape[1] - 1 if cfg.positions == "last" else \
            1 if cell.protocol == "iclprobe" else 0
        return model, hyper, diverges(cell.truth, hyper, batch.xs, t_min), cfg
    positions = "last" if cell.kind in ("gd construction", "newton construction last") \
        else "all"
    cfg = dataclasses.replace(cfg, positions=positions)
    batch = _evaluation_batch(task, cfg)
    value = cell.multiplier * _stability_bound(cell.kind, batch.xs, positions)
    if cell.kind == "gd construction":
        pq, hyper = gd_transformer(d, N_LAYERS, lr=value), {"lr": value}
    else:
        pq, hyper = newton_transformer(d, N_LAYERS + 4, a=value), {"a": value}
    pq.task = task
    pq.exact_layer_readout = exact  # type: ignore[misc]
    return pq, hyper, False, cfg


def run_cell(cell: Cell, cfg: AlignConfig) -> CellResult:
    """Align the cell's model and count its Newton-vs-GD verdicts per metric."""
    model, hyper, diverges, cell_cfg = build(cell, cfg)
    if diverges:
        return CellResult(cell, True, {}, {}, hyper)
    res = align(model, cell_cfg)
    other = "newton" if cell.truth == "gd" else "gd"
    views = {f"protocol {metric}": next(p for p in table.pairs if {p.a, p.b} == {"newton", "gd"})
             for metric, table in res.comparisons.items()}
    views.update({f"fitted {metric}": pair for metric, pair in res.fitted.items()})
    counts, verdicts = {}, {}
    for view, pair in views.items():
        live = [i for i, v in enumerate(pair.verdicts)
                if v not in ("computes nothing", "matches no learner")]
        said = [pair.verdicts[i] for i in live]
        counts[view] = {"true": said.count(f"prefers {cell.truth}"),
                        "false": said.count(f"prefers {other}"),
                        "none": sum(not v.startswith("prefers") for v in said)}
        if view.startswith("fitted"):
            sep = [i for i in live if separable(pair, cell.truth, i)]
            counts[view]["separable"] = len(sep)
            counts[view]["true_separable"] = sum(
                pair.verdicts[i] == f"prefers {cell.truth}" for i in sep)
        verdicts[view] = list(pair.verdicts)
    if res.fitted:  # the verdict align reports: the fitted view's verdict metrics combined
        default = [p for m, p in res.fitted.items() if m in DEFAULT_METRICS]
        for view, said_by in (("verdict", res.verdict),
                              (DEFAULT_VIEW, combined(default)[0] if default else [])):
            counts[view] = _verdict_counts(said_by, list(res.fitted.values()), cell.truth)
            verdicts[view] = list(said_by)
    if res.spectral is not None:  # the spectral view's reading, as a verdict
        said = [r for r in res.spectral.reading if r != "computes nothing"]
        counts["spectral order"] = {"true": said.count(f"{cell.truth}-like"),
                                    "false": said.count(f"{other}-like"),
                                    "none": sum(not r.endswith("-like") for r in said)}
        verdicts["spectral order"] = list(res.spectral.reading)
    return CellResult(cell, False, counts, verdicts, hyper)


def _verdict_counts(said_by: list[str], pairs: list[PairVerdict], truth: str) -> dict[str, int]:
    """A combined verdict's counts over the live layers, and at the separable ones."""
    other = "newton" if truth == "gd" else "gd"
    live = [i for i, v in enumerate(said_by) if v not in ("computes nothing",
                                                           "matches no learner")]
    sep = [i for i in live if any(separable(p, truth, i) for p in pairs)]
    said = [said_by[i] for i in live]
    return {"true": said.count(f"prefers {truth}"), "false": said.count(f"prefers {other}"),
            "none": sum(not v.startswith("prefers") for v in said), "separable": len(sep),
            "true_separable": sum(said_by[i] == f"prefers {truth}" for i in sep)}


def separable(pair: PairVerdict, truth: str, layer: int) -> bool:
    """Whether the learners alone can tell the true learner's iterate from the other's.

    The other learner's best match (over its whole fitted family) to the true learner's
    matched column falls short of 1 by more than the width of the Newton − GD interval.
    """
    cal, diff = pair.calibration, pair.difference
    rival = cal.a_by_b[layer] if truth == pair.a else cal.b_by_a[layer]
    # how far the rival's imitation is from a perfect one: 1 for a cosine, 0 for a distance
    gap = 1.0 - rival if metric_info(pair.metric).higher_is_better else rival
    return gap > diff.upper[layer] - diff.lower[layer]


def bench_config(n_sequences: int = 256, n_boot: int = 100) -> AlignConfig:
    """The AlignConfig the benchmark runs (Newton and GD only, no separation views)."""
    return AlignConfig(n_sequences=n_sequences, n_boot=n_boot, algorithms=("newton", "gd"),
                       metrics=METRICS, separation=False)


#: The verdict of `align`'s default metrics (error and weight cosine) alone: what a user
#: who does not ask for spd gets.
DEFAULT_VIEW = "verdict, default metrics"
VIEWS = ("protocol", "fitted", "spectral", "verdict", DEFAULT_VIEW)
JUDGED = "verdict"  # the view the targets are held to: the verdict align reports


def totals(results: list[CellResult], view: str | None = None) -> dict[str, int]:
    """Counts over every counted cell (of one view: "protocol", "fitted"), and divergences."""
    out = {"true": 0, "false": 0, "none": 0, "diverges": 0, "separable": 0,
           "true_separable": 0}
    for r in results:
        if r.diverges:
            out["diverges"] += 1
            continue
        for name, counts in r.counts.items():
            if view is not None and name != view and not name.startswith(view + " "):
                continue
            for key, value in counts.items():
                out[key] += value
    return out


@dataclasses.dataclass
class ProbePower:
    """A cell's verdict through probes at the layers where the exact readout names the truth."""

    cell: Cell  # the probe-readout cell
    named_exactly: int  # layers whose exact-readout verdict prefers the true learner
    named_by_probe: int  # of those, layers whose probe-readout verdict prefers it too

    @property
    def short(self) -> bool:
        """Probes name the truth at fewer than 80% of the exactly named layers."""
        return self.named_by_probe < 0.8 * self.named_exactly

    @property
    def key(self) -> str:
        """The cell in words (its readout left out)."""
        c = self.cell
        return f"{c.setting} {c.kind} {c.protocol} {c.data} x{c.multiplier:g}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {**dataclasses.asdict(self.cell), "named_exactly": self.named_exactly,
                "named_by_probe": self.named_by_probe, "short": self.short}


def probe_power(results: list[CellResult], view: str = "verdict") -> list[ProbePower]:
    """Per cell, `ProbePower` of ``view``: probe readout against the same cell read exactly."""
    exact = {dataclasses.replace(r.cell, readout="probe"): r for r in results
             if r.cell.readout == "exact" and not r.diverges}
    out = []
    for r in results:
        twin = exact.get(r.cell)
        if r.cell.readout != "probe" or r.diverges or twin is None:
            continue
        want = f"prefers {r.cell.truth}"
        named = [i for i, v in enumerate(twin.verdicts.get(view, [])) if v == want]
        probe = r.verdicts.get(view, [])
        out.append(ProbePower(r.cell, len(named),
                              sum(i < len(probe) and probe[i] == want for i in named)))
    return out
