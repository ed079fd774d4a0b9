"""Similarity metrics between predictors, per sequence and averaged.

Fu et al. 2024, Def. 3.1 (similarity of errors) and Def. 3.2 (similarity of induced
weights); Akyürek et al. 2023 (SPD: squared prediction difference; ILWD: implicit linear
weight difference). Axis legend: ``batch``, ``pos`` (t), ``n_dims``; any leading axes
broadcast. Only positions ``t_min <= t <= t_max`` enter (t = 0 has no context: every
learner predicts 0 there; ``t_max`` defaults to the last position).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from iclprobe._checks import check_name, is_int
from iclprobe._finite import all_finite
from iclprobe.errors import InputError, InputTypeError
from iclprobe.plugins import claim, registrant


def check_window(t_min: int, t_max: int | None, n: int) -> int:
    """Validate the position window ``[t_min, t_max]`` of ``n`` positions; returns t_max."""
    if not is_int(t_min) or not 0 <= t_min < n:
        raise InputError(f"t_min must be an integer in [0, {n - 1}], got {t_min!r}")
    if t_max is None:
        return n - 1
    if not is_int(t_max) or not t_min <= t_max < n:
        raise InputError(f"t_max must be an integer in [{t_min}, {n - 1}], got {t_max!r}")
    return t_max


def cosine(a: Tensor, b: Tensor) -> Tensor:
    """Cosine along the last axis; 0 where either vector is 0."""
    num = (a * b).sum(-1)
    den = a.norm(dim=-1) * b.norm(dim=-1)
    return torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)


def error_cosine_per_sequence(preds_a: Tensor, preds_b: Tensor, ys: Tensor, t_min: int = 1,
                              t_max: int | None = None) -> Tensor:
    """Per sequence, the cosine between the residual vectors (pred − y) over the window."""
    t_max = check_window(t_min, t_max, ys.shape[-1])
    window = slice(t_min, t_max + 1)
    return cosine(preds_a[..., window] - ys[..., window], preds_b[..., window] - ys[..., window])


def _checked_pair(who: str, a: Tensor, b: Tensor, ys: Tensor | None, core: int, t_min: int,
                  t_max: int | None) -> None:
    """Refuse what the public metrics cannot compare.

    Tensors whose last ``core`` axes (``batch, pos`` or ``batch, pos, n_dims``) agree
    (leading axes broadcast: a stack of predictors against one), with at least one
    sequence, finite in the window ``t_min..t_max``.
    """
    named = (("a", a), ("b", b)) + ((("ys", ys),) if ys is not None else ())
    for name, t in named:
        if not isinstance(t, Tensor):
            raise InputTypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim < core:
            raise InputError(f"{who}: {name} must have at least {core} axes "
                             f"[..., {'batch, pos' if core == 2 else 'batch, pos, n_dims'}], "
                             f"got shape {tuple(t.shape)}")
    shapes = {name: tuple(t.shape[t.ndim - core:]) for name, t in named}
    if len(set(shapes.values())) > 1 or shapes["a"][0] == 0:
        raise InputError(f"{who}: the inputs must agree on their last {core} axes, with at "
                         f"least one sequence; got {shapes}")
    t_max = check_window(t_min, t_max, shapes["a"][1])
    for name, t in named:
        if not all_finite(t.narrow(t.ndim - core + 1, t_min, t_max + 1 - t_min)):
            raise InputError(f"{who}: {name} is not finite (NaN or Inf) at t = "
                             f"{t_min}..{t_max}, the window compared")


def error_cosine(preds_a: Tensor, preds_b: Tensor, ys: Tensor, t_min: int = 1,
                 t_max: int | None = None) -> Tensor:
    """Fu et al.'s similarity of errors: mean over sequences of the residual cosine.

    ``t_min=0`` reproduces their code (which includes the context-free position).
    """
    _checked_pair("error_cosine", preds_a, preds_b, ys, 2, t_min, t_max)
    return error_cosine_per_sequence(preds_a, preds_b, ys, t_min, t_max).mean(-1)


def weight_cosine_per_sequence(w_a: Tensor, w_b: Tensor, t_min: int = 1,
                               t_max: int | None = None) -> Tensor:
    """Per sequence, the mean over the window of the cosine of the induced weights."""
    t_max = check_window(t_min, t_max, w_a.shape[-2])
    return cosine(w_a[..., t_min:t_max + 1, :], w_b[..., t_min:t_max + 1, :]).mean(-1)


def weight_cosine(w_a: Tensor, w_b: Tensor, t_min: int = 1, t_max: int | None = None) -> Tensor:
    """Fu et al.'s similarity of induced weights, averaged over (sequence, t in the window)."""
    _checked_pair("weight_cosine", w_a, w_b, None, 3, t_min, t_max)
    return weight_cosine_per_sequence(w_a, w_b, t_min, t_max).mean(-1)


def spd_per_sequence(preds_a: Tensor, preds_b: Tensor, t_min: int = 1,
                     n_dims: int | None = None, t_max: int | None = None) -> Tensor:
    """Per sequence, the mean squared prediction difference over the window (÷ d if given)."""
    t_max = check_window(t_min, t_max, preds_a.shape[-1])
    window = slice(t_min, t_max + 1)  # sliced first: the columns' tables are large
    out = (preds_a[..., window] - preds_b[..., window]).pow(2).mean(-1)
    return out / n_dims if n_dims else out


def spd(preds_a: Tensor, preds_b: Tensor, t_min: int = 1, n_dims: int | None = None,
        t_max: int | None = None) -> Tensor:
    """Akyürek et al.'s SPD; dimension-normalized (÷ d, Garg's convention) with ``n_dims``."""
    _checked_pair("spd", preds_a, preds_b, None, 2, t_min, t_max)
    return spd_per_sequence(preds_a, preds_b, t_min, n_dims, t_max).mean(-1)


def ilwd_per_sequence(w_a: Tensor, w_b: Tensor, t_min: int = 1, normalized: bool = False,
                      t_max: int | None = None) -> Tensor:
    """Per sequence, the mean squared weight distance ‖w_a − w_b‖² over the window."""
    t_max = check_window(t_min, t_max, w_a.shape[-2])
    out = (w_a - w_b)[..., t_min:t_max + 1, :].pow(2).sum(-1).mean(-1)
    return out / w_a.shape[-1] if normalized else out


def ilwd(w_a: Tensor, w_b: Tensor, t_min: int = 1, normalized: bool = False,
         t_max: int | None = None) -> Tensor:
    """Akyürek et al.'s ILWD; ÷ d when ``normalized``."""
    _checked_pair("ilwd", w_a, w_b, None, 3, t_min, t_max)
    return ilwd_per_sequence(w_a, w_b, t_min, normalized, t_max).mean(-1)


# ------------------------------------------------------------------ registry
MetricFn = Callable[[Tensor, Tensor, Tensor, int, int], Tensor]


@dataclasses.dataclass(frozen=True)
class MetricInfo:
    """What ``align``, its report and ``--metric`` need to know of a similarity metric.

    ``per_sequence(a, b, ys, t_min, t_max) -> [..., batch]`` compares two predictors per
    sequence over the positions ``t_min..t_max`` (both integers): predictions
    ``[..., batch, pos]`` when ``on="preds"``, induced weights ``[..., batch, pos, n_dims]``
    when ``on="weights"``. ``verdict``: the metric enters `AlignResult.verdict` (the fitted
    view's metrics combined). ``across``: None, or the metric's form across sequences at each
    position, ``(a, b, ys, t_min, t_max) -> [..., batch, pos', 3]``: per sequence and
    position of the window the products ``(u·v, u·u, v·v)`` of two vectors whose batch means
    make a cosine across sequences (the error cosine's are those of the residuals).
    ``geometry``: how the metric relates to a distance, for the answer's geometric tests
    and the correction of a probe readout's noise: "cosine" (a mean of cosines: the angle
    is ``arccos``, independent noise scales it down), "squared" (a mean squared distance:
    the distance is its square root, independent noise adds its power), or None (neither
    is applied).
    """

    name: str
    per_sequence: MetricFn
    on: str
    higher_is_better: bool
    label: str
    across: MetricFn | None = None
    verdict: bool = True
    registrant: str = ""  # who registered it (`iclprobe.plugins.registrant`), for messages
    geometry: str | None = None


METRIC_INFO: dict[str, MetricInfo] = {}
METRIC_ON = ("preds", "weights")
GEOMETRIES = ("cosine", "squared")


def register_metric(name: str, *, on: str, higher_is_better: bool, label: str | None = None,
                    across: MetricFn | None = None, verdict: bool = True,
                    geometry: str | None = None, replace: bool = False
                    ) -> Callable[[MetricFn], MetricFn]:
    """Add a metric to the registry.

    One function and this decorator make a metric available to ``align``
    (``AlignConfig(metrics=...)``, ``--metric``), its tables, report and plots. The function
    is called as ``fn(a, b, ys, t_min, t_max)`` with integer ``t_min <= t_max`` and returns
    one value per sequence, ``[..., batch]`` (checked on every call).

    Args:
        across: the products whose batch means make the metric's cosine across sequences
            at each position (see `MetricInfo`), used where a model is evaluated at one
            position only; None (the default): the metric is computed per sequence there too.
            ``across=True`` is refused: a metric has no across form unless it is given.
        verdict: whether the metric's fitted-view verdicts enter `AlignResult.verdict`
            (where it is computed). Among the built-in metrics ilwd does not: through probe
            readouts (noisy induced weights, squared) the known-answer benchmark measured 15
            false attributions by ilwd on its main grid, and its leans the other way cost
            the verdict layers; it is reported per metric all the same.
        geometry: "cosine", "squared" or None (see `MetricInfo`): what lets the answer test
            whether a layer lies between two learners, and correct a probe readout's noise.
        replace: replace the metric registered as ``name`` (without it, a name taken is
            refused, naming who registered it); every command then says what replaced what.

    Raises:
        ValueError, TypeError: a bad switch, or a function that cannot be called with
            ``(a, b, ys, t_min, t_max)``.
    """
    check_name("metric", name)
    if on not in METRIC_ON:
        raise InputError(f"on must be one of {METRIC_ON}, got {on!r}")
    if not isinstance(higher_is_better, bool):
        raise InputTypeError(f"higher_is_better must be a bool, got {higher_is_better!r}")
    if label is not None and not isinstance(label, str):
        raise InputTypeError(f"label must be a string, got {label!r}")
    if not isinstance(verdict, bool) or (geometry is not None and geometry not in GEOMETRIES):
        raise InputTypeError(f"verdict must be a bool and geometry one of {GEOMETRIES} or "
                             f"None, got verdict={verdict!r}, geometry={geometry!r}")
    if across is not None:
        if isinstance(across, bool) or not callable(across):
            raise InputTypeError(f"metric {name!r}: across must be None or a function (a, b, ys, "
                            "t_min, t_max) -> [..., batch, pos, 3] giving the products "
                            f"(u·v, u·u, v·v) of a cosine across sequences, got {across!r}")
        _check_signature(name, "across", across)

    def wrap(fn: MetricFn) -> MetricFn:
        _check_signature(name, "the metric", fn)
        _try_metric(name, on, fn, across)
        by = registrant(getattr(fn, "__module__", None) or "?")
        taken = METRIC_INFO.get(name)
        claim("metric", name, taken.registrant if taken else None, by, replace)
        METRIC_INFO[name] = MetricInfo(name, fn, on, higher_is_better,
                                       label or name.replace("_", " "), across, verdict, by,
                                       geometry)
        return fn

    return wrap


def _check_signature(name: str, what: str, fn: Any) -> None:
    """Refuse a function that cannot be called as ``fn(a, b, ys, t_min, t_max)``."""
    if not callable(fn):
        raise InputTypeError(f"metric {name!r}: {what} must be a function, got {fn!r}")
    try:
        inspect.signature(fn).bind(*"abcde")
    except TypeError as err:
        raise InputTypeError(f"metric {name!r}: {what} {getattr(fn, '__name__', fn)}"
                        f"{inspect.signature(fn)} must take (a, b, ys, t_min, t_max): "
                        f"{err}") from None


#: The sizes a metric is tried on when registered, no two alike (a metric that reads the
#: wrong axis gets a shape that shows it), with leading axes as ``align`` passes them.
TRIAL = {"layer": 2, "step": 3, "batch": 5, "pos": 7, "n_dims": 4}
_ON_TEXT = {"preds": "predictions [..., batch, pos]",
            "weights": "induced weights [..., batch, pos, n_dims]"}


def _try_metric(name: str, on: str, fn: Any, across: Any) -> None:
    """Call a metric (and its across form) once on random data of the kind ``on`` says.

    A metric written for the other kind of input than its ``on=``, or one that does not
    return one value per sequence, is refused here, naming ``on=``, not at its first use.
    """
    n_l, n_k, b, n, d = TRIAL.values()
    core = (b, n) if on == "preds" else (b, n, d)
    g = torch.Generator().manual_seed(0)
    x = torch.randn((n_l, 1, *core), generator=g, dtype=torch.float64)
    y = torch.randn((n_k, *core), generator=g, dtype=torch.float64)
    ys = torch.randn((b, n), generator=g, dtype=torch.float64)
    other = "weights" if on == "preds" else "preds"
    sizes = ", ".join(f"{k}={v}" for k, v in TRIAL.items() if on == "weights" or k != "n_dims")
    where = (f"metric {name!r}, registered with on={on!r} (it compares {_ON_TEXT[on]}), "
             f"tried on inputs of shapes {tuple(x.shape)} and {tuple(y.shape)} ({sizes})")
    hint = f"if it compares {_ON_TEXT[other]}, register it with on={other!r}"
    for what, f, want in (("the metric", fn, (n_l, n_k, b)),
                          ("its across form", across, None)):
        if f is None:
            continue
        try:
            out = f(x, y, ys, 1, n - 1)
        except Exception as err:  # noqa: BLE001 - any error of the user's function
            raise InputError(f"{where}: {what} raised {type(err).__name__}: {err}; {hint}") \
                from err
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        ok = isinstance(out, Tensor) and (out.shape == want if want is not None else
                                          out.ndim >= 3 and out.shape[-1] == 3
                                          and out.shape[:-2] == (n_l, n_k, b))
        if not ok:
            need = (f"one value per sequence, shape {want}" if want is not None else
                    f"[{n_l}, {n_k}, {b}, pos, 3]: the products (u·v, u·u, v·v)")
            raise InputError(f"{where}: {what} must return {need}, got {got}; {hint}")
        if not all_finite(out):
            raise InputError(f"{where}: {what} returned NaN or Inf on finite random inputs")


def metric_info(name: str) -> MetricInfo:
    """The registration of metric ``name`` (the error lists the registered ones)."""
    if name not in METRIC_INFO:
        raise InputError(f"metric must be one of {list(METRIC_INFO)}, got {name!r}")
    return METRIC_INFO[name]


def on_weights(name: str) -> bool:
    """Whether metric ``name`` compares induced weights (else predictions)."""
    return metric_info(name).on == "weights"


def per_sequence(name: str, a: Tensor, b: Tensor, ys: Tensor, t_min: int,
                 t_max: int | None) -> Tensor:
    """Metric ``name`` per sequence, ``[..., batch]``, its output's shape checked."""
    info = metric_info(name)
    t_max = check_window(t_min, t_max, ys.shape[-1])
    out = info.per_sequence(a, b, ys, t_min, t_max)
    core = 1 if info.on == "preds" else 2
    want = _broadcast(tuple(a.shape[:-core]), tuple(b.shape[:-core]))
    if not isinstance(out, Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise InputError(f"metric {name!r} must return one value per sequence, shape "
                         f"{tuple(want)} here (the inputs' shape less its last "
                         f"{'axis' if core == 1 else 'two axes'}: {_ON_TEXT[info.on]}, as "
                         f"registered with on={info.on!r}), got {got}")
    _check_finite_output(name, out)
    return out


def _check_finite_output(name: str, out: Tensor) -> None:
    """Refuse a metric's value that is not finite: a NaN would read as "no match" silently."""
    if not all_finite(out):
        raise InputError(f"metric {name!r} returned values that are not finite (NaN or Inf) "
                         "on finite inputs: a metric must be defined for every pair, an "
                         "all-zero one included (a learner's step 0 and the zero predictor's "
                         "reference are 0: the built-in cosines count a cosine with 0 as 0)")


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy's broadcast of two shapes (torch.broadcast_shapes imports sympy: 1.4 s once)."""
    a, b = (1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b)):
        raise InputError(f"shapes {a} and {b} do not broadcast")
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def across_moments(name: str, a: Tensor, b: Tensor, ys: Tensor, t_min: int,
                   t_max: int | None) -> Tensor:
    """Metric ``name``'s across-sequence products ``[..., batch, pos, 3]``, checked."""
    info = metric_info(name)
    if info.across is None:
        raise InputError(f"metric {name!r} has no form across sequences; those that have: "
                         f"{[m for m, i in METRIC_INFO.items() if i.across is not None]}")
    t_max = check_window(t_min, t_max, ys.shape[-1])
    out = info.across(a, b, ys, t_min, t_max)
    if not isinstance(out, Tensor) or out.ndim < 3 or out.shape[-1] != 3:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise InputError(f"metric {name!r}: across must return [..., batch, pos, 3], got {got}")
    _check_finite_output(name, out)
    return out


def _residual_products(a: Tensor, b: Tensor, ys: Tensor, t_min: int, t_max: int) -> Tensor:
    """The products of the residuals (pred − y) of two predictors, ``[..., batch, pos, 3]``."""
    ra, rb = (a - ys)[..., t_min:t_max + 1], (b - ys)[..., t_min:t_max + 1]
    return torch.stack(torch.broadcast_tensors(ra * rb, ra * ra, rb * rb), dim=-1)


@register_metric("error_cosine", on="preds", higher_is_better=True, across=_residual_products,
                 geometry="cosine")
def _error_cosine(a: Tensor, b: Tensor, ys: Tensor, t_min: int, t_max: int) -> Tensor:
    return error_cosine_per_sequence(a, b, ys, t_min, t_max)


@register_metric("weight_cosine", on="weights", higher_is_better=True, geometry="cosine")
def _weight_cosine(a: Tensor, b: Tensor, ys: Tensor, t_min: int, t_max: int) -> Tensor:
    return weight_cosine_per_sequence(a, b, t_min, t_max)


@register_metric("spd", on="preds", higher_is_better=False,
                 label="squared prediction difference", geometry="squared")
def _spd(a: Tensor, b: Tensor, ys: Tensor, t_min: int, t_max: int) -> Tensor:
    return spd_per_sequence(a, b, t_min, t_max=t_max)


@register_metric("ilwd", on="weights", higher_is_better=False,
                 label="implicit linear weight difference", verdict=False, geometry="squared")
def _ilwd(a: Tensor, b: Tensor, ys: Tensor, t_min: int, t_max: int) -> Tensor:
    return ilwd_per_sequence(a, b, t_min, t_max=t_max)
