"""`AlignConfig`: what ``align`` computes (its fields are ``iclprobe align``'s flags)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from iclprobe._checks import (
    SEED_LIMIT,
    ConfigError,
    check_bool,
    check_choice,
    check_fields,
    check_int,
    check_real,
    check_seed,
    option,
)

if TYPE_CHECKING:
    from iclprobe.alignment.protocols import Protocol

DATA_CHOICES = ("task", "isotropic", "ill-conditioned")
DEFAULT_METRICS = ("error_cosine", "weight_cosine")
POSITION_CHOICES = ("auto", "all", "last")
FIT_LAYER_CHOICES = ("live", "all")
PROBE_FITS = ("crossfit", "fresh")
PROBE_TARGETS = ("column", "y")
FRESH_PROBE_SEQUENCES = 1000  # fresh probes' sequences where n_probe_sequences is not set
DEVICES = ("cpu", "cuda")
_OWNER = "AlignConfig"  # in the messages of the names' checks


@dataclasses.dataclass(frozen=True)
class AlignConfig:
    """What `align` computes (defaults sized for a CPU).

    Each field's help is its ``iclprobe align`` flag's.
    """

    protocol: str = option("iclprobe", "the alignment choices: iclprobe (per-prefix step "
                           "sizes, t >= 1) or fu2024 (Fu et al.'s evaluation code: GD step 0.01 "
                           "on the summed loss, Newton alpha 1/||SS^T||_F, t >= 0)")
    algorithms: tuple[str, ...] | None = option(
        None, "comma-separated learners to consider (default: every registered learner, "
        "newton,gd,online_gd,pgd,cg,ols,ridge,momentum,gd_plus_plus, and the model family's "
        "own, e.g. pgd_own): the answer's candidates and, of them, those the protocol runs in "
        "its tables (unset: the protocol's own, iclprobe: newton,gd,online_gd,pgd,cg,ols; "
        "fu2024: newton,gd,online_gd,ols)")
    metrics: tuple[str, ...] = option(
        DEFAULT_METRICS, "comma-separated similarity metrics: error_cosine, weight_cosine, spd, "
        "ilwd (and any registered), or both = error_cosine,weight_cosine",
        aliases=("--metric",), names={"both": DEFAULT_METRICS})
    positions: str = option("auto", "positions t to align at: auto = where the model was "
                            "trained (the last position for Ahn-style PQ models, every prefix "
                            "otherwise)", choices=POSITION_CHOICES)
    t_min: int | None = option(None, "first position in the metrics (default: the protocol's; "
                               "a window of positions all, refused where the model is "
                               "aligned at its last position)")
    t_max: int | None = option(None, "last position in the metrics, >= 1 (default: the last)")
    fit_layers: str = option("live", "layers the step-vs-layer lines are fitted over: live = "
                             "above the zero predictor", choices=FIT_LAYER_CHOICES)
    n_sequences: int = option(512, "evaluation sequences")
    probe_fit: str = option("crossfit", "how GPT layers' probes are fitted when none are saved: "
                            "crossfit = on the evaluation sequences (each read by probes "
                            "fitted on the other folds; one forward pass), fresh = on "
                            "--n-probe-sequences fresh sequences", choices=PROBE_FITS)
    probe_folds: int = option(4, "folds of the cross-fitted probes")
    probe_target: str = option(
        "column", "what the cross-fitted probes are fitted to: column = per layer, the "
        "candidate learner's prediction that layer's residual holds best (a target without "
        "label noise: a layer that holds it is read almost exactly), y = the true labels "
        "(Fu et al.'s probes; saved and fresh probes are always fitted to y)",
        choices=PROBE_TARGETS)
    probe_extra_sequences: int = option(
        0, "further sequences of the evaluation task the cross-fitted probes are also "
        "fitted on, never read: their estimation error shrinks with the rows, for a forward "
        "pass over them")
    n_probe_sequences: int | None = option(
        None, "fresh sequences the layer probes are fitted on (default: probes saved by "
        "`iclprobe probe` are used however many they were fitted on, fresh ones on "
        f"{FRESH_PROBE_SEQUENCES}); given, saved probes must have been fitted on this many")
    refit_probes: bool = option(False, "fit new layer probes even where saved ones fit the "
                                "model and data")
    n_probe_heldout: int = option(256, "fresh sequences the probes' held-out R² is measured on")
    n_weight_sequences: int = option(16, "sequences the induced weights (weight metrics) are "
                                     "measured on (16 keep the query pass cheap; their 95% "
                                     "intervals then hold the value about 92% of the time, "
                                     "more with more: docs/protocols.md)")
    n_queries: int | None = option(None, "fresh queries per prefix for the induced weights "
                                   "(default: d + max(2, d // 2))")
    data: str = option("task", "evaluation data: task = the checkpoint's own task",
                       choices=DATA_CHOICES)
    condition_number: float = option(100.0, "κ of the ill-conditioned evaluation data")
    n_boot: int = option(200, "bootstrap resamples of the sequences (a 95% interval needs "
                         "40 over the 512 evaluation sequences, 72 over the 16 weight "
                         "sequences; align notes when there are fewer)")
    confidence: float = option(0.95, "confidence level of the bootstrap intervals")
    separation: bool = option(True, "measure which views separate Newton from GD")
    fitted: bool = option(True, "match every candidate learner over its fitted family of "
                          "step sizes (or λ, β, ...) and steps: the per-layer answer over "
                          "the candidates, and the Newton-vs-GD verdict")
    seed: int = option(0, "seed of the evaluation data (the probes' data: seed + 1, the "
                       "induced weights' queries: seed + 3)")
    device: str = option("cpu", "where the model runs", choices=DEVICES)

    def __post_init__(self) -> None:
        from iclprobe.tasks.covariance import MAX_CONDITION  # imports torch: only when validating

        self._check_names()
        for name, allowed in (("data", DATA_CHOICES), ("positions", POSITION_CHOICES),
                              ("fit_layers", FIT_LAYER_CHOICES), ("device", DEVICES),
                              ("probe_fit", PROBE_FITS), ("probe_target", PROBE_TARGETS)):
            check_fields(self, check_choice, name, choices=allowed)
        check_fields(self, check_int, "n_sequences", "n_probe_heldout", "n_weight_sequences",
                     "n_boot", "probe_folds", low=2)
        for name, low in (("n_probe_sequences", 2), ("t_min", 0), ("t_max", 0),
                          ("n_queries", 1)):
            if getattr(self, name) is not None:
                check_fields(self, check_int, name, low=low)
        if self.t_min is not None and self.t_max is not None and self.t_min > self.t_max:
            raise ConfigError(_OWNER, "t_max", f"{_OWNER}.t_max must be >= t_min={self.t_min} "
                              f"(the window t_min..t_max), got {self.t_max}")
        check_fields(self, check_int, "probe_extra_sequences", low=0)
        if self.probe_extra_sequences and self.probe_fit != "crossfit":
            raise ConfigError(_OWNER, "probe_extra_sequences", f"{_OWNER}.probe_extra_sequences "
                              f"applies to cross-fitted probes (probe_fit='crossfit'), got "
                              f"{self.probe_extra_sequences} with probe_fit={self.probe_fit!r}")
        if self.probe_extra_sequences and self.probe_target != "y":
            raise ConfigError(_OWNER, "probe_extra_sequences", f"{_OWNER}.probe_extra_sequences "
                              f"applies to probes fitted to y (probe_target='y'; the "
                              f"further sequences have no candidates' columns), got "
                              f"{self.probe_extra_sequences} with "
                              f"probe_target={self.probe_target!r}")
        if 0 < self.probe_extra_sequences < self.probe_folds:
            raise ConfigError(_OWNER, "probe_extra_sequences", f"{_OWNER}.probe_extra_sequences "
                              f"must be 0 or at least probe_folds={self.probe_folds} (split "
                              f"among the folds), got {self.probe_extra_sequences}")
        check_fields(self, check_real, "condition_number", low=1.0, high=MAX_CONDITION)
        check_fields(self, check_real, "confidence", low=0.0, high=1.0, low_open=True,
                     high_open=True)
        check_fields(self, check_bool, "separation", "fitted", "refit_probes")
        check_fields(self, check_seed, "seed")
        if self.seed > SEED_LIMIT - 4:  # the probes' data: seed + 1, 2; the queries: seed + 3
            raise ConfigError(_OWNER, "seed", f"{_OWNER}.seed must be at most 2**63 - 4 (the "
                              f"probes' data are drawn with seed + 1 and seed + 2, the "
                              f"induced weights' queries with seed + 3), got {self.seed}")

    @property
    def fresh_probe_sequences(self) -> int:
        """The sequences freshly fitted probes are fitted on (``n_probe_sequences`` or 1000)."""
        return self.n_probe_sequences or FRESH_PROBE_SEQUENCES

    def queries_for(self, n_dims: int) -> int:
        """Fresh queries per prefix for the induced weights: ``n_queries`` or d + max(2, d // 2)."""
        return self.n_queries or n_dims + max(2, n_dims // 2)

    def _check_names(self) -> None:
        """``protocol``, ``algorithms`` and ``metrics`` against the registries."""
        from iclprobe import algorithms  # the registries import torch: only when validating
        from iclprobe.alignment.metrics import METRIC_INFO
        from iclprobe.alignment.protocols import get_protocol
        from iclprobe.models.registry import FAMILIES

        try:
            protocol = get_protocol(self.protocol)
        except ValueError as err:
            raise ConfigError(_OWNER, "protocol", f"{_OWNER}.{err}") from None
        for name in ("algorithms", "metrics"):
            value = getattr(self, name)
            if value is None and name == "algorithms":
                continue
            if (isinstance(value, str) or not isinstance(value, (tuple, list))
                    or not all(isinstance(v, str) for v in value)):
                raise ConfigError(_OWNER, name, f"{_OWNER}.{name} must be a tuple of names, "
                                  f"got {value!r}")
            object.__setattr__(self, name, tuple(value))
            if twice := sorted({v for v in value if list(value).count(v) > 1}):
                raise ConfigError(_OWNER, name, f"{_OWNER}.{name} names {twice} more than "
                                  f"once, got {tuple(value)!r}")
        if self.algorithms is not None:
            # runs a registered family adds (PQ: GD preconditioned by its own A_l, ...);
            # whether this model has them is checked by align
            family_runs = [r for family in FAMILIES.values() for r in family.runs]
            # a learner stepped by a model's own per-layer schedule takes it from the model
            own = sorted(k for k, i in algorithms.LEARNERS.items() if i.steps == "layers")
            unknown = [a for a in self.algorithms if not protocol.accepts(a)
                       and a not in family_runs and a not in algorithms.LEARNERS]
            choices = sorted({*protocol.runs, *algorithms.LEARNERS} - set(own)) + family_runs
            if not self.algorithms:
                raise ConfigError(_OWNER, "algorithms", f"{_OWNER}.algorithms must name at "
                                  f"least one learner, got none; choose from {choices}")
            if unknown:
                raise ConfigError(_OWNER, "algorithms", f"{_OWNER}.algorithms "
                                  f"{unknown} are not registered learners; choose from "
                                  f"{choices}")
            if asked := [a for a in self.algorithms if a in own]:
                raise ConfigError(_OWNER, "algorithms", f"{_OWNER}.algorithms {asked}: "
                                  "a learner stepped by a model's own per-layer schedule "
                                  "(its preconditioners) runs only as that model's claim "
                                  f"(a PQ model's pgd_own); choose from {choices}")
        bad = [m for m in self.metrics if m not in METRIC_INFO]
        if bad or not self.metrics:
            raise ConfigError(_OWNER, "metrics", f"{_OWNER}.metrics must be among "
                              f"{list(METRIC_INFO)}, got {list(self.metrics)}")

    @property
    def protocol_spec(self) -> Protocol:
        """The `Protocol` named by ``protocol``."""
        from iclprobe.alignment.protocols import get_protocol

        return get_protocol(self.protocol)
