"""Which layer probes `align` reads a model's layers with: saved, cached, or fitted here.

``iclprobe probe`` saves a checkpoint's probes next to it (`probes_dir`; a shipped model's in
the user cache). `align`, given no probes, calls `resolve_probes`: it reuses the probes
saved for the checkpoint the model was loaded from (``model.checkpoint``) when they fit the
model, the evaluation data and the config (the probes' seed is ``AlignConfig.seed + 1``,
their count ``AlignConfig.n_probe_sequences`` where that is set, default probe settings),
unless ``AlignConfig.refit_probes``; otherwise it fits them as ``AlignConfig.probe_fit``
says. ``iclprobe align X`` and ``align(models.load(X))`` therefore read the same probes and
give the same numbers.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclprobe import probes
from iclprobe._shipped import PRETRAINED_DIR
from iclprobe.models.checkpoint import resolve
from iclprobe.models.files import RUN_CHECKPOINT
from iclprobe.probes.inputs import check_fit_fits
from iclprobe.storage import cache_dir, read_marker
from iclprobe.training.run_dir import METRICS_FILE

if TYPE_CHECKING:
    from iclprobe.alignment.config import AlignConfig
    from iclprobe.models.base import Regressor
    from iclprobe.tasks import RegressionTask

logger = logging.getLogger(__name__)
PROBES_FILE = "probes.json"  # what marks a directory of saved probes
#: the `AlignConfig` fields that say how probes read the layers
PROBE_FIELDS = ("probe_fit", "probe_folds", "probe_target", "probe_extra_sequences",
                "n_probe_sequences", "refit_probes", "n_probe_heldout")


def model_dir(checkpoint: str | os.PathLike[str]) -> Path:
    """The directory that stands for a checkpoint: a run directory for ``RUN/checkpoint``."""
    path = Path(os.path.abspath(resolve(checkpoint)))
    run = path.parent
    if path.name == RUN_CHECKPOINT and ((read_marker(run) or {}).get("kind") == "run"
                                        or (run / METRICS_FILE).is_file()):
        return run
    return path


def probes_dir(checkpoint: str | os.PathLike[str]) -> Path:
    """Where ``iclprobe probe`` saves a checkpoint's probes and `align` looks for them.

    Next to the checkpoint (``CHECKPOINT/probes``; ``RUN/probes`` for a training run), but
    for a shipped model in the user cache (``$ICLPROBE_CACHE``, else the platform's), never
    inside the installed package.
    """
    path = model_dir(checkpoint)
    if path.resolve().is_relative_to(PRETRAINED_DIR.resolve()):
        return cache_dir() / "probes" / path.name
    if path.is_file():  # an Ahn et al. .pt file
        return path.with_name(path.name + ".probes")
    return path / "probes"


def resolve_probes(model: Regressor, cfg: AlignConfig, task: RegressionTask,
                   name: str = "model") -> tuple[probes.LayerProbes | None, dict[str, Any]]:
    """The probes `align` reads ``model``'s layers with, and a record of which and why.

    Returns ``(probes, record)``: the saved probes when they fit, freshly fitted ones
    (``probe_fit="fresh"``), or None where `align` cross-fits them on its evaluation
    sequences (``"crossfit"``) or reads the layers exactly (no probes needed). The record
    (``AlignResult.probes_info``) says the source, how the probes were fitted, and in
    ``notes`` one line each on what was used and why; each is logged (INFO) as
    ``NAME: line`` when it is decided, before any probe is fitted (the CLI prints them).
    """
    if model.exact_layer_readout:  # probe settings given do nothing here: said, not dropped
        unused = [f"{f}={getattr(cfg, f)!r}" for f in PROBE_FIELDS
                  if getattr(cfg, f) != cfg.__dataclass_fields__[f].default]
        notes = [f"the layers are read exactly, without probes: {', '.join(unused)} "
                 f"{'does' if len(unused) == 1 else 'do'} not apply"] if unused else []
        return None, _noted(name, {"source": "none: the layers are read exactly"}, notes)
    checkpoint = getattr(model, "checkpoint", None)
    saved = probes_dir(checkpoint) if checkpoint is not None else None
    notes, why = [], ""
    if cfg.refit_probes:
        why = " (--refit-probes)"
    elif saved is not None and (saved / PROBES_FILE).is_file():
        try:
            lp = probes.LayerProbes.load(saved, model)
        except ValueError as err:
            notes.append(f"warning: not using the saved probes: {err}")
            why = f" (the saved probes in {saved} are unusable)"
        else:
            mismatch = _mismatch(lp, cfg, task)
            if not mismatch:
                record = _record("saved", saved, lp)
                return lp, _noted(name, record, [f"using the probes saved in {saved} "
                                           f"({_describe(record)}); --refit-probes fits new "
                                           "ones"])
            why = f" (the probes saved in {saved} have {'; '.join(mismatch)})"
    if cfg.probe_fit == "crossfit":  # align fits them on its own evaluation sequences
        record = {"source": "cross-fitted", "path": None, "folds": cfg.probe_folds,
                  "n_sequences": cfg.n_sequences, "seed": cfg.seed,
                  "target": cfg.probe_target, "alpha": "gcv", "fitted_at": None}
        fitted_to = "y" if cfg.probe_target == "y" else \
            "each layer's best-held candidate prediction"
        if cfg.n_probe_sequences is not None:  # it chose among saved probes; unused here
            why += (f"; n_probe_sequences={cfg.n_probe_sequences} only selects saved probes "
                    "(probe_fit='fresh' fits new ones on that many)")
        return None, _noted(name, record, [*notes, f"cross-fitting probes on the {cfg.n_sequences} "
                                             f"evaluation sequences ({cfg.probe_folds} "
                                             f"folds, fitted to {fitted_to}){why}"])
    n = cfg.fresh_probe_sequences
    check_fit_fits(model, task, n, cfg.n_probe_heldout)  # refused before it is announced
    _noted(name, {}, [*notes, f"fitting new probes on {n} fresh sequences (seed "
                              f"{cfg.seed + 1}){why}"])
    lp = probes.LayerProbes().fit(model, task, n_sequences=n, generator=cfg.seed + 1,
                                  n_heldout=cfg.n_probe_heldout)
    record = _record("fitted", None, lp)
    return lp, {**record, "notes": [*notes, f"fitted new probes ({_describe(record)}){why}"]}


def given_probes(lp: probes.LayerProbes) -> dict[str, Any]:
    """The record of probes a caller passed to `align`."""
    return {**_record("given", None, lp), "notes": []}


def _mismatch(lp: probes.LayerProbes, cfg: AlignConfig, task: RegressionTask) -> list[str]:
    """How saved probes differ from what ``cfg`` asks for on ``task`` (empty: usable)."""
    fit = getattr(lp, "fit_settings_", None)
    if not isinstance(fit, dict):
        return ["they do not record how they were fitted"]
    default = probes.LayerProbes()
    why = [f"{k} {getattr(lp, k)!r}, not {getattr(default, k)!r}"
           for k in ("target", "alpha", "solver", "t_min") if getattr(lp, k) != getattr(default, k)]
    if cfg.n_probe_sequences is not None and fit.get("n_sequences") != cfg.n_probe_sequences:
        why.append(f"{fit.get('n_sequences')} sequences, not {cfg.n_probe_sequences}")
    if fit.get("seed") != cfg.seed + 1:
        why.append(f"seed {fit.get('seed')}, not {cfg.seed + 1}")
    if fit.get("task") != json.loads(task.to_json()):
        why.append("other data than the evaluation task")
    return why


def _record(source: str, path: Path | None, lp: probes.LayerProbes) -> dict[str, Any]:
    fit = getattr(lp, "fit_settings_", None) or {}
    return {"source": source, "path": str(path) if path else None,
            "n_sequences": fit.get("n_sequences"), "seed": fit.get("seed"),
            "target": lp.target, "alpha": lp.alpha, "fitted_at": fit.get("fitted_at")}


def _noted(name: str, record: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    for line in notes:  # the CLI prints them; unusable saved probes are refitted, not an error
        logger.info("%s: %s", name, line)
    return {**record, "notes": notes}


def _describe(info: dict[str, Any]) -> str:
    return (f"{info['n_sequences']} sequences, data seed {info['seed']}, target {info['target']}, "
            f"alpha {info['alpha']}, fitted {info['fitted_at']}")
