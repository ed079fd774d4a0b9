"""`Iterates`, the learner registry and the checks every learner shares.

Axis legend: ``step`` (K step counts), ``batch``, ``pos`` (prefix t), ``n_dims``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from iclprobe._checks import check_name, is_int
from iclprobe._finite import all_finite
from iclprobe.algorithms.families import Family, single
from iclprobe.errors import InputError, InputTypeError, NonFinite
from iclprobe.plugins import claim, registrant


@dataclasses.dataclass
class Iterates:
    """Predictions (and optionally weights) of a learner after each of K step counts.

    ``preds[k, :, t]`` predicts ``ys[:, t]`` from the t examples before it after
    ``steps[k]`` steps; closed-form learners (ols, ridge) have one "step", 0. ``steps`` may
    be given as any sequence of integers (the ``steps`` list ``align`` passes a learner):
    it is stored as an int64 tensor.
    """

    steps: Tensor  # [step], int64
    preds: Float[Tensor, "step batch pos"]
    weights: Float[Tensor, "step batch pos n_dims"] | None
    hyper: dict[str, Any]
    name: str = ""

    def __post_init__(self) -> None:
        self.steps = check_steps(self.steps)
        for field, shape in (("preds", "[K steps, batch, pos]"),
                             ("weights", "[K steps, batch, pos, n_dims] or None")):
            value = getattr(self, field)
            if not isinstance(value, Tensor) and not (field == "weights" and value is None):
                raise InputTypeError(f"Iterates.{field} must be a torch.Tensor {shape}, got a "
                                     f"{type(value).__name__}" + (
                                         " (stack a list of per-step tensors with torch.stack)"
                                         if isinstance(value, (list, tuple)) else ""))
        if not isinstance(self.hyper, dict):
            raise InputTypeError(f"Iterates.hyper must be a dict of the hyperparameters used, "
                                 f"got a {type(self.hyper).__name__}")

    def to(self, dtype: torch.dtype) -> Iterates:
        """The same iterates in another dtype."""
        w = self.weights.to(dtype) if self.weights is not None else None
        return dataclasses.replace(self, preds=self.preds.to(dtype), weights=w)


Learner = Callable[..., Iterates]
STEP_SCALES = ("linear", "log2")
STEP_RULES = ("cg", "layers")  # step grids resolved per model (alignment.RunSpec)


@dataclasses.dataclass(frozen=True)
class LearnerInfo:
    """A registered learner: its function and what ``align``, its report and CLI need.

    ``steps``: the default step grid of ``align`` — a tuple, a rule resolved per model
    (``"cg"``: 0…d+1; ``"layers"``: 0…L), or None for a closed form. ``step_scale``: how
    matched steps grow with depth in a fitted line ("log2" for GD-like learners, whose
    matched steps grow exponentially). ``align_hyper``: the hyperparameters ``align`` passes
    (``precond="inverse_cov"`` stands for Σ⁻¹ of the evaluation data). ``align``: whether
    ``align`` runs it by default. ``order``: its place in tables (lower first).
    ``compare_with``: the learners ``align`` compares it with when both ran (a paired
    difference and a verdict per layer); a registration without it is compared with Newton
    and GD, the library's reference pair. ``family``: the hyperparameter variants × steps
    the learner is matched over as a candidate of `align`'s answer
    (`iclprobe.algorithms.families`). ``candidate``: whether it is one by default.
    """

    name: str
    fn: Learner
    label: str
    steps: tuple[int, ...] | str | None = None
    step_scale: str = "linear"
    align_hyper: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    align: bool = False
    order: int = 100
    compare_with: tuple[str, ...] = ()
    registrant: str = ""  # who registered it (`iclprobe.plugins.registrant`), for messages
    family: Family | None = None  # None: `align_hyper` at `steps` (`families.single`)
    candidate: bool = True

    @property
    def fitted_family(self) -> Family:
        """The family the answer matches it over: its own, or its align_hyper at its steps."""
        return self.family or single(dict(self.align_hyper), self.steps)


#: The learner registry, name -> `LearnerInfo` (``register`` adds one).
LEARNERS: dict[str, LearnerInfo] = {}


def register(name: str, *, label: str | None = None,
             steps: Iterable[int] | str | None = None, step_scale: str = "linear",
             align_hyper: Mapping[str, Any] | None = None, align: bool = False,
             order: int = 100, compare_with: Iterable[str] | None = None,
             family: Family | None = None, candidate: bool = True,
             replace: bool = False) -> Callable[[Learner], Learner]:
    """Add a learner to the registry under ``name``, with what ``align`` needs of it.

    One decorator is all a new learner needs to appear in ``align``'s tables, JSON, CSVs,
    report and heatmaps (pass ``align=True`` to run it by default, or name it in
    ``AlignConfig(algorithms=...)``)::

        @register("heavy_ball", label="heavy ball", steps=(1, 2, 4, 8), step_scale="log2",
                  align_hyper={"lr": 0.1}, align=True)
        def heavy_ball(xs, ys, steps=None, lr=0.1, weights=True): ...

    The function is checked here: it takes ``xs, ys`` first and a ``weights`` keyword (and
    ``steps`` when it has a step grid), and every key of ``align_hyper`` is one of its
    parameters. What it returns is checked on every call, and named ``name`` (`iterates`).

    Every registered learner is a candidate of `align`'s answer ("this layer runs X"),
    matched over ``family`` (`iclprobe.algorithms.families.Family`: hyperparameter
    variants × steps; default: ``align_hyper`` at ``steps``); ``candidate=False`` keeps
    it out by default (a learner that needs a model's own matrices, say).

    A name belongs to its first registration: registering it again is refused, naming who
    registered it, unless ``replace=True`` (then every command says what replaced what).

    Raises:
        InputError, InputTypeError: naming the argument or the missing parameter, or the
            registrant of a name taken.
    """
    check_name("learner", name)
    if step_scale not in STEP_SCALES:
        raise InputError(f"step_scale must be one of {STEP_SCALES}, got {step_scale!r}")
    grid = _check_grid(name, steps)
    if label is not None and not isinstance(label, str):
        raise InputTypeError(f"label must be a string, got {label!r}")
    if not isinstance(align, bool):
        raise InputTypeError(f"align must be a bool, got {align!r}")
    if not is_int(order):
        raise InputTypeError(f"order must be an integer, got {order!r}")
    hyper = dict(align_hyper or {})
    rivals = _check_rivals(name, compare_with)
    _check_family(name, family, candidate)

    def wrap(fn: Learner) -> Learner:
        _check_learner(name, fn, grid, hyper)
        by = registrant(getattr(fn, "__module__", None) or "?")
        taken = LEARNERS.get(name)
        claim("learner", name, taken.registrant if taken else None, by, replace)
        LEARNERS[name] = LearnerInfo(name, fn, label or name, grid, step_scale, hyper, align,
                                     order, rivals, by, family, candidate)
        return fn

    return wrap


#: Newton vs GD, Fu et al.'s question: the one home of the pair that the Newton-vs-GD views
#: (the fitted view's verdict, the protocol tables' main pair, the separation views) and a
#: learner registered without ``compare_with`` are compared by. The answer weighs every
#: candidate instead.
REFERENCE_PAIR = ("newton", "gd")


def _check_rivals(name: str, compare_with: Iterable[str] | None) -> tuple[str, ...]:
    """``compare_with`` as a tuple of learner names (default: Newton and GD, not itself)."""
    if compare_with is None:
        return tuple(r for r in REFERENCE_PAIR if r != name)
    if isinstance(compare_with, str) or not all(isinstance(r, str) and r
                                                for r in compare_with):
        raise InputTypeError(f"learner {name!r}: compare_with must be a sequence of learner "
                        f"names, got {compare_with!r}")
    rivals = tuple(compare_with)
    if name in rivals:
        raise InputError(f"learner {name!r}: compare_with names the learner itself")
    return rivals


def _check_family(name: str, family: Any, candidate: Any) -> None:
    """Refuse a ``family`` that is not a `Family` and a ``candidate`` that is not a bool."""
    if family is not None and not isinstance(family, Family):
        raise InputTypeError(f"learner {name!r}: family must be an "
                             f"iclprobe.algorithms.families.Family, got {family!r}")
    if not isinstance(candidate, bool):
        raise InputTypeError(f"candidate must be a bool, got {candidate!r}")


def _check_grid(name: str, steps: Iterable[int] | str | None) -> tuple[int, ...] | str | None:
    """A registered step grid: None, a rule of `STEP_RULES` or step counts >= 0."""
    if steps is None:
        return None
    if isinstance(steps, str):
        if steps not in STEP_RULES:
            raise InputError(f"learner {name!r}: steps must be step counts, None or one of "
                             f"{STEP_RULES}, got {steps!r}")
        return steps
    return tuple(check_steps(steps).tolist())


def _check_learner(name: str, fn: Any, grid: tuple[int, ...] | str | None,
                   hyper: Mapping[str, Any]) -> None:
    """Refuse a learner function that ``align`` could not call as registered."""
    if not callable(fn):
        raise InputTypeError(f"learner {name!r}: @register decorates a function, got {fn!r}")
    params = inspect.signature(fn).parameters
    positional = [v for v in params.values()
                  if v.kind in (v.POSITIONAL_ONLY, v.POSITIONAL_OR_KEYWORD)]
    any_kw = any(v.kind is v.VAR_KEYWORD for v in params.values())
    if len(positional) < 2 or any(v.default is not v.empty for v in positional[:2]):
        raise InputTypeError(f"learner {name!r}: {fn.__name__}{inspect.signature(fn)} must take "
                        "the data as its first two arguments, (xs, ys, ...)")
    needed = ["weights", *(["steps"] if grid is not None else []), *hyper]
    missing = [p for p in needed if p not in params] if not any_kw else []
    if missing:
        why = {"weights": "align asks for weights=True or False",
               "steps": f"it is registered with steps={grid!r}"}
        raise InputTypeError(f"learner {name!r}: {fn.__name__}{inspect.signature(fn)} has no "
                        f"parameter(s) {missing} ("
                        + "; ".join(why.get(p, f"{p!r} is in align_hyper") for p in missing)
                        + ")")


def learner_info(name: str) -> LearnerInfo:
    """The registration of learner ``name`` (the error lists the registered ones)."""
    if name not in LEARNERS:
        raise InputError(f"unknown learner {name!r}; valid: {sorted(LEARNERS)}")
    return LEARNERS[name]


def candidate_learners() -> list[LearnerInfo]:
    """The learners `align`'s answer weighs by default, in table order."""
    return sorted((i for i in LEARNERS.values() if i.candidate), key=lambda i: i.order)


def aligned_learners() -> list[LearnerInfo]:
    """The learners ``align`` runs by default, in table order."""
    infos = [i for i in LEARNERS.values() if i.align]
    return sorted(infos, key=lambda i: i.order)


@functools.lru_cache(maxsize=256)
def parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    """A learner function's parameters, as ``inspect.signature`` gives them.

    Kept per function: learners run thousands of times a benchmark, and reading the
    signature costs a fifth of a closed form's run.
    """
    return inspect.signature(fn).parameters


def iterates(name: str, xs: Tensor, ys: Tensor, steps: Iterable[int] | None = None,
             **hyper: Any) -> Iterates:
    """Run the learner registered as ``name`` on every prefix of every sequence.

    Args:
        name: one of ``algorithms.LEARNERS`` (the error lists them).
        xs: ``[batch, pos, n_dims]``.
        ys: ``[batch, pos]``.
        steps: step counts (ignored by the closed forms ``ols`` and ``ridge``).
        **hyper: the learner's hyperparameters (``lr``, ``alpha``, ...).

    Returns:
        The learner's `Iterates`, checked: ``preds [K, batch, pos]`` for its K step counts,
        ``weights`` None or ``[K, batch, pos, n_dims]``; named ``name`` (a learner that
        wraps another returns it under its own name).

    Raises:
        TypeError: the learner returned something else than `Iterates`.
        ValueError: an unknown name or hyperparameter, or iterates of the wrong shape.
    """
    fn = learner_info(name).fn
    params = parameters(fn)
    any_kw = any(v.kind is v.VAR_KEYWORD for v in params.values())
    if not any_kw:
        unknown = sorted(set(hyper) - set(params))
        if unknown:
            accepted = [p for p in params if p not in ("xs", "ys", "steps")]
            raise InputError(f"unknown hyperparameter(s) {unknown} for {name!r}; "
                             f"accepted: {accepted}")
    takes_steps = "steps" in params or (any_kw and steps is not None)
    out = fn(xs, ys, steps=steps, **hyper) if takes_steps else fn(xs, ys, **hyper)
    it = check_iterates(name, out, xs)
    if takes_steps and steps is not None:
        asked = check_steps(steps)
        if not torch.equal(it.steps, asked):
            raise InputError(f"learner {name!r} was asked for steps {asked.tolist()} and "
                             f"returned iterates of steps {it.steps.tolist()}: run the "
                             "`steps` it receives and pass them to Iterates")
    return it


def check_iterates(name: str, it: Any, xs: Tensor) -> Iterates:
    """``it`` if it is `Iterates` of learner ``name`` on ``xs [batch, pos, n_dims]``."""
    if not isinstance(it, Iterates):
        raise InputTypeError(f"learner {name!r} must return algorithms.Iterates, got "
                        f"{type(it).__name__}")
    k, (b, n, d) = it.steps.numel(), xs.shape
    if not isinstance(it.preds, Tensor) or tuple(it.preds.shape) != (k, b, n):
        shape = tuple(it.preds.shape) if isinstance(it.preds, Tensor) else \
            f"a {type(it.preds).__name__}"
        raise InputError(f"learner {name!r}: preds must have shape [K={k} steps, {b}, {n}], "
                         f"got {shape}")
    if it.weights is not None and (not isinstance(it.weights, Tensor)
                                   or tuple(it.weights.shape) != (k, b, n, d)):
        shape = tuple(it.weights.shape) if isinstance(it.weights, Tensor) else \
            f"a {type(it.weights).__name__}"
        raise InputError(f"learner {name!r}: weights must be None or of shape [K={k} steps, "
                         f"{b}, {n}, {d}], got {shape}")
    if not isinstance(it.hyper, dict):
        raise InputTypeError(f"learner {name!r}: hyper must be a dict, got {type(it.hyper).__name__}")
    for what, values in (("predictions", it.preds), ("weights", it.weights)):
        if values is not None and not all_finite(values):  # a registered learner's NaN
            raise NonFinite(f"learner {name!r} returned {what} that are not finite (NaN or "
                            f"Inf) on these data at hyperparameters {it.hyper}")
    return it if it.name == name else dataclasses.replace(it, name=name)


def check_steps(steps: Iterable[int] | None) -> Tensor:
    """Non-negative integer step counts (a sequence or a 1-D tensor) as an int64 tensor."""
    if steps is None:
        raise InputError("steps is required: an iterable of step counts >= 0")
    if isinstance(steps, Tensor) and (steps.ndim != 1 or steps.is_floating_point()):
        raise InputError(f"steps must be a 1-D integer tensor, got {steps.dtype} of shape "
                         f"{tuple(steps.shape)}")
    if isinstance(steps, (str, bytes)) or not isinstance(steps, (Tensor, Iterable)):
        raise InputTypeError(f"steps must be a sequence of integers >= 0 (e.g. [{steps!r}] for "
                             f"one), got {type(steps).__name__} {steps!r}")
    values = list(steps.tolist() if isinstance(steps, Tensor) else steps)
    if not values:
        raise InputError("steps must hold at least one step count")
    for s in values:
        if isinstance(s, bool) or not hasattr(s, "__index__") or operator.index(s) < 0:
            raise InputError(f"steps must be integers >= 0, got {s!r}")
        if operator.index(s) >= 2**63:  # beyond int64
            raise InputError(f"steps must be below 2**63, got {s!r}")
    return torch.tensor([operator.index(s) for s in values], dtype=torch.int64)
