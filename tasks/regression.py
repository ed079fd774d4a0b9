"""In-context linear regression tasks: x samplers, covariances, w priors, label noise.

Axis legend: ``batch`` sequences, ``pos`` examples (n), ``n_dims`` (d).
A batch holds ``xs [batch, pos, n_dims]``, ``ys [batch, pos]``, ``ws [batch, n_dims]`` and
the covariance of the xs, ``[n_dims, n_dims]`` or, for per-sequence covariances,
``[batch, n_dims, n_dims]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from iclprobe._checks import (
    SEED_LIMIT,
    ConfigError,
    check_bytes,
    check_choice,
    check_fields,
    check_int,
    check_real,
    check_seed,
    is_int,
)
from iclprobe.errors import InputError, InputTypeError
from iclprobe.tasks.covariance import (
    MAX_CONDITION,
    check_covariance,
    check_eigenvalues,
    ill_conditioned_eigenvalues,
    random_orthogonal,
    rotated_eigenvalues,
    symmetric_sqrt_pair,
)
from iclprobe.tasks.fields import COVARIANCES, EIGENBASES, QUERIES, W_PRIORS, TaskFields

_OWNER = "RegressionTask"
TASK_FORMAT_VERSION = 1


@dataclass(frozen=True)
class RegressionBatch:
    """A batch of regression sequences (see the module docstring for shapes)."""

    xs: Tensor  # [batch, pos, n_dims]
    ys: Tensor  # [batch, pos]
    ws: Tensor  # [batch, n_dims]
    cov: Tensor  # [n_dims, n_dims] or [batch, n_dims, n_dims]

    def to(self, device: torch.device | str) -> RegressionBatch:
        """Return the batch moved to ``device``."""
        return RegressionBatch(*(t.to(device) for t in (self.xs, self.ys, self.ws, self.cov)))


def as_generator(generator: torch.Generator | int | None, name: str = "generator"):
    """Accept a ``torch.Generator`` or an integer seed in [0, 2^63); refuse the global RNG."""
    if isinstance(generator, torch.Generator):
        return generator
    if is_int(generator):
        if not 0 <= generator < SEED_LIMIT:
            raise InputError(f"{name} must be a torch.Generator or an integer seed in "
                             f"[0, 2**63), got {generator!r}")
        return torch.Generator().manual_seed(generator)
    raise InputTypeError(
        f"{name} must be a torch.Generator or an int seed, got {type(generator).__name__}"
        " (iclprobe never draws from the global RNG)"
    )


@dataclass(frozen=True, eq=False)
class RegressionTask(TaskFields):
    """In-context linear regression y = wᵀx (+ noise) with x ~ N(0, Σ).

    Args:
        n_dims: covariate dimension d.
        n_points: examples per sequence n (a paper's N context examples + 1 query is N + 1).
        cov: ``"isotropic"``; ``"rotated"`` (Ahn et al.: Σ = U D² Uᵀ, U a random orthogonal
            matrix fixed by ``seed``); ``"ill-conditioned"`` (Fu et al.: a random eigenbasis
            per sequence or per batch, half the eigenvalues ``condition_number`` times the
            other half, trace d); or a symmetric positive-definite ``[d, d]`` tensor.
            Sampling never depends on a decomposition's conventions: a fixed Σ (every kind
            but ``"ill-conditioned"``) draws ``x = Σ^{1/2} z`` with the symmetric square
            root, so ``RegressionTask(cov=task.covariance)`` samples what ``task`` samples;
            a per-sequence Σ = V D Vᵀ draws ``x = V D^{1/2} z`` with the V it was built
            from (`random_orthogonal`, unique). ``w ~ N(0, Σ⁻¹)`` is drawn the same way.
        w_prior: ``"standard"`` (w ~ N(0, I)), ``"inverse-cov"`` (w ~ N(0, Σ⁻¹), Ahn et
            al.'s code with rotated Σ), or ``"rotated"``: w ~ N(0, Σ_w), Σ_w = V D Vᵀ
            unrelated to Σ, with D the rotated eigenvalues ({1, 1, 1/4, 1/16, 1} repeated
            to d) and V the second orthogonal matrix drawn from ``seed`` (the first is the
            rotation of ``cov="rotated"``); w = V D^{1/2} u, the factor Σ_w is built from
            (see `w_covariance`).
        noise_std: standard deviation of Gaussian label noise.
        seed: fixes the rotation of ``"rotated"``, and starts the stream `sample` draws from
            when it is given no generator (an integer in [0, 2^63)).
        condition_number: κ of ``"ill-conditioned"`` (100 in Fu et al.), in [1, 1e6]: beyond
            it a sampled float32 Σ is no longer positive definite (so is the ratio of the
            largest to the smallest eigenvalue of any Σ here).
        eigenbasis: ``"sequence"`` (a fresh eigenbasis per sequence) or ``"batch"`` (one per
            batch, as Fu et al.'s code) for ``"ill-conditioned"``.
        eigenvalues: Σ's eigenvalues for ``"rotated"``; default {1, 1, 1/4, 1/16, 1}
            (repeated cyclically for d ≠ 5).
        active_dims: Garg et al.'s curriculum truncation: only the first k coordinates of x
            and w are non-zero (None: all d).
        query: the last example's x: ``"context"`` (drawn as every other) or
            ``"low-variance"``: from N(0, s Σ⁻¹), s = tr Σ / tr Σ⁻¹ (the same mean squared
            norm), so that its energy lies along Σ's low-variance directions, where GD has
            moved least and Newton most. It is the same draw z as under "context" (x = s^{1/2}
            L⁻ᵀ z instead of L z): the context is the same, only the query moves.
    """

    # the fields are `TaskFields`' (their one home, torch-free for the CLI's flags)
    _fixed_cov: Tensor | None = field(default=None, init=False, repr=False)
    _fixed_factors: tuple[Tensor, Tensor] | None = field(default=None, init=False, repr=False)
    _stream: torch.Generator | None = field(default=None, init=False, repr=False)
    _w_factor: Tensor | None = field(default=None, init=False, repr=False)  # V D^{1/2}

    def __post_init__(self) -> None:
        check_fields(self, check_int, "n_dims", "n_points")
        if isinstance(self.cov, str):
            if self.cov not in COVARIANCES:
                raise ConfigError(_OWNER, "cov", f"{_OWNER}.cov must be one of {COVARIANCES} "
                                  f"or a [d, d] tensor, got {self.cov!r}")
        else:
            object.__setattr__(self, "cov", check_covariance(self.cov, self.n_dims))
        check_fields(self, check_choice, "w_prior", choices=W_PRIORS)
        check_fields(self, check_real, "noise_std", low=0.0)
        check_fields(self, check_seed, "seed")
        check_fields(self, check_real, "condition_number", low=1.0, high=MAX_CONDITION)
        check_fields(self, check_choice, "eigenbasis", choices=EIGENBASES)
        check_fields(self, check_choice, "query", choices=QUERIES)
        if self.active_dims is not None:
            check_fields(self, check_int, "active_dims")
            if self.active_dims > self.n_dims:
                raise ConfigError(_OWNER, "active_dims", f"{_OWNER}.active_dims must be <= "
                                  f"n_dims={self.n_dims}, got {self.active_dims}")
        if self.eigenvalues is not None:
            if self.cov != "rotated":
                raise InputError(f"eigenvalues applies only to cov='rotated', not {self.cov!r}")
            object.__setattr__(self, "eigenvalues", check_eigenvalues(self.eigenvalues))
        if not isinstance(self.cov, Tensor) and self.cov != "ill-conditioned":
            # Σ and its two factors, d x d float64 each, are built here
            check_bytes(3 * 8 * self.n_dims**2, f"RegressionTask(n_dims={self.n_dims})")
        fixed = self._build_fixed_cov()
        object.__setattr__(self, "_fixed_cov", fixed)
        if fixed is not None:  # factor once: sampling then costs two matmuls
            object.__setattr__(self, "_fixed_factors", symmetric_sqrt_pair(fixed))
        if self.w_prior == "rotated":
            gen = torch.Generator().manual_seed(self.seed)
            random_orthogonal(self.n_dims, gen)  # the rotation of cov="rotated"
            vecs = random_orthogonal(self.n_dims, gen)
            root = rotated_eigenvalues(self.n_dims).sqrt()
            object.__setattr__(self, "_w_factor", vecs * root)

    # ------------------------------------------------------------------ covariance
    def _build_fixed_cov(self) -> Tensor | None:
        d = self.n_dims
        if isinstance(self.cov, Tensor):
            return self.cov
        if self.cov == "isotropic":
            return torch.eye(d, dtype=torch.float64)
        if self.cov == "rotated":
            rot = random_orthogonal(d, torch.Generator().manual_seed(self.seed))
            eig = rotated_eigenvalues(d, self.eigenvalues)
            return rot @ torch.diag(eig) @ rot.T
        return None  # ill-conditioned: drawn per sequence or per batch

    @property
    def covariance(self) -> Tensor | None:
        """The task's fixed Σ (float64), or None when Σ is drawn with each batch."""
        return self._fixed_cov

    @property
    def w_covariance(self) -> Tensor | None:
        """Σ_w, the covariance of the prior of w (float64), or None when it varies with Σ."""
        if self.w_prior == "standard":
            return torch.eye(self.n_dims, dtype=torch.float64)
        if self.w_prior == "rotated":
            assert self._w_factor is not None
            return self._w_factor @ self._w_factor.T
        cov = self.covariance
        return torch.linalg.inv(cov) if cov is not None else None

    # ------------------------------------------------------------------ sampling
    def sample(
        self,
        batch_size: int,
        generator: torch.Generator | int | None = None,
        n_points: int | None = None,
        active_dims: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> RegressionBatch:
        """Draw a batch of sequences.

        Args:
            batch_size: number of sequences B.
            generator: the source of randomness (a ``torch.Generator`` or an int seed). None:
                the task's own stream, a generator seeded with ``seed + 1`` when the task is
                built (``seed`` itself fixes the rotation), advanced by each such call: two
                calls give two different batches, and a new task with the same fields
                replays the same sequence of batches.
            n_points: examples per sequence (default: the task's).
            active_dims: curriculum truncation for this batch (default: the task's).
            dtype: dtype of the returned tensors (draws are made in float64).

        Returns:
            A `RegressionBatch` with ``xs [B, n, d]``, ``ys [B, n]``, ``ws [B, d]``, ``cov``.
        """
        gen = as_generator(generator) if generator is not None else self._own_stream()
        batch_size = check_int(_OWNER, "batch_size", batch_size)
        n = check_int(_OWNER, "n_points", n_points if n_points is not None else self.n_points)
        k = active_dims if active_dims is not None else self.active_dims
        if k is not None and not (is_int(k) and 0 < k <= self.n_dims):
            raise InputError(f"active_dims must be in 1..{self.n_dims}, got {k!r}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise InputTypeError(f"dtype must be a floating torch.dtype (e.g. torch.float32), "
                                 f"got {dtype!r}")
        d = self.n_dims
        f64 = torch.float64
        check_bytes(8 * batch_size * n * (d + 2), f"RegressionTask.sample(batch_size="
                    f"{batch_size}, n_points={n})")  # xs, ys and the noise, in float64

        sqrt_cov, inv_sqrt_t, cov = self._factors(batch_size, gen)
        z = torch.randn(batch_size, n, d, generator=gen, dtype=f64)
        xs = z @ sqrt_cov.transpose(-1, -2)  # x = L z, Σ = L Lᵀ
        if self.query == "low-variance":  # x_n = s^{1/2} L⁻ᵀ z_n ~ N(0, s Σ⁻¹)
            inv_trace = inv_sqrt_t.pow(2).sum((-2, -1))  # tr Σ⁻¹ = ‖L⁻ᵀ‖²_F
            scale = (cov.diagonal(dim1=-2, dim2=-1).sum(-1) / inv_trace).sqrt()
            last = z[:, -1:] @ inv_sqrt_t.transpose(-1, -2)
            xs[:, -1:] = last * (scale[..., None, None] if scale.ndim else scale)
        w_std = torch.randn(batch_size, d, generator=gen, dtype=f64)
        if self.w_prior == "standard":
            ws = w_std
        elif self._w_factor is not None:  # rotated: w = V D^{1/2} u, Σ_w = V D Vᵀ
            ws = w_std @ self._w_factor.T
        else:  # w = L⁻ᵀ u has covariance L⁻ᵀ L⁻¹ = Σ⁻¹
            ws = (inv_sqrt_t @ w_std.unsqueeze(-1)).squeeze(-1)
        if k is not None and k < d:
            xs[..., k:] = 0.0
            ws[..., k:] = 0.0
        ys = torch.einsum("bnd,bd->bn", xs, ws)
        if self.noise_std > 0:
            ys = ys + self.noise_std * torch.randn(batch_size, n, generator=gen, dtype=f64)
        return RegressionBatch(xs.to(dtype), ys.to(dtype), ws.to(dtype), cov.to(dtype))

    def _own_stream(self) -> torch.Generator:
        if self._stream is None:
            object.__setattr__(self, "_stream", torch.Generator().manual_seed(self.seed + 1))
        assert self._stream is not None
        return self._stream

    def _factors(self, batch_size: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """Return (L, L⁻ᵀ, Σ) with Σ = L Lᵀ, batched ``[B, d, d]`` or shared ``[d, d]``."""
        if self._fixed_cov is not None and self._fixed_factors is not None:
            sqrt_cov, inv_sqrt = self._fixed_factors  # Σ^{1/2} and Σ^{-1/2}, both symmetric
            return sqrt_cov, inv_sqrt, self._fixed_cov
        # Per-sequence Σ = V D Vᵀ with V from `random_orthogonal` (a sign-fixed QR of the
        # generator's draws, unique): its factor V D^{1/2} is a function of the draws alone.
        eig = ill_conditioned_eigenvalues(self.n_dims, float(self.condition_number))
        n_bases = batch_size if self.eigenbasis == "sequence" else 1
        vecs = random_orthogonal(self.n_dims, gen, batch=(n_bases,))
        cov = (vecs * eig) @ vecs.transpose(-1, -2)
        sqrt_cov, inv_sqrt_t = vecs * eig.sqrt(), vecs * eig.rsqrt()
        if self.eigenbasis == "batch":
            return sqrt_cov[0], inv_sqrt_t[0], cov[0]
        return sqrt_cov, inv_sqrt_t, cov

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description; a given Σ is stored as nested lists."""
        cov: Any = self.cov.tolist() if isinstance(self.cov, Tensor) else self.cov
        return {
            "format_version": TASK_FORMAT_VERSION,
            "n_dims": self.n_dims,
            "n_points": self.n_points,
            "cov": cov,
            "w_prior": self.w_prior,
            "noise_std": float(self.noise_std),
            "seed": self.seed,
            "condition_number": float(self.condition_number),
            "eigenbasis": self.eigenbasis,
            "eigenvalues": list(self.eigenvalues) if self.eigenvalues is not None else None,
            "active_dims": self.active_dims,
            # written where it is not the default: every task.json before it stays valid
            **({"query": self.query} if self.query != "context" else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RegressionTask:
        """Rebuild a task from `to_dict` output."""
        data = dict(data)
        version = data.pop("format_version", TASK_FORMAT_VERSION)
        if version != TASK_FORMAT_VERSION:
            raise InputError(
                f"task format_version {version!r} is not supported (expected {TASK_FORMAT_VERSION})"
            )
        if isinstance(data.get("cov"), list):
            data["cov"] = torch.tensor(data["cov"], dtype=torch.float64)
        if data.get("eigenvalues") is not None:
            data["eigenvalues"] = tuple(data["eigenvalues"])
        known = {f for f in cls.__dataclass_fields__ if not f.startswith("_")}
        unknown = set(data) - known
        if unknown:
            raise InputError(f"unknown task fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def to_json(self) -> str:
        """Serialize to a JSON string."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> RegressionTask:
        """Load from a JSON string or a ``task.json`` path."""
        path = Path(text_or_path) if not str(text_or_path).lstrip().startswith("{") else None
        text = path.read_text() if path is not None else str(text_or_path)
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:  # RecursionError: nested too deep
            where = f" in {path}" if path is not None else ""
            raise InputError(f"invalid task JSON{where}: {err}") from None
        return cls.from_dict(data)
