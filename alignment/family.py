"""What alignment needs from each model family: layer readouts and family-specific learners.

A GPT's layers are read by ridge probes fitted on fresh sequences; a PQ transformer's
layers carry their prediction in the query row (−Z[query, d]), read exactly. A PQ layer
with the linear kernel and B = 0 computes ``w <- w − A_l ∇R(w)``, so such a model is
aligned against preconditioned GD with its own A_l (step l = layer l exactly when the
model is what it claims) and with Σ⁻¹ scaled by the fitted a_l (Ahn et al.'s optimum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from iclprobe import probes
from iclprobe.alignment.protocols import RunSpec
from iclprobe.hooks.residuals import collect_residuals
from iclprobe.models.pq import PQTransformer
from iclprobe.models.regressor import Regressor, readout_residual
from iclprobe.tasks import RegressionBatch, RegressionTask

if TYPE_CHECKING:
    from iclprobe.alignment.pipeline import AlignConfig


def default_positions(model: Regressor) -> str:
    """Where a model without a recorded recipe was trained: PQ (Ahn et al.) on the last."""
    return "last" if isinstance(model, PQTransformer) else "all"


def _exact_readout(model: Regressor) -> bool:
    return isinstance(model, PQTransformer)


def needs_probes(model: Regressor) -> bool:
    """Whether `align` reads this model's layers through fitted probes (else exactly)."""
    return not _exact_readout(model)


def layer_predictions(model: Regressor, task: RegressionTask, batch: RegressionBatch,
                      cfg: AlignConfig, layer_probes: probes.LayerProbes | None
                      ) -> tuple[Tensor, str, list[float], probes.LayerProbes | None]:
    """Every layer's prediction ``[L+1, B, n]`` (float64), how it was read, probe R², probes.

    Probes are fitted here (seed + 1) unless ``layer_probes`` are given.
    """
    xs, ys = batch.xs.to(cfg.device), batch.ys.to(cfg.device)
    if _exact_readout(model):
        with torch.no_grad():
            preds = readout_residual(model, collect_residuals(model, xs, ys))
        return preds.double().cpu(), "exact readout −Z[query, d] of each layer", [], None
    if layer_probes is None:
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        layer_probes = probes.LayerProbes().fit(model, task, n_sequences=cfg.n_probe_sequences,
                                                generator=gen, n_heldout=cfg.n_probe_heldout)
    r2 = list(layer_probes.metrics_.r2) if hasattr(layer_probes, "metrics_") else []
    preds = layer_probes.predict(xs, ys).double().cpu()
    return preds, "ridge probes fitted per layer on fresh sequences", r2, layer_probes


def layer_weight_fn(model: Regressor, layer_probes: probes.LayerProbes | None
                    ) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``(xs, ys, queries) -> [L+1, B, n, T]``: every layer's prediction at fresh queries."""
    if _exact_readout(model):
        def exact(xs: Tensor, ys: Tensor, queries: Tensor) -> Tensor:
            return model.query_residuals(xs, ys, queries, reduce=lambda r: -r[..., -1])
        return exact
    if layer_probes is None:
        raise ValueError("induced weights of a GPT's layers need its fitted layer probes")
    return layer_probes.predict_queries


def family_runs(model: Regressor, batch: RegressionBatch
                ) -> tuple[dict[str, tuple[RunSpec, dict[str, Any]]], list[str]]:
    """Learners only this model family is claimed to run, and notes on their meaning."""
    if not isinstance(model, PQTransformer):
        return {}, []
    pre = probes.preconditioners(model)
    a_own = pre.A.detach().to(torch.float64)  # [layer, d, d], heads summed
    notes = []
    exact = model.cfg.kernel == "linear" and float(pre.B.abs().max()) == 0.0
    if not exact:
        notes.append(f"pgd_own: a layer computes w <- w − A_l ∇R(w) exactly only with the "
                     f"linear kernel and B = 0 (this model: kernel {model.cfg.kernel}, "
                     f"max |B| {float(pre.B.abs().max()):.3g}); read it as a reference")
    runs: dict[str, tuple[RunSpec, dict[str, Any]]] = {
        "pgd_own": (RunSpec("pgd_schedule", "GD preconditioned by the model's own A_l",
                            "layers", {"normalize": True}), {"preconds": a_own})}
    if batch.cov.ndim == 2:
        inv = torch.linalg.inv(batch.cov.to(torch.float64))
        _, scale = probes.distance(a_own, inv.expand_as(a_own))
        runs["pgd_inv_cov"] = (
            RunSpec("pgd_schedule", "GD preconditioned by a_l Σ⁻¹ (a_l fitted to A_l)",
                    "layers", {"normalize": True}),
            {"preconds": scale[:, None, None] * inv})
    else:
        notes.append("pgd_inv_cov: skipped, Σ differs per sequence in this data")
    return runs, notes
