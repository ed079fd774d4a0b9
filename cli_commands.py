"""Handlers of ``iclprobe align | compare | probe | demo`` (heavy imports happen here)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iclprobe.errors import InputError

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)
DEMO_MODELS = ("gpt-softmax", "gpt-softmax-paired", "gpt-linear-paired")
DEMO_PQ = ("pq-rotated-3layer", "pq-isotropic-1layer")
DEMO_RECURRENT = "lstm"  # the recurrent baseline, on gpt-softmax's task
DEMO_KNOWN = ("ka-gd-oracle", "ka-newton-pq")  # read first: the instrument on known answers


class UsageError(InputError):
    """A bad invocation: printed as one line, exit status 2 (by `iclprobe.cli.main`)."""


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
    from iclprobe.models.checkpoint import check_device

    try:
        check_device("--device", device)  # the library's check, under the flag's name
    except InputError as err:
        raise UsageError(str(err)) from None


def unique_names(checkpoints: list[str]) -> list[str]:
    """One name per checkpoint, for tables, JSON keys and file names.

    A checkpoint is named after its directory, parent-qualified (``a_run``) where two
    directories share a name, and numbered (``run-2``) where that is not enough (the same
    checkpoint given twice keeps its name: ``gpt-softmax``, ``gpt-softmax-2``).
    """
    from iclprobe.alignment.measuring.probe_source import model_dir

    dirs = [model_dir(c) for c in checkpoints]
    base = [d.name or c for d, c in zip(dirs, checkpoints)]
    shared = {n for n in base if len({d for d, m in zip(dirs, base) if m == n}) > 1}
    names = [f"{d.parent.name}_{n}" if n in shared and d.parent.name else n
             for d, n in zip(dirs, base)]
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


def align_checkpoints(checkpoints: list[str], cfg: Any) -> tuple[list[Any], dict[str, Any]]:
    """Load and align each checkpoint on the same evaluation data.

    Returns the results (named uniquely) and, by name, which layer probes each used and
    how they were fitted (`resolve_probes`, as `align` itself resolves them; its notes are
    printed on stderr).
    """
    from iclprobe import models
    from iclprobe.alignment.evaluation import evaluation_task
    from iclprobe.alignment.measuring.layers import needs_probes
    from iclprobe.alignment.measuring.memory import check_align_fits
    from iclprobe.alignment.pipeline import compare

    loaded = [(c, models.load(c, device=cfg.device)) for c in checkpoints]
    task = evaluation_task(loaded[0][1], cfg)
    names = unique_names(checkpoints)
    for (checkpoint, model), name in zip(loaded, names):
        if model.cfg.n_dims != task.n_dims:
            raise InputError(f"{checkpoint} has n_dims={model.cfg.n_dims}, but the data has "
                             f"d={task.n_dims}: compare models of one dimension")
        check_align_fits(model, task, cfg, needs_probes(model), name)  # before fitting probes
    with status_lines():
        results = compare([m for _, m in loaded], cfg, names, eval_task=task)
    return results, {res.name: res.probes_info for res in results}


def design_checkpoints(checkpoints: list[str], results: list[Any], cfg: Any) -> dict[str, Any]:
    """Each model aligned again on its designed data (`alignment.design.align_designed`)."""
    from iclprobe import models
    from iclprobe.alignment.design import align_designed

    out = {}
    for checkpoint, res in zip(checkpoints, results):
        model = models.load(checkpoint, device=cfg.device)
        with status_lines():
            out[res.name] = align_designed(model, cfg, res.name, own=res, progress=True)
    return out


class _StageBar(logging.Handler):
    """`align`'s stages as a progress bar on stderr (a terminal's only: tqdm's ``disable=None``).

    A bar per `align`: it starts afresh at the first stage (`Timings.stage` logs each).
    """

    def __init__(self) -> None:
        super().__init__()
        self.bar: Any = None

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        from iclprobe._text import WIDTH
        from iclprobe.alignment.measuring.timing import FIRST_STAGE, N_STAGES

        stage = record.getMessage()
        if self.bar is None or stage == FIRST_STAGE:
            self._end_bar()
            self.bar = tqdm(total=N_STAGES, desc="align", ncols=WIDTH, leave=False, disable=None,
                            file=sys.stderr, bar_format="{desc} ({elapsed})", mininterval=0)
        self.bar.set_description_str(f"align, stage {self.bar.n + 1} of {N_STAGES}: {stage}",
                                     refresh=False)
        self.bar.update(1)

    def _end_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        self._end_bar()
        super().close()


class _Notes(logging.Handler):
    """Notes on stderr within the CLI's width, written around a progress bar (tqdm.write)."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        from iclprobe._text import wrap

        tqdm.write("\n".join(wrap([record.getMessage()], whole_words=True)), file=sys.stderr)


@contextlib.contextmanager
def status_lines() -> Iterator[None]:
    """On stderr: what `resolve_probes` says of each model's probes, and `align`'s stages.

    The notes are printed as the probes are decided on; the stages are a progress bar in a
    terminal, nothing elsewhere.
    """
    loggers = [(logging.getLogger("iclprobe.alignment.measuring.probe_source"), _Notes()),
               (logging.getLogger("iclprobe.alignment.measuring.timing"), _StageBar())]
    saved = [(log.level, log.propagate) for log, _ in loggers]
    for log, handler in loggers:
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False  # printed here, not again by the root logger's handlers
    try:
        yield
    finally:
        for (log, handler), (level, propagate) in zip(loggers, saved):
            log.removeHandler(handler)
            handler.close()
            log.setLevel(level)
            log.propagate = propagate


def cmd_align(args: argparse.Namespace) -> int:
    """``iclprobe align`` and ``iclprobe compare``."""
    from iclprobe._text import wrap
    from iclprobe.alignment.output.screen import screen
    from iclprobe.alignment.output.side_by_side import comparison_lines
    from iclprobe.alignment.output.tables import answer_table, spectral_lines, text_table
    from iclprobe.atomic import atomic_directory
    from iclprobe.storage import check_output

    checkpoints = [args.checkpoint] if hasattr(args, "checkpoint") else args.checkpoints
    cfg = _align_config(args)
    _check_device(cfg.device)
    if args.design and not cfg.fitted:
        raise UsageError("--design needs the fitted view: drop --no-fitted")
    if args.out is not None:
        check_output(args.out, "report", args.overwrite)  # before the work, not after
    # With --json, stdout is the JSON alone: what a plugin's learner or metric prints while
    # the models are aligned goes to stderr.
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        results, records = align_checkpoints(checkpoints, cfg)
        designed = design_checkpoints(checkpoints, results, cfg) if args.design else {}
        if args.out is not None:
            from iclprobe.alignment.output.report import write_report  # matplotlib: for a report

            command = "iclprobe " + " ".join(args.argv)
            with atomic_directory(args.out, "report", args.overwrite) as tmp:
                write_report(tmp, results, title=f"iclprobe {args.command}", command=command,
                             side_by_side=[[r.name for r in results]] if len(results) > 1
                             else [], designed=designed)
    if args.json:
        print(json.dumps({r.name: {**r.to_dict(), "probes": records[r.name],
                                   **({"designed": designed[r.name].to_dict()}
                                      if r.name in designed else {})} for r in results}))
        return 0
    notes = preconditioner_notes(checkpoints, [r.name for r in results])
    for res in results:
        if not args.verbose:
            note = wrap([notes[res.name]]) if res.name in notes else []
            print(screen(res, reserve=len(note)), end="\n\n" if not note else "\n")
            print("\n".join(note), end="\n\n" if note else "")
            if res.name in designed:
                print("\n".join(designed[res.name].lines()), end="\n\n")
            continue
        if answer_table(res):
            print(answer_table(res), end="\n\n")
        for metric in cfg.metrics:
            print(text_table(res, metric), end="\n\n")
            if res.meaningless:
                break
        if res.verdict_sentence and not res.meaningless:
            print("\n".join(spectral_lines(res)), end="\n\n" if res.spectral else "")
            print("\n".join(wrap([res.verdict_sentence])), end="\n\n")
        if res.name in designed:
            print("\n".join(designed[res.name].lines()), end="\n\n")
    if len(results) > 1:
        print("best Newton step per layer (* = the models differ, † = not above zero)")
        print("\n".join(comparison_lines(results)))
    if args.out is not None:
        print(f"report: {Path(args.out) / 'report.md'}")
    return 0


def preconditioner_notes(checkpoints: list[str], names: list[str]) -> dict[str, str]:
    """By name, for each PQ model with a fixed Σ: is each A_l positive definite (one line)?"""
    from iclprobe import models, probes

    notes = {}
    for checkpoint, name in zip(checkpoints, names):
        model = models.load(checkpoint)
        task = getattr(model, "task", None)
        if not callable(getattr(model, "matrices", None)) or getattr(model.cfg, "n_state", None) != 0:
            continue  # not a PQ model, or one whose layers are no A_l
        if task is None or task.covariance is None:
            continue
        try:
            notes[name] = probes.analyze_preconditioners(model).summary(  # type: ignore[arg-type]
                name)
        except InputError as err:  # an A_l of 0 (an untrained model) has no definiteness
            notes[name] = f"{name}: its preconditioners are not analysed: {err}"
    return notes


def cmd_probe(args: argparse.Namespace) -> int:
    """``iclprobe probe``: fit and save the layer probes of a checkpoint."""
    from iclprobe import models, probes
    from iclprobe.alignment.measuring.probe_source import probes_dir
    from iclprobe.probes.inputs import check_fit_fits
    from iclprobe.storage import check_output

    _check_device(args.device)
    model = models.load(args.checkpoint, device=args.device)
    if model.exact_layer_readout:  # saved, they would be used by nothing
        raise InputError(f"{args.checkpoint}: align reads its layers exactly (each layer's "
                         "own prediction), never through probes, so none are saved (in "
                         "Python, probes.LayerProbes().fit(model, ...) fits some)")
    if model.task is None:
        raise InputError(f"{args.checkpoint} has no task.json to draw probe data from")
    out = Path(args.out) if args.out is not None else probes_dir(args.checkpoint)
    check_output(out, "probes", args.overwrite)  # before the work, not after
    check_fit_fits(model, model.task, args.n_sequences, 500)
    # Seeded as `align --seed SEED` fits its probes, so that align uses these.
    print(f"{args.checkpoint}: fitting probes on {args.n_sequences} sequences of its task "
          f"(--seed {args.seed}: data seed {args.seed + 1}, as align --seed {args.seed} draws "
          f"its probes' data)", file=sys.stderr)
    lp = probes.LayerProbes().fit(model, n_sequences=args.n_sequences, generator=args.seed + 1)
    lp.save(out, overwrite=args.overwrite)
    print("layer  alpha      held-out R²  normalized error")
    for layer, (a, r2, err) in enumerate(zip(lp.alpha_.tolist(), lp.metrics_.r2,
                                             lp.metrics_.normalized_error)):
        print(f"{layer:5d}  {a:9.2e}  {r2:11.4f}  {err:.4f}")
    print(f"probes saved to {out}")
    return 0


def run_demo(out: Path, n_sequences: int = 512, n_probe_sequences: int | None = None,
             overwrite: bool = False) -> Path:
    """The whole pipeline on the shipped models; returns the report path.

    ``out`` is checked before any work (`check_output`) and written whole at the end.
    """
    from iclprobe import models, probes
    from iclprobe.alignment.measuring import kept
    from iclprobe.alignment.output.report import write_report
    from iclprobe.alignment.output.tables import answer_lines
    from iclprobe.alignment.pipeline import AlignConfig, align
    from iclprobe.atomic import atomic_directory
    from iclprobe.storage import check_output

    check_output(out, "report", overwrite)
    cfg = AlignConfig(n_sequences=n_sequences, n_probe_sequences=n_probe_sequences)
    if n_sequences < cfg.probe_folds:  # align names --probe-folds, a flag demo does not have
        raise InputError(f"--n-sequences {n_sequences}: the demo cross-fits gpt-softmax's "
                         f"probes in {cfg.probe_folds} folds of the evaluation sequences; use "
                         f"at least {cfg.probe_folds} (more for enough rows per probe)")
    model = models.load(DEMO_MODELS[0])
    with kept.reusing():  # models aligned on the same data share the candidates' families
        with status_lines():
            gpt = [align(model, cfg, name=DEMO_MODELS[0]),
                   align(model, dataclasses.replace(cfg, protocol="fu2024"),
                         name=f"{DEMO_MODELS[0]}-fu2024")]  # the same probes: data, seed
        paired, _ = align_checkpoints(list(DEMO_MODELS[1:]), cfg)
        recurrent = align_checkpoints([DEMO_RECURRENT], cfg)[0][0]
        pq_aligned = [align_checkpoints([name], cfg)[0][0] for name in DEMO_PQ]
        known = [align_checkpoints([name], cfg)[0][0] for name in DEMO_KNOWN]
    pq = []
    for name in DEMO_PQ:
        pq.append((name, probes.analyze_preconditioners(models.load(name))))  # type: ignore[arg-type]
    with atomic_directory(out, "report", overwrite) as tmp:
        write_report(tmp, known + gpt + paired + [recurrent] + pq_aligned, pq,
                     title="iclprobe demo: which algorithm does each layer run?",
                     command="iclprobe demo", side_by_side=[list(DEMO_MODELS[1:])])
    report = Path(out) / "report.md"
    print("what each layer runs, among every candidate learner: first two models whose "
          "algorithm is known by construction, then the trained ones")
    print("\n".join(answer_lines(known + gpt + paired + [recurrent] + pq_aligned)), end="\n\n")
    _print_demo(gpt, paired, recurrent, pq_aligned, pq)
    print(f"report: {report}")
    return report


def _print_demo(gpt: list[Any], paired: list[Any], recurrent: Any, pq_aligned: list[Any],
                pq: list[tuple[str, Any]]) -> None:
    """The demo's screen after the answers: gpt-softmax's, the comparisons, the PQ models."""
    from iclprobe.alignment.output.screen import screen
    from iclprobe.alignment.output.side_by_side import comparison_lines
    from iclprobe.alignment.output.tables import fitted_lines, headline_lines

    print(screen(gpt[0]), end="\n\n")
    print("Fu et al.'s headline (Newton closer than GD) at the last layer: gpt-softmax "
          "under both protocols, every transformer under iclprobe's:")
    print("\n".join(headline_lines(gpt + paired)), end="\n\n")
    print("the verdict, step sizes fitted (Newton and GD with equal flexibility; the view "
          "with the fewest false attributions on bench/known_answers.py):")
    print("\n".join(fitted_lines(gpt + paired + [recurrent])), end="\n\n")
    print("softmax vs linear attention, paired layout: best Newton step per layer")
    print("\n".join(comparison_lines(paired)), end="\n\n")
    print(f"transformer vs its recurrent baseline ({DEMO_RECURRENT}) on the same task: best "
          "online GD step per layer, and online GD against Newton at the last layer")
    print("\n".join(comparison_lines([gpt[0], recurrent], learner="online_gd")))
    print("\n".join(headline_lines([gpt[0], recurrent], b="online_gd")), end="\n\n")
    print(screen(pq_aligned[0]), end="\n\n")
    for name, analysis in pq:
        dists = ", ".join(f"{d:.3f}" for d in analysis.dist_to_inv_cov)
        print(f"{name}: distance of A_l to Σ⁻¹ per layer: {dists}; scales a_l "
              + ", ".join(f"{a:.2f}" for a in analysis.scale))
        print(analysis.summary(name))


def cmd_demo(args: argparse.Namespace) -> int:
    """``iclprobe demo``."""
    run_demo(Path(args.out), n_sequences=args.n_sequences,
             n_probe_sequences=args.n_probe_sequences, overwrite=args.overwrite)
    return 0
