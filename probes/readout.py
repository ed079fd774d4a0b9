"""`ReadoutProbe`: a scikit-learn estimator for closed-form ridge readouts."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from iclprobe.errors import InputError
from iclprobe.probes.inputs import check_finite_inputs
from iclprobe.probes.ridge import ridge_gcv


class ReadoutProbe(RegressorMixin, BaseEstimator):
    """Ridge regression ``min ‖y − Xw − b‖² + α‖w‖²`` in closed form (scikit-learn API).

    Equal to ``sklearn.linear_model.Ridge(alpha, fit_intercept)``, shapes included; fitted
    attributes ``coef_`` (``[n_features]`` for y ``[n]`` or ``[n, 1]``, else
    ``[n_targets, n_features]``), ``intercept_`` and ``n_features_in_``. Used for one layer at a time;
    `LayerProbes` solves all layers in one batched call of the same solver.

    Args:
        alpha: regularization strength, a finite α ≥ 0.
        fit_intercept: fit the bias b (on centered data) or not.
    """

    def __init__(self, alpha: float = 1.0, fit_intercept: bool = True):
        self.alpha = alpha
        self.fit_intercept = fit_intercept

    def __sklearn_tags__(self):
        """Multi-output targets are supported (one ridge per column)."""
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def fit(self, X, y):  # noqa: N803 - scikit-learn's naming
        """Fit on ``X [n_samples, n_features]`` and ``y [n_samples]`` or 2-D; returns self."""
        alpha = self.alpha
        if not (isinstance(alpha, numbers.Real) and not isinstance(alpha, bool) and alpha >= 0):
            raise InputError(f"alpha must be a number >= 0, got {alpha!r}")
        if not math.isfinite(alpha):  # Ridge refuses it too; α = inf would predict the mean
            raise InputError(f"alpha must be a number >= 0, got {alpha!r} (not finite)")
        X, y = _detached(X), _detached(y)
        X, y = validate_data(self, X, y, y_numeric=True, multi_output=True, dtype=np.float64)
        xt, yt = torch.tensor(X), torch.tensor(np.asarray(y))  # copies: X may be read-only
        check_finite_inputs(X=xt, y=yt)
        targets = y[:, None] if y.ndim == 1 else y
        xt = xt.expand(targets.shape[1], -1, -1)
        fit = ridge_gcv(xt, torch.tensor(targets.T),
                        alphas=float(alpha), fit_intercept=bool(self.fit_intercept))
        coef, intercept = fit.coef.numpy(), fit.intercept.numpy()
        # As Ridge: one target column gives coef_ [n_features] (and intercept_ [1] for 2-D y).
        self.coef_ = coef[0] if targets.shape[1] == 1 else coef
        if not self.fit_intercept:
            self.intercept_ = 0.0
        else:
            self.intercept_ = float(intercept[0]) if y.ndim == 1 else intercept
        return self

    def predict(self, X):  # noqa: N803
        """Predictions for ``X [n_samples, n_features]``."""
        check_is_fitted(self)
        X = validate_data(self, _detached(X), reset=False, dtype=np.float64)
        return X @ np.asarray(self.coef_).T + self.intercept_


def _detached(a: Any) -> Any:
    """A torch tensor as numpy reads it (a tensor that requires grad would be refused)."""
    return a.detach().cpu() if isinstance(a, torch.Tensor) else a
