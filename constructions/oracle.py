"""`LearnerOracle`: a model whose layer l *is* a registered learner's iterate.

The oracle runs any learner of `iclprobe.algorithms` (chosen steps, hyperparameters, a
step-to-layer map such as step = c·l) and exposes its predictions as layers, so alignment
can be held to a known answer through the very path it reads real models by. Its residual
stream makes the probe readout a real test: layer l's residual at position t is a fixed
random rotation R of ``[x_t, ŷ_l(t), tanh(W x_t + c)]`` — the prediction is linearly
decodable but mixed with the query and with distractor channels, not alone in one
coordinate. The exact readout undoes R and reads ŷ.

Oracles are a registered model family (``"oracle"``, config `OracleConfig`): saved and
loaded like any checkpoint, with no weights (R, W and c are rebuilt from the seed). A few
ship by name (`SHIPPED`, listed by ``iclprobe models``).

Axis legend: ``layer`` (L + 1), ``batch``, ``pos`` (t), ``query`` (T), ``d_model``
(D = d + 1 + n_noise).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from iclprobe import algorithms
from iclprobe._checks import check_int
from iclprobe.errors import InputError, InputTypeError
from iclprobe.models._tl import HookPoint
from iclprobe.models.base import ModuleList, Regressor
from iclprobe.models.config import MAX_ORACLE_LAYERS, OracleConfig
from iclprobe.models.size import check_model_fits
from iclprobe.tasks.covariance import random_orthogonal


class _OracleLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]


class LearnerOracle(Regressor):
    """Layer l outputs ``cfg.learner``'s step ``cfg.steps[l]`` (see the module docstring).

    Args:
        cfg: the `OracleConfig` (``cfg.exact_readout``: `iclprobe.alignment.align` reads
            layers exactly, undoing R; False makes it fit ridge probes on the mixed
            residuals, as for a GPT).
        task: the `iclprobe.tasks.RegressionTask` align evaluates on by default.
    """

    family = "oracle"
    default_positions = "all"
    curriculum = False
    rotation: Tensor  # [d_model, d_model], orthogonal: resid = R feats
    noise_w: Tensor  # [n_noise, n_dims]
    noise_c: Tensor  # [n_noise]

    def __init__(self, cfg: OracleConfig, task: Any = None):
        super().__init__()
        if not isinstance(cfg, OracleConfig):
            raise InputTypeError(f"cfg must be an OracleConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.exact_layer_readout = cfg.exact_readout  # type: ignore[misc]
        self.task = task
        d, m = cfg.n_dims, cfg.n_noise
        if torch.empty(0).device.type == "meta":  # sized only: shapes, no draws (torch
            # draws from a seeded generator on meta in ~0.1 s each, longer than the build)
            rotation = torch.empty(cfg.d_model, cfg.d_model)
            noise_w, noise_c = torch.empty(m, d), torch.empty(m)
        else:  # measured on meta first, like every family
            check_model_fits(LearnerOracle, cfg, f"building a LearnerOracle of {cfg.learner}",
                             copies=1, held=True)
            gen = torch.Generator().manual_seed(cfg.seed)
            rotation = random_orthogonal(cfg.d_model, gen).float()
            noise_w = torch.randn(m, d, generator=gen).float()
            noise_c = torch.randn(m, generator=gen).float()
        # not persistent: a checkpoint holds no weights, the seed rebuilds them
        self.register_buffer("rotation", rotation, persistent=False)
        self.register_buffer("noise_w", noise_w, persistent=False)
        self.register_buffer("noise_c", noise_c, persistent=False)
        self.blocks: ModuleList[_OracleLayer] = ModuleList(
            _OracleLayer() for _ in range(cfg.n_layers))
        self.setup()

    # ------------------------------------------------------------------ the learner
    def iterates(self, xs: Tensor, ys: Tensor, weights: bool = False) -> algorithms.Iterates:
        """The learner's iterates at ``cfg.steps`` (float64), one per layer in layer order."""
        grid = sorted(set(self.cfg.steps))
        hyper = {k: torch.tensor(v, dtype=torch.float64) if isinstance(v, list) else v
                 for k, v in self.cfg.hyper.items()}  # lists: a per-prefix α, a matrix
        it = algorithms.iterates(self.cfg.learner, xs.double(), ys.double(), steps=grid,
                                 weights=weights, **hyper)
        cols = torch.tensor([grid.index(s) for s in self.cfg.steps])
        if it.preds.shape[0] == 1 and len(grid) > 1:  # a closed form (ols, ridge): no steps
            cols = torch.zeros_like(cols)
        w = it.weights[cols] if weights and it.weights is not None else None
        return algorithms.Iterates(torch.tensor(self.cfg.steps), it.preds[cols], w, it.hyper)

    def _residual(self, points: Tensor, preds: Tensor) -> Tensor:
        """``R [x, ŷ, tanh(W x + c)]`` for ``points [..., d]`` and ``preds [...]``."""
        noise = torch.tanh(points @ self.noise_w.T + self.noise_c)
        feats = torch.cat([points, preds[..., None].to(points), noise], dim=-1)
        return feats @ self.rotation.T

    # ------------------------------------------------------------------ what a family provides
    def forward(self, xs: Tensor, ys: Tensor, last_only: bool = False) -> Tensor:
        """The learner's last step's prediction at every prefix (``[batch, 1]``: last only)."""
        self.check_inputs(xs, ys)
        preds = self.iterates(xs, ys).preds.to(xs.dtype)  # [layer, batch, pos]
        resid = self.blocks[0].hook_resid_pre(self._residual(xs, preds[0]))
        for layer, block in enumerate(self.blocks, start=1):
            resid = block.hook_resid_post(self._residual(xs, preds[layer]))
        out = self.readout_residual(resid)
        return out[:, -1:] if last_only else out

    def predict_queries(self, xs: Tensor, ys: Tensor, queries: Tensor) -> Tensor:
        """``[batch, pos, T]``: the last step's weights at prefix t applied to its queries."""
        return self.query_residuals(xs, ys, queries, reduce=self.readout_residual)[-1]

    def query_residuals(self, xs: Tensor, ys: Tensor, queries: Tensor,
                        reduce: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """Every layer's residual at the queries, ``[L+1, batch, pos, T, d_model]``."""
        self.check_queries(xs, ys, queries)
        w = self.iterates(xs, ys, weights=True).weights
        assert w is not None
        preds = torch.einsum("lbnd,bntd->lbnt", w, queries.double()).to(queries.dtype)
        stacked = self._residual(queries.expand(len(self.cfg.steps), *queries.shape), preds)
        return reduce(stacked) if reduce is not None else stacked

    def readout_residual(self, resid: Tensor) -> Tensor:
        """ŷ: the prediction coordinate of ``Rᵀ resid``, ``[..., d_model] -> [...]``."""
        return resid @ self.rotation[:, self.cfg.n_dims]

    def readout_rows(self, activation: Tensor, n_points: int) -> Tensor:
        """One token per position: the hook's ``[batch, pos, d_model]`` as it is."""
        return activation

    def set_readout_rows(self, activation: Tensor, rows: Tensor) -> Tensor:
        """``rows`` in place of the activation (an oracle's layers do not feed each other)."""
        if rows.shape != activation.shape:
            raise InputError(f"rows must have shape {tuple(activation.shape)}, got "
                             f"{tuple(rows.shape)}")
        return rows.to(activation).clone()

    def n_points_of(self, activation: Tensor) -> int:
        """Examples n of a ``[batch, pos, d_model]`` hook tensor."""
        return activation.shape[1]

    def check_train_config(self, train_cfg: Any) -> None:
        """An oracle has nothing to train."""
        raise InputError("a LearnerOracle has no trainable parameters: it runs "
                         f"{self.cfg.learner!r} exactly")


def _as_int(step: Any) -> Any:
    """A step ``step_of_layer`` returned: an integer (numpy's too) as int, else as it is.

    The config then refuses a non-integer (2.5 was truncated to 2).
    """
    if isinstance(step, bool):
        return step
    try:
        return operator.index(step)
    except TypeError:
        return step


def oracle(learner: str, n_dims: int, n_layers: int,
           step_of_layer: Callable[[int], int] | Sequence[int] = lambda layer: layer,
           *, n_noise: int = 8, seed: int = 0, exact_readout: bool = True, task: Any = None,
           **hyper: Any) -> LearnerOracle:
    """An oracle of ``learner`` whose layer l is step ``step_of_layer(l)`` (default l).

    ``step_of_layer`` is a function of the layer (e.g. ``lambda l: 4 * l``) or the list of
    L + 1 steps; ``hyper`` are the learner's hyperparameters (``lr=0.05``, ``alpha=...``).
    """
    check_int("oracle", "n_layers", n_layers, high=MAX_ORACLE_LAYERS + 1)  # before its steps
    steps = list(step_of_layer) if not callable(step_of_layer) else \
        [_as_int(step_of_layer(layer)) for layer in range(n_layers + 1)]
    if len(steps) != n_layers + 1:
        raise InputError(f"oracle: step_of_layer gives {len(steps)} steps, expected "
                         f"n_layers + 1 = {n_layers + 1}")
    cfg = OracleConfig(n_dims=n_dims, n_layers=n_layers, learner=learner, steps=tuple(steps),
                       hyper=hyper, n_noise=n_noise, seed=seed, exact_readout=exact_readout)
    return LearnerOracle(cfg, task=task)


#: The oracles shipped by name (`iclprobe models`): a one-line summary and a builder each.
SHIPPED = {
    "ka-newton-oracle": ("known answer: oracle, 12 layers: layer l is iterative Newton step l, "
                         "alpha = 1/||SS^T||_F (the library's default), behind a rotation with "
                         "8 distractor channels",
                         lambda: oracle("newton", 5, 12, alpha="frobenius")),
    "ka-gd-oracle": ("known answer: oracle, 8 layers: layer l is GD step 3l, lr = 1/lambda_max "
                     "(S/t) per prefix (the iclprobe protocol's rule), behind a rotation with "
                     "8 distractor channels",
                     lambda: oracle("gd", 5, 8, lambda layer: 3 * layer, lr="max",
                                    normalize=True)),
}


__all__ = ["SHIPPED", "LearnerOracle", "OracleConfig", "oracle"]
