"""`Regressor`: either hooked model family (for type annotations)."""

from __future__ import annotations

from typing import Any, Union

from torch import Tensor

from iclprobe.models.gpt import GPTRegressor
from iclprobe.models.lstm import LSTMRegressor  # family wiring: lstm
from iclprobe.models.pq import PQTransformer

Regressor = Union[GPTRegressor, PQTransformer, LSTMRegressor]  # noqa: UP007 - a runtime alias


def check_model(model: Any) -> None:
    """Refuse anything but the hooked families, naming the type given."""
    if not isinstance(model, (GPTRegressor, PQTransformer, LSTMRegressor)):  # family wiring: lstm
        raise TypeError("model must be a GPTRegressor, PQTransformer or LSTMRegressor, got "
                        f"{type(model).__name__}")


def readout_residual(model: Regressor, resid: Tensor) -> Tensor:
    """The model's own read-out of residuals at the readout positions, ``[..., d_model] -> [...]``.

    GPT: final norm and read-out; PQ: ``−Z[query, d]``; LSTM: the read-out Linear. Applied
    to the last layer it gives the model's prediction, to earlier layers the no-training
    (logit-lens) readout.
    """
    if isinstance(model, PQTransformer):
        return -resid[..., -1]
    return model.readout(resid)
