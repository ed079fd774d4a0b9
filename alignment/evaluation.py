"""The evaluation every stage of `align` reads: the data, the window, the learners to run.

`align` builds it from a model (`model_evaluation`: the model's task sampled, the positions
it was trained on, the learners its family claims), `align_layers` from the data it is
given (`evaluation`). Either way the learners asked for and the window are checked here,
before any forward pass or learner runs, and the stages that follow read the config
through it.

A model is aligned where it was trained: every prefix for a model trained on all
positions (Garg et al.), only the trained context length for one trained on the last
position (Ahn et al.), where the error cosine is taken across sequences.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe._checks import ConfigError
from iclprobe._finite import all_finite
from iclprobe.algorithms.base import REFERENCE_PAIR
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.metrics import metric_info, on_weights
from iclprobe.alignment.protocols import Protocol, RunSpec
from iclprobe.errors import InputError, NonFinite
from iclprobe.models.base import Regressor, input_dtype
from iclprobe.tasks import RegressionBatch, RegressionTask

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What every stage of `align` reads.

    Attributes:
        name: the model's name, in messages and in the result.
        cfg: what to compute (metrics, bootstrap, views).
        batch: the evaluation sequences.
        task: the task they were drawn from (None: data given without one).
        positions: "all" (every prefix) or "last" (the last position only).
        window: the positions ``(t_min, t_max)`` that enter the metrics.
        runs: the learner runs, ``key -> RunSpec``, in the order they run.
        claimed: the keys of ``runs`` that the model's family claims.
        weight_rows: the induced weights are measured on this many first sequences.
        notes: lines for the result: what was skipped or means little, and why.
    """

    name: str
    cfg: AlignConfig
    batch: RegressionBatch
    task: RegressionTask | None
    positions: str
    window: tuple[int, int]
    runs: dict[str, RunSpec]
    claimed: tuple[str, ...]
    weight_rows: int
    notes: tuple[str, ...] = ()

    @property
    def protocol(self) -> Protocol:
        """The protocol the config names."""
        return self.cfg.protocol_spec

    @functools.cached_property
    def ys(self) -> Tensor:
        """``[batch, pos]`` the targets in float64, as every metric reads them."""
        return self.batch.ys.double()

    @functools.cached_property
    def stats(self) -> algorithms.PrefixStats:
        """The prefix statistics of the data, computed once for every stage that runs learners."""
        return algorithms.prefix_stats(self.batch.xs.double(), self.ys)

    @property
    def weight_metrics(self) -> list[str]:
        """The metrics that compare induced weights (they need the layers' and learners')."""
        return [m for m in self.cfg.metrics if on_weights(m)]

    def rows(self, metric: str) -> slice:
        """The sequences ``metric``'s tables are computed on (a weight metric's: the first)."""
        return slice(0, self.weight_rows) if on_weights(metric) else slice(None)

    def t_min(self, metric: str) -> int:
        """The first position of ``metric``'s tables.

        The window's; a weight metric at every prefix starts no earlier than the protocol's
        ``weight_t_min`` (at t = 0 every induced weight is 0).
        """
        if on_weights(metric) and self.averaging == "positions":
            return max(self.window[0], self.protocol.weight_t_min)
        return self.window[0]

    @property
    def averaging(self) -> str:
        """"sequences" at the last position alone (a cosine across sequences), else "positions"."""
        return "sequences" if self.positions == "last" else "positions"

    def over(self, metric: str) -> str:
        """How ``metric`` is averaged: as `averaging` says where it has a form across sequences."""
        return self.averaging if metric_info(metric).across else "positions"

    @property
    def bootstrap(self) -> dict[str, Any]:
        """The bootstrap of every interval: ``n_boot``, ``confidence`` and ``seed``."""
        return {"n_boot": self.cfg.n_boot, "confidence": self.cfg.confidence,
                "seed": self.cfg.seed}


def evaluation(cfg: AlignConfig, batch: RegressionBatch, name: str = "model",
               positions: str = "all", claimed: Mapping[str, RunSpec] | None = None,
               notes: Sequence[str] = (), task: RegressionTask | None = None,
               weight_rows: int = 0) -> Evaluation:
    """An evaluation on ``batch``, its learners and window checked (see `Evaluation`).

    ``claimed``: runs beyond the protocol's (a model family's claims), ``key -> RunSpec``.

    Raises:
        InputError: the window does not fit the data, or a learner asked for by name cannot
            run here.
    """
    claimed = dict(claimed or {})
    window = aligned_window(cfg, positions, batch.xs.shape[1])
    runs = learner_runs(cfg, claimed, name)
    return Evaluation(name, cfg, batch, task, positions, window, runs, tuple(claimed),
                      weight_rows, tuple(notes))


def check_evaluation(model: Regressor, task: RegressionTask, cfg: AlignConfig,
                     name: str = "model") -> None:
    """Refuse a window or learners ``model_evaluation`` would refuse, before probes are fitted.

    The learners the model claims are read on two sequences (their names, not their runs).
    """
    positions = trained_positions(model) if cfg.positions == "auto" else cfg.positions
    given = [f for f in ("t_min", "t_max") if getattr(cfg, f) is not None]
    if positions == "last" and given:  # the window is of positions "all": it would be dropped
        why = "(the position it was trained at)" if cfg.positions == "auto" else \
            "(positions='last')"
        raise ConfigError("AlignConfig", given[0], f"AlignConfig.{given[0]}="
                          f"{getattr(cfg, given[0])} sets the window of positions='all', but "
                          f"{name} is aligned at its last position only {why}")
    aligned_window(cfg, positions, task.n_points)
    learner_runs(cfg, family_runs(model, task.sample(2, generator=cfg.seed))[0], name)


def model_evaluation(model: Regressor, task: RegressionTask, cfg: AlignConfig,
                     name: str = "model", crossfit: bool = False) -> Evaluation:
    """`align`'s evaluation of ``model``: ``task``'s sequences at the model's positions.

    ``crossfit``: the layer probes are cross-fitted on these sequences, so the induced
    weights are measured within one fold (read by probes that never saw them).
    """
    positions = trained_positions(model) if cfg.positions == "auto" else cfg.positions
    batch = task.sample(cfg.n_sequences, generator=torch.Generator().manual_seed(cfg.seed),
                        dtype=input_dtype(model))
    n_weight = min(cfg.n_weight_sequences, cfg.n_sequences)
    if crossfit:
        n_weight = min(n_weight, cfg.n_sequences // cfg.probe_folds)  # within one fold
    claimed, notes = family_runs(model, batch)
    if n_weight < cfg.n_weight_sequences and any(on_weights(m) for m in cfg.metrics):
        notes.append(f"induced weights on {n_weight} sequences, not n_weight_sequences="
                     f"{cfg.n_weight_sequences} (--n-weight-sequences): at most n_sequences"
                     + (" / probe_folds (within one fold)" if n_weight < cfg.n_sequences
                        else ""))
    return evaluation(cfg, batch, name, positions, claimed, notes, task, n_weight)


#: the taskless models told of the length they are evaluated at
_TASKLESS_TOLD: weakref.WeakSet[Regressor] = weakref.WeakSet()


def evaluation_task(model: Regressor, cfg: AlignConfig) -> RegressionTask:
    """The data `align` evaluates on: the model's task, or isotropic/ill-conditioned."""
    task = getattr(model, "task", None)
    if cfg.data == "task":
        if task is None:
            raise InputError("the checkpoint has no task.json: pass --data isotropic or "
                             "ill-conditioned")
        return task
    if task is not None:
        n_dims, n_points = task.n_dims, task.n_points
    else:  # a taskless model (Ahn et al.'s bare allparam): its context length
        from iclprobe.models.ahn import DEFAULT_N_CONTEXT

        n_dims = model.cfg.n_dims
        n_points = getattr(model.cfg, "n_positions", None) or DEFAULT_N_CONTEXT + 1
        if model not in _TASKLESS_TOLD:  # once per model (the design asks for it often)
            _TASKLESS_TOLD.add(model)
            logger.warning("the model has no task: evaluating on %d points (%s)", n_points,
                           "its n_positions" if hasattr(model.cfg, "n_positions") else
                           f"Ahn et al.'s N = {DEFAULT_N_CONTEXT} examples and a query")
    return RegressionTask(n_dims=n_dims, n_points=n_points, cov=cfg.data,
                          condition_number=cfg.condition_number)


def trained_positions(model: Regressor) -> str:
    """"last" for a model trained on the last position only (Ahn et al.), else "all"."""
    recipe = getattr(model, "train_config", None) or {}
    if "loss" in recipe:
        return "last" if recipe["loss"] == "last" else "all"
    return model.default_positions


def aligned_window(cfg: AlignConfig, positions: str, n: int) -> tuple[int, int]:
    """The positions ``(t_min, t_max)`` the metrics read, of ``n`` (the last alone for "last")."""
    if positions == "last":
        return n - 1, n - 1
    t_min = cfg.protocol_spec.t_min if cfg.t_min is None else cfg.t_min
    t_max = n - 1 if cfg.t_max is None else cfg.t_max
    if not t_min <= t_max < n:  # the field given that is out of the data's range is named
        field = "t_min" if cfg.t_min is not None and t_max < n else "t_max"
        raise ConfigError("AlignConfig", field, f"t_min={t_min}, t_max={t_max}: need t_min "
                          f"<= t_max <= {n - 1} for {n} points")
    if t_max < 1:  # t = 0 has no examples: every learner predicts 0 there
        raise ConfigError("AlignConfig", "t_max", f"t_max={t_max}: the window t = 0 holds no "
                          "prediction from examples (position t predicts from the t before "
                          "it); need t_max >= 1")
    return t_min, t_max


def learner_runs(cfg: AlignConfig, claimed: Mapping[str, RunSpec], name: str
                 ) -> dict[str, RunSpec]:
    """The protocol tables' runs: those chosen (default: the claimed, then the protocol's).

    ``cfg.algorithms`` names the learners to consider: the answer's candidates, and of them
    those the protocol (or the model) runs in its tables. A name that is neither a
    registered learner nor a run of this model is refused; where none of the chosen
    learners is the protocol's, its tables keep the protocol's own.
    """
    protocol = cfg.protocol_spec
    chosen = cfg.algorithms or [*claimed, *protocol.runs]
    unknown = [k for k in chosen if not (protocol.accepts(k) or k in claimed
                                         or k in algorithms.LEARNERS)]
    if unknown:
        offered = ", ".join([*claimed, *(k for k in protocol.runs if k not in claimed)])
        raise ConfigError("AlignConfig", "algorithms", f"AlignConfig.algorithms: "
                          f"{', '.join(map(repr, unknown))} cannot be run on {name}; available "
                          f"here: {offered}, or any learner registered in iclprobe.algorithms")
    runs = [k for k in chosen if protocol.accepts(k) or k in claimed] or \
        [*claimed, *protocol.runs]
    return {k: claimed[k] if k in claimed else protocol.run(k) for k in runs}


def family_runs(model: Regressor, batch: RegressionBatch
                ) -> tuple[dict[str, RunSpec], list[str]]:
    """Learners the model's family claims it runs (`Regressor.claimed_learners`), and notes.

    Each claim is a dict with ``learner``, and optionally ``label``, ``steps``, ``hyper``
    (tensors allowed) and ``compare_with`` (default: Newton and GD).
    """
    claimed, notes = model.claimed_learners(batch)
    runs = {}
    for key, spec in claimed.items():
        rivals = tuple(spec.get("compare_with", REFERENCE_PAIR))
        runs[key] = RunSpec(spec["learner"], spec.get("label", key), spec.get("steps"),
                            dict(spec.get("hyper", {})),
                            compare_with=tuple(r for r in rivals if r != key))
    return runs, list(notes)


def refuse_nonfinite(what: str, tensor: Tensor) -> None:
    """Refuse a reading that holds NaN or Inf (naming ``what``)."""
    if not all_finite(tensor):
        raise NonFinite(f"align: the {what} are not finite (found NaN or Inf)")
