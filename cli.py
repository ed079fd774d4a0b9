"""The ``iclprobe`` command line.

Heavy imports (torch, TransformerLens) happen inside the command handlers, so that
``iclprobe --help`` answers at once. Errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """A bad invocation: printed as one line, exit status 2."""


def _cmd_models(args: argparse.Namespace) -> int:
    from iclprobe.models.checkpoint import shipped_models

    rows = shipped_models()
    if not rows:
        print("no shipped models in this installation")
    for name, summary in rows:
        print(f"{name:24s} {summary}")
    return 0


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = _Parser(
        prog="iclprobe",
        description="Which learning algorithm does each layer of an in-context regressor run?",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    p = sub.add_parser("models", help="list the shipped pretrained models")
    p.set_defaults(handler=_cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (tests call it with ``argv``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (UsageError, ValueError, TypeError, FileNotFoundError) as err:
        print(f"iclprobe {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
