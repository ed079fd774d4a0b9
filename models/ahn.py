"""Import of Ahn et al.'s linear-transformer parameters and training histories.

Their ``Transformer_F`` holds one parameter ``allparam [n_layer, n_head, 2, d, d]``: per layer
and head a P block (``[..., 0, :, :]``) and a Q block (``[..., 1, :, :]``), used as
``P_full = [[P, 0], [0, 1]]`` and ``Q_full = [[Q, 0], [0, 0]]``; the prediction is
``-Z[N, d]``, as ours. Their Q block is our ``-A``, their P block our B.

Their notebooks save training histories (``allparam`` every few steps, the trained model
last): ``{'hist': [allparam, ...], 'U': U, 'D': D}`` (one run), ``{'hist_list': [...]}``, or
``{'hist_dict': {run: [...]}, 'U_dict': {run: U}, 'D_dict': {run: D}}`` (several runs). U is
orthogonal and D diagonal: their covariates are ``x = U D z``, ``z ~ N(0, I)``, and their
weights ``w = U D⁻¹ u``, ``u ~ N(0, I)``; so Σ = U D Dᵀ Uᵀ and w ~ N(0, Σ⁻¹).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from iclprobe._checks import is_int
from iclprobe._finite import all_finite
from iclprobe.errors import InputError
from iclprobe.models.pq import PQTransformer
from iclprobe.storage import CheckpointError, torch_load_tensors
from iclprobe.tasks import RegressionTask

logger = logging.getLogger(__name__)

#: Their ``activation`` → our kernel. Their softmax is not ours (see `PQTransformer`).
KERNEL_OF_ACTIVATION = {"linear": "linear", "relu": "relu", "softmax": "softmax-ahn"}
#: N, the context examples per prompt, in every one of their notebooks.
DEFAULT_N_CONTEXT = 20


def load_ahn(source: Tensor | str | os.PathLike[str], index: int = -1, kernel: str = "linear",
             n_context: int | None = None) -> PQTransformer:
    """Import Ahn et al.'s ``allparam`` into a sparse `PQTransformer`.

    Args:
        source: an ``allparam`` tensor ``[n_layer, n_head, 2, d, d]``, or a file written by
            ``torch.save`` (read with ``weights_only=True``) holding one alone, as
            ``"allparam"`` in a dict or state dict, or a training history (module docstring).
        index: the entry of a history to load; default -1, the last (the trained model).
            A single ``allparam`` is a history of one.
        kernel: their ``activation``: ``"linear"`` (None), ``"relu"`` or ``"softmax"``. Their
            softmax imports as ``kernel="softmax-ahn"``, which differs from our ``"softmax"``.
        n_context: their N (context examples per prompt), for the task attached when the file
            holds U and D; default 20, the N of their notebooks (the file does not record it).

    Returns:
        The model; ``model.task`` is x ~ N(0, U D Dᵀ Uᵀ), w ~ N(0, Σ⁻¹) with N + 1 points
        when the file holds U and D, else None.
    """
    if kernel not in KERNEL_OF_ACTIVATION:
        raise InputError(f"kernel must be one of {tuple(KERNEL_OF_ACTIVATION)} (Ahn et al.'s "
                         f"activations), got {kernel!r}")
    if isinstance(source, Tensor):
        history, u, d, where = [source], None, None, "allparam"
    else:
        history, u, d = _read_file(Path(source))
        where = str(source)
    allparam = _pick(history, index, where)
    model = PQTransformer.from_matrices(A=-allparam[:, :, 1], B=allparam[:, :, 0],
                                        kernel=KERNEL_OF_ACTIVATION[kernel])
    if u is not None and d is not None:
        model.task = _task(u, d, allparam.shape[-1], n_context, where)
    return model


def _read_file(path: Path) -> tuple[list[Any], Tensor | None, Tensor | None]:
    """``(history, U, D)`` from one of their files (U, D: None when absent)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file is missing")
    raw = torch_load_tensors(path)
    if isinstance(raw, Tensor):
        return [raw], None, None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected an allparam tensor or a dict, "
                              f"got {type(raw).__name__}")
    if "hist_dict" in raw:
        runs = raw["hist_dict"]
        if not isinstance(runs, dict) or len(runs) != 1:
            keys = list(runs) if isinstance(runs, dict) else type(runs).__name__
            raise CheckpointError(
                f"{path}: 'hist_dict' holds several runs {keys}; save the one to load as "
                "{'hist': d['hist_dict'][run], 'U': d['U_dict'][run], 'D': d['D_dict'][run]}")
        (run, history), = runs.items()
        return (_as_list(history, path), (raw.get("U_dict") or {}).get(run),
                (raw.get("D_dict") or {}).get(run))
    for key in ("hist", "hist_list", "allparam"):
        if key in raw:
            return _as_list(raw[key], path), raw.get("U"), raw.get("D")
    raise CheckpointError(f"{path}: no 'allparam', 'hist', 'hist_list' or 'hist_dict' in the "
                          f"file (keys: {sorted(map(str, raw))})")


def _as_list(found: Any, path: Path) -> list[Any]:
    if isinstance(found, Tensor):
        return [found]
    if isinstance(found, (list, tuple)) and found:
        return list(found)
    raise CheckpointError(f"{path}: expected an allparam tensor or a non-empty list of them, "
                          f"got {type(found).__name__}")


def _pick(history: list[Any], index: int, where: str) -> Tensor:
    """History entry ``index``, checked to be an ``allparam`` tensor."""
    n = len(history)
    if not is_int(index) or not -n <= index < n:
        raise InputError(f"index must be an integer in {-n}..{n - 1} ({where} holds {n} "
                         f"parameter snapshot{'s' * (n != 1)}), got {index!r}")
    allparam = history[index]
    if not isinstance(allparam, Tensor):
        raise CheckpointError(f"{where}: entry {index} is a {type(allparam).__name__}, "
                              "not an allparam tensor")
    if allparam.ndim != 5 or allparam.shape[2] != 2 or allparam.shape[3] != allparam.shape[4]:
        raise InputError(
            f"allparam must have shape [n_layer, n_head, 2, d, d], got {tuple(allparam.shape)}"
        )
    if not all_finite(allparam):
        raise InputError(f"{where}: allparam (entry {index}) contains NaN or Inf")
    return allparam.detach().float().cpu()


def _task(u: Any, d: Any, n_dims: int, n_context: int | None, where: str) -> RegressionTask:
    """Their task: x = U D z, w = U D⁻¹ u, N context examples and a query."""
    if not (isinstance(u, Tensor) and u.shape == (n_dims, n_dims)):
        raise CheckpointError(f"{where}: U must be a [{n_dims}, {n_dims}] tensor, got "
                              f"{tuple(u.shape) if isinstance(u, Tensor) else type(u).__name__}")
    if not (isinstance(d, Tensor) and d.shape in ((n_dims, n_dims), (n_dims,))):
        raise CheckpointError(f"{where}: D must be a [{n_dims}, {n_dims}] or [{n_dims}] tensor, "
                              f"got {tuple(d.shape) if isinstance(d, Tensor) else type(d).__name__}")
    if n_context is None:
        logger.warning("%s: the file does not record N, the context length; assuming N = %d "
                       "(their notebooks'); pass n_context to set it", where, DEFAULT_N_CONTEXT)
        n_context = DEFAULT_N_CONTEXT
    if not is_int(n_context) or n_context <= 0:
        raise InputError(f"n_context must be a positive integer, got {n_context!r}")
    u, d = u.detach().cpu().double(), d.detach().cpu().double()
    scale = u @ (torch.diag(d) if d.ndim == 1 else d)  # x = (U D) z
    cov = scale @ scale.T
    try:
        return RegressionTask(n_dims=n_dims, n_points=n_context + 1, cov=(cov + cov.T) / 2,
                              w_prior="inverse-cov")
    except ValueError as err:
        raise CheckpointError(f"{where}: U D Dᵀ Uᵀ is not a covariance ({err})") from None
