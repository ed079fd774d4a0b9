"""`AlignConfig`: what ``align`` computes (its fields are ``iclprobe align``'s flags)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from iclprobe.alignment.protocols import Protocol

DATA_CHOICES = ("task", "isotropic", "ill-conditioned")
DEFAULT_METRICS = ("error_cosine", "weight_cosine")
POSITION_CHOICES = ("auto", "all", "last")
FIT_LAYER_CHOICES = ("live", "all")
PROBE_FITS = ("crossfit", "fresh")
#: Learners a model family adds (PQ: preconditioned GD with its own A_l, and a_l Σ⁻¹).
FAMILY_RUNS = ("pgd_own", "pgd_inv_cov")


@dataclasses.dataclass(frozen=True)
class AlignConfig:
    """What `align` computes (defaults sized for a CPU)."""

    protocol: str = "iclprobe"  # a named set of learner/metric choices (see protocols)
    algorithms: tuple[str, ...] | None = None  # a subset of the protocol's learners
    metrics: tuple[str, ...] = DEFAULT_METRICS  # any registered metric
    positions: str = "auto"  # "auto" (where the model was trained) | "all" | "last"
    t_min: int | None = None  # first position in the metrics (default: the protocol's)
    t_max: int | None = None  # last position (default: the last)
    fit_layers: str = "live"  # "live": layers above the zero predictor | "all"
    n_sequences: int = 512  # evaluation sequences
    probe_fit: str = "crossfit"  # "crossfit": on the evaluation sequences | "fresh"
    probe_folds: int = 4  # folds of the cross-fit
    n_probe_sequences: int = 1000  # fresh sequences the layer probes are fitted on ("fresh")
    n_probe_heldout: int = 256  # fresh sequences the probes' R² is measured on
    n_weight_sequences: int = 64  # sequences for induced weights (weight_cosine)
    n_queries: int | None = None  # queries per prefix for induced weights (default 1.5 d)
    data: str = "task"  # "task" | "isotropic" | "ill-conditioned"
    condition_number: float = 100.0
    n_boot: int = 200  # bootstrap resamples of the sequences
    confidence: float = 0.95
    separation: bool = True  # measure which views separate Newton from GD
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        from iclprobe import algorithms  # the registries import torch: only when validating
        from iclprobe.alignment.metrics import METRIC_INFO
        from iclprobe.alignment.protocols import get_protocol

        protocol = get_protocol(self.protocol)
        if self.algorithms is not None:
            unknown = [a for a in self.algorithms
                       if not protocol.accepts(a) and a not in FAMILY_RUNS]
            if unknown or not self.algorithms:
                choices = (list(protocol.runs) if protocol.explicit_runs is not None
                           else sorted(algorithms.LEARNER_INFO))
                raise ValueError(f"algorithms {unknown or list(self.algorithms)} are not in "
                                 f"protocol {self.protocol!r}; choose from "
                                 f"{choices + list(FAMILY_RUNS)}")
        if isinstance(self.metrics, str) or not self.metrics:
            raise ValueError(f"metrics must be a non-empty tuple of metric names, got "
                             f"{self.metrics!r}")
        bad = [m for m in self.metrics if m not in METRIC_INFO]
        if bad:
            raise ValueError(f"metric must be among {list(METRIC_INFO)}, got {list(self.metrics)}")
        for name, allowed in (("data", DATA_CHOICES), ("positions", POSITION_CHOICES),
                              ("probe_fit", PROBE_FITS),
                              ("fit_layers", FIT_LAYER_CHOICES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("n_sequences", "n_probe_sequences", "n_weight_sequences", "n_boot",
                     "probe_folds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an integer >= 2, got {value!r}")
        for name in ("t_min", "t_max"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ValueError(f"{name} must be an integer >= 0 or None, got {value!r}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence!r}")
        if not self.condition_number >= 1:
            raise ValueError(f"condition_number must be >= 1, got {self.condition_number!r}")

    @property
    def protocol_spec(self) -> Protocol:
        """The `Protocol` named by ``protocol``."""
        from iclprobe.alignment.protocols import get_protocol

        return get_protocol(self.protocol)
