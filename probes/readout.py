"""`ReadoutProbe`: a scikit-learn estimator for closed-form ridge readouts."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from iclprobe.probes.ridge import ridge_gcv


class ReadoutProbe(RegressorMixin, BaseEstimator):
    """Ridge regression ``min ‖y − Xw − b‖² + α‖w‖²`` in closed form (scikit-learn API).

    Equal to ``sklearn.linear_model.Ridge(alpha, fit_intercept)``; fitted attributes
    ``coef_`` (``[n_features]``, or ``[n_targets, n_features]`` for 2-D y), ``intercept_``
    and ``n_features_in_``. Used for one layer at a time; `LayerProbes` solves all layers
    in one batched call of the same solver.

    Args:
        alpha: regularization strength α ≥ 0.
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
        X, y = validate_data(self, X, y, y_numeric=True, multi_output=True, dtype=np.float64)
        if not isinstance(self.alpha, numbers.Real) or self.alpha < 0:
            raise ValueError(f"alpha must be a number >= 0, got {self.alpha!r}")
        targets = y[:, None] if y.ndim == 1 else y
        xt = torch.tensor(X).expand(targets.shape[1], -1, -1)
        fit = ridge_gcv(xt, torch.tensor(targets.T),
                        alphas=float(self.alpha), fit_intercept=bool(self.fit_intercept))
        coef, intercept = fit.coef.numpy(), fit.intercept.numpy()
        self.coef_ = coef[0] if y.ndim == 1 else coef
        self.intercept_ = float(intercept[0]) if y.ndim == 1 else intercept
        return self

    def predict(self, X):  # noqa: N803
        """Predictions for ``X [n_samples, n_features]``."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return X @ np.asarray(self.coef_).T + self.intercept_
