"""Hook-name helpers, residual collection and interventions (layers as in docs/architecture.md)."""

from iclprobe.hooks.interventions import ablate, patch_residual, run_first_layers
from iclprobe.hooks.residuals import (
    ResidualStore,
    check_layers,
    collect_residuals,
    iter_residuals,
    readout_rows,
    resid_hook_name,
)

__all__ = [
    "ResidualStore",
    "ablate",
    "check_layers",
    "collect_residuals",
    "iter_residuals",
    "patch_residual",
    "readout_rows",
    "resid_hook_name",
    "run_first_layers",
]
