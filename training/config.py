"""`TrainConfig`: every knob of `training.train` and ``iclprobe train``."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import TYPE_CHECKING

from iclprobe._checks import (
    ConfigError,
    check_choice,
    check_fields,
    check_int,
    check_real,
    is_number,
    option,
)
from iclprobe.models.config import ConfigMixin

if TYPE_CHECKING:
    from iclprobe.tasks import RegressionTask

OPTIMIZERS = ("adam", "adamw", "sgd", "lbfgs")
SCHEDULES = ("constant", "step", "cosine")
CLIPS = ("none", "global", "per-matrix")
LOSSES = ("all", "last")
DEVICES = ("cpu", "cuda")
#: the largest learning rate accepted: the optimizers step in float32 and Adam's first step
#: is lr / (1 − β₁), so lr = 1e38 overflowed float32 (3.4e38) inside the optimizer (an
#: internal error); 1e20 leaves room for any β₁ below 1 − 1e-18
MAX_LR = 1e20


@dataclasses.dataclass(frozen=True)
class TrainConfig(ConfigMixin):
    """How to train a model on its task (defaults: Garg et al.'s recipe, sized for a CPU).

    Each field's help is its ``iclprobe train`` flag's.
    """

    steps: int = option(1000, "optimizer steps (L-BFGS: outer steps of max_iter iterations "
                        "each)")
    batch_size: int = option(64, "sequences per step and rank")
    optimizer: str = option("adam", "the optimizer (sgd: with heavy-ball momentum)",
                            choices=OPTIMIZERS)
    lr: float = option(1e-3, "peak learning rate")
    betas: tuple[float, float] = option((0.9, 0.999), "Adam/AdamW betas")
    weight_decay: float = option(0.0, "AdamW decoupled weight decay / SGD L2")
    momentum: float = option(0.9, "SGD heavy-ball momentum, in [0, 1)")
    history_size: int = option(100, "L-BFGS history size")
    max_iter: int = option(20, "L-BFGS iterations per step")
    schedule: str = option("constant", "learning-rate schedule: step halves it every step_every "
                           "steps", choices=SCHEDULES)
    step_every: int = option(2000, "schedule step: halve the learning rate every this many "
                             "steps")
    warmup_steps: int = option(0, "schedule cosine: linear warm-up steps before the decay")
    clip: str = option("none", "gradient clipping: global (total norm) or per-matrix (Ahn "
                       "et al.)", choices=CLIPS)
    clip_norm: float = option(1.0, "threshold of the clipping")
    resample_every: int = option(1, "fresh data every k steps (1: every step; 0: one fixed "
                                 "dataset)")
    loss: str = option("all", "all: the mean over every prefix (Garg); last: the last "
                       "position (Ahn)", choices=LOSSES)
    curriculum_every: int = option(0, "Garg's curriculum: grow dims/points every k steps "
                                   "(0: off)")
    curriculum_dims: tuple[int, int] = option((5, 1), "curriculum (start, increment) of the "
                                              "active dimensions")
    curriculum_points: tuple[int, int] = option((11, 2), "curriculum (start, increment) of "
                                                "the points")
    project_sparse: bool = option(False, "dense PQ model: project P, Q onto Eq. 8 after each "
                                  "step", family_only=True)
    zero_b: bool = option(False, "PQ model: keep B = 0 (Ahn et al.'s p0 setting)",
                          family_only=True)
    seed: int = option(0, "run seed: the data of step s on rank r come from (seed, r, s)")
    log_every: int = option(50, "metrics-log period in steps")
    checkpoint_every: int = option(500, "checkpoint period in steps (0: only at the end)")
    device: str = option("cpu", "where training runs", choices=DEVICES)

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_fields(self, check_int, "steps", "batch_size", "history_size", "max_iter",
                     "step_every", "log_every")
        check_fields(self, check_int, "warmup_steps", "resample_every", "curriculum_every",
                     "checkpoint_every", "seed", low=0)
        for field, choices in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES),
                               ("clip", CLIPS), ("loss", LOSSES), ("device", DEVICES)):
            check_fields(self, check_choice, field, choices=choices)
        check_fields(self, check_real, "clip_norm", low=0.0, low_open=True)
        check_fields(self, check_real, "lr", low=0.0, high=MAX_LR, low_open=True)
        check_fields(self, check_real, "weight_decay", low=0.0)
        check_fields(self, check_real, "momentum", low=0.0, high=1.0, high_open=True)
        betas_ok = isinstance(self.betas, (tuple, list)) and len(self.betas) == 2 and all(
            is_number(b) and 0 <= b < 1 for b in self.betas)
        if not betas_ok:  # NaN and inf fail the comparison
            numpy = isinstance(self.betas, (tuple, list)) and any(
                isinstance(b, numbers.Real) and not is_number(b) for b in self.betas)
            hint = " (Python floats: pass float(b) for each)" if numpy else ""
            raise ConfigError(name, "betas", f"{name}.betas must be two numbers in [0, 1)"
                                             f"{hint}, got {self.betas!r}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        for field in ("curriculum_dims", "curriculum_points"):
            value = getattr(self, field)
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                raise ConfigError(name, field, f"{name}.{field} must be (start, increment), "
                                  f"positive integers, got {value!r}")
            for v in value:
                check_int(name, field, v)
            object.__setattr__(self, field, tuple(value))
        if self.warmup_steps and self.schedule != "cosine":
            raise ConfigError(name, "warmup_steps", f"{name}.warmup_steps applies to "
                              f"schedule='cosine' only, not {self.schedule!r}")

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` at ``step`` under the schedule."""
        if self.schedule == "step":
            return 0.5 ** (step // self.step_every)
        if self.schedule == "cosine":
            if step < self.warmup_steps:
                return (step + 1) / self.warmup_steps
            span = max(1, self.steps - self.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - self.warmup_steps) / span)))
        return 1.0

    def curriculum(self, step: int, n_dims: int, n_points: int) -> tuple[int, int]:
        """Garg's curriculum: (active dims, points) in force at ``step``."""
        if not self.curriculum_every:
            return n_dims, n_points
        grown = step // self.curriculum_every
        (d0, dinc), (p0, pinc) = self.curriculum_dims, self.curriculum_points
        return min(n_dims, d0 + grown * dinc), min(n_points, p0 + grown * pinc)


def check_curriculum(cfg: TrainConfig, task: RegressionTask) -> None:
    """Refuse a curriculum that starts beyond the task, naming the start that does.

    Where both starts exceed the task, the one changed from its default is named (the flag
    typed, in the CLI) and the other is mentioned: a small task makes a default too large.
    """
    over = [(field, start, size, what) for field, start, size, what in (
        ("curriculum_dims", cfg.curriculum_dims[0], task.n_dims, "dimensions (n_dims)"),
        ("curriculum_points", cfg.curriculum_points[0], task.n_points, "points (n_points)"))
        if start > size]
    if not over:
        return
    defaults = TrainConfig()
    changed = [o for o in over if getattr(cfg, o[0]) != getattr(defaults, o[0])]
    field, start, size, what = (changed or over)[0]
    also = "".join(f"; {f} starts at {s}, beyond its {n} {w.split()[0]}, too"
                   for f, s, n, w in over if f != field)
    raise ConfigError("TrainConfig", field, f"TrainConfig.{field} starts at {start}, beyond "
                      f"the task's {size} {what}{also}")
