"""Alignment protocols: named sets of choices that decide what "layer l runs step k" means.

A protocol fixes the learners and their hyperparameters (step sizes, loss scaling, Newton's
initial scaling), the step grids, which positions t enter the similarities, and how the
best step is picked. Every result records the protocol that made it.

- ``iclprobe`` (the default): GD with step 1/λ_max of each prefix's Hessian on the mean
  loss, so a step count means the same at every t; Newton–Schulz with α = 1/‖SSᵀ‖_F;
  online GD with normalized (Kaczmarz) steps from 0; positions t ≥ 1 (t = 0 has no
  context, every learner predicts 0 there).
- ``fu2024``: Fu et al. 2024's evaluation code (``eval_similarity.py`` and the learners of
  their ``models.py``): GD with a fixed step 0.01 on the summed loss, 2⁰…2¹² steps;
  Newton–Schulz with α = 1/‖SSᵀ‖_F (their ``newton_inv`` since the commit after their first,
  which had 2/‖SSᵀ‖_F) and steps 1…23; online GD as one pass from a uniform U[0, 1)^d start
  (their learner; its step sizes 0.01…0.05 are ours: their script never runs it); the error
  cosine over every position, t = 0 included; the best step is the first maximum (no tie
  tolerance).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from iclprobe import algorithms
from iclprobe.algorithms.learners import GD_LOG_GRID
from iclprobe.errors import InputError


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One learner run, from the registry to the verdict: what runs, how, compared with whom.

    ``learner``: a registered learner's name; ``hyper``: its hyperparameters (numbers,
    names, or tensors such as a model's own preconditioners). ``steps``: a tuple of step
    counts, or a rule resolved per model: ``"cg"`` (0…d+1), ``"layers"`` (0…L). ``grid``: a
    hyperparameter whose values become extra columns (each value run at every step count),
    e.g. Fu et al.'s online-GD step sizes. ``compare_with``: the runs this one gets a paired
    difference and a verdict against, when they ran too. Protocols build them
    (`registered_run` from a learner's registration), and so do model families
    (`Regressor.claimed_learners`).
    """

    learner: str
    label: str
    steps: tuple[int, ...] | str | None = None
    hyper: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    grid: tuple[str, tuple[Any, ...]] | None = None
    compare_with: tuple[str, ...] = ()

    def resolve_steps(self, n_dims: int, n_layers: int) -> list[int] | None:
        """The step counts for a model with ``n_layers`` on ``n_dims``-dimensional data."""
        if self.steps is None or isinstance(self.steps, tuple):
            return None if self.steps is None else list(self.steps)
        if self.steps == "cg":
            return list(range(n_dims + 2))
        if self.steps == "layers":
            return list(range(n_layers + 1))
        raise InputError(f"unknown step rule {self.steps!r} (known: 'cg', 'layers')")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description."""
        return {"learner": self.learner, "label": self.label,
                "steps": list(self.steps) if isinstance(self.steps, tuple) else self.steps,
                "hyper": {k: f"tensor of shape {list(v.shape)}" if isinstance(v, Tensor) else v
                          for k, v in self.hyper.items()},
                "grid": {self.grid[0]: list(self.grid[1])} if self.grid else None,
                "compare_with": list(self.compare_with)}


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A named set of alignment choices (see the module docstring).

    ``explicit_runs`` None means: every learner registered with ``align=True``, with its
    registered step grid and hyperparameters (so a newly registered learner joins in).
    """

    name: str
    summary: str
    t_min: int  # first position t in the error metrics
    weight_t_min: int  # first position t in the weight metrics (t = 0: every w is 0)
    tie_tol: float  # steps within this of the best are reported as ties
    pick: str  # how the best step is chosen
    source: str
    explicit_runs: Mapping[str, RunSpec] | None = None

    @property
    def runs(self) -> dict[str, RunSpec]:
        """The learners this protocol runs by default, ``key -> RunSpec``."""
        if self.explicit_runs is not None:
            return dict(self.explicit_runs)
        return {i.name: registered_run(i.name) for i in algorithms.aligned_learners()}

    def run(self, key: str) -> RunSpec:
        """The run of learner ``key``: the protocol's own, or (registry protocols) its default."""
        runs = self.runs
        if key in runs:
            return runs[key]
        if self.explicit_runs is None and key in algorithms.LEARNERS:
            return registered_run(key)
        raise InputError(f"learner {key!r} is not in protocol {self.name!r}; choose from "
                         f"{list(runs)}")

    def accepts(self, key: str) -> bool:
        """Whether ``run(key)`` has an answer."""
        return key in self.runs or (self.explicit_runs is None
                                    and key in algorithms.LEARNERS)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (recorded in every result)."""
        return {"name": self.name, "summary": self.summary, "t_min": self.t_min,
                "weight_t_min": self.weight_t_min, "tie_tol": self.tie_tol, "pick": self.pick,
                "source": self.source,
                "runs": {key: spec.to_dict() for key, spec in self.runs.items()}}


def verdict_pairs(runs: Mapping[str, RunSpec]) -> list[tuple[str, str]]:
    """The pairs ``(a, b)`` that get a paired difference and a verdict.

    Each run's ``compare_with`` among the runs present, in run order, each unordered pair
    once.
    """
    pairs: list[tuple[str, str]] = []
    for key, spec in runs.items():
        for other in spec.compare_with:
            if other in runs and other != key and {key, other} not in map(set, pairs):
                pairs.append((key, other))
    return pairs


def registered_run(name: str) -> RunSpec:
    """Learner ``name`` as its registration says ``align`` should run it."""
    info = algorithms.learner_info(name)
    return RunSpec(info.name, info.label, info.steps, dict(info.align_hyper),
                   compare_with=info.compare_with)


ICLPROBE = Protocol(
    name="iclprobe",
    summary="step sizes scaled per prefix (GD 1/λ_max, mean loss), Newton α = 1/‖SSᵀ‖_F, "
            "positions t ≥ 1, ties within 1e-3",
    t_min=1, weight_t_min=1, tie_tol=1e-3, pick="first maximum; ties within 1e-3 reported",
    source="iclprobe's own choices: every learner registered with align=True, with its "
           "registered step grid and hyperparameters",
)

FU2024 = Protocol(
    name="fu2024",
    summary="Fu et al. 2024's eval code: GD step 0.01 on the summed loss, Newton α = "
            "1/‖SSᵀ‖_F with steps 1..23, online GD one pass from U[0,1)^d (steps 0.01..0.05: "
            "ours), error cosine over t = 0..n-1, first maximum",
    explicit_runs={
        "newton": RunSpec("newton", "Newton", tuple(range(1, 24)), {"alpha": "frobenius"},
                          compare_with=("gd", "online_gd")),
        "gd": RunSpec("gd", "GD", GD_LOG_GRID, {"lr": 0.01, "normalize": False}),
        "online_gd": RunSpec("online_gd", "online GD", (1,), {"init": "uniform"},
                             grid=("lr", (0.01, 0.02, 0.03, 0.04, 0.05))),
        "ols": RunSpec("ols", "OLS"),
    },
    t_min=0, weight_t_min=1, tie_tol=0.0, pick="first maximum (numpy argmax; to 1e-12)",
    source="DeqingFu/transformers-icl-second-order: src/eval_similarity.py, src/models.py",
)

PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (ICLPROBE, FU2024)}


def get_protocol(name: str) -> Protocol:
    """The protocol registered as ``name`` (the error lists them)."""
    if name not in PROTOCOLS:
        raise InputError(f"protocol must be one of {sorted(PROTOCOLS)}, got {name!r}")
    return PROTOCOLS[name]
