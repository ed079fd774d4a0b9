"""One candidate of `align`'s answer: a learner's columns over its fitted family, described.

`measuring.candidates` builds them and their tables; `measuring.refine` adds a family's
fine step sizes next to the layers' matches.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.alignment.metrics import METRIC_INFO
from iclprobe.errors import InputError

#: fine variants to run (`Family.fine`): their rank in `Family.grid` -> the steps to run (a
#: rank between two integers: a step size between theirs, `Family.variant_at`)
Fine = Mapping[float, tuple[int, ...]]
#: hyperparameters a family's variants set, recorded per column in ``hyper["variant"]``
#: where several variants share one table
VARIANT_HYPER = ("lr", "alpha", "lr_scale", "alpha_scale", "lam", "beta", "gamma")


@dataclasses.dataclass
class Candidate:
    """One candidate learner over its family: every column, described.

    ``preds``: its columns on every evaluation sequence; ``weights``: the same with weights
    on the weight sequences (None where no weight metric is computed). ``columns[k]``: how
    column k is shown ("0.5/λmax, step 8").
    """

    key: str
    label: str
    preds: algorithms.Iterates
    weights: algorithms.Iterates | None
    columns: list[str]
    variant: list[int]  # per column, the index of its variant
    closed: bool  # a closed form: one column per variant (ridge over λ)
    #: per column, (its variant's place in the family's variants, its step): the same
    #: column on other data (the variants' numbers, e.g. a fixed η, are the data's)
    places: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    #: columns of the family fitted to imitate other candidates' matched columns (through
    #: probes: `measuring.imitators`), predictions only; read for that imitation alone
    imitators: algorithms.Iterates | None = None

    def neighbors(self, col: int) -> list[int]:
        """The columns next to ``col`` on the family's grid.

        The adjacent step counts of the same variant, and the same step count of the
        adjacent variants (the next step size up and down; for a closed form, the next λ).
        Adjacent on the family's step counts: a fine variant (`Family.fine`) runs at a few
        of them only, and its columns either side of a gap are not neighbours.
        """
        steps, axis, at_place = self._grid
        step, variant = steps[col], self.variant[col]
        at = axis.index(step)
        near = set(axis[max(at - 1, 0):at + 2]) - {step}
        out = [k for k in (col - 1, col + 1) if 0 <= k < len(self.variant)
               and self.variant[k] == variant and steps[k] in near]
        for v in (variant - 1, variant + 1):
            out += at_place.get((v, step), [])
        return sorted(set(out))

    @functools.cached_property
    def _grid(self) -> tuple[list[int], list[int], dict[tuple[int, int], list[int]]]:
        """Each column's step, the family's step counts, and (variant, step) -> its columns."""
        steps = self.preds.steps.tolist()
        at_place: dict[tuple[int, int], list[int]] = {}
        for k, place in enumerate(zip(self.variant, steps)):
            at_place.setdefault(place, []).append(k)
        return steps, sorted(set(steps)), at_place

    @functools.cached_property
    def variant_index(self) -> tuple[torch.Tensor, list[int]]:
        """``variant`` as a tensor, and the variants in the order their columns first appear."""
        return torch.as_tensor(self.variant), list(dict.fromkeys(self.variant))

    def of(self, metric: str) -> algorithms.Iterates:
        """The iterates ``metric`` compares: with weights for a weight metric."""
        if METRIC_INFO[metric].on == "weights":
            if self.weights is None:
                raise InputError(f"candidate {self.key!r} has no weights for {metric!r}")
            return self.weights
        return self.preds


def columns_of(it: algorithms.Iterates, cols: Sequence[int], weights: bool) -> Tensor:
    """The values of columns ``cols`` (predictions or weights), as layers to compare."""
    values = it.weights if weights else it.preds
    if values is None:
        raise InputError(f"{it.name} has no weights")
    return values[torch.as_tensor(list(cols), dtype=torch.long)]
