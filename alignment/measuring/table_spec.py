"""`TableSpec`: how the candidates' tables are computed, and their probes-noise correction."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from iclprobe.alignment.measuring.similarities import Similarity
from iclprobe.alignment.metrics import METRIC_INFO, metric_info


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """How the candidates' tables are computed (the protocol's window and statistics)."""

    window: tuple[int, int]
    weight_t_min: int
    over: str  # "positions" or "sequences" (a model aligned at one position)
    n_boot: int
    confidence: float
    seed: int
    ceilings: Mapping[str, Tensor] | None = None  # metric -> per layer (`noise_ceilings`)
    noise_features: int | None = None  # the probes' width: the noise's degrees of freedom

    def correct(self, metric: str, values: Tensor, layers: Tensor | slice = slice(None)
                ) -> Tensor:
        """Similarities of the layers ``layers`` (first axis) corrected for readout noise.

        By the metric's geometry: a cosine divided by the layer's ceiling (what a perfect
        copy of the layer reaches through the noise), a squared distance less it.
        """
        if self.ceilings is None or metric not in self.ceilings:
            return values
        c = self.ceilings[metric][layers].to(values.dtype)
        c = c.reshape(-1, *[1] * (values.ndim - 1))
        if metric_info(metric).geometry == "cosine":
            return values / c
        return values - c

    def slack(self, metric: str, layer: int) -> float:
        """How far the noise correction may leave layer ``layer``'s similarities (0: none).

        The correction removes the noise's expected effect, measured on draws of it
        (`noise_ceilings`); the effect on the layer is another draw. The effect is a
        squared norm of the probes' error, which has ``p`` degrees of freedom
        (``noise_features``, the width the probes read), so it varies by about ``√(2/p)``
        of its size: that share of the correction (``1/c − 1`` for a cosine of a
        similarity near 1, the noise's power ``c`` for a squared distance) is returned;
        none where ``p`` is unknown (noise given to `align_predictions` without it).
        """
        if self.ceilings is None or metric not in self.ceilings or not self.noise_features:
            return 0.0
        c = float(self.ceilings[metric][layer])
        size = 1.0 / c - 1.0 if metric_info(metric).geometry == "cosine" else c
        return size * min(1.0, (2 / self.noise_features) ** 0.5)

    def corrected(self, sim: Similarity) -> Similarity:
        """``sim`` with its values, bounds and replicates corrected (`correct`)."""
        if self.ceilings is None or sim.metric not in self.ceilings:
            return sim
        fix = functools.partial(self.correct, sim.metric)
        return dataclasses.replace(sim, values=fix(sim.values), lower=fix(sim.lower),
                                   upper=fix(sim.upper),
                                   boots=None if sim.boots is None else fix(sim.boots))

    def t_min(self, metric: str) -> int:
        """First position of ``metric``'s window (weights: from the protocol's weight t)."""
        if METRIC_INFO[metric].on == "weights" and self.over == "positions":
            return max(self.window[0], self.weight_t_min)
        return self.window[0]

    def over_for(self, metric: str) -> str:
        """Across sequences only for the metrics that have that form."""
        return self.over if METRIC_INFO[metric].across else "positions"

    def kw(self, metric: str) -> dict[str, Any]:
        """The window and pooling of ``metric`` as `similarity` keywords."""
        return {"t_min": self.t_min(metric), "t_max": self.window[1],
                "over": self.over_for(metric)}
