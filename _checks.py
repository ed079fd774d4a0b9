"""Config fields and their validators, and checks of sizes against memory (no heavy imports).

The one home of iclprobe's input checks: every config's ``__post_init__`` and every
function that checks a count, a number, a choice or a seed uses these. `option` declares a
config field with its command-line help (the CLI's flags are generated from it);
`check_fields` applies a validator to fields of a config. Each field validator raises a
`ConfigError` that carries the config and field (the CLI maps them to the flag the user
typed) and names ``Owner.field``, the value and what is allowed; `is_int` and `is_number`
are the type tests behind them (a bool is neither), for checks whose message names a file
or a context instead. A `ConfigError` is a ValueError and a TypeError both: a value of the
wrong type (a string, a bool for a number) and a number out of range, NaN or infinite are
the same kind of mistake, and callers catching either keep working.

Memory: sizes that cannot fit are refused before anything is allocated (`check_bytes`,
`check_fits`); what a model holds is measured by `iclprobe.models.size`. Available memory
is psutil's, else ``MemAvailable`` of ``/proc/meminfo``; where neither is known the check
passes.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

from iclprobe.errors import InputError, InputTypeError

#: Seeds go to ``torch.manual_seed``, which takes 64-bit values; iclprobe's are 0 .. 2^63-1.
SEED_LIMIT = 2**63


class ConfigError(InputTypeError):
    """A bad value of one config field: ``owner`` (the config class's name) and ``field``.

    An `iclprobe.errors.InputTypeError`: a ValueError and a TypeError both.

    The message names ``owner.field``, the value and what is allowed; the CLI prefixes the
    flag of ``field`` (`iclprobe.cli`), never parsing the message.
    """

    def __init__(self, owner: str, field: str, message: str):
        super().__init__(message)
        self.owner = owner
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (DDP workers, multiprocessing)
        return (type(self), (self.owner, self.field, str(self)))


def option(default: Any = dataclasses.MISSING, help: str = "", *,
           choices: tuple[Any, ...] | None = None, **flag: Any) -> Any:
    """A dataclass field that carries its command-line flag in its metadata.

    Args:
        default: the field's default (none: a required field).
        help: the flag's help. The CLI appends ``(default: …)`` unless the text says the
            default itself, as it must where the default is None.
        choices: the allowed values, listed by the help; the config's ``__post_init__``
            checks them (`check_choice`), the CLI does not.
        **flag: further keys: ``aliases`` (other flag names, e.g. ``("--metric",)``),
            ``names`` (words that stand for a tuple of names, e.g. ``{"both": (...)}``),
            ``family_only`` (a `TrainConfig` field that only the families listing it in
            ``Regressor.train_options`` accept).
    """
    return dataclasses.field(default=default,
                             metadata={"help": help, "choices": choices, **flag})


def is_int(value: Any) -> TypeGuard[int]:
    """An int that is not a bool (``True`` is an int to Python, never a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """An int or a float that is not a bool (NaN and inf included: finiteness is apart)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_fields(cfg: Any, check: Callable[..., Any], *names: str, **kw: Any) -> None:
    """``check(Owner, name, cfg.name, **kw)`` for each field ``name`` of the config ``cfg``.

    A config's ``__post_init__`` checks its fields with it, the owner being its class's
    name: ``check_fields(self, check_int, "n_layers", "d_model")``,
    ``check_fields(self, check_choice, "layout", choices=LAYOUTS)``.
    """
    for name in names:
        check(type(cfg).__name__, name, getattr(cfg, name), **kw)


def check_bool(owner: str, name: str, value: Any) -> bool:
    """``True`` or ``False`` (not 0 or 1, nor a string)."""
    if not isinstance(value, bool):
        raise ConfigError(owner, name, f"{owner}.{name} must be a bool, got {value!r}")
    return value


def check_choice(owner: str, name: str, value: Any, choices: tuple[Any, ...]) -> Any:
    """One of ``choices``."""
    if value not in choices:
        raise ConfigError(owner, name, f"{owner}.{name} must be one of {choices}, "
                          f"got {value!r}")
    return value


def _num(x: float) -> str:
    return f"{x:g}".replace("e+0", "e").replace("e+", "e")


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    if math.isinf(high):
        return f"{'>' if low_open else '>='} {_num(low)}"
    return f"in {'(' if low_open else '['}{_num(low)}, {_num(high)}{')' if high_open else ']'}"


def check_int(owner: str, name: str, value: Any, low: int = 1, high: int | None = None) -> int:
    """An integer (not a bool) with ``low <= value`` (and ``value < high``)."""
    allowed = ("a positive integer" if low == 1 and high is None else
               f"an integer >= {low}" if high is None else f"an integer in [{low}, {high})")
    if not is_int(value):
        hint = (" (a Python int: pass int(value))" if isinstance(value, numbers.Integral)
                and not isinstance(value, bool) else "")  # numpy's integers
        raise ConfigError(owner, name, f"{owner}.{name} must be {allowed}{hint}, got {value!r}")
    if value < low or (high is not None and value >= high):
        raise ConfigError(owner, name, f"{owner}.{name} must be {allowed}, got {value!r}")
    return value


def check_real(owner: str, name: str, value: Any, low: float, high: float = math.inf, *,
               low_open: bool = False, high_open: bool = False) -> float:
    """A finite int or float (not a bool) in the interval from ``low`` to ``high``."""
    allowed = f"a number {_interval(low, high, low_open, high_open)}"
    if not is_number(value):
        hint = (" (a Python float: pass float(value))" if isinstance(value, numbers.Real)
                and not isinstance(value, bool) else "")  # numpy's float32, int64, ...
        raise ConfigError(owner, name, f"{owner}.{name} must be {allowed}{hint}, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(owner, name,
                          f"{owner}.{name} must be {allowed}, got {value!r} (not finite)")
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above:
        raise ConfigError(owner, name, f"{owner}.{name} must be {allowed}, got {value!r}")
    return float(value)


def check_type(owner: str, name: str, value: Any, kind: type | tuple[type, ...],
               what: str) -> Any:
    """``value`` if it is an instance of ``kind``, else an `InputTypeError` naming ``what``.

    The message reads "OWNER: NAME must be WHAT, got TYPE VALUE" (the value's repr cut to
    60 characters).
    """
    if not isinstance(value, kind):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise InputTypeError(f"{owner}: {name} must be {what}, got {type(value).__name__} "
                             f"{shown}")
    return value


def check_seed(owner: str, name: str, value: Any) -> int:
    """A seed for ``torch.manual_seed``: an integer in [0, 2^63)."""
    if not (is_int(value) and 0 <= value < SEED_LIMIT):
        raise ConfigError(owner, name,
                          f"{owner}.{name} must be an integer seed in [0, 2**63), got {value!r}")
    return value


FLOAT_BYTES = 4  # float32 weights and activations
GIB = 2**30
SMALL = 2**26  # sizes below this are never refused


def meminfo_available(text: str) -> int | None:
    """Bytes of ``MemAvailable`` in the text of ``/proc/meminfo`` (None if absent)."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # the file counts kB
    return None


def available_memory() -> int | None:
    """Bytes of memory available now, or None where it cannot be told."""
    try:
        import psutil
    except ImportError:
        try:
            return meminfo_available(Path("/proc/meminfo").read_text())
        except OSError:
            return None
    return int(psutil.virtual_memory().available)


def sizes(cfg: Any) -> str:
    """The integer fields of a model config but its seed, as text (``n_layers=8, ...``)."""
    ints = (int, "int", "int | None", "Optional[int]")
    return ", ".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
                     if f.type in ints and f.name != "seed")


def check_bytes(need: int, what: str, available: int | None = None) -> None:
    """Raise ValueError when ``need`` bytes exceed the memory available."""
    if available is None and need <= SMALL:
        return  # not worth asking the system
    free = available_memory() if available is None else available
    if free is not None and need > free:
        raise InputError(f"{what} needs at least {need / GIB:,.3g} GiB of memory, but "
                         f"{free / GIB:,.3g} GiB are available")


def check_fits(n_parameters: int, what: str, described: str, copies: int = 2,
               extra_floats: int = 0, available: int | None = None) -> None:
    """Raise ValueError when ``copies`` of the weights plus ``extra_floats`` cannot fit.

    Args:
        n_parameters: the model's weights (`iclprobe.models.size` counts them).
        what: what would be built, for the message ("loading runs/m", "training").
        described: the config's sizes, for the message (`sizes`).
        copies: float32 copies of the weights held at once (2 when loading: the file's and
            the model's; 4 when training: weights, gradients, Adam's moments).
        extra_floats: further float32 values (activations, data).
        available: bytes available (default: `available_memory`).
    """
    need = (copies * n_parameters + extra_floats) * FLOAT_BYTES
    check_bytes(need, f"{what}: a model with {n_parameters:,} parameters ({described})",
                available)


#: what a registered learner's or metric's name may hold: it names files, columns and
#: ``--algorithms``/``--metric`` entries (no separators, spaces or line breaks)
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def check_name(kind: str, name: Any) -> str:
    """``name`` if it can name a registered ``kind`` (`NAME_PATTERN`), else an `InputError`."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        flag = "--metric" if kind == "metric" else "--algorithms"
        raise InputError(f"{kind} name must be a non-empty string of letters, digits and "
                         f"_ . + - (it names files and {flag} entries), got {name!r}")
    return name


#: characters that would break a name or path out of its line of output: the C0 and C1
#: controls (newline, tab, carriage return, escape, ...), DEL, and Unicode's line and
#: paragraph separators
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_one_line(who: str, name: str, value: Any) -> Any:
    """``value`` (a string or a path) unless it holds a control character (`CONTROL`).

    Model names and the paths of checkpoints and runs are printed on one line (the CLI's
    messages, tables, report headings): a newline or tab in one would break it. Spaces,
    slashes and every other printable character pass; a value of another type is left to
    the caller's type check. ``who`` "" (the CLI's flags): the message without a prefix.
    """
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    found = CONTROL.search(text) if isinstance(text, str) else None
    if found:
        raise InputError(f"{who + ': ' if who else ''}{name} must not hold a control character "
                         f"such as a newline or tab (it is printed on one line), got {value!r}, "
                         f"which holds {found.group()!r}")
    return value
