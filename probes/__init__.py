"""Per-layer readout probes, induced weights and preconditioner analysis (DESIGN.md)."""

from iclprobe.probes.induced import gradient_weights, induced_weights, sample_queries
from iclprobe.probes.layer_probes import (
    LayerProbes,
    ProbeMetrics,
    model_hash,
    readout_predictions,
)
from iclprobe.probes.preconditioners import (
    PreconditionerAnalysis,
    Preconditioners,
    ahn_optimum,
    analyze_preconditioners,
    distance,
    preconditioners,
)
from iclprobe.probes.readout import ReadoutProbe
from iclprobe.probes.ridge import RidgeFit, ridge_gcv

__all__ = [
    "LayerProbes",
    "PreconditionerAnalysis",
    "Preconditioners",
    "ProbeMetrics",
    "ReadoutProbe",
    "RidgeFit",
    "ahn_optimum",
    "analyze_preconditioners",
    "distance",
    "gradient_weights",
    "induced_weights",
    "model_hash",
    "preconditioners",
    "readout_predictions",
    "ridge_gcv",
    "sample_queries",
]
