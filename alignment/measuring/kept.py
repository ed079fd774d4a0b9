"""Candidates' families kept for reuse on data seen before (`reusing_families`).

A family's columns depend only on the data (``xs``, ``ys``, Σ), the window, the number of
layers and the weight sequences — not on the model. A batch of alignments on the same
evaluation data (the known-answer benchmark's cells share a few batches) can run each
family once: inside `reusing_families`, `family` keeps what it ran, keyed by those and a
digest of the data, and hands out copies (`reusing`: the same, for `compare` and
``iclprobe demo``, unless a caller's block is open). Outside it nothing is kept. `kept`
does the same for any value computed from the data alone (the benchmark's reach of the
candidates on a truth's iterates, the same for a cell's exact and probe readouts).

Within one `align` (`reusing_in_alignment`) a family is run once for its two asks: the
probe targets' choice only reads it (``peek=True``: the kept value itself, never copied),
and the candidates' stage then takes it out of the block, uncopied.

The blocks are a context's (`contextvars`): a block opened in one thread (or task) is not
another's, so alignments run in two threads keep apart what each keeps, and a block closed
out of order by another thread cannot leave one open.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy as copy_module
import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.tasks import RegressionBatch

Family = tuple[algorithms.Iterates, list[str], algorithms.Iterates | None, list[str]]


@dataclasses.dataclass(frozen=True)
class _Block:
    """The open block's rules: what it keeps and how."""

    #: the values kept (None: outside `reusing_families`, nothing is kept)
    values: OrderedDict[tuple[Any, ...], Any] | None = None
    #: the most kept (0: no bound)
    most: int = 0
    #: inside `reusing_in_alignment`: a kept value goes to its next ask, uncopied
    handover: bool = False


#: no block open: nothing is kept
_CLOSED = _Block()
#: this context's open block
_BLOCK: contextvars.ContextVar[_Block] = contextvars.ContextVar("kept_block", default=_CLOSED)


@contextlib.contextmanager
def _open(block: _Block) -> Iterator[None]:
    """``block`` open in this context for the ``with`` body."""
    token = _BLOCK.set(block)
    try:
        yield
    finally:
        _BLOCK.reset(token)


@contextlib.contextmanager
def reusing_families(max_families: int = 96) -> Iterator[None]:
    """Within the block, a candidate's family on data seen before is reused, not rerun.

    The ``max_families`` most recently used values are kept (a learner's columns on one
    batch, or a value `kept` computed from the data); the numbers are those a rerun gives,
    bit for bit.
    """
    with _open(_Block(OrderedDict(), max_families)):
        yield


@contextlib.contextmanager
def reusing(max_families: int = 96) -> Iterator[None]:
    """`reusing_families`, unless a caller's block is open (then that one, unchanged).

    For several alignments on the same data (`compare`, ``iclprobe demo``).
    """
    block = _BLOCK.get()
    if block.values is not None and not block.handover:
        yield
        return
    with reusing_families(max_families):
        yield


@contextlib.contextmanager
def reusing_in_alignment() -> Iterator[None]:
    """Within one alignment, a family peeked at is handed over to its next ask, not rerun.

    `align` asks for each candidate's grid twice on the same data: to choose the layers'
    probe targets (`held`, which only reads it: ``peek=True``) and to measure the
    candidates. Inside this block the first ask keeps the family and the second takes it
    (no copy, nothing left kept); what nobody peeked at is run and not kept. Inside a
    caller's `reusing_families` block, that block's rules hold instead.
    """
    if _BLOCK.get().values is not None:
        yield
        return
    with _open(_Block(OrderedDict(), handover=True)):
        yield


def family(at: tuple[Any, ...], batch: RegressionBatch, run: Callable[[], Family],
           peek: bool = False) -> Family:
    """``run()``'s family, or a copy of the one kept for ``at`` on the same data.

    ``peek``: the caller only reads it; the kept family itself is returned (never copied).
    """
    return kept(at, (batch.xs, batch.ys, batch.cov), run, _copy, peek)


T = TypeVar("T")


def kept(at: tuple[Any, ...], data: Sequence[Tensor], run: Callable[[], T],
         copy: Callable[[T], T] = copy_module.deepcopy, peek: bool = False) -> T:
    """``run()``'s value, or a copy of the one kept for ``at`` on the same ``data``.

    Inside `reusing_families` only (outside it ``run()`` is called each time); ``at`` names
    what is computed, ``data`` the tensors it is computed from (digested). ``peek``: the
    kept value itself, for a caller that does not change it (inside
    `reusing_in_alignment`, kept for the next ask, which takes it).
    """
    block = _BLOCK.get()
    values = block.values
    if values is None:
        return run()
    key = (*at, _data_key(data))
    if block.handover and not peek:  # one alignment: the peeked value, taken, or a fresh run
        return values.pop(key) if key in values else run()
    if key not in values:
        values[key] = run()
        while block.most and len(values) > block.most:
            values.popitem(last=False)
    values.move_to_end(key)
    return values[key] if peek else copy(values[key])


def _data_key(data: Sequence[Tensor]) -> str:
    """A digest of the data a value is computed from."""
    h = hashlib.sha256()
    for t in data:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # any dtype (bfloat16)
    return h.hexdigest()


def _copy(fam: Family) -> Family:
    """A family its user may change (hyperparameter dicts and tensors of its own)."""
    def one(it: algorithms.Iterates | None) -> algorithms.Iterates | None:
        if it is None:
            return None
        return dataclasses.replace(it, preds=it.preds.clone(), hyper=dict(it.hyper),
                                   weights=None if it.weights is None else it.weights.clone())
    preds, columns, w, dropped = fam
    copied = one(preds)
    assert copied is not None
    return copied, list(columns), one(w), list(dropped)
