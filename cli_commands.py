"""Handlers of ``iclprobe align | compare | probe | demo`` (heavy imports happen here)."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclprobe.cli import UsageError

if TYPE_CHECKING:
    from iclprobe.models.regressor import Regressor

logger = logging.getLogger(__name__)
DEMO_MODELS = ("gpt-softmax", "gpt-softmax-paired", "gpt-linear-paired")
DEMO_PQ = ("pq-rotated-3layer", "pq-isotropic-1layer")


def _align_config(args: argparse.Namespace) -> Any:
    from iclprobe.alignment.pipeline import AlignConfig

    metrics = ("error_cosine", "weight_cosine") if args.metric == "both" else (args.metric,)
    algos = None
    if args.algorithms:
        algos = tuple(a.strip() for a in args.algorithms.split(",") if a.strip())
    return AlignConfig(protocol=args.protocol, algorithms=algos, metrics=metrics,
                       positions=args.positions, t_min=args.t_min, t_max=args.t_max,
                       fit_layers=args.fit_layers, n_sequences=args.n_sequences,
                       n_probe_sequences=args.n_probe_sequences, data=args.data,
                       condition_number=args.condition_number, seed=args.seed,
                       device=args.device)


def _name(checkpoint: str) -> str:
    return Path(checkpoint.rstrip("/")).name or checkpoint


def _probes(model: Any, checkpoint: str, cfg: Any, task: Any) -> Any:
    """Probes saved next to the checkpoint (when they fit this model and data), else fitted."""
    from iclprobe import probes
    from iclprobe.models.checkpoint import resolve

    saved = resolve(checkpoint) / "probes"
    if cfg.data == "task" and (saved / "probes.json").is_file():
        try:
            return probes.LayerProbes.load(saved, model)
        except ValueError as err:
            logger.warning("not using %s: %s", saved, err)
    import torch

    return probes.LayerProbes().fit(model, task, n_sequences=cfg.n_probe_sequences,
                                    generator=torch.Generator().manual_seed(cfg.seed + 1),
                                    n_heldout=cfg.n_probe_heldout)


def align_checkpoints(checkpoints: list[str], cfg: Any) -> list[Any]:
    """Load and align each checkpoint on the same evaluation data."""
    from iclprobe import models
    from iclprobe.alignment.pipeline import align, evaluation_task

    loaded = [(c, models.load(c, device=cfg.device)) for c in checkpoints]
    task = evaluation_task(loaded[0][1], cfg)
    results = []
    for checkpoint, model in loaded:
        if model.cfg.n_dims != task.n_dims:
            raise ValueError(f"{checkpoint} has n_dims={model.cfg.n_dims}, but the data has "
                             f"d={task.n_dims}: compare models of one dimension")
        results.append(align(model, cfg, name=_name(checkpoint),
                             layer_probes=_probes(model, checkpoint, cfg, task), eval_task=task))
    return results


def cmd_align(args: argparse.Namespace) -> int:
    """``iclprobe align`` and ``iclprobe compare``."""
    from iclprobe.alignment.report import comparison_rows, text_table, write_report

    checkpoints = [args.checkpoint] if hasattr(args, "checkpoint") else args.checkpoints
    cfg = _align_config(args)
    results = align_checkpoints(checkpoints, cfg)
    if args.out:
        command = "iclprobe " + " ".join(args.argv)
        write_report(args.out, results, title=f"iclprobe {args.command}", command=command)
    if args.json:
        print(json.dumps({r.name: r.to_dict() for r in results}))
        return 0
    for res in results:
        for metric in cfg.metrics:
            print(text_table(res, metric), end="\n\n")
            if res.meaningless:
                break
    if len(results) > 1:
        header, body = comparison_rows(results)
        print("best Newton step per layer (* = the models differ, † = not above zero)")
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
        for row in [header, *body]:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    if args.out:
        print(f"report: {Path(args.out) / 'report.md'}")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """``iclprobe probe``: fit and save the layer probes of a checkpoint."""
    import torch

    from iclprobe import models, probes
    from iclprobe.models.checkpoint import resolve

    model = models.load(args.checkpoint, device=args.device)
    if model.task is None:
        raise ValueError(f"{args.checkpoint} has no task.json to draw probe data from")
    out = Path(args.out) if args.out else resolve(args.checkpoint) / "probes"
    lp = probes.LayerProbes().fit(model, n_sequences=args.n_sequences,
                                  generator=torch.Generator().manual_seed(args.seed))
    lp.save(out)
    print("layer  alpha      held-out R²  normalized error")
    for layer, (a, r2, err) in enumerate(zip(lp.alpha_.tolist(), lp.metrics_.r2,
                                             lp.metrics_.normalized_error)):
        print(f"{layer:5d}  {a:9.2e}  {r2:11.4f}  {err:.4f}")
    print(f"probes saved to {out}")
    return 0


def run_demo(out: Path, n_sequences: int = 512, n_probe_sequences: int = 1000) -> Path:
    """The whole pipeline on the shipped models; returns the report path."""
    import dataclasses

    from iclprobe import models, probes
    from iclprobe.alignment.pipeline import AlignConfig, align
    from iclprobe.alignment.report import comparison_rows, write_report
    from iclprobe.alignment.tables import aligned, headline_lines, text_table

    cfg = AlignConfig(n_sequences=n_sequences, n_probe_sequences=n_probe_sequences)
    model = models.load(DEMO_MODELS[0])
    assert model.task is not None
    probe = _probes(model, DEMO_MODELS[0], cfg, model.task)
    gpt = [align(model, cfg, name=DEMO_MODELS[0], layer_probes=probe),
           align(model, dataclasses.replace(cfg, protocol="fu2024"),
                 name=f"{DEMO_MODELS[0]}-fu2024", layer_probes=probe)]
    paired = align_checkpoints(list(DEMO_MODELS[1:]), cfg)
    pq_aligned = [align_checkpoints([name], cfg)[0] for name in DEMO_PQ]
    pq = []
    for name in DEMO_PQ:
        pq_model = models.load(name)
        assert isinstance(pq_model, models.PQTransformer), name
        pq.append((name, probes.analyze_preconditioners(pq_model)))
    report = write_report(out, gpt + paired + pq_aligned, pq,
                          title="iclprobe demo: which algorithm does each layer run?",
                          command="iclprobe demo")
    print(text_table(gpt[0]), end="\n\n")
    print("Fu et al.'s headline (Newton closer than GD) at the last layer, under both "
          "protocols and on every model:")
    print("\n".join(headline_lines(gpt + paired)), end="\n\n")
    print("softmax vs linear attention, paired layout: best Newton step per layer")
    print("\n".join(aligned(*comparison_rows(paired), right=False)), end="\n\n")
    print(text_table(pq_aligned[0]), end="\n\n")
    for name, analysis in pq:
        dists = ", ".join(f"{d:.3f}" for d in analysis.dist_to_inv_cov)
        print(f"{name}: distance of A_l to Σ⁻¹ per layer: {dists}; scales a_l "
              + ", ".join(f"{a:.2f}" for a in analysis.scale))
    print(f"report: {report}")
    return report


def cmd_demo(args: argparse.Namespace) -> int:
    """``iclprobe demo``."""
    run_demo(Path(args.out), n_sequences=args.n_sequences,
             n_probe_sequences=args.n_probe_sequences)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """``iclprobe train``."""
    import dataclasses

    from iclprobe import models, tasks
    from iclprobe.cli_flags import (
        MODEL_FIELDS,
        MODEL_RENAME,
        TASK_FIELDS,
        TASK_RENAME,
        TRAIN_FIELDS,
        given,
    )

    train_given = given(args, [f[0] for f in TRAIN_FIELDS])
    if args.resume:
        ignored = given(args, [f[0] for f in TASK_FIELDS], TASK_RENAME) | given(
            args, [f[0] for f in MODEL_FIELDS], MODEL_RENAME)
        if ignored or hasattr(args, "family"):
            raise UsageError(f"--resume takes the model and task from {args.out}; "
                             f"drop {sorted(ignored) or ['--family']}")
        cfg = dataclasses.replace(models.read_train_config(args.out), **train_given)
        model: Regressor = models.load(args.out)
        task = model.task
    else:
        task = tasks.RegressionTask(**{"n_dims": 8, "n_points": 24,
                                       **given(args, [f[0] for f in TASK_FIELDS], TASK_RENAME)})
        model_kw = given(args, [f[0] for f in MODEL_FIELDS], MODEL_RENAME)
        model_kw["n_dims"] = task.n_dims
        family = getattr(args, "family", "gpt")
        if family == "gpt":
            model_kw.setdefault("n_positions", task.n_points)
            bad = sorted({"sparse", "kernel", "init_std"} & set(model_kw))
            model = models.GPTRegressor(models.GPTConfig(**_only(model_kw, bad, family)))
        elif family == "lstm":  # family wiring: lstm
            from iclprobe.models.lstm import LSTMConfig, LSTMRegressor

            model_kw.setdefault("n_positions", task.n_points)
            bad = sorted({"n_heads", "d_mlp", "attention", "ln_eps", "final_norm", "sparse",
                          "kernel", "init_std"} & set(model_kw))
            model = LSTMRegressor(LSTMConfig(**_only(model_kw, bad, family)))
        else:
            bad = sorted({"n_positions", "d_model", "d_mlp", "attention", "layout",
                          "ln_eps", "final_norm"} & set(model_kw))
            model = models.PQTransformer(models.PQConfig(**_only(model_kw, bad, family)))
        cfg = models.TrainConfig(**train_given)
    result = models.train(model, task, cfg, out=args.out, resume=args.resume)
    if result.history and os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 reports
        last = result.final
        print(f"step {last['step']}: loss {last['loss']:.5f}, normalized "
              f"{last['normalized_loss']:.5f} (OLS on the same batch: "
              f"{last['ols_normalized_loss']:.5f}); run in {args.out}")
    return 0


def _only(kw: dict[str, Any], bad: list[str], family: str) -> dict[str, Any]:
    if bad:
        flags = ", ".join("--" + b.replace("_", "-") for b in bad)
        raise UsageError(f"not applicable to --family {family}: {flags}")
    return kw
