"""Known-answer models: networks whose layer l provably runs step c·l of a learner.

- `gd_transformer`, `pgd_transformer`: PQ linear transformers set to the GD construction
  (von Oswald et al. 2023; Ahn et al. 2023's Eq. 8), any lr or preconditioner;
- `newton_transformer`: Newton–Schulz in linear attention (a PQ transformer with d state
  channels; layer l ≥ 2 is Newton step l − 2 with α_t = a/t²);
- `oracle` / `LearnerOracle`: any registered learner's iterates as layers, behind a random
  rotation mixed with distractor channels, read exactly or by probes (a registered model
  family, ``"oracle"``, configured by `OracleConfig`).

Each is tested against its learner to round-off. ``docs/known-answers.md`` derives them and
explains the benchmark (``bench/known_answers.py``) that counts the verdicts they get.
`SHIPPED` maps the ones shipped by name (``iclprobe models``) to a summary and a builder.
"""

from typing import Any

from iclprobe.constructions import blend as _blend  # noqa: F401  (registers gd_newton_blend)
from iclprobe.constructions import oracle as _oracle_module
from iclprobe.constructions import pq as _pq_module
from iclprobe.constructions.oracle import LearnerOracle, OracleConfig, oracle
from iclprobe.constructions.pq import (
    gd_transformer,
    newton_transformer,
    newton_transformer_alpha,
    pgd_transformer,
)

#: Every shipped known-answer model: name -> (one-line summary, builder).
SHIPPED: dict[str, tuple[str, Any]] = {**_pq_module.SHIPPED, **_oracle_module.SHIPPED}

__all__ = ["SHIPPED", "LearnerOracle", "OracleConfig", "gd_transformer", "newton_transformer",
           "newton_transformer_alpha", "oracle", "pgd_transformer"]
