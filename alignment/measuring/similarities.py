"""Layer × step similarity tables with bootstrap bounds.

Axis legend: ``layer`` (L + 1 rows: the embedding, then each block), ``step`` (K step
counts of a learner), ``batch``, ``pos`` (t), ``boot`` (bootstrap resamples).

A metric is computed from per-sequence moments that are averaged over sequences and then
combined, so one bootstrap code path serves both kinds of statistic: a per-sequence value
averaged over sequences (``over="positions"``: error cosine over the positions of each
sequence, Fu et al.'s Def. 3.1), and a cosine across sequences at each position
(``over="sequences"``: the error cosine of a model evaluated at one context length).
Every `similarity` call with the same ``seed`` and batch size draws the same resamples,
so statistics of two tables (the best step of Newton minus that of GD) pair up
replicate by replicate; the intervals are `bootstrap.interval`'s (expanded percentile).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from typing import Any

import torch
from torch import Tensor

from iclprobe._checks import check_seed, check_type, is_int
from iclprobe._finite import all_finite
from iclprobe.algorithms.base import Iterates
from iclprobe.alignment import metrics as M
from iclprobe.alignment.measuring.bootstrap import bootstrap_weights, interval
from iclprobe.alignment.measuring.products import fast_form
from iclprobe.errors import InputError

METRICS = M.METRIC_INFO  # the registered metrics, by name (register_metric adds one)
OVER = ("positions", "sequences")


@dataclasses.dataclass
class Similarity:
    """``values[l, k]``: similarity of layer l with the learner after ``steps[k]`` steps."""

    metric: str
    learner: str
    steps: list[int]
    values: Tensor  # [layer, step]
    lower: Tensor  # [layer, step] bootstrap bound
    upper: Tensor  # [layer, step]
    zero: Tensor  # [step]: the zero predictor's similarity, the "computes nothing" reference
    higher_is_better: bool
    t_min: int
    n_sequences: int
    confidence: float
    t_max: int | None = None  # last position in the window (None: the last of the data)
    over: str = "positions"  # "positions": per sequence, then mean; "sequences": per t
    labels: list[str] | None = None  # per column, when columns differ by more than steps
    boots: Tensor | None = dataclasses.field(default=None, repr=False)  # [layer, step, boot]

    def column_label(self, k: int) -> str:
        """How column k is shown: its step count, or its label when there is one."""
        return self.labels[k] if self.labels else str(self.steps[k])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (tensors as nested lists; the bootstrap replicates left out)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "boots"}
        for key in ("values", "lower", "upper", "zero"):
            out[key] = getattr(self, key).tolist()
        return out

    def to_json(self) -> str:
        """The table as JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        """One row per (layer, step): value, bounds and the zero predictor's value."""
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["metric", "learner", "layer", "step", "column", "value", "lower",
                         "upper", "zero_predictor"])
        for layer in range(self.values.shape[0]):
            for k, step in enumerate(self.steps):
                writer.writerow([self.metric, self.learner, layer, step, self.column_label(k),
                                 f"{self.values[layer, k].item():.6g}",
                                 f"{self.lower[layer, k].item():.6g}",
                                 f"{self.upper[layer, k].item():.6g}",
                                 f"{self.zero[k].item():.6g}"])
        return buf.getvalue()


#: Similarities within this of a row's best (relative, at least absolute) are equal to
#: round-off: the first such column in the table's order is the match (`first_best`).
ROUND_OFF = 1e-12


def first_best(scored: Tensor) -> Tensor:
    """Per row of ``scored [..., column]`` (higher is better), the matched column.

    The first column within `ROUND_OFF` of the row's best. A plain argmax lets the last bits
    of a sum choose among columns equal in exact arithmetic (under the weight cosine,
    Newton's step 0 at every α is one column up to scale), so that summing in another order
    changed the hyperparameters a match reports and the spectral view that reads them;
    within round-off, the table's order decides.
    """
    top = scored.max(-1, keepdim=True).values
    near = scored >= top - ROUND_OFF * top.abs().clamp(min=1.0)
    return near.to(torch.uint8).argmax(-1)  # the first True


def moments(metric: str, over: str, a: Tensor, b: Tensor, ys: Tensor, t_min: int,
            t_max: int | None) -> Tensor:
    """Per-sequence moments ``[..., batch, pos, m]`` whose batch mean `combine` reduces.

    ``over="positions"``: the metric's value per sequence (m = 1); ``over="sequences"``: the
    metric's ``across`` products (m = 3), combined into a cosine per position.
    """
    if over == "sequences":
        return M.across_moments(metric, a, b, ys, t_min, t_max)
    fast = fast_form(metric)
    if fast is not None and a.ndim == b.ndim and a.shape[1] == 1 and b.shape[0] == 1:
        t_max = M.check_window(t_min, t_max, ys.shape[-1])
        return fast(a[:, 0], b[0], ys, slice(t_min, t_max + 1))[..., None, None]
    return M.per_sequence(metric, a, b, ys, t_min, t_max)[..., None, None]


def combine(mean_moments: Tensor) -> Tensor:
    """The statistic from moments averaged over sequences, ``[..., pos, m] -> [...]``."""
    if mean_moments.shape[-1] == 1:
        return mean_moments[..., 0].mean(-1)
    ab, aa, bb = mean_moments.unbind(-1)
    den = (aa * bb).sqrt()
    return torch.where(den > 0, ab / torch.where(den > 0, den, 1.0), 0.0).mean(-1)


def column_labels(iterates: Iterates) -> list[str] | None:
    """Column labels when a hyperparameter varies per column (e.g. a learning-rate grid)."""
    k = iterates.steps.numel()
    varying = {key: v for key, v in iterates.hyper.items()
               if isinstance(v, list) and len(v) == k and k > 1 and len(set(map(str, v))) > 1}
    if not varying:
        return None

    def show(value: Any) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    return [f"{int(step)} ({', '.join(key + ' ' + show(v[i]) for key, v in varying.items())})"
            for i, step in enumerate(iterates.steps.tolist())]


def _check_defined(metric: str, learner: str, layers: Tensor, other: Tensor, ys: Tensor,
                   t_min: int, t_max: int) -> None:
    """Refuse a cosine table that is undefined everywhere (all-zero data, say).

    A cosine with a zero vector counts as 0 (the zero predictor's reference, a learner's
    step 0 by weight cosine): right for one step or one layer, but not when every entry
    would be that convention and none a measurement: the error cosine when the learner's
    residuals (or every layer's) are 0 on every sequence, the weight cosine when every y
    is 0 (every learner's weights are then 0).
    """
    if metric not in ("error_cosine", "weight_cosine"):
        return
    window = slice(t_min, t_max + 1)
    at = f"on every sequence and position t = {t_min}..{t_max} (all-zero data?)"
    if metric == "weight_cosine":
        if not bool((ys[..., window] != 0).any()):
            raise InputError(f"similarity: the weight cosine is undefined: every y is 0 {at}, "
                             "so every learner's weights are 0")
        return
    for who, values in (("the learner " + learner, other), ("the layers", layers)):
        if not bool(((values - ys)[..., window] != 0).any()):
            raise InputError(f"similarity: the error cosine is undefined: the residuals "
                             f"(prediction − y) of {who} are 0 {at}")


def similarity(layer_values: Tensor, iterates: Iterates, ys: Tensor,
               metric: str = "error_cosine", t_min: int = 1, n_boot: int = 200,
               confidence: float = 0.95, seed: int = 0, chunk: int = 64,
               t_max: int | None = None, over: str = "positions",
               check: bool = True, *, labels: bool = True) -> Similarity:
    """Similarity of every layer with every step count of a learner.

    Args:
        layer_values: per-layer predictions ``[layer, batch, pos]`` (error_cosine, spd) or
            induced weights ``[layer, batch, pos, n_dims]`` (weight_cosine, ilwd).
        iterates: the learner's `Iterates` (with weights for the weight metrics).
        ys: ``[batch, pos]``.
        metric: a registered metric (``METRICS``: error_cosine, weight_cosine, spd, ilwd, and
            any added with `register_metric`).
        t_min, t_max: the positions that enter (default: t >= 1).
        n_boot: bootstrap resamples of the sequences (seeded by ``seed``).
        confidence: width of the bootstrap interval.
        chunk: step counts evaluated at once (bounds memory at thousands of steps).
        over: "positions" (a value per sequence, averaged) or "sequences" (a cosine across
            sequences at each position, averaged over positions: only for the metrics
            registered with an ``across`` form, such as error_cosine).
        check: refuse values that are not finite in the window ``t_min..t_max`` (outside
            it, where a model may blow up unaligned, they count as 0: no metric reads them)
            and tables undefined everywhere; False only for inputs already checked (the
            pipeline's learners and layers, compared many times over).
        labels: describe each column by the hyperparameters that vary across them
            (``Similarity.labels``); False for a table only its numbers are read from.
    """
    info = M.metric_info(metric)
    other, last = _checked(info, layer_values, iterates, ys, n_boot, confidence, seed, chunk,
                           over, t_min, t_max, check)
    if check:  # finite in the window (checked); what lies outside it enters no metric
        layer_values, other, ys = (_zero_outside(x, pos) for x, pos in
                                   ((layer_values, 2), (other, 2), (ys, 1)))
    a, b = layer_values.to(torch.float64)[:, None], other.to(torch.float64)[None]
    ys64 = ys.to(torch.float64)
    if check:
        _check_defined(metric, iterates.name, a[:, 0], b[0], ys64, t_min, last)
    weights = bootstrap_weights(ys.shape[0], n_boot, seed)
    values, boots = [], []
    for s in range(0, b.shape[1], chunk):
        mom = moments(metric, over, a, b[:, s:s + chunk], ys64, t_min,
                      t_max)  # [layer, step, batch, pos, m]
        values.append(combine(mom.mean(2)))
        boots.append(combine(_resampled(mom, weights)))
    zero_mom = moments(metric, over, torch.zeros_like(a[:1]), b, ys64, t_min, t_max)
    value, boot = torch.cat(values, dim=1), torch.cat(boots, dim=1)  # boot: [layer, step, boot]
    lower, upper = interval(boot, confidence, ys.shape[0])
    return Similarity(metric, iterates.name, iterates.steps.tolist(), value, lower, upper,
                      combine(zero_mom.mean(2))[0], info.higher_is_better, t_min, ys.shape[0],
                      confidence, t_max, over, column_labels(iterates) if labels else None, boot)


def _resampled(mom: Tensor, weights: Tensor) -> Tensor:
    """Moments ``[L, K, batch, pos, m]`` averaged by each resample's weights ``[boot, batch]``.

    One matrix product where a value per sequence is all (pos = m = 1: the positions'
    tables), einsum's contraction otherwise.
    """
    n_l, n_k, batch, pos, m = mom.shape
    if pos == m == 1:
        return (mom.reshape(-1, batch) @ weights.T).view(n_l, n_k, -1, 1, 1)
    return torch.einsum("lkbtm,rb->lkrtm", mom, weights)


def similarity_values(layer_values: Tensor, iterates: Iterates, ys: Tensor,
                      metric: str = "error_cosine", t_min: int = 1, t_max: int | None = None,
                      over: str = "positions", chunk: int = 64) -> Tensor:
    """`similarity`'s ``values`` alone, ``[layer, step]``: the same numbers, bit for bit.

    For tables only their values are read from (a rival's best imitation, a mix's fit):
    no bootstrap, interval, zero predictor's reference or labels, which at a few rows cost
    as much as the table itself. The inputs are taken as checked for finiteness
    (`similarity` with ``check=False``); their shapes and the window are checked.
    """
    info = M.metric_info(metric)
    other, _ = _checked(info, layer_values, iterates, ys, 2, 0.5, 0, chunk, over, t_min,
                        t_max, False)
    a, b = layer_values.to(torch.float64)[:, None], other.to(torch.float64)[None]
    ys64 = ys.to(torch.float64)
    return torch.cat([combine(moments(metric, over, a, b[:, s:s + chunk], ys64, t_min,
                                      t_max).mean(2))
                      for s in range(0, b.shape[1], chunk)], dim=1)


def _checked(info: M.MetricInfo, layer_values: Tensor, iterates: Iterates, ys: Tensor,
             n_boot: int, confidence: float, seed: int, chunk: int, over: str, t_min: int,
             t_max: int | None, finite: bool = True) -> tuple[Tensor, int]:
    """`similarity`'s arguments checked, the window last.

    Returns what the layers are compared with (the learner's predictions, or its weights
    for a weight metric) and the window's last position.
    """
    metric = info.name
    check_type("similarity", "layer_values", layer_values, Tensor, "a torch.Tensor")
    check_type("similarity", "iterates", iterates, Iterates, "an Iterates (`iterates`)")
    check_type("similarity", "ys", ys, Tensor, "a torch.Tensor")
    if over not in OVER or (over == "sequences" and info.across is None):
        raise InputError(f"over must be one of {OVER} ('sequences' only for "
                         f"{[m for m, i in METRICS.items() if i.across is not None]}), got "
                         f"{over!r} with metric {metric!r}")
    if not 0 < confidence < 1:
        raise InputError(f"confidence must be in (0, 1), got {confidence!r}")
    if not is_int(n_boot) or n_boot < 2:
        raise InputError(f"n_boot must be an integer >= 2, got {n_boot!r}")
    if not is_int(chunk) or chunk < 1:
        raise InputError(f"chunk must be a positive integer, got {chunk!r}")
    check_seed("similarity", "seed", seed)
    other = iterates.weights if info.on == "weights" else iterates.preds
    if other is None:
        raise InputError(f"metric {metric!r} needs the learner's weights: "
                         "compute the iterates with weights=True")
    if layer_values.shape[1:] != other.shape[1:]:
        raise InputError(f"layer_values must have shape [layer, "
                         f"{', '.join(map(str, other.shape[1:]))}] to match the iterates, "
                         f"got {tuple(layer_values.shape)}")
    if ys.shape != iterates.preds.shape[1:]:
        raise InputError(f"ys must have shape {tuple(iterates.preds.shape[1:])}, "
                         f"got {tuple(ys.shape)}")
    if ys.ndim != 2 or ys.shape[0] == 0:
        raise InputError(f"similarity needs at least one sequence: ys has shape "
                         f"{tuple(ys.shape)} [batch, pos]")
    last = M.check_window(t_min, t_max, ys.shape[-1])
    for what, tensor, pos in (("layer values", layer_values, 2),
                              (f"{iterates.name} iterates", other, 2), ("ys", ys, 1)):
        if finite and not all_finite(tensor.narrow(pos, t_min, last + 1 - t_min)):
            raise InputError(f"similarity: the {what} are not finite (found NaN or Inf) at "
                             f"positions t = {t_min}..{last}, the window compared")
    return other, last


def _zero_outside(values: Tensor, pos: int) -> Tensor:
    """``values`` with what is not finite set to 0: outside the window (the only place left).

    A model or learner may blow up where it is not aligned (a layer valid only at its
    trained length); its values there enter no metric, but would turn a product over the
    whole tensor into NaN. ``values`` itself where all is finite (no copy).
    """
    if all_finite(values):
        return values
    return torch.where(torch.isfinite(values), values, torch.zeros((), dtype=values.dtype))
