"""`LayerProbes`: one readout per layer, all layers in one batched solve.

Fu et al. 2024 fit a linear readout on each layer's residual stream at the x tokens and
read the layer's prediction from it. Here every layer is fitted at once by closed-form
ridge with the regularization picked per layer by generalized cross-validation (or a
given α), on residuals of fresh task draws; the target is the true y (Fu et al.) or the
model's own final prediction. `solver="adam"` instead trains the readouts with Fu et al.'s
recipe (Adam, lr 1e-4, MSE) for comparison. Axis legend: ``layer``, ``batch``, ``pos``,
``query``, ``d_model``.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from iclprobe._checks import check_int, check_real, check_type
from iclprobe._finite import all_finite
from iclprobe.atomic import atomic_directory
from iclprobe.errors import InputError, TooFewRows
from iclprobe.hooks.residuals import BATCH_SEQUENCES, collect_residuals
from iclprobe.models.base import Regressor, check_model, input_dtype
from iclprobe.probes.inputs import check_batch, check_finite_inputs, check_fit_fits, check_tensors
from iclprobe.probes.ridge import alpha_grid, ridge_gcv
from iclprobe.storage import parse_json
from iclprobe.tasks import RegressionTask, as_generator

TARGETS = ("y", "model")
SOLVERS = ("ridge", "adam")
PROBE_FORMAT_VERSION = 1
PROBES_WEIGHTS, PROBES_META = "probes.safetensors", "probes.json"
def model_hash(model: Regressor) -> str:
    """SHA-256 of what makes the model this model: probes saved for one load for no other.

    Hashed: the class's qualified name, its config (``cfg.to_dict()``, where it has one),
    and every parameter and buffer (persistent or not) with its name, shape, dtype and
    bytes; so two models without parameters differ by class or config, and a learned
    scalar (a 0-dim parameter) hashes as any tensor does.
    """
    h = hashlib.sha256()
    cls = type(model)
    h.update(f"class:{cls.__module__}.{cls.__qualname__}\n".encode())
    to_dict = getattr(getattr(model, "cfg", None), "to_dict", None)
    if callable(to_dict):
        h.update(f"config:{json.dumps(to_dict(), sort_keys=True, default=repr)}\n".encode())
    for kind, named in (("parameter", model.named_parameters()),
                        ("buffer", model.named_buffers())):
        for name, tensor in sorted(named, key=lambda item: item[0]):
            t = tensor.detach().cpu().contiguous().reshape(-1)  # a 0-dim tensor views as 1
            h.update(f"{kind}:{name}:{tuple(tensor.shape)}:{t.dtype}\n".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@torch.no_grad()
def readout_predictions(model: Regressor, xs: Tensor, ys: Tensor,
                        batch_size: int = BATCH_SEQUENCES) -> Tensor:
    """The no-training readout of every layer, ``[L+1, B, n]``.

    GPT: the final norm and read-out applied to each layer's residual (a logit lens);
    PQ: ``−Z[query, d]`` of each layer.
    """
    return model.readout_residual(collect_residuals(model, xs, ys, batch_size=batch_size))


def check_rows(n_rows: int, width: int, where: str, per_sequence: int,
               share: float = 1.0) -> None:
    """Refuse fits with no more rows than features + intercept (a probe would interpolate).

    ``share``: the fraction of the sequences a probe is fitted on (cross-fitting: the other
    folds'), so that the advice counts every sequence.
    """
    if n_rows <= width + 1:
        fitted = (width + 1) // max(per_sequence, 1) + 1
        raise TooFewRows(
            f"too few rows for the probes: {where} give {n_rows} rows for {width} residual "
            f"features per layer; a probe needs more rows than features + 1 (its ridge fit "
            f"would interpolate them and GCV has nothing left out): use at least "
            f"{math.ceil(fitted / share - 1e-9)} sequences")


@dataclasses.dataclass
class ProbeMetrics:
    """Held-out quality per layer."""

    r2: list[float]  # R² of the probe's prediction against its target
    normalized_error: list[float]  # mean (pred − y)² / d against the true y


def probe_metrics(preds: Tensor, targets: Tensor, ys: Tensor, t_min: int,
                  n_dims: int) -> ProbeMetrics:
    """R² of ``preds [layer, B, n]`` against ``targets``, normalized error against ``ys``.

    Both over the positions ``t >= t_min``; ``targets`` ``[B, n]`` (one for every layer) or
    ``[layer, B, n]`` (each layer's own).
    """
    pred = preds[:, :, t_min:].double()
    tgt, y = targets[..., t_min:].double(), ys[:, t_min:].double()
    tgt = tgt.expand_as(pred)
    spread = (tgt - tgt.mean((1, 2), keepdim=True)).pow(2).sum((1, 2))
    r2 = 1 - (pred - tgt).pow(2).sum((1, 2)) / spread
    err = (pred - y).pow(2).mean((1, 2)) / n_dims
    return ProbeMetrics(r2.tolist(), err.tolist())


class LayerProbes:
    """Per-layer linear readouts ``ŷ_l = w_l · h_l + b_l`` of the residual stream.

    Args:
        alpha: "gcv" (pick α per layer from ``alphas`` by generalized cross-validation)
            or a fixed α ≥ 0.
        alphas: the GCV grid (default 1e-6 … 1e4).
        target: "y" (the true labels, Fu et al.) or "model" (the model's final prediction).
        t_min: positions t < t_min are left out of the fit (t = 0 has no context).
        solver: "ridge" (closed form) or "adam" (Fu et al.'s recipe, for comparison).
        lr, max_steps, batch_rows: the Adam solver's settings.
    """

    def __init__(self, alpha: float | str = "gcv", alphas: Tensor | None = None,
                 target: str = "y", t_min: int = 1, solver: str = "ridge", lr: float = 1e-4,
                 max_steps: int = 2000, batch_rows: int = 4096):
        if target not in TARGETS:
            raise InputError(f"target must be one of {TARGETS}, got {target!r}")
        if solver not in SOLVERS:
            raise InputError(f"solver must be one of {SOLVERS}, got {solver!r}")
        if alpha != "gcv" and not (isinstance(alpha, (int, float)) and not isinstance(
                alpha, bool) and math.isfinite(alpha) and alpha >= 0):
            raise InputError(f"alpha must be 'gcv' or a finite number >= 0, got {alpha!r}"
                             + (" (an infinite α fits every probe to 0)" if alpha == math.inf
                                else ""))
        if alphas is not None:
            alpha_grid(alphas)  # before any fit: at least one α, each finite and >= 0
        if solver == "adam":  # what the closed form does not use is not checked for it
            check_int("LayerProbes", "max_steps", max_steps)
            check_int("LayerProbes", "batch_rows", batch_rows)
            check_real("LayerProbes", "lr", lr, 0.0, low_open=True)
        self.alpha, self.alphas, self.target, self.t_min = alpha, alphas, target, t_min
        self.solver, self.lr, self.max_steps, self.batch_rows = solver, lr, max_steps, batch_rows
        self.model: Regressor | None = None

    # ------------------------------------------------------------------ fitting
    def fit(self, model: Regressor, task: RegressionTask | None = None,
            n_sequences: int = 2000, generator: torch.Generator | int = 0,
            n_heldout: int = 500, batch_size: int = BATCH_SEQUENCES) -> LayerProbes:
        """Fit on residuals of ``n_sequences`` fresh draws of ``task`` (default: the model's).

        Records how in ``fit_settings_`` (sequences, seed — None for a generator already
        drawn from —, task, time), which `save` writes to ``probes.json``.
        """
        check_model(model)
        if task is not None:
            check_type("LayerProbes.fit", "task", task, RegressionTask,
                       "a RegressionTask (or None: the model's task)")
        task = task if task is not None else getattr(model, "task", None)
        if not isinstance(task, RegressionTask):
            raise InputError("task is required: the model has no task attached")
        check_int("LayerProbes.fit", "batch_size", batch_size)
        check_fit_fits(model, task, n_sequences, n_heldout)
        if isinstance(n_sequences, int) and isinstance(self.t_min, int) and \
                0 <= self.t_min < task.n_points:  # before any work
            check_rows(n_sequences * (task.n_points - self.t_min), model.cfg.d_model,
                        f"n_sequences={n_sequences} x {task.n_points - self.t_min} positions "
                        f"t >= {self.t_min}", task.n_points - self.t_min)
        gen = as_generator(generator)
        seed = _seed_of(generator)
        train = task.sample(n_sequences, generator=gen, dtype=input_dtype(model))
        held = task.sample(n_heldout, generator=gen, dtype=input_dtype(model))
        self.model = model
        resid = collect_residuals(model, train.xs, train.ys, batch_size=batch_size)
        self.fit_residuals(resid, self._targets(resid, train.ys))
        self.model_hash_ = model_hash(model)
        self.n_dims_ = task.n_dims
        resid = collect_residuals(model, held.xs, held.ys, batch_size=batch_size)
        self.metrics_ = self._evaluate(resid, self._targets(resid, held.ys), held.ys)
        self.fit_settings_ = {
            "n_sequences": n_sequences, "n_heldout": n_heldout, "seed": seed,
            "task": json.loads(task.to_json()),
            "fitted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        return self

    def _targets(self, resid: Tensor, ys: Tensor) -> Tensor:
        """The true y, or the model's prediction read off its last residual (no 2nd forward)."""
        if self.target == "y":
            return ys
        assert self.model is not None
        with torch.no_grad():
            return self.model.readout_residual(resid[-1])

    def fit_residuals(self, resid: Tensor, targets: Tensor) -> LayerProbes:
        """Fit on collected residuals ``[L+1, B, n, d_model]`` and targets ``[B, n]``."""
        check_tensors(resid=resid, targets=targets)
        if resid.ndim != 4 or targets.shape != resid.shape[1:3]:
            raise InputError(f"resid must be [layer, B, n, d_model] and targets [B, n]; got "
                             f"{tuple(resid.shape)} and {tuple(targets.shape)}")
        check_finite_inputs(resid=resid, targets=targets)
        if not isinstance(self.t_min, int) or not 0 <= self.t_min < resid.shape[2]:
            raise InputError(f"t_min must be in [0, {resid.shape[2] - 1}], got {self.t_min!r}")
        x = resid[:, :, self.t_min:].flatten(1, 2)  # [layer, rows, d_model]
        y = targets[:, self.t_min:].flatten()
        check_rows(x.shape[1], x.shape[2], f"{resid.shape[1]} sequences x "
                    f"{resid.shape[2] - self.t_min} positions t >= {self.t_min}",
                    resid.shape[2] - self.t_min)
        if self.solver == "adam":
            self.coef_, self.intercept_ = self._fit_adam(x, y)
            self.alpha_ = torch.zeros(x.shape[0], dtype=torch.float64)
        else:
            alphas = self.alphas if self.alpha == "gcv" else float(self.alpha)
            fit = ridge_gcv(x, y, alphas=alphas)
            self.coef_, self.intercept_, self.alpha_ = fit.coef, fit.intercept, fit.alpha
        self.n_layers_ = x.shape[0]
        return self

    def _fit_adam(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Fu et al.'s recipe: Adam on the mean squared error, every layer at once."""
        n_layers, n_rows, width = x.shape
        coef = torch.zeros(n_layers, width, requires_grad=True)
        bias = torch.zeros(n_layers, requires_grad=True)
        opt = torch.optim.Adam([coef, bias], lr=self.lr)
        gen = torch.Generator().manual_seed(0)
        xf, yf = x.float(), y.float()
        for _ in range(self.max_steps):
            rows = torch.randint(n_rows, (min(self.batch_rows, n_rows),), generator=gen)
            pred = torch.einsum("lrd,ld->lr", xf[:, rows], coef) + bias[:, None]
            loss = (pred - yf[rows]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return coef.detach().double(), bias.detach().double()

    def _evaluate(self, resid: Tensor, targets: Tensor, ys: Tensor) -> ProbeMetrics:
        return probe_metrics(self.apply(resid), targets, ys, self.t_min, self.n_dims_)

    # ------------------------------------------------------------------ prediction
    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise InputError("LayerProbes is not fitted: call fit() or load() first")

    def apply(self, resid: Tensor) -> Tensor:
        """Probe predictions from residuals ``[L+1, ..., d_model]`` → ``[L+1, ...]``.

        In the residuals' dtype (integer residuals: in the coefficients' float dtype).
        """
        self._check_fitted()
        check_tensors(resid=resid)
        if resid.shape[0] != self.n_layers_ or resid.shape[-1] != self.coef_.shape[-1]:
            raise InputError(f"resid must be [{self.n_layers_}, ..., {self.coef_.shape[-1]}], "
                             f"got {tuple(resid.shape)}")
        if not resid.is_floating_point():  # the coefficients cast to ints would be 0
            resid = resid.to(self.coef_.dtype)
        coef = self.coef_.to(resid.dtype).reshape(self.n_layers_, *[1] * (resid.ndim - 2), -1)
        bias = self.intercept_.to(resid.dtype).reshape(self.n_layers_, *[1] * (resid.ndim - 2))
        return (resid * coef).sum(-1) + bias

    def _model_or_raise(self) -> Regressor:
        if self.model is None:
            raise InputError("no model attached: fit() on a model or load(path, model)")
        return self.model

    def predict(self, xs: Tensor, ys: Tensor, batch_size: int = BATCH_SEQUENCES) -> Tensor:
        """Every layer's prediction ``[L+1, B, n]``."""
        self._check_fitted()
        check_batch(xs=xs, ys=ys)
        return self.apply(collect_residuals(self._model_or_raise(), xs, ys,
                                            batch_size=batch_size))

    def predict_queries(self, xs: Tensor, ys: Tensor, queries: Tensor) -> Tensor:
        """Every layer's prediction at each query, ``[L+1, B, n, T]`` (for induced weights)."""
        self._check_fitted()
        check_batch(xs=xs, ys=ys, queries=queries)
        with torch.no_grad():
            return self._model_or_raise().query_residuals(xs, ys, queries, reduce=self.apply)

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike[str], overwrite: bool = False) -> Path:
        """Write ``probes.safetensors`` and ``probes.json`` into directory ``path``.

        ``probes.json`` records how the probes were fitted (sequences, seed, task, target,
        α, when). ``overwrite=True`` replaces probes that iclprobe saved at ``path``;
        nothing else is ever replaced.
        """
        check_type("LayerProbes.save", "path", path, (str, os.PathLike),
                   "a directory path (str or os.PathLike)")
        self._check_fitted()
        if getattr(self, "model_hash_", None) is None:  # load checks the probes' model
            raise InputError("LayerProbes.save: these probes were fitted on residuals "
                             "(fit_residuals), not on a model, so no model is recorded for load "
                             "to check: save probes fitted with fit(model, ...)")
        tensors = {"coef": self.coef_.contiguous(), "intercept": self.intercept_,
                   "alpha": self.alpha_}
        _check_finite(tensors, "the probes to save")
        meta: dict[str, Any] = {
            "format_version": PROBE_FORMAT_VERSION, "model_hash": self.model_hash_,
            "target": self.target, "t_min": self.t_min, "solver": self.solver,
            "alpha": self.alpha, "n_dims": self.n_dims_,
            "metrics": dataclasses.asdict(self.metrics_) if hasattr(self, "metrics_") else None,
            "fit": getattr(self, "fit_settings_", None),
        }
        with atomic_directory(path, "probes", overwrite) as tmp:
            save_file(tensors, str(tmp / PROBES_WEIGHTS))
            (tmp / PROBES_META).write_text(json.dumps(meta, indent=2))
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], model: Regressor) -> LayerProbes:
        """Load probes saved by `save`.

        Raises:
            FileNotFoundError: no ``probes.json`` in ``path``.
            ValueError: probes fitted on another model, or a truncated, corrupt or
                non-finite file (the message names it).
        """
        check_type("LayerProbes.load", "path", path, (str, os.PathLike),
                   "a directory path (str or os.PathLike)")
        path = Path(path)
        meta = _read_meta(path / PROBES_META)
        actual = model_hash(model)
        if meta["model_hash"] != actual:
            raise InputError(f"{path / PROBES_META}: these probes were fitted on another model "
                             f"(hash {meta['model_hash'][:12]}…, this model {actual[:12]}…)")
        weights = path / PROBES_WEIGHTS
        try:
            tensors = load_file(str(weights))
            coef, intercept, alpha = tensors["coef"], tensors["intercept"], tensors["alpha"]
        except (SafetensorError, OSError, KeyError) as err:
            raise InputError(f"{weights}: truncated or corrupt probe weights ({err})") from None
        _check_finite(tensors, str(weights))
        if coef.ndim != 2 or intercept.shape != coef.shape[:1]:
            raise InputError(f"{weights}: coef must be [layer, d_model] and intercept [layer], "
                             f"got {tuple(coef.shape)} and {tuple(intercept.shape)}")
        probes = cls(alpha=meta["alpha"], target=meta["target"], t_min=meta["t_min"],
                     solver=meta["solver"])
        probes.coef_, probes.intercept_, probes.alpha_ = coef, intercept, alpha
        probes.n_layers_ = coef.shape[0]
        probes.model_hash_, probes.n_dims_, probes.model = actual, meta["n_dims"], model
        if meta.get("metrics"):
            probes.metrics_ = ProbeMetrics(**meta["metrics"])
        if isinstance(meta.get("fit"), dict):
            probes.fit_settings_ = meta["fit"]
        return probes


def _seed_of(generator: torch.Generator | int) -> int | None:
    """The seed that ``generator`` stands for, or None for a generator already drawn from."""
    if not isinstance(generator, torch.Generator):
        return int(generator)
    seed = generator.initial_seed()
    fresh = torch.Generator(generator.device).manual_seed(seed)
    return seed if torch.equal(generator.get_state(), fresh.get_state()) else None


def _check_finite(tensors: dict[str, Tensor], what: str) -> None:
    bad = [name for name, t in tensors.items() if not all_finite(t)]
    if bad:
        raise InputError(f"{what}: non-finite (NaN or infinite) probe weights in {bad}")


def _read_meta(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file is missing")
    try:
        meta = parse_json(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("format_version") != PROBE_FORMAT_VERSION:
        version = meta.get("format_version") if isinstance(meta, dict) else None
        raise InputError(f"{path}: unknown format_version {version!r}")
    missing = [k for k in ("model_hash", "alpha", "target", "t_min", "solver", "n_dims")
               if k not in meta]
    if missing:
        raise InputError(f"{path}: missing keys {missing}")
    wrong = [k for k, ok in (("model_hash", isinstance(meta["model_hash"], str)),
                             ("target", meta["target"] in TARGETS),
                             ("solver", meta["solver"] in SOLVERS),
                             ("t_min", isinstance(meta["t_min"], int)),
                             ("n_dims", isinstance(meta["n_dims"], int))) if not ok]
    if wrong:
        raise InputError(f"{path}: invalid {', '.join(f'{k}={meta[k]!r:.40}' for k in wrong)}")
    return meta
