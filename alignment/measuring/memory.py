"""What `align` will hold in memory, estimated from its config before anything is allocated.

Each count an `AlignConfig` field sets (sequences, bootstrap resamples, queries) sizes
tensors that `align` holds at once. The estimate is a lower bound (float32 data and
residuals, float64 statistics), so a config it refuses cannot run; one it passes may
still need more. ``--n-boot 1000000000`` is refused in a line instead of failing
inside torch's allocator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from iclprobe._checks import ConfigError, check_bytes
from iclprobe.alignment.metrics import on_weights

if TYPE_CHECKING:
    from iclprobe.alignment.config import AlignConfig

F32, F64 = 4, 8


def align_bytes(model: Any, task: Any, cfg: AlignConfig, residuals: bool) -> dict[str, int]:
    """Bytes `align` holds at least, by the `AlignConfig` field that sizes them.

    Args:
        model: the model (its ``cfg.n_layers`` and ``cfg.d_model``, where it has one).
        task: the evaluation task (``n_dims``, ``n_points``).
        cfg: what align computes.
        residuals: whether align reads the layers through probes (every layer's residual
            stream on the evaluation sequences is then held at once).
    """
    b, n, d = cfg.n_sequences, task.n_points, task.n_dims
    layers = int(getattr(model.cfg, "n_layers", 1)) + 1
    width = int(getattr(model.cfg, "d_model", d))
    sequences = (b * n * (d + 1) * F32  # the evaluation batch
                 + layers * b * n * F64  # every layer's predictions
                 + 2 * b * n * d * d * F64)  # the learners' prefix Gram matrices, eigenvectors
    if residuals:
        sequences += layers * b * n * width * F32  # every layer's residual stream
    out = {"n_sequences": sequences,
           "n_boot": cfg.n_boot * b * F64}  # the bootstrap's resampling weights
    if any(on_weights(m) for m in cfg.metrics):
        sub, t = min(cfg.n_weight_sequences, b), cfg.queries_for(d)
        out["n_queries"] = sub * n * t * (d + layers) * F32  # the queries, their predictions
    return out


def check_align_fits(model: Any, task: Any, cfg: AlignConfig, residuals: bool,
                     name: str = "the model", available: int | None = None) -> None:
    """Refuse, naming the field that asks most, what `align_bytes` says cannot fit.

    Raises:
        ValueError: ``AlignConfig.FIELD=VALUE: aligning NAME needs at least … GiB of
            memory, but … GiB are available``.
    """
    need = align_bytes(model, task, cfg, residuals)
    field = max(need, key=lambda k: need[k])
    value = cfg.queries_for(task.n_dims) if field == "n_queries" else getattr(cfg, field)
    try:
        check_bytes(sum(need.values()), f"AlignConfig.{field}={value}: aligning {name}",
                    available)
    except ValueError as err:  # a ConfigError: the CLI names the field's flag
        raise ConfigError("AlignConfig", field, str(err)) from None
