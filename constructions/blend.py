"""A learner that is none of the candidates: GD's and Newton's predictions averaged.

The known-answer benchmark needs models whose right answer is "cannot tell" or "none of
them", not a learner's name. Its layer l predicts ``(ŷ_gd,l + ŷ_newton,l) / 2``: each
half is a candidate's iterate, their average is neither's (its induced weights are the
average too). Registered so that an `oracle` can run it (``oracle("gd_newton_blend", ...)``),
with ``candidate=False``: it is a construction, never an answer.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor

from iclprobe.algorithms.base import Iterates, check_steps, register
from iclprobe.algorithms.learners import LrSpec, gd, newton
from iclprobe.algorithms.prefix import PrefixStats, prefix_stats


@register("gd_newton_blend", label="the average of GD's and Newton's step-k predictions",
          steps=range(25), candidate=False, compare_with=())
def gd_newton_blend(xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
                    lr: LrSpec = "max", lr_scale: float = 1.0, alpha: str = "frobenius",
                    alpha_scale: float = 1.0, weights: bool = True,
                    stats: PrefixStats | None = None) -> Iterates:
    """Step k: the mean of GD's step k (``lr``, mean loss) and Newton's step k (``alpha``)."""
    k_steps = check_steps(steps)
    stats = stats if stats is not None else prefix_stats(xs, ys)
    a = gd(xs, ys, k_steps.tolist(), lr=lr, lr_scale=lr_scale, weights=weights, stats=stats)
    b = newton(xs, ys, k_steps.tolist(), alpha=alpha, alpha_scale=alpha_scale, weights=weights,
               stats=stats)
    w = None if a.weights is None or b.weights is None else (a.weights + b.weights) / 2
    return Iterates(k_steps, (a.preds + b.preds) / 2, w,
                    {"lr": lr, "lr_scale": lr_scale, "alpha": alpha, "alpha_scale": alpha_scale})
