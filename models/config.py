"""Frozen configuration dataclasses for the model families (GPT, PQ, LSTM, oracle).

``to_dict``/``from_dict`` round-trip through ``config.json``; ``from_dict`` drops unknown
keys with a warning, so checkpoints written by a newer iclprobe still load.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
from typing import Any, TypeVar

from iclprobe._checks import (
    ConfigError,
    check_bool,
    check_choice,
    check_fields,
    check_int,
    check_real,
    check_seed,
    is_int,
    option,
)
from iclprobe.errors import InputTypeError

logger = logging.getLogger(__name__)

LAYOUTS = ("interleaved", "paired")
KERNELS = ("linear", "softmax", "relu", "softmax-ahn")
ATTENTIONS = ("softmax", "linear")
N_DIMS_HELP = "covariate dimension d"
N_POSITIONS_HELP = "most examples per sequence (Garg's meaning: 2x tokens when interleaved)"
LAYOUT_HELP = "tokens: interleaved x, y tokens, or paired (x_prev, y_prev, x) tokens"
SEED_HELP = "initialization seed (the global RNG is untouched)"

C = TypeVar("C", bound="ConfigMixin")


class _TokenLayout:
    """Token geometry shared by the families that read a token sequence (GPT, LSTM)."""

    n_dims: int
    n_positions: int
    layout: str

    @property
    def n_ctx(self) -> int:
        """Number of token positions."""
        return 2 * self.n_positions if self.layout == "interleaved" else self.n_positions

    @property
    def token_dim(self) -> int:
        """Width of one input token before the read-in."""
        return self.n_dims if self.layout == "interleaved" else 2 * self.n_dims + 1


class ConfigMixin:
    """``to_dict`` and ``from_dict`` for a config dataclass (a family's config builds on it).

    ``from_dict`` drops unknown keys with a warning, so checkpoints written by a newer
    iclprobe still load.
    """

    def to_dict(self) -> dict[str, Any]:
        """A fresh dict of the fields (never an alias of ``__dict__``)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """Build from a dict, dropping unknown keys with a warning."""
        if not isinstance(data, dict):
            raise InputTypeError(f"{cls.__name__}.from_dict takes a dict of fields, got a "
                            f"{type(data).__name__} ({str(data)[:60]!r})")
        fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - fields)
        if unknown:
            logger.warning("%s: ignoring unknown config keys %s", cls.__name__, unknown)
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass(frozen=True)
class GPTConfig(_TokenLayout, ConfigMixin):
    """Configuration of `GPTRegressor` (Garg et al.'s read-in → GPT-2 → read-out).

    Each field's help is its ``iclprobe train`` flag's.
    """

    n_dims: int = option(help=N_DIMS_HELP)
    n_positions: int = option(help=N_POSITIONS_HELP)
    n_layers: int = option(8, "transformer blocks")
    d_model: int = option(64, "residual width")
    n_heads: int = option(4, "attention heads; must divide d_model")
    d_mlp: int | None = option(None, "MLP hidden width (default: 4 d_model, GPT-2's)")
    attention: str = option("softmax", "softmax, or linear: no softmax, the scores divided by "
                            "the number of keys", choices=ATTENTIONS)
    layout: str = option("interleaved", LAYOUT_HELP, choices=LAYOUTS)
    seed: int = option(0, SEED_HELP)
    ln_eps: float = option(1e-5, "LayerNorm epsilon (GPT-2's)")
    final_norm: bool = option(True, "LayerNorm before the read-out (off: Fu et al.'s probing "
                              "runs)")

    def __post_init__(self) -> None:
        check_fields(self, check_int, "n_dims", "n_positions", "n_layers", "d_model", "n_heads")
        if self.d_mlp is not None:
            check_fields(self, check_int, "d_mlp")
        if self.d_model % self.n_heads:
            # both fields in one: the CLI then names no one flag (either may be the one to change)
            raise ConfigError("GPTConfig", "d_model/n_heads", f"GPTConfig.d_model={self.d_model}"
                              f" must be divisible by n_heads={self.n_heads}")
        check_fields(self, check_choice, "attention", choices=ATTENTIONS)
        check_fields(self, check_choice, "layout", choices=LAYOUTS)
        check_fields(self, check_seed, "seed")
        check_fields(self, check_real, "ln_eps", low=0.0, low_open=True)
        check_fields(self, check_bool, "final_norm")

    # Attributes TransformerLens's ActivationCache reads from ``model.cfg``.
    @property
    def d_head(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_heads

    @property
    def d_mlp_resolved(self) -> int:
        """The MLP hidden width in force."""
        return self.d_mlp if self.d_mlp is not None else 4 * self.d_model

    attn_only = False
    normalization_type = "LN"
    positional_embedding_type = "standard"
    act_fn = "gelu_new"
    device = None


@dataclasses.dataclass(frozen=True)
class PQConfig(ConfigMixin):
    """Configuration of `PQTransformer` (Ahn et al. / von Oswald et al.).

    Each field's help is its ``iclprobe train`` flag's.
    """

    n_dims: int = option(help=N_DIMS_HELP + "; tokens are (x, y) rows of width d + 1")
    n_layers: int = option(3, "attention-only layers")
    n_heads: int = option(1, "heads per layer (their outputs are summed)")
    sparse: bool = option(True, "Eq. 8's sparse P = [[B, 0], [0, 1]], Q = -[[A, 0], [0, 0]]")
    kernel: str = option("linear", "attention kernel (see PQTransformer)", choices=KERNELS)
    seed: int = option(0, SEED_HELP)
    init_std: float = option(0.01, "std of the N(0, init_std²) initialization (Ahn's var)")
    n_state: int = option(0, "state channels between x and y, zero in the input: tokens are "
                             "(x, s, y) rows of width d + 1 + n_state (dense models only)")
    d_k: int | None = option(None, "factored (standard) parametrization with head width d_k: "
                             "sparse A = W_Kᵀ W_Q (W_K, W_Q: d_k x d); dense Q = W_Kᵀ W_Q, "
                             "P = W_Oᵀ W_V (each d_k x D) (default: unfactored A, B or P, Q)")

    def __post_init__(self) -> None:
        check_fields(self, check_int, "n_dims", "n_layers", "n_heads")
        check_fields(self, check_choice, "kernel", choices=KERNELS)
        check_fields(self, check_bool, "sparse")
        check_fields(self, check_real, "init_std", low=0.0)
        check_fields(self, check_seed, "seed")
        check_fields(self, check_int, "n_state", low=0)
        if self.d_k is not None and not (is_int(self.d_k) and self.d_k >= 1):
            raise ConfigError("PQConfig", "d_k", f"PQConfig.d_k must be a positive integer "
                              "(the head width of the factored parametrization) or None "
                              f"(unfactored), got {self.d_k!r}")
        if self.n_state and self.sparse:
            raise ConfigError("PQConfig", "n_state", f"PQConfig.n_state={self.n_state} needs a "
                              "dense model (sparse=False): Eq. 8's sparsity has no state "
                              "channels")

    @property
    def d_model(self) -> int:
        """Width of a token row, d + 1 + n_state."""
        return self.n_dims + 1 + self.n_state

    attn_only = True
    normalization_type = None
    positional_embedding_type = "none"
    device = None


@dataclasses.dataclass(frozen=True)
class LSTMConfig(_TokenLayout, ConfigMixin):
    """Configuration of `LSTMRegressor` (Garg et al.'s read-in → LSTM layers → read-out).

    Each field's help is its ``iclprobe train`` flag's.
    """

    n_dims: int = option(help=N_DIMS_HELP)
    n_positions: int = option(help=N_POSITIONS_HELP)
    n_layers: int = option(3, "LSTM layers, one per block (each one's hidden states are "
                           "hooked)")
    d_model: int = option(128, "hidden width of every LSTM layer and of the read-in")
    layout: str = option("interleaved", LAYOUT_HELP, choices=LAYOUTS)
    seed: int = option(0, SEED_HELP)

    def __post_init__(self) -> None:
        check_fields(self, check_int, "n_dims", "n_positions", "n_layers", "d_model")
        check_fields(self, check_choice, "layout", choices=LAYOUTS)
        check_fields(self, check_seed, "seed")

    # Attributes TransformerLens's ActivationCache reads from ``model.cfg``.
    attn_only = False
    normalization_type = None
    positional_embedding_type = "none"
    device = None


def _json_value(value: Any, where: str) -> Any:
    """``value`` as a JSON value (a tensor or tuple as nested lists), or a ConfigError."""
    if hasattr(value, "tolist") and callable(value.tolist):  # a tensor or array
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_json_value(v, where) for v in value]
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise ConfigError("OracleConfig", "hyper", f"OracleConfig.hyper[{where!r}] must be a JSON "
                      "value (a finite number, string, bool, None or a list of them), got "
                      f"{value!r}")


#: The most layers of a known-answer oracle (its steps: the fitted view's GD grid ends at 4096).
MAX_ORACLE_LAYERS = 2**12


@dataclasses.dataclass(frozen=True)
class OracleConfig(ConfigMixin):
    """Configuration of `iclprobe.constructions.LearnerOracle` (a known-answer model).

    Layer l is ``learner``'s step ``steps[l]``. Not trained: ``iclprobe train`` refuses the
    family, and its fields have no flags.

    ``hyper``: the learner's hyperparameters as JSON values, so that ``config.json`` holds
    them: numbers, strings (``lr="max"``, ``alpha="frobenius"``), booleans, and lists of
    numbers, which the learner receives as float64 tensors (a per-prefix α, a
    preconditioner); a tensor given here is stored as its list.
    """

    n_dims: int = option(help="covariate dimension d")
    n_layers: int = option(help="layers beyond the embedding (L; steps has L + 1 entries)")
    learner: str = option(help="a registered learner (iclprobe.algorithms.LEARNERS)")
    steps: tuple[int, ...] | None = option(None, "the learner's step at layer l = 0..L "
                                           "(default: step l at layer l)")
    hyper: dict[str, Any] = dataclasses.field(default_factory=dict)  # JSON values
    n_noise: int = option(8, "distractor channels tanh(W x + c) in the residual")
    seed: int = option(0, "seed of the rotation R and the distractors W, c")
    exact_readout: bool = option(True, "align reads layers exactly (undo R); False: probes")

    def __post_init__(self) -> None:
        check_fields(self, check_int, "n_dims")
        # its layers are a learner's steps, one module each: 10**7 take minutes to build
        check_fields(self, check_int, "n_layers", high=MAX_ORACLE_LAYERS + 1)
        check_fields(self, check_int, "n_noise", low=0)
        check_fields(self, check_seed, "seed")
        check_fields(self, check_bool, "exact_readout")
        object.__setattr__(self, "steps", self._checked_steps())
        object.__setattr__(self, "hyper", self._checked_hyper())

    def _checked_steps(self) -> tuple[int, ...]:
        if self.steps is None:
            return tuple(range(self.n_layers + 1))
        steps = tuple(self.steps) if isinstance(self.steps, (list, tuple)) else None
        ok = steps is not None and len(steps) == self.n_layers + 1 and all(
            is_int(s) and s >= 0 for s in steps)
        if not ok or steps is None:
            raise ConfigError("OracleConfig", "steps", f"OracleConfig.steps must be "
                              f"n_layers + 1 = {self.n_layers + 1} integers >= 0 (the step at "
                              f"layer 0..{self.n_layers}) or None, got {self.steps!r}")
        return steps

    def _checked_hyper(self) -> dict[str, Any]:
        """The hyperparameters as JSON values, each one the learner takes."""
        from iclprobe import algorithms  # the learner registry (imports torch)

        if self.learner not in algorithms.LEARNERS:
            raise ConfigError("OracleConfig", "learner", f"OracleConfig.learner must be a "
                              f"registered learner {sorted(algorithms.LEARNERS)}, got "
                              f"{self.learner!r}")
        if not isinstance(self.hyper, dict) or not all(isinstance(k, str) for k in self.hyper):
            raise ConfigError("OracleConfig", "hyper", f"OracleConfig.hyper must be a dict of "
                              f"the learner's hyperparameters by name, got {self.hyper!r}")
        params = inspect.signature(algorithms.LEARNERS[self.learner].fn).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            accepted = [p for p in params if p not in ("xs", "ys", "steps", "weights")]
            unknown = sorted(set(self.hyper) - set(accepted))
            if unknown:
                raise ConfigError("OracleConfig", "hyper", f"OracleConfig.hyper: {unknown} "
                                  f"are not hyperparameters of {self.learner!r} (accepted: "
                                  f"{accepted})")
        return {k: _json_value(v, k) for k, v in self.hyper.items()}

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    @property
    def d_model(self) -> int:
        """Residual width d + 1 + n_noise."""
        return self.n_dims + 1 + self.n_noise

    attn_only = True
    normalization_type = None
    positional_embedding_type = "none"
    device = None
