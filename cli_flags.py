"""Command-line flags generated from the config dataclasses (one flag per field).

A field's flag takes its help, choices and aliases from the field's metadata
(`iclprobe._checks.option`) and its type from the annotation: ``--field-name``, a bool as
``--name/--no-name``, a pair as two values, ``tuple[str, ...]`` comma-separated. The
flags only convert text: the dataclass's ``__post_init__`` refuses bad values.

Defaults are left out of the namespace (``argparse.SUPPRESS``) so a command can tell which
flags were given (`given`), and the dataclass's own default applies to the rest; the help
shows that default. No heavy imports: the task's flags come from `TaskFields`, the
torch-free fields `RegressionTask` subclasses.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

MISSING: Any = dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag standing for a config field (of one or more classes: the model families)."""

    name: str  # the field's name
    dest: str  # the attribute of the namespace (the field's name unless renamed)
    kind: Any  # the field's type, None stripped from an optional one
    help: str
    defaults: dict[str, Any]  # per owner (a family's name, or ""): the default, or MISSING
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def option(self) -> str:
        """The flag as typed: ``--dest-with-dashes``."""
        return "--" + self.dest.replace("_", "-")


def config_flags(cls: Any, rename: dict[str, str] | None = None,
                 skip: Iterable[str] = ()) -> list[Flag]:
    """One `Flag` per field of the dataclass ``cls`` (but those named in ``skip``)."""
    return merged_flags({"": cls}, rename, skip)


def merged_flags(classes: dict[str, Any], rename: dict[str, str] | None = None,
                 skip: Iterable[str] = ()) -> list[Flag]:
    """One `Flag` per field name over several dataclasses (by owner name: the families).

    A field the owners share is one flag; its help names each owner's default (and each
    owner's help, where they differ), and its type is the first owner's.
    """
    rename, skip = rename or {}, set(skip)
    owners: dict[str, list[tuple[str, dataclasses.Field[Any], Any]]] = {}
    for owner, cls in classes.items():
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            if f.init and f.name not in skip:
                owners.setdefault(f.name, []).append((owner, f, hints.get(f.name)))
    flags = []
    for name, fields in owners.items():
        meta = {k: v for k, v in fields[0][1].metadata.items() if k != "help"}
        choices = [c for _, f, _ in fields for c in f.metadata.get("choices") or ()]
        meta["choices"] = tuple(dict.fromkeys(choices)) or None
        helps = {o: f.metadata.get("help") or name.replace("_", " ") for o, f, _ in fields}
        flags.append(Flag(name, rename.get(name, name), _strip_none(fields[0][2]),
                          _joined(helps, len(classes)), {o: f.default for o, f, _ in fields},
                          meta))
    return flags


def add_flags(group: Any, flags: list[Flag], defaults: dict[str, str] | None = None) -> None:
    """Add ``flags`` to an argparse parser or group.

    ``defaults`` gives the help's default for flags whose value comes from elsewhere when
    they are not given (``{"n_positions": "--n-points"}``).
    """
    defaults = defaults or {}
    for flag in flags:
        shown = defaults.get(flag.name) or _default_text(flag)
        text = flag.help if not shown else f"{flag.help} (default: {shown})"
        kw: dict[str, Any] = {"dest": flag.dest, "default": argparse.SUPPRESS,
                              "help": text.replace("%", "%%")}
        kw.update(_conversion(flag))
        group.add_argument(flag.option, *flag.meta.get("aliases", ()), **kw)


def given(args: argparse.Namespace, flags: list[Flag]) -> dict[str, Any]:
    """The values, by field name, of the flags among ``flags`` given on the command line."""
    out = {}
    for flag in flags:
        if hasattr(args, flag.dest):
            value = getattr(args, flag.dest)
            out[flag.name] = tuple(value) if isinstance(value, list) else value
    return out


def format_value(value: Any) -> str:
    """``value`` as typed on the command line (a pair as two words, names comma-separated)."""
    if isinstance(value, tuple):
        sep = "," if value and all(isinstance(v, str) for v in value) else " "
        return sep.join(format_value(v) for v in value)
    return str(value)


def _default_text(flag: Flag) -> str:
    """The help's ``default: …`` text, one per owner where the owners' defaults differ."""
    if "default" in flag.help:
        return ""  # the text says it (as it must where the default is None)
    by_value: dict[str, list[str]] = {}
    for owner, default in flag.defaults.items():
        if default is not MISSING and default is not None:
            by_value.setdefault(format_value(default), []).append(owner)
    if len(by_value) == 1 and len(next(iter(by_value.values()))) == len(flag.defaults):
        return next(iter(by_value))
    return "; ".join(f"{', '.join(owners)}: {text}" for text, owners in by_value.items())


def _joined(helps: dict[str, str], n_owners: int) -> str:
    """One help text for the owners of a field: shared, or ``owner: text`` each."""
    texts = set(helps.values())
    if len(texts) == 1:
        text = texts.pop()
        return text if len(helps) == n_owners else f"{', '.join(helps)}: {text}"
    by_text: dict[str, list[str]] = {}
    for owner, text in helps.items():
        by_text.setdefault(text, []).append(owner)
    return "; ".join(f"{', '.join(owners)}: {text}" for text, owners in by_text.items())


def _conversion(flag: Flag) -> dict[str, Any]:
    """The ``type``/``nargs``/``action`` of the flag's field type (text → value) for argparse."""
    choices = flag.meta.get("choices")
    metavar = "{" + ",".join(map(str, choices)) + "}" if choices else None
    kind, origin, args = flag.kind, typing.get_origin(flag.kind), typing.get_args(flag.kind)
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is tuple and args[-1:] == (Ellipsis,) and args[0] is str:
        return {"type": _names(flag.meta.get("names", {})), "metavar": "A,B,..."}
    if origin is tuple and args[-1:] == (Ellipsis,):
        return {"type": args[0], "nargs": "+"}
    if origin is tuple:
        return {"type": args[0], "nargs": len(args), "metavar": flag.dest.upper()[:1]}
    kw: dict[str, Any] = {"type": kind if kind in (int, float) else str}
    return {**kw, "metavar": metavar} if metavar else kw


def _names(aliases: dict[str, tuple[str, ...]]) -> Callable[[str], tuple[str, ...]]:
    def convert(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        return aliases.get(names[0], names) if len(names) == 1 else names
    convert.__name__ = "comma-separated names"  # argparse's "invalid ... value" says this
    return convert


def _hints(cls: Any) -> dict[str, Any]:
    """The evaluated annotations of ``cls`` (the defaults' types where they cannot be)."""
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):
        return {f.name: type(f.default) if f.default not in (MISSING, None) else str
                for f in dataclasses.fields(cls)}


def _strip_none(kind: Any) -> Any:
    """``X`` for ``X | None`` (and ``Optional[X]``)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(kind) if a is not type(None)]
        return rest[0] if len(rest) == 1 else str
    return kind if kind is not None else str


#: ``iclprobe train``'s task sizes when not given (the task itself has no default for them).
TRAIN_TASK_DEFAULTS = {"n_dims": 8, "n_points": 24}
TASK_RENAME = {"seed": "task_seed"}
MODEL_RENAME = {"seed": "model_seed"}
#: Model fields whose value comes from the task's flags: none of their own (n_dims), or
#: a default when not given (n_positions).
MODEL_FROM_TASK = {"n_dims": "n_dims", "n_positions": "n_points"}


def train_flags() -> dict[str, list[Flag]]:
    """The flags of ``iclprobe train`` by group: task, model (trainable families), training."""
    from iclprobe.models.registry import FAMILIES  # torch-free
    from iclprobe.tasks.fields import TaskFields  # torch-free
    from iclprobe.training.config import TrainConfig

    task = [dataclasses.replace(f, defaults={"": TRAIN_TASK_DEFAULTS[f.name]})
            if f.name in TRAIN_TASK_DEFAULTS else f for f in config_flags(TaskFields, TASK_RENAME)]
    return {"task": task,
            "model": merged_flags({n: f.config for n, f in FAMILIES.items() if f.trainable},
                                  MODEL_RENAME, skip=("n_dims",)),
            "training": config_flags(TrainConfig)}


def command_flags(command: str) -> dict[str, list[Flag]]:
    """The generated flags of ``command`` by the config class they set (its name).

    ``train``: the task's (``RegressionTask``), each trainable family's config's and
    ``TrainConfig``'s; ``align`` and ``compare``: ``AlignConfig``'s; ``demo``: the two of
    them it takes; others: none.
    """
    from iclprobe.models.registry import FAMILIES  # torch-free

    if command == "train":
        flags = train_flags()
        out = {"RegressionTask": flags["task"], "TrainConfig": flags["training"]}
        for family in FAMILIES.values():
            if family.trainable:
                out[family.config.__name__] = flags["model"]
        return out
    if command in ("align", "compare"):
        return {"AlignConfig": align_flags()}
    if command == "demo":  # the two of align's flags the demo takes, by the same names
        return {"AlignConfig": [f for f in align_flags()
                                if f.name in ("n_sequences", "n_probe_sequences")]}
    return {}


def align_flags() -> list[Flag]:
    """The flags of ``iclprobe align`` and ``compare``: `AlignConfig`'s fields."""
    from iclprobe.alignment.config import AlignConfig  # torch-free until constructed

    return config_flags(AlignConfig)
