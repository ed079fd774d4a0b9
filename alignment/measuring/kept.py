"""Candidates' families kept for reuse on data seen before (`reusing_families`).

A family's columns depend only on the data (``xs``, ``ys``, Σ), the window, the number of
layers and the weight sequences — not on the model. A batch of alignments on the same
evaluation data (the known-answer benchmark's cells share a few batches) can run each
family once: inside `reusing_families`, `family` keeps what it ran, keyed by those and a
digest of the data, and hands out copies. Outside it nothing is kept. `kept` does the
same for any value computed from the data alone (the benchmark's reach of the candidates
on a truth's iterates, the same for a cell's exact and probe readouts).
"""

from __future__ import annotations

import contextlib
import copy as copy_module
import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from torch import Tensor

from iclprobe import algorithms
from iclprobe.tasks import RegressionBatch

Family = tuple[algorithms.Iterates, list[str], algorithms.Iterates | None, list[str]]
#: the families kept (None: outside `reusing_families`, nothing is kept)
_KEPT: OrderedDict[tuple[Any, ...], Any] | None = None
_KEPT_MAX = 0


@contextlib.contextmanager
def reusing_families(max_families: int = 96) -> Iterator[None]:
    """Within the block, a candidate's family on data seen before is reused, not rerun.

    The ``max_families`` most recently used values are kept (a learner's columns on one
    batch, or a value `kept` computed from the data); the numbers are those a rerun gives,
    bit for bit.
    """
    global _KEPT, _KEPT_MAX
    outer = (_KEPT, _KEPT_MAX)
    _KEPT, _KEPT_MAX = OrderedDict(), max_families
    try:
        yield
    finally:
        _KEPT, _KEPT_MAX = outer


def family(at: tuple[Any, ...], batch: RegressionBatch, run: Callable[[], Family]) -> Family:
    """``run()``'s family, or a copy of the one kept for ``at`` on the same data."""
    return kept(at, (batch.xs, batch.ys, batch.cov), run, _copy)


T = TypeVar("T")


def kept(at: tuple[Any, ...], data: Sequence[Tensor], run: Callable[[], T],
         copy: Callable[[T], T] = copy_module.deepcopy) -> T:
    """``run()``'s value, or a copy of the one kept for ``at`` on the same ``data``.

    Inside `reusing_families` only (outside it ``run()`` is called each time); ``at`` names
    what is computed, ``data`` the tensors it is computed from (digested).
    """
    if _KEPT is None:
        return run()
    key = (*at, _data_key(data))
    if key not in _KEPT:
        _KEPT[key] = run()
        while len(_KEPT) > _KEPT_MAX:
            _KEPT.popitem(last=False)
    _KEPT.move_to_end(key)
    return copy(_KEPT[key])


def _data_key(data: Sequence[Tensor]) -> str:
    """A digest of the data a value is computed from."""
    h = hashlib.sha256()
    for t in data:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
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
