"""The one liveness rule: does a layer compute something?

A layer is **live** when its normalized error over the aligned window is below the zero
predictor's beyond the bootstrap interval: the paired difference
``mean_b e_l(b) − mean_b e_0(b)`` (``e_l(b)``: layer l's mean squared error on sequence b
over the window, ``e_0(b)``: the zero predictor's, ``mean y²``) has its upper bound below 0,
with the sequences resampled as every other interval of `align` resamples them. A layer
whose error is not below the zero predictor's is never live, whatever a similarity says of
it (a cosine of a near-zero residual, or a probe's overfit); every view, protocol, readout
and position uses this rule, and a layer that is not live gets no verdict ("computes
nothing").
"""

from __future__ import annotations

from torch import Tensor

from iclprobe.alignment.measuring.bootstrap import bootstrap_weights, interval


def live_layers(layer_preds: Tensor, ys: Tensor, window: tuple[int, int], n_boot: int,
                confidence: float, seed: int) -> list[bool]:
    """Per layer, whether it is live (see the module docstring).

    Args:
        layer_preds: ``[layer, batch, pos]`` each layer's predictions.
        ys: ``[batch, pos]`` the targets.
        window: the positions ``(t_min, t_max)`` that are aligned.
        n_boot, confidence, seed: the bootstrap of the difference (as `similarity`'s).
    """
    lo, hi = window
    err = (layer_preds[..., lo:hi + 1].double() - ys[:, lo:hi + 1].double()).pow(2).mean(-1)
    zero = ys[:, lo:hi + 1].double().pow(2).mean(-1)  # [batch]
    diff = err - zero  # [layer, batch]
    weights = bootstrap_weights(diff.shape[1], n_boot, seed)  # [boot, batch]
    boots = diff @ weights.T  # [layer, boot]
    _, upper = interval(boots, confidence, diff.shape[1])
    mean = diff.mean(-1)
    return [bool(m < 0 and u < 0) for m, u in zip(mean.tolist(), upper.tolist())]
