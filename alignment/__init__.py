"""Which learning algorithm does each layer run? Similarities, step matching, verdicts.

The pipeline is `align` (one model) and `compare` (several on the same data), configured
by `AlignConfig` and a named `Protocol`; `align_layers` aligns per-layer predictions of any
model. The parts: `similarity` (layer × step tables with bootstrap bounds), `match_steps`
(best step per layer and step-vs-layer fits), the learner comparison with calibrated
verdicts, and the report (`write_report`). New metrics join with `register_metric`; new
learners with ``iclprobe.algorithms.register``.
"""

from iclprobe.alignment.comparison import LearnerComparison, PairVerdict
from iclprobe.alignment.matching import Fit, Match, fit_line, match_steps
from iclprobe.alignment.metrics import (
    METRIC_INFO,
    MetricInfo,
    error_cosine,
    ilwd,
    register_metric,
    spd,
    weight_cosine,
)
from iclprobe.alignment.pipeline import AlignConfig, AlignResult, align, align_layers, compare
from iclprobe.alignment.protocols import PROTOCOLS, Protocol, RunSpec, get_protocol
from iclprobe.alignment.similarity import METRICS, Similarity, similarity

__all__ = [
    "METRICS",
    "METRIC_INFO",
    "PROTOCOLS",
    "AlignConfig",
    "AlignResult",
    "Fit",
    "LearnerComparison",
    "Match",
    "MetricInfo",
    "PairVerdict",
    "Protocol",
    "RunSpec",
    "Similarity",
    "align",
    "align_layers",
    "compare",
    "error_cosine",
    "fit_line",
    "get_protocol",
    "ilwd",
    "match_steps",
    "register_metric",
    "similarity",
    "spd",
    "weight_cosine",
]
