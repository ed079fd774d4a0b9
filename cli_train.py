"""``iclprobe train``: the recipe from the flags (or the run, with --resume), and its run."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclprobe._text import wrap
from iclprobe.cli_commands import UsageError

if TYPE_CHECKING:
    from iclprobe.models.base import Regressor


def cmd_train(args: argparse.Namespace) -> int:
    """``iclprobe train``: exit 1 when training diverges, 130 on Ctrl-C."""
    from iclprobe import training
    from iclprobe.models.files import RUN_CHECKPOINT, TRAIN_CONFIG_FILE

    if args.resume and args.overwrite:
        raise UsageError("--overwrite starts a fresh run: drop --resume, or drop --overwrite")
    try:
        model, task, cfg = _train_setup(args)
        result = training.train(model, task, cfg, out=args.out, resume=args.resume,
                              overwrite=args.overwrite)
    except training.TrainingDiverged as err:
        print(f"iclprobe train: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        known = err if isinstance(err, training.TrainingInterrupted) else None
        done = f" after step {known.step}" if known is not None else ""
        if (Path(args.out) / RUN_CHECKPOINT / TRAIN_CONFIG_FILE).is_file():
            at = known.checkpoint_step if known is not None else None
            hint = f"continue with: iclprobe train --out {args.out} --resume" + (
                f" (from its checkpoint at step {at})" if at is not None else "")
        else:
            hint = "no checkpoint was written yet: run the same command again to start afresh"
        print("\n".join(wrap([f"iclprobe train: interrupted{done}; {hint}"], whole_words=True)),
              file=sys.stderr)
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
    from iclprobe import models, tasks, training
    from iclprobe.cli_flags import MODEL_FROM_TASK, TRAIN_TASK_DEFAULTS, given, train_flags
    from iclprobe.models import registry
    from iclprobe.training.memory import check_training_fits

    flags = train_flags()
    train_given = given(args, flags["training"])
    if args.resume:
        ignored = [f.option for f in flags["task"] + flags["model"] if hasattr(args, f.dest)]
        if ignored or hasattr(args, "family"):
            raise UsageError(f"--resume takes the model and task from {args.out}; "
                             f"drop {', '.join(ignored) or '--family'}")
        cfg = dataclasses.replace(training.read_train_config(args.out), **train_given)
        model: Regressor = models.load(args.out)
        return model, model.task, cfg
    task_given = given(args, flags["task"])
    task = tasks.RegressionTask(**{**TRAIN_TASK_DEFAULTS, **task_given})
    unused = [f"--{k.replace('_', '-')}" for k in ("condition_number", "eigenbasis")
              if k in task_given]
    if unused and task.cov != "ill-conditioned":
        raise UsageError(f"{' and '.join(unused)} appl{'y' if unused[1:] else 'ies'} to "
                         f"--cov ill-conditioned only, not --cov {task.cov}")
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
    if task.n_points > getattr(model_cfg, "n_positions", task.n_points):
        raise UsageError(f"--n-points {task.n_points} is more than the model's --n-positions "
                         f"{model_cfg.n_positions}: it sees at most that many examples")
    cfg = training.TrainConfig(**train_given)
    model_cls = family.model_class()
    check_training_fits(model_cls, model_cfg, task, cfg)  # before allocating anything
    model = model_cls(model_cfg)
    return model, task, cfg
