"""Reference learners as batched iterates over every prefix (docs/architecture.md).

``iterates(name, xs, ys, steps, **hyper)`` looks a learner up in one registry; each is also
a function here. Adding a learner is one function and one ``@register`` line.

The learners are references, not differentiable: xs and ys that require gradients are
read detached, and the iterates carry no gradient.
"""

from iclprobe.algorithms import learners as _learners  # noqa: F401  (registers learners)
from iclprobe.algorithms import pgd as _pgd  # noqa: F401
from iclprobe.algorithms import recurrences as _recurrences  # noqa: F401
from iclprobe.algorithms import schedule as _schedule  # noqa: F401
from iclprobe.algorithms import sequential as _sequential  # noqa: F401
from iclprobe.algorithms.base import (
    LEARNERS,
    Iterates,
    LearnerInfo,
    aligned_learners,
    candidate_learners,
    iterates,
    learner_info,
    register,
)
from iclprobe.algorithms.learners import gd, newton, ols, ridge
from iclprobe.algorithms.pgd import pgd
from iclprobe.algorithms.prefix import PrefixStats, prefix_stats
from iclprobe.algorithms.recurrences import cg, gd_plus_plus, momentum
from iclprobe.algorithms.schedule import pgd_schedule
from iclprobe.algorithms.sequential import online_gd

__all__ = [
    "LEARNERS",
    "LearnerInfo",
    "aligned_learners",
    "candidate_learners",
    "learner_info",
    "Iterates",
    "PrefixStats",
    "cg",
    "gd",
    "gd_plus_plus",
    "iterates",
    "momentum",
    "newton",
    "ols",
    "online_gd",
    "pgd",
    "pgd_schedule",
    "prefix_stats",
    "register",
    "ridge",
]
