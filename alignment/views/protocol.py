"""The protocol's view: each learner matched at the protocol's own step sizes.

Per metric, Fu et al.'s learner table: every run's best similarity with its interval and,
for each pair of runs that compare with each other (`protocols.verdict_pairs`: a run's
``compare_with``), the paired difference, the calibration and the verdicts
(`iclprobe.alignment.comparison`).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from iclprobe import algorithms
from iclprobe.alignment import comparison as C
from iclprobe.alignment.evaluation import Evaluation
from iclprobe.alignment.measuring.matching import Matched
from iclprobe.alignment.measuring.runs import Learners
from iclprobe.alignment.protocols import verdict_pairs


def protocol_view(ev: Evaluation, matched: Matched, learners: Learners
                  ) -> dict[str, C.LearnerComparison]:
    """`align`'s stage: the learner table of every metric."""
    # a family's claimed runs come after the protocol's in each pair
    pairs = verdict_pairs({k: ev.runs[k] for k in sorted(ev.runs, key=lambda k: k in ev.claimed)})
    return {m: learner_table(m, pairs, matched, learners.of(m), ev.ys[ev.rows(m)])
            for m in ev.cfg.metrics}


def learner_table(metric: str, pairs: Sequence[tuple[str, str]], matched: Matched,
                  iterates: dict[str, algorithms.Iterates], ys: Tensor) -> C.LearnerComparison:
    """The learner table for one metric: best scores, paired differences, verdicts.

    ``iterates`` and ``ys`` are on the sequences the metric's tables were computed on.
    """
    sims, matches, live = matched.sims, matched.matches, matched.live
    scores = {r: C.learner_score(by[metric], matches[r][metric].best_column)
              for r, by in sims.items()}
    verdicts = []
    for a, b in pairs:
        sa, sb = sims[a][metric], sims[b][metric]
        ma, mb = matches[a][metric], matches[b][metric]
        diff = C.difference(sa, sb)
        cal = C.calibrate(iterates[a], iterates[b], ys, sa, sb, ma.best_column, mb.best_column)
        labels = C.verdicts(scores[a], scores[b], diff, cal, live, sa.higher_is_better,
                            matched.matched)
        verdicts.append(C.PairVerdict(a, b, metric, diff, cal, labels,
                                      C.sentence(labels, a, b, metric)))
    return C.LearnerComparison(metric, scores, verdicts, list(live))
