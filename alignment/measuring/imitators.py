"""Rivals fitted to the matches: each family's closest imitation of another's matched column.

The answer names X at a layer only where the layer is closer to X's matched column than
any rival's family comes to that column (the learners' own resemblance: rule 2 of the
answer, `views.answer_rule`). A rival's family is a grid; where the rival imitates X's
column exactly at a step size between its grid points, the grid falls short of it and
the layer seems closer to X than the rival can come.

Through probes this happens by construction. A probe reads a layer that holds ``ŷ`` as
``a ŷ + bᵀx_t + c``, and the learners are read the same way (`reading`), so columns that
differ by a scale are one column: heavy ball's step 2, ``(2 + β)η b − η² S b``, is GD's
step 2 at step size ``2η/(2 + β)`` once read, and a heavy-ball layer there is GD's as much
as heavy ball's. With the probes fitted on enough sequences that their noise no longer
hides the grid's gap, the layer was named GD (the known-answer benchmark, 1024 further
probe sequences: five false attributions between GD and heavy ball).

So, where probes read the layers, the rivals whose families lie on continua
(`Family.continuum`) have their step sizes fitted toward each layer's matched column of
the leading candidate (by the fit metric, `fit_steps.fit_metric`), by the search
`fit_steps` runs toward the layers read exactly: at the rival's best-imitating step, the
step counts next to it, and the column's own step count (heavy ball at 1/λ_max, β ½ is
GD's step 2 at 0.8/λ_max, while GD's grid imitates it best at step 3; heavy ball's grid,
2× apart in step size, imitates GD's step 2 at 1.2/λ_max best at its step 4, and only its
step 2 reaches it), between the neighbouring grid step sizes. The
`RIVALS_FITTED` rivals whose grids imitate the column best are fitted. The columns found
are kept as the rival's **imitators** (`Candidate.imitators`): used only for its
imitation of another candidate's match, never for its own match to a layer, so that they
fit no probe noise and can only keep a learner from being named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from iclprobe import algorithms
from iclprobe.algorithms.prefix import PrefixStats
from iclprobe.alignment.measuring import fit_steps
from iclprobe.alignment.measuring.candidate import Candidate, Fine
from iclprobe.alignment.measuring.similarities import Similarity, first_best, similarity_values
from iclprobe.alignment.measuring.table_spec import TableSpec
from iclprobe.alignment.metrics import metric_info
from iclprobe.tasks import RegressionBatch

#: the rivals fitted per match: those whose grids imitate it best
RIVALS_FITTED = 3
#: ``fine -> candidates``: the asked variants alone (`candidates.build_candidates`)
RunFine = Callable[[Mapping[str, Fine]], Mapping[str, Candidate]]


def leading_matches(by: Mapping[str, Similarity]) -> dict[tuple[str, int], list[int]]:
    """The (candidate, column) each layer's leading candidate matches in one metric's tables.

    The leader is the candidate whose best column is best at the layer (the first of equals
    in the tables' order), as the answer ranks them. Returns each distinct pair, in
    first-seen order, with the layers it leads at.
    """
    out: dict[tuple[str, int], list[int]] = {}
    sign = 1.0 if next(iter(by.values())).higher_is_better else -1.0
    keys = list(by)
    scored = torch.stack([(sign * by[k].values).max(1).values for k in keys])  # [cand, layer]
    for layer, lead in enumerate(first_best(scored.T).tolist()):
        col = int(first_best(sign * by[keys[lead]].values[layer]))
        out.setdefault((keys[lead], col), []).append(layer)
    return out


def fit_imitators(members: dict[str, Candidate], tables: Mapping[str, Mapping[str, Similarity]],
                  batch: RegressionBatch, stats: PrefixStats, window: tuple[int, int],
                  spec: TableSpec, run: RunFine) -> None:
    """Every rival's step size fitted toward the leaders' matched columns (in place).

    ``run(fine)``: the asked variants alone, as candidates read as the layers are
    (predictions only). Each candidate gets the columns that imitate some leader's match
    better than its grid does (`Candidate.imitators`; None: none do).
    """
    metric = fit_steps.fit_metric(tables)
    if metric is None or len(members) < 2:
        return
    led = leading_matches(tables[metric])
    targets = list(led)
    values = torch.stack([members[k].preds.preds[c] for k, c in targets])  # as layers
    ys, kw = batch.ys.double(), spec.kw(metric)
    sign = 1.0 if metric_info(metric).higher_is_better else -1.0
    scored = {k: sign * similarity_values(values, c.preds, ys, metric, **kw)
              for k, c in members.items() if k in algorithms.LEARNERS}
    if not scored:
        return
    skip = _not_fitted(scored, targets)
    places = {k: members[k].places for k in scored}
    own_steps = [int(members[k].preds.steps[c]) for k, c in targets]  # each column's step
    fits = fit_steps.fitted(places, metric, scored, values, ys, kw, batch, stats, window, run,
                            skip=skip, around=True, also_at=own_steps)
    for key, cand in (run(fits) if fits else {}).items():
        members[key] = dataclasses.replace(members[key], imitators=cand.preds)


def _not_fitted(scored: Mapping[str, torch.Tensor], targets: list[tuple[str, int]]
                ) -> set[tuple[str, int]]:
    """The (candidate, target) pairs left unfitted.

    A leader's own, and all but the `RIVALS_FITTED` candidates whose grids imitate the
    target best.
    """
    keys = list(scored)
    best = torch.stack([scored[k].max(1).values for k in keys], 1)  # [target, candidate]
    out: set[tuple[str, int]] = set()
    for row, (lead, _) in enumerate(targets):
        rivals = [keys[j] for j in best[row].argsort(descending=True, stable=True).tolist()
                  if keys[j] != lead][:RIVALS_FITTED]
        out.update((k, row) for k in keys if k not in rivals)
    return out
