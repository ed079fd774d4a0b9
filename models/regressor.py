"""`Regressor` (the model families' base class) and the checks every consumer shares."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from iclprobe.errors import InputTypeError
from iclprobe.models.base import Regressor

__all__ = ["Regressor", "check_model", "readout_residual"]


def check_model(model: Any) -> None:
    """Refuse anything that is not a model of a registered family, naming the type given."""
    if not isinstance(model, Regressor):
        raise InputTypeError(f"model must be an iclprobe model (a Regressor: GPTRegressor, "
                        f"PQTransformer, ...), got {type(model).__name__}")


def readout_residual(model: Regressor, resid: Tensor) -> Tensor:
    """The model's own read-out of residuals at the readout positions, ``[..., d_model] -> [...]``.

    GPT: final norm and read-out; PQ: ``−Z[query, d]``. Applied to the last layer it gives
    the model's prediction, to earlier layers the no-training (logit-lens) readout.
    """
    return model.readout_residual(resid)
