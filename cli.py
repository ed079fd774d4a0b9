"""The ``iclprobe`` command line.

Heavy imports (torch, TransformerLens) happen inside the command handlers, so that
``iclprobe --help`` answers at once. Errors print one line: bad input (a bad flag, a config
field's `ConfigError`, an error the library raises on purpose) exits with status 2, an
unexpected exception (a bug) with status 1 and a hint to rerun with ``--debug``, which
shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from iclprobe._checks import ConfigError

Handler = Callable[[argparse.Namespace], int]
CHECKPOINT_HELP = ("a checkpoint or `iclprobe train` run directory, a Garg/Fu run directory, "
                   "or the name of a shipped model (see `iclprobe models`)")
DEVICE_HELP = "where the model runs (default: cpu)"


def _cmd_models(args: argparse.Namespace) -> int:
    from iclprobe._shipped import shipped_models  # reads config.json files: no torch
    from iclprobe._text import wrap

    rows = shipped_models()
    if not rows:
        print("no shipped models in this installation")
    for name, summary in rows:  # continuations under the summary
        print("\n".join(wrap([f"{name:24s} {summary}"], indent=" " * 25)))
    return 0


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print ``PROG: error: MESSAGE`` (no usage) and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = OneLineParser(
        prog="iclprobe",
        description="Which learning algorithm does each layer of an in-context regressor run?",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    p = sub.add_parser("models", help="list the shipped pretrained models",
                       description="List the pretrained models shipped with iclprobe, by "
                       "name (give the name wherever a checkpoint is asked for).")
    p.set_defaults(handler=_cmd_models)
    _add_train(sub)
    _add_analysis(sub)
    for p in [parser, *sub.choices.values()]:  # before or after the command
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an unexpected error")
    return parser


def _add_train(sub: Any) -> None:
    from iclprobe.cli_flags import MODEL_FROM_TASK, add_flags, train_flags
    from iclprobe.models.registry import FAMILIES  # torch-free

    p = sub.add_parser(
        "train", help="train a model on in-context regression",
        description="Train a model of any registered family (--family). Run under `torchrun "
        "--nproc_per_node=K -m iclprobe train ...` for DistributedDataParallel. Note: linear "
        "attention does not learn the interleaved layout (it cannot copy a label onto its x "
        "token); use --layout paired with --attention linear.")
    p.add_argument("--out", required=True, type=_out_path,
                   help="run directory (metrics.jsonl, checkpoint/)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out (model, task and recipe from its checkpoint)")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in --out, replacing the run iclprobe wrote there")
    p.add_argument("--family", choices=sorted(FAMILIES), default=argparse.SUPPRESS,
                   help="the model family: " + "; ".join(
                       f"{name}: {fam.summary}" + ("" if fam.trainable else " (built, not "
                                                   "trained: refused here)")
                       for name, fam in FAMILIES.items()) + " (default: gpt)")
    flags = train_flags()
    add_flags(p.add_argument_group("task (RegressionTask)"), flags["task"])
    add_flags(p.add_argument_group("model (the --family's config; n_dims is --n-dims)"),
              flags["model"], {k: "--" + v.replace("_", "-") for k, v in MODEL_FROM_TASK.items()})
    add_flags(p.add_argument_group("training (TrainConfig)"), flags["training"])
    p.set_defaults(handler=_lazy("cmd_train", "cli_train"))


def _lazy(name: str, module: str = "cli_commands") -> Handler:
    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"iclprobe.{module}"), name)(args)
    return run


def sequence_count(text: str) -> int:
    """An argparse type: an integer >= 2 (AlignConfig.n_sequences' bound), else "expected ..."."""
    value = _int(text, "an integer >= 2")
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2 (evaluation sequences), "
                                         f"got {value}")
    return value


#: the largest count a flag takes: Python's own index bound (2^63 - 1 on 64-bit builds); a
#: larger one overflowed in ``range``'s length or a tensor's shape, with a traceback
MAX_COUNT = sys.maxsize
#: the most CPU threads a ``--threads`` flag takes (torch's setting overflowed on huge ones)
MAX_THREADS = 1024


def positive_int(text: str) -> int:
    """An argparse type: a positive integer up to `MAX_COUNT`, else a one-line "expected ..."."""
    value = _int(text, "a positive integer")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected a positive integer at most {MAX_COUNT}, "
                                         f"got {value}")
    return value


def thread_count(text: str) -> int:
    """An argparse type: a number of CPU threads, 1 to `MAX_THREADS`."""
    value = _int(text, "a number of threads")
    if not 1 <= value <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected a number of threads from 1 to "
                                         f"{MAX_THREADS}, got {value}")
    return value


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def out_dir(text: str) -> Path:
    """An argparse type: an output folder's path, not empty (``Path("")`` is the current one)."""
    return Path(_out_path(text))


def _out_path(text: str) -> str:
    """An output directory: not empty (``--out ""`` would otherwise mean no output at all)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a directory path, got {text!r}")
    return _one_line(text)


def _one_line(text: str) -> str:
    """A path or name without a control character: the CLI prints it on one line."""
    from iclprobe._checks import check_one_line  # torch-free
    from iclprobe.errors import InputError

    try:
        return str(check_one_line("", "a path or name", text))
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _seed(text: str) -> int:
    from iclprobe._checks import SEED_LIMIT  # torch-free

    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < SEED_LIMIT:  # the range check_seed allows
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**63), got {text!r}")
    return value


def _align_options(p: argparse.ArgumentParser) -> None:
    from iclprobe.cli_flags import add_flags, align_flags

    add_flags(p.add_argument_group("alignment (AlignConfig)"), align_flags())
    p.add_argument("--out", type=_out_path,
                   help="write a report folder (report.md, PNGs, CSVs, JSON) here")
    p.add_argument("--design", action="store_true",
                   help="also align on designed data: the evaluation distribution (Σ's "
                        "spectrum, examples, label noise, queries) where the candidates' "
                        "matched columns differ most, chosen from the learners alone; both "
                        "answers side by side")
    _overwrite_flag(p, "a report")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    shown.add_argument("--verbose", action="store_true", help="print the full tables (every "
                       "learner with intervals, ties, calibration) instead of one screen per "
                       "model")


def _overwrite_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help=f"replace {what} that iclprobe wrote in --out (anything else in "
                   "--out is never replaced)")


def _add_analysis(sub: Any) -> None:
    p = sub.add_parser("align", help="which learner does each layer of a checkpoint run?",
                       description="Align each layer of CHECKPOINT (a run directory, a Garg/Fu "
                       "run directory or a shipped model name) with reference learners.")
    p.add_argument("checkpoint", type=_one_line, help=CHECKPOINT_HELP)
    _align_options(p)
    p.set_defaults(handler=_lazy("cmd_align"))
    p = sub.add_parser("compare", help="align several checkpoints on the same data",
                       description="Align several checkpoints on the same data, side by side "
                       "(e.g. softmax against linear attention).")
    p.add_argument("checkpoints", nargs="+", type=_one_line,
                   help="the checkpoints to compare (each as for align)")
    _align_options(p)
    p.set_defaults(handler=_lazy("cmd_align"))
    p = sub.add_parser("probe", help="fit and save the layer probes of a checkpoint",
                       description="Fit one ridge readout per layer of CHECKPOINT on fresh "
                       "sequences of its own task (regularization picked per layer by "
                       "generalized cross-validation), print each layer's held-out R² and "
                       "error, and save the probes; align and compare reuse them.")
    p.add_argument("checkpoint", type=_one_line, help=CHECKPOINT_HELP)
    p.add_argument("--n-sequences", type=positive_int, default=2000,
                   help="sequences the probes are fitted on (default: 2000)")
    p.add_argument("--seed", type=_seed, default=0,
                   help="seed as `align --seed`: a later align with this seed uses these "
                   "probes (default: 0)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help=DEVICE_HELP)
    p.add_argument("--out", type=_out_path, help="directory for the probes (default: "
                   "CHECKPOINT/probes; for a shipped model, the user cache, $ICLPROBE_CACHE overrides)")
    _overwrite_flag(p, "probes")
    p.set_defaults(handler=_lazy("cmd_probe"))
    from iclprobe.cli_commands import DEMO_KNOWN, DEMO_MODELS, DEMO_RECURRENT  # torch-free

    gpt, paired = DEMO_MODELS[0], " with ".join(DEMO_MODELS[1:])
    p = sub.add_parser("demo", help="the whole pipeline on the shipped models",
                       description=f"Align {gpt} under both protocols, compare {paired} and "
                       f"{gpt} with its recurrent baseline ({DEMO_RECURRENT}), align the PQ "
                       "models where they were trained and analyse their preconditioners, "
                       f"beside {len(DEMO_KNOWN)} known-answer models ({', '.join(DEMO_KNOWN)}) "
                       "that come first in the answers; writes a report folder.")
    p.add_argument("--out", default="iclprobe-report", type=_out_path, help="report folder "
                   "(default: ./iclprobe-report)")
    _overwrite_flag(p, "a report")
    p.add_argument("--n-sequences", type=sequence_count, default=512,
                   help="evaluation sequences per model (default: 512)")
    p.add_argument("--n-probe-sequences", type=positive_int, default=None,
                   help="use gpt-softmax's probes saved by `iclprobe probe` only if fitted "
                   "on this many sequences (default: however many); otherwise probes are "
                   "cross-fitted on the evaluation sequences")
    p.set_defaults(handler=_lazy("cmd_demo"))


#: Commands that use the registries (learners, metrics, families): they load the plugins.
PLUGIN_COMMANDS = ("train", "align", "compare", "probe", "demo")


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (tests call it with ``argv``).

    A command that uses the registries first loads the installed plugins
    (`iclprobe.plugins`), so their learners, metrics and families are among its choices and
    flags, and says which registration a plugin replaced; ``iclprobe --help`` and
    ``iclprobe models`` load none. The exit status comes from the exception's type alone:
    an `iclprobe.errors.InputError` or an OSError is bad input (one line, status 2), any
    other exception a bug (one line naming its type, status 1, with how to report it).
    """
    words = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(words)
    if command in PLUGIN_COMMANDS:
        from iclprobe.plugins import load_plugins

        try:
            load_plugins()
        except KeyboardInterrupt as err:
            print(f"iclprobe {command}: interrupted {err}; nothing was written",
                  file=sys.stderr)
            return 130
        for sentence in replacements_in_force():
            print(f"iclprobe {command}: note: {sentence}", file=sys.stderr)
    parser = build_parser()
    args = parser.parse_args(words)
    args.argv = words  # for the report's "Produced by"
    handler: Handler = args.handler
    try:
        return handler(args)
    except Exception as err:  # noqa: BLE001 - every error ends as one line (or --debug)
        if getattr(args, "debug", False):
            raise
        return _report_error(args.command, err)
    except KeyboardInterrupt:  # train answers its own (how to resume)
        print(f"iclprobe {args.command}: interrupted; nothing was written (an output folder "
              "is swapped in whole or not at all)", file=sys.stderr)
        return 130


def replacements_in_force() -> list[str]:
    """What ``replace=True`` registrations replaced, where the replacement still stands."""
    from iclprobe.plugins import REPLACED

    if not REPLACED:
        return []  # no registry to import
    from iclprobe.algorithms.base import LEARNERS
    from iclprobe.alignment.metrics import METRIC_INFO
    from iclprobe.models.registry import FAMILIES

    registries: dict[str, dict[str, Any]] = {"learner": LEARNERS, "metric": METRIC_INFO,
                                             "model family": FAMILIES}
    return [sentence for (kind, name), (sentence, by) in REPLACED.items()
            if getattr(registries[kind].get(name), "registrant", None) == by]


def _report_error(command: str, err: Exception) -> int:
    """Print ``err`` as one line; its exit status: 2 for bad input, 1 for a bug."""
    from iclprobe._checks import ConfigError  # torch-free
    from iclprobe.errors import InputError

    if isinstance(err, (InputError, OSError)):  # OSError: unwritable --out, ...
        flag = flag_of(err, command) if isinstance(err, ConfigError) else None
        print(f"iclprobe {command}: error: {flag + ': ' if flag else ''}{err}",
              file=sys.stderr)
        return 2
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    print(f"iclprobe {command}: internal error: {type(err).__name__}: {first} (a bug, not "
          "your input: rerun with --debug for the traceback, and report it with that "
          "traceback and the command)", file=sys.stderr)
    return 1


def flag_of(err: ConfigError, command: str) -> str | None:
    """The flag of the field a `ConfigError` names, where ``command`` has that flag.

    Errors from a config speak of its fields, the user typed flags: the task's and every
    registered family's ``seed`` have their own names (``--task-seed``, ``--model-seed``).
    The flags are the ones `iclprobe.cli_flags` generates from the configs' fields.
    """
    from iclprobe.cli_flags import command_flags

    flags = command_flags(command)
    if err.owner in flags:
        match = [f for f in flags[err.owner] if f.name == err.field]
    else:  # a check outside the configs: a flag of the field's own name
        match = [f for group in flags.values() for f in group if f.dest == err.field]
    return match[0].option if match else None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
