"""Similarities between layers and learner iterates, and step matching (DESIGN.md)."""

from iclprobe.alignment.matching import Fit, Match, fit_line, match_steps
from iclprobe.alignment.metrics import error_cosine, ilwd, spd, weight_cosine
from iclprobe.alignment.similarity import METRICS, Similarity, similarity

__all__ = [
    "METRICS",
    "Fit",
    "Match",
    "Similarity",
    "error_cosine",
    "fit_line",
    "ilwd",
    "match_steps",
    "similarity",
    "spd",
    "weight_cosine",
]
