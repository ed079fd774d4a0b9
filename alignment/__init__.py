"""Which learning algorithm does each layer run? Similarities, step matching, verdicts.

The pipeline is `align` (one model) and `compare` (several on the same data), configured
by `AlignConfig` and a named `Protocol`; `align_layers` aligns per-layer predictions of any
model; `resolve_probes` picks the layer probes `align` reads with (saved, cached or fitted
here). The parts: `similarity` (layer × step tables with bootstrap bounds), `match_steps`
(best step per layer and step-vs-layer fits), the learner comparison with calibrated
verdicts, and the report (`write_report`). New metrics join with `register_metric`; new
learners with ``iclprobe.algorithms.register``.

Names are imported on first use (`AlignConfig` loads without torch, for the CLI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from iclprobe._lazy import lazy_exports

_EXPORTS = {
    "LearnerComparison": "iclprobe.alignment.comparison",
    "PairVerdict": "iclprobe.alignment.comparison",
    "Fit": "iclprobe.alignment.measuring.matching",
    "Match": "iclprobe.alignment.measuring.matching",
    "fit_line": "iclprobe.alignment.measuring.matching",
    "match_steps": "iclprobe.alignment.measuring.matching",
    "METRIC_INFO": "iclprobe.alignment.metrics",
    "MetricInfo": "iclprobe.alignment.metrics",
    "error_cosine": "iclprobe.alignment.metrics",
    "ilwd": "iclprobe.alignment.metrics",
    "register_metric": "iclprobe.alignment.metrics",
    "spd": "iclprobe.alignment.metrics",
    "weight_cosine": "iclprobe.alignment.metrics",
    "AlignResult": "iclprobe.alignment.result",
    "align": "iclprobe.alignment.pipeline",
    "align_layers": "iclprobe.alignment.pipeline",
    "compare": "iclprobe.alignment.pipeline",
    "AlignConfig": "iclprobe.alignment.config",
    "resolve_probes": "iclprobe.alignment.measuring.probe_source",
    "PROTOCOLS": "iclprobe.alignment.protocols",
    "Protocol": "iclprobe.alignment.protocols",
    "RunSpec": "iclprobe.alignment.protocols",
    "get_protocol": "iclprobe.alignment.protocols",
    "METRICS": "iclprobe.alignment.measuring.similarities",
    "Similarity": "iclprobe.alignment.measuring.similarities",
    "similarity": "iclprobe.alignment.measuring.similarities",
    "write_report": "iclprobe.alignment.output.report",
}

__all__ = [
    "AlignConfig",
    "AlignResult",
    "Fit",
    "LearnerComparison",
    "METRICS",
    "METRIC_INFO",
    "Match",
    "MetricInfo",
    "PROTOCOLS",
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
    "resolve_probes",
    "similarity",
    "spd",
    "weight_cosine",
    "write_report",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from iclprobe.alignment.comparison import LearnerComparison, PairVerdict
    from iclprobe.alignment.config import AlignConfig
    from iclprobe.alignment.measuring.matching import Fit, Match, fit_line, match_steps
    from iclprobe.alignment.measuring.probe_source import resolve_probes
    from iclprobe.alignment.measuring.similarities import METRICS, Similarity, similarity
    from iclprobe.alignment.metrics import (
        METRIC_INFO,
        MetricInfo,
        error_cosine,
        ilwd,
        register_metric,
        spd,
        weight_cosine,
    )
    from iclprobe.alignment.output.report import write_report
    from iclprobe.alignment.pipeline import align, align_layers, compare
    from iclprobe.alignment.protocols import PROTOCOLS, Protocol, RunSpec, get_protocol
    from iclprobe.alignment.result import AlignResult
