"""Per-layer readout probes, induced weights and the PQ preconditioner analysis.

Probes are fitted on fresh sequences (`LayerProbes`) or cross-fitted on the evaluation
sequences themselves (`cross_fit`); `decodability` fits learners' predictions from a
layer's residual stream instead (how much of each a layer holds).
"""

from iclprobe.probes.crossfit import (
    CrossFit,
    ReadoutNoise,
    cross_fit,
    fold_features,
    fold_sums,
    readout_noise,
)
from iclprobe.probes.decode import decodability, held_shares
from iclprobe.probes.induced import gradient_weights, induced_weights, sample_queries
from iclprobe.probes.layer_probes import (
    LayerProbes,
    ProbeMetrics,
    model_hash,
    readout_predictions,
)
from iclprobe.probes.preconditioners import (
    Definiteness,
    PreconditionerAnalysis,
    Preconditioners,
    ahn_optimum,
    analyze_preconditioners,
    definiteness,
    distance,
    preconditioners,
)
from iclprobe.probes.readout import ReadoutProbe
from iclprobe.probes.ridge import FeatureSums, RidgeFit, RidgeSums, ridge_gcv

__all__ = [
    "CrossFit",
    "FeatureSums",
    "ReadoutNoise",
    "Definiteness",
    "LayerProbes",
    "PreconditionerAnalysis",
    "Preconditioners",
    "ProbeMetrics",
    "ReadoutProbe",
    "RidgeFit",
    "RidgeSums",
    "ahn_optimum",
    "analyze_preconditioners",
    "cross_fit",
    "decodability",
    "held_shares",
    "fold_features",
    "fold_sums",
    "readout_noise",
    "definiteness",
    "distance",
    "gradient_weights",
    "induced_weights",
    "model_hash",
    "preconditioners",
    "readout_predictions",
    "ridge_gcv",
    "sample_queries",
]
