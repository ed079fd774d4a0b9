"""The probes' own noise as a margin on the answer's separations (`probe_margins`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from iclprobe.algorithms.base import Iterates
from iclprobe.alignment.measuring.candidate import columns_of
from iclprobe.alignment.measuring.candidates import Candidate, TableSpec
from iclprobe.alignment.measuring.similarities import similarity_values
from iclprobe.alignment.metrics import METRIC_INFO


def probe_margins(x: str, layers: Sequence[int], best: Mapping[str, Sequence[int]], sign: float,
                  cands: Mapping[str, Candidate], metric: str, ys: Tensor, spec: TableSpec,
                  clean: Tensor, noisy: Sequence[Tensor]) -> dict[str, dict[int, float]]:
    """How far the probes' own noise moves each layer's lead of X over each rival.

    A layer read by probes carries the probes' estimation error, shared by the sequences a
    probe read, so the bootstrap over sequences does not see it. ``noisy``: the layers read
    with a sample of that error (`probes.readout_noise`) added and subtracted. The lead is
    the layer's similarity to X's matched column (``best[X][layer]``) less its similarity
    to the rival's (as the tables, corrected; ``sign`` turns lower-is-better metrics
    around); its margin is the larger change of the lead under either sample. Returns
    rival -> layer -> margin (empty where ``noisy`` is: an exact readout).
    """
    if not noisy:
        return {}
    on_w = METRIC_INFO[metric].on == "weights"
    keys = list(cands)
    out: dict[str, dict[int, float]] = {y: {} for y in keys if y != x}
    for i in layers:
        cols = torch.stack([columns_of(cands[k].of(metric), [best[k][i]], on_w)[0]
                            for k in keys])
        matched = Iterates(torch.zeros(len(keys), dtype=torch.long),
                           cols if not on_w else cols.new_zeros(cols.shape[:-1]),
                           cols if on_w else None, {}, "matched")
        base = _leads(keys.index(x), i, clean, matched, sign, metric, ys, spec)
        moved = torch.stack([(_leads(keys.index(x), i, v, matched, sign, metric, ys, spec)
                              - base).abs() for v in noisy]).amax(0)
        for j, y in enumerate(keys):
            if y != x:
                out[y][i] = float(moved[j])
    return out


def _leads(at: int, layer: int, values: Tensor, matched: Iterates, sign: float, metric: str,
           ys: Tensor, spec: TableSpec) -> Tensor:
    """The layer's similarity to column ``at`` less its similarity to each (corrected)."""
    rows = slice(layer, layer + 1)
    sim = similarity_values(values[rows], matched, ys, metric, **spec.kw(metric))
    scored = sign * spec.correct(metric, sim, rows)[0]
    return scored[at] - scored
