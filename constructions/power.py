"""The probe readout's power on the known-answer benchmark: probes against the exact readout.

Per probe cell, of the layers where its exact twin's answer names the truth, how many the
answer through probes names too — judged without the layers the probes miss where the
truth is not separable as a probe reads a layer (`scoring.THROUGH_PROBES`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from iclprobe.alignment.views.answer_rule import DEAD
from iclprobe.constructions.scoring import JUDGED, NOT_SEPARABLE, THROUGH_PROBES, names_truth


@dataclasses.dataclass
class ProbePower:
    """A cell's answer through probes at the layers where the exact readout names the truth.

    Judged with the layers left out where the probes' answer is live but does not name
    the truth, and the truth is not separable as a probe reads the layer
    (`THROUGH_PROBES`: no rival reproduces the truth's probe-read column worse than the
    truth's own family by more than the probe cell's interval width and the answer
    rule's resolution): where a rival reproduces the truth's column up to the probe's
    scale, "cannot tell" is the right answer through probes (``within`` and
    ``named_within``); ``named_exactly`` and ``named_by_probe`` count every such layer.
    With probes fitted to the column a layer holds the widths are at round-off, so what
    is left out is what a probe's reading cannot tell apart at all; with noisier probes
    (fitted to y) their noise is left out too. A cell with named layers and none judged is
    short (no evidence).
    """

    cell: Any  # the probe-readout cell
    named_exactly: int  # layers whose exact-readout answer names the true learner
    named_by_probe: int  # of those, layers whose probe-readout answer names it too
    within: int  # of the first, all but those probes miss where they cannot separate it
    named_within: int  # of those, layers whose probe-readout answer names it (all it names)

    @property
    def short(self) -> bool:
        """Probes name the truth at fewer than 80% of the judged layers (``within``)."""
        return self.named_within < 0.8 * self.within or self.within == 0 < self.named_exactly

    @property
    def key(self) -> str:
        """The cell in words (its readout left out)."""
        c = self.cell
        beta = f" β {c.beta:g}" if c.beta is not None else ""
        return f"{c.setting} {c.kind} {c.protocol} {c.data} x{c.multiplier:g}{beta}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {**dataclasses.asdict(self.cell), "named_exactly": self.named_exactly,
                "named_by_probe": self.named_by_probe, "within": self.within,
                "named_within": self.named_within, "short": self.short}


def probe_power(results: list[Any], view: str = JUDGED) -> list[ProbePower]:
    """Per cell with a truth, `ProbePower` of ``view``: probe readout against exact."""
    exact = {dataclasses.replace(r.cell, readout="probe"): r for r in results
             if r.cell.readout == "exact" and not r.diverges}
    out = []
    for r in results:
        twin = exact.get(r.cell)
        if r.cell.readout != "probe" or r.diverges or twin is None or r.cell.truth is None:
            continue
        named = [i for i, v in enumerate(twin.verdicts.get(view, []))
                 if names_truth(v, r.cell.truth)]
        probe = r.verdicts.get(view, [])
        hit = [i for i in named if i < len(probe) and names_truth(probe[i], r.cell.truth)]
        through = r.verdicts.get(THROUGH_PROBES, [])
        excused = [i for i in named if i not in hit and i < len(through)
                   and through[i] == NOT_SEPARABLE and probe[i] not in DEAD]
        out.append(ProbePower(r.cell, len(named), len(hit), len(named) - len(excused),
                              len(hit)))
    return out
