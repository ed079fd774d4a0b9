"""The errors a caller's input causes: `InputError` and its type-error form (no imports).

Everything iclprobe refuses because of what it was given — an argument, a config field, a
file, a registration, a flag — raises an `InputError` (or a subclass: `InputTypeError`
for a value of the wrong type, `iclprobe._checks.ConfigError` for a config field,
`iclprobe.storage.CheckpointError` for a file). `InputError` is a ValueError, so
``except ValueError`` keeps catching it; `InputTypeError` is a TypeError too.

The ``iclprobe`` command decides its exit status from these types alone: an `InputError`
(or an OSError: an unwritable path, a missing file) is one line and status 2; any other
exception — torch's or numpy's own ValueError included — is a bug, status 1 with how to
report it. A check that raises ValueError or TypeError instead would be reported as a bug.
"""

from __future__ import annotations

__all__ = ["InputError", "InputTypeError", "NonFinite"]


class InputError(ValueError):
    """A bad input, named: the argument (or file, field), its value and what is allowed.

    The CLI prints it as one line and exits with status 2.
    """


class InputTypeError(InputError, TypeError):
    """A bad input of the wrong type (a string for a tensor, a bool for a count).

    Both a ValueError and a TypeError, so callers catching either keep working.
    """


class NonFinite(InputError):
    """Numbers that are not finite where finite ones are needed.

    A model's readings (or their squares) overflow, or hold NaN or Inf, on the data given.
    Raised where a model is read (`align`'s layer predictions, the probes' sums); the
    designed evaluation takes it as the model no longer doing regression on those data.
    """


class TooFewRows(InputError):
    """Too few rows (sequences × positions) for a layer probe's fit on the data given.

    Raised by the probes' row check; the designed evaluation takes it as its data being too
    short to be read with the configuration's sequences (the model's own answer stands).
    """
