"""Handlers of ``iclprobe align | compare | probe | demo`` (heavy imports happen here)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclprobe.cli import UsageError

if TYPE_CHECKING:
    from iclprobe.models.regressor import Regressor

logger = logging.getLogger(__name__)
DEMO_MODELS = ("gpt-softmax", "gpt-softmax-paired", "gpt-linear-paired")
DEMO_PQ = ("pq-rotated-3layer", "pq-isotropic-1layer")
DEMO_RECURRENT = "lstm"  # the recurrent baseline, on gpt-softmax's task


def _align_config(args: argparse.Namespace) -> Any:
    """The `AlignConfig` of the flags given (its own defaults for the rest)."""
    from iclprobe.alignment.config import AlignConfig
    from iclprobe.cli_flags import align_flags, given

    fields = given(args, align_flags())
    cfg = AlignConfig(**fields)
    if "condition_number" in fields and cfg.data != "ill-conditioned":
        if not cfg.separation:
            raise UsageError(f"--condition-number {cfg.condition_number:g} applies to --data "
                             f"ill-conditioned (the data here: {cfg.data}) and to the "
                             "separation views, which --no-separation turns off")
        print(f"note: --condition-number {cfg.condition_number:g} sets only the κ of the "
              f"separation views' ill-conditioned data; the evaluation data are --data "
              f"{cfg.data}'s (pass --data ill-conditioned to evaluate on κ = "
              f"{cfg.condition_number:g})", file=sys.stderr)
    return cfg


def _check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device cuda: no CUDA device is available to torch "
                         f"{torch.__version__}; use --device cpu")


def _model_dir(checkpoint: str) -> Path:
    """The directory that stands for a checkpoint: a run directory for ``RUN/checkpoint``."""
    from iclprobe.models.checkpoint import RUN_CHECKPOINT, resolve
    from iclprobe.storage import read_marker
    from iclprobe.training.run_dir import METRICS_FILE

    path = Path(os.path.abspath(resolve(checkpoint)))
    run = path.parent
    if path.name == RUN_CHECKPOINT and ((read_marker(run) or {}).get("kind") == "run"
                                        or (run / METRICS_FILE).is_file()):
        return run
    return path


def unique_names(checkpoints: list[str]) -> list[str]:
    """One name per checkpoint, for tables, JSON keys and file names.

    A checkpoint is named after its directory, parent-qualified (``a_run``) where two share
    a name, and numbered (``run-2``) where that is not enough.
    """
    dirs = [_model_dir(c) for c in checkpoints]
    base = [d.name or c for d, c in zip(dirs, checkpoints)]
    names = [f"{d.parent.name}_{n}" if base.count(n) > 1 and d.parent.name else n
             for d, n in zip(dirs, base)]
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


def probes_dir(checkpoint: str) -> Path:
    """Where ``iclprobe probe`` saves a checkpoint's probes and ``align`` looks for them.

    Next to the checkpoint (``CHECKPOINT/probes``; ``RUN/probes`` for a training run), but
    for a shipped model in the user cache (``$ICLPROBE_CACHE``, else the platform's), never
    inside the installed package.
    """
    from iclprobe.models.checkpoint import PRETRAINED_DIR
    from iclprobe.storage import cache_dir

    path = _model_dir(checkpoint)
    if path.resolve().is_relative_to(PRETRAINED_DIR.resolve()):
        return cache_dir() / "probes" / path.name
    if path.is_file():  # an Ahn et al. .pt file
        return path.with_name(path.name + ".probes")
    return path / "probes"


@dataclasses.dataclass
class ProbeRequest:
    """What ``align`` asks of the layer probes it reads out with."""

    n_sequences: int
    seed: int  # the probe data's seed (align's --seed + 1)
    n_given: bool = False  # --n-probe-sequences given: saved probes must match it
    refit: bool = False  # --refit-probes


def _probe_mismatch(fit: Any, req: ProbeRequest, task: Any, lp: Any) -> list[str]:
    """How saved probes differ from what ``req`` asks for (empty: usable)."""
    from iclprobe import probes

    if not isinstance(fit, dict):
        return ["they do not record how they were fitted"]
    default = probes.LayerProbes()
    why = [f"{k} {getattr(lp, k)!r}, not {getattr(default, k)!r}"
           for k in ("target", "alpha", "solver", "t_min") if getattr(lp, k) != getattr(default, k)]
    if req.n_given and fit.get("n_sequences") != req.n_sequences:
        why.append(f"{fit.get('n_sequences')} sequences, not {req.n_sequences}")
    if fit.get("seed") != req.seed:
        why.append(f"seed {fit.get('seed')}, not {req.seed}")
    if fit.get("task") != json.loads(task.to_json()):
        why.append("other data than the evaluation task")
    return why


def _probes(model: Any, checkpoint: str, cfg: Any, task: Any, req: ProbeRequest,
            name: str) -> tuple[Any | None, dict[str, Any]]:
    """Probes saved for the checkpoint when they fit this model, data and request, else fitted.

    Returns the probes and a record of which were used and how they were fitted; prints
    that record as one line on stderr.
    """
    from iclprobe import probes

    saved, why = probes_dir(checkpoint), ""
    if req.refit:
        why = " (--refit-probes)"
    elif (saved / "probes.json").is_file():
        try:
            lp = probes.LayerProbes.load(saved, model)
        except ValueError as err:
            print(f"{name}: warning: not using the saved probes: {err}", file=sys.stderr)
            why = f" (the saved probes in {saved} are unusable)"
        else:
            mismatch = _probe_mismatch(getattr(lp, "fit_settings_", None), req, task, lp)
            if not mismatch:
                info = _probe_record("saved", saved, lp)
                print(f"{name}: using the probes saved in {saved} ({_describe(info)}); "
                      "--refit-probes fits new ones", file=sys.stderr)
                return lp, info
            why = f" (the probes saved in {saved} have {'; '.join(mismatch)})"
    if cfg.probe_fit == "crossfit":  # align fits them on its own evaluation sequences
        info = {"source": "cross-fitted", "path": None, "folds": cfg.probe_folds,
                "n_sequences": cfg.n_sequences, "seed": cfg.seed, "target": "y",
                "alpha": "gcv", "fitted_at": None}
        print(f"{name}: cross-fitting probes on the {cfg.n_sequences} evaluation sequences "
              f"({cfg.probe_folds} folds){why}", file=sys.stderr)
        return None, info
    lp = probes.LayerProbes().fit(model, task, n_sequences=req.n_sequences, generator=req.seed,
                                  n_heldout=cfg.n_probe_heldout)
    info = _probe_record("fitted", None, lp)
    print(f"{name}: fitted new probes ({_describe(info)}){why}", file=sys.stderr)
    return lp, info


def _probe_record(source: str, path: Path | None, lp: Any) -> dict[str, Any]:
    fit = getattr(lp, "fit_settings_", None) or {}
    return {"source": source, "path": str(path) if path else None,
            "n_sequences": fit.get("n_sequences"), "seed": fit.get("seed"),
            "target": lp.target, "alpha": lp.alpha, "fitted_at": fit.get("fitted_at")}


def _describe(info: dict[str, Any]) -> str:
    return (f"{info['n_sequences']} sequences, seed {info['seed']}, target {info['target']}, "
            f"alpha {info['alpha']}, fitted {info['fitted_at']}")


def align_checkpoints(checkpoints: list[str], cfg: Any, refit_probes: bool = False,
                      n_probe_given: bool = True) -> tuple[list[Any], dict[str, Any]]:
    """Load and align each checkpoint on the same evaluation data.

    Returns the results (named uniquely) and, by name, which layer probes each used and
    how they were fitted.
    """
    from iclprobe import models
    from iclprobe.alignment.family import needs_probes
    from iclprobe.alignment.memory import check_align_fits
    from iclprobe.alignment.pipeline import compare, evaluation_task

    loaded = [(c, models.load(c, device=cfg.device)) for c in checkpoints]
    task = evaluation_task(loaded[0][1], cfg)
    req = ProbeRequest(cfg.n_probe_sequences, cfg.seed + 1, n_probe_given, refit_probes)
    names = unique_names(checkpoints)
    for (checkpoint, model), name in zip(loaded, names):
        if model.cfg.n_dims != task.n_dims:
            raise ValueError(f"{checkpoint} has n_dims={model.cfg.n_dims}, but the data has "
                             f"d={task.n_dims}: compare models of one dimension")
        check_align_fits(model, task, cfg, needs_probes(model), name)  # before fitting probes
    lps, records = [], {}
    for (checkpoint, model), name in zip(loaded, names):
        lp = None
        if needs_probes(model):
            lp, records[name] = _probes(model, checkpoint, cfg, task, req, name)
        else:
            records[name] = {"source": "none: the layers are read exactly"}
        lps.append(lp)
    results = compare([m for _, m in loaded], cfg, names, lps, eval_task=task)
    for res in results:
        res.probes_info = records[res.name]
    return results, records


def cmd_align(args: argparse.Namespace) -> int:
    """``iclprobe align`` and ``iclprobe compare``."""
    from iclprobe.alignment.screen import screen
    from iclprobe.alignment.tables import aligned, comparison_rows, spectral_lines, text_table
    from iclprobe.storage import atomic_directory, check_output

    checkpoints = [args.checkpoint] if hasattr(args, "checkpoint") else args.checkpoints
    cfg = _align_config(args)
    _check_device(cfg.device)
    if args.out is not None:
        check_output(args.out, "report", args.overwrite)  # before the work, not after
    results, records = align_checkpoints(checkpoints, cfg, refit_probes=args.refit_probes,
                                         n_probe_given=hasattr(args, "n_probe_sequences"))
    if args.out is not None:
        from iclprobe.alignment.report import write_report  # matplotlib: only for a report

        command = "iclprobe " + " ".join(args.argv)
        with atomic_directory(args.out, "report", args.overwrite) as tmp:
            write_report(tmp, results, title=f"iclprobe {args.command}", command=command,
                         side_by_side=[[r.name for r in results]] if len(results) > 1 else [])
    if args.json:
        print(json.dumps({r.name: {**r.to_dict(), "probes": records[r.name]} for r in results}))
        return 0
    for res in results:
        if not args.verbose:
            print(screen(res), end="\n\n")
            continue
        for metric in cfg.metrics:
            print(text_table(res, metric), end="\n\n")
            if res.meaningless:
                break
        if res.verdict_sentence and not res.meaningless:
            print("\n".join(spectral_lines(res)), end="\n\n" if res.spectral else "")
            print(res.verdict_sentence, end="\n\n")
    if len(results) > 1:
        print("best Newton step per layer (* = the models differ, † = not above zero)")
        print("\n".join(aligned(*comparison_rows(results), right=False)))
    if args.out is not None:
        print(f"report: {Path(args.out) / 'report.md'}")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """``iclprobe probe``: fit and save the layer probes of a checkpoint."""
    from iclprobe import models, probes
    from iclprobe.probes.inputs import check_fit_fits
    from iclprobe.storage import check_output

    _check_device(args.device)
    model = models.load(args.checkpoint, device=args.device)
    if model.task is None:
        raise ValueError(f"{args.checkpoint} has no task.json to draw probe data from")
    out = Path(args.out) if args.out is not None else probes_dir(args.checkpoint)
    check_output(out, "probes", args.overwrite)  # before the work, not after
    check_fit_fits(model, model.task, args.n_sequences, 500)
    # Seeded as `align --seed SEED` fits its probes, so that align uses these.
    print(f"{args.checkpoint}: fitting probes on {args.n_sequences} sequences of its task "
          f"(seed {args.seed})", file=sys.stderr)
    lp = probes.LayerProbes().fit(model, n_sequences=args.n_sequences, generator=args.seed + 1)
    lp.save(out, overwrite=args.overwrite)
    print("layer  alpha      held-out R²  normalized error")
    for layer, (a, r2, err) in enumerate(zip(lp.alpha_.tolist(), lp.metrics_.r2,
                                             lp.metrics_.normalized_error)):
        print(f"{layer:5d}  {a:9.2e}  {r2:11.4f}  {err:.4f}")
    print(f"probes saved to {out}")
    return 0


def run_demo(out: Path, n_sequences: int = 512, n_probe_sequences: int = 1000,
             overwrite: bool = False) -> Path:
    """The whole pipeline on the shipped models; returns the report path.

    ``out`` is checked before any work (`check_output`) and written whole at the end.
    """
    from iclprobe import models, probes
    from iclprobe.alignment.pipeline import AlignConfig, align
    from iclprobe.alignment.report import write_report
    from iclprobe.alignment.screen import screen
    from iclprobe.alignment.tables import aligned, comparison_rows, fitted_lines, headline_lines
    from iclprobe.storage import atomic_directory, check_output

    check_output(out, "report", overwrite)
    cfg = AlignConfig(n_sequences=n_sequences, n_probe_sequences=n_probe_sequences)
    model = models.load(DEMO_MODELS[0])
    req = ProbeRequest(cfg.n_probe_sequences, cfg.seed + 1)
    probe, record = _probes(model, DEMO_MODELS[0], cfg, model.task, req, DEMO_MODELS[0])
    gpt = [align(model, cfg, name=DEMO_MODELS[0], layer_probes=probe),
           align(model, dataclasses.replace(cfg, protocol="fu2024"),
                 name=f"{DEMO_MODELS[0]}-fu2024", layer_probes=probe)]
    for res in gpt:
        res.probes_info = record
    paired, _ = align_checkpoints(list(DEMO_MODELS[1:]), cfg)
    recurrent = align_checkpoints([DEMO_RECURRENT], cfg)[0][0]
    pq_aligned = [align_checkpoints([name], cfg)[0][0] for name in DEMO_PQ]
    pq = []
    for name in DEMO_PQ:
        pq.append((name, probes.analyze_preconditioners(models.load(name))))  # type: ignore[arg-type]
    with atomic_directory(out, "report", overwrite) as tmp:
        write_report(tmp, gpt + paired + [recurrent] + pq_aligned, pq,
                     title="iclprobe demo: which algorithm does each layer run?",
                     command="iclprobe demo", side_by_side=[list(DEMO_MODELS[1:])])
    report = Path(out) / "report.md"
    print(screen(gpt[0]), end="\n\n")
    print("Fu et al.'s headline (Newton closer than GD) at the last layer: gpt-softmax "
          "under both protocols, every transformer under iclprobe's:")
    print("\n".join(headline_lines(gpt + paired)), end="\n\n")
    print("the verdict, step sizes fitted (Newton and GD with equal flexibility; the view "
          "with the fewest false attributions on bench/known_answers.py):")
    print("\n".join(fitted_lines(gpt + paired + [recurrent])), end="\n\n")
    print("softmax vs linear attention, paired layout: best Newton step per layer")
    print("\n".join(aligned(*comparison_rows(paired), right=False)), end="\n\n")
    print(f"transformer vs its recurrent baseline ({DEMO_RECURRENT}) on the same task: best "
          "online GD step per layer, and online GD against Newton at the last layer")
    print("\n".join(aligned(*comparison_rows([gpt[0], recurrent], learner="online_gd"),
                           right=False)))
    print("\n".join(headline_lines([gpt[0], recurrent], b="online_gd")), end="\n\n")
    print(screen(pq_aligned[0]), end="\n\n")
    for name, analysis in pq:
        dists = ", ".join(f"{d:.3f}" for d in analysis.dist_to_inv_cov)
        print(f"{name}: distance of A_l to Σ⁻¹ per layer: {dists}; scales a_l "
              + ", ".join(f"{a:.2f}" for a in analysis.scale))
    print(f"report: {report}")
    return report


def cmd_demo(args: argparse.Namespace) -> int:
    """``iclprobe demo``."""
    run_demo(Path(args.out), n_sequences=args.n_sequences,
             n_probe_sequences=args.n_probe_sequences, overwrite=args.overwrite)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """``iclprobe train``: exit 1 when training diverges, 130 on Ctrl-C."""
    from iclprobe import models
    from iclprobe.models.checkpoint import RUN_CHECKPOINT, TRAIN_CONFIG_FILE

    if args.resume and args.overwrite:
        raise UsageError("--overwrite starts a fresh run: drop --resume, or drop --overwrite")
    try:
        model, task, cfg = _train_setup(args)
        result = models.train(model, task, cfg, out=args.out, resume=args.resume,
                              overwrite=args.overwrite)
    except models.TrainingDiverged as err:
        print(f"iclprobe train: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        done = f" after step {err.step}" if isinstance(err, models.TrainingInterrupted) else ""
        if (Path(args.out) / RUN_CHECKPOINT / TRAIN_CONFIG_FILE).is_file():
            hint = f"continue with: iclprobe train --out {args.out} --resume"
        else:
            hint = "no checkpoint was written yet: run the same command again to start afresh"
        print(f"iclprobe train: interrupted{done}; {hint}", file=sys.stderr)
        return 130
    if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 reports
        return 0
    if result.history:
        last = result.final
        print(f"step {last['step']}: loss {last['loss']:.5f}, normalized "
              f"{last['normalized_loss']:.5f} (OLS on the same batch: "
              f"{last['ols_normalized_loss']:.5f}); run in {args.out}")
    elif args.resume:
        print(f"nothing to do: the run in {args.out} has done all {cfg.steps} steps "
              "(pass a larger --steps to train further)")
    return 0


def _train_setup(args: argparse.Namespace) -> tuple[Regressor, Any, Any]:
    """The model, task and recipe of ``iclprobe train``, fresh or from the run (--resume)."""
    from iclprobe import models, tasks
    from iclprobe._checks import check_training_fits
    from iclprobe.cli_flags import MODEL_FROM_TASK, given, train_flags
    from iclprobe.models import registry

    flags = train_flags()
    train_given = given(args, flags["training"])
    if args.resume:
        ignored = [f.option for f in flags["task"] + flags["model"] if hasattr(args, f.dest)]
        if ignored or hasattr(args, "family"):
            raise UsageError(f"--resume takes the model and task from {args.out}; "
                             f"drop {', '.join(ignored) or '--family'}")
        cfg = dataclasses.replace(models.read_train_config(args.out), **train_given)
        model: Regressor = models.load(args.out)
        return model, model.task, cfg
    task = tasks.RegressionTask(**{"n_dims": 8, "n_points": 24, **given(args, flags["task"])})
    model_kw = given(args, flags["model"])
    family = registry.get_family(getattr(args, "family", "gpt"))
    if not family.trainable:
        trainable = sorted(name for name, f in registry.FAMILIES.items() if f.trainable)
        raise UsageError(f"--family {family.name} cannot be trained: its models are built, "
                         f"not trained ({family.summary}); trainable families: "
                         f"{', '.join(trainable)}")
    fields = {f.name for f in dataclasses.fields(family.config)}
    for name, task_field in MODEL_FROM_TASK.items():
        if name in fields:
            model_kw.setdefault(name, getattr(task, task_field))
    bad = [f.option for f in flags["model"] if f.name in model_kw and f.name not in fields]
    if bad:
        raise UsageError(f"not applicable to --family {family.name}: {', '.join(bad)}")
    model_cfg = family.config(**model_kw)
    cfg = models.TrainConfig(**train_given)
    check_training_fits(model_cfg, task, cfg)  # before allocating anything
    model = family.model_class()(model_cfg)
    return model, task, cfg
