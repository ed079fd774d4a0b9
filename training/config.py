"""`TrainConfig`: every knob of `models.train` and ``iclprobe train``."""

from __future__ import annotations

import dataclasses
import math

from iclprobe._checks import check_int, check_real
from iclprobe.models.config import _check_choice, _ConfigMixin

OPTIMIZERS = ("adam", "adamw", "sgd", "lbfgs")
SCHEDULES = ("constant", "step", "cosine")
CLIPS = ("none", "global", "per-matrix")
LOSSES = ("all", "last")
DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class TrainConfig(_ConfigMixin):
    """How to train a model on its task (defaults: Garg et al.'s recipe, sized for a CPU)."""

    steps: int = 1000  # optimizer steps (L-BFGS: outer steps of max_iter iterations each)
    batch_size: int = 64  # sequences per step and rank
    optimizer: str = "adam"  # "adam" | "adamw" | "sgd" (with momentum) | "lbfgs"
    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.999)  # Adam/AdamW
    weight_decay: float = 0.0  # AdamW decoupled decay / SGD L2
    momentum: float = 0.9  # SGD heavy-ball momentum, in [0, 1)
    history_size: int = 100  # L-BFGS history
    max_iter: int = 20  # L-BFGS iterations per step
    schedule: str = "constant"  # "constant" | "step" (halve every step_every) | "cosine"
    step_every: int = 2000  # "step": halve the learning rate every this many steps
    warmup_steps: int = 0  # "cosine": linear warm-up steps before the cosine decay
    clip: str = "none"  # "none" | "global" (total norm) | "per-matrix" (Ahn et al.)
    clip_norm: float = 1.0  # threshold of the clipping
    resample_every: int = 1  # fresh data every k steps (1: every step; 0: one fixed dataset)
    loss: str = "all"  # "all": mean over every prefix (Garg); "last": last position (Ahn)
    curriculum_every: int = 0  # Garg's curriculum: grow dims/points every k steps (0: off)
    curriculum_dims: tuple[int, int] = (5, 1)  # (start, increment) of the active dimensions
    curriculum_points: tuple[int, int] = (11, 2)  # (start, increment) of the points
    project_sparse: bool = False  # dense PQ model: project P, Q onto Eq. 8 after each step
    zero_b: bool = False  # PQ model: keep B = 0 (Ahn et al.'s "p0" setting)
    seed: int = 0  # run seed: the data of step s on rank r come from (seed, r, s)
    log_every: int = 50  # metrics-log period in steps
    checkpoint_every: int = 500  # checkpoint period in steps (0: only at the end)
    device: str = "cpu"  # "cpu" | "cuda"

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field in ("steps", "batch_size", "history_size", "max_iter", "step_every",
                      "log_every"):
            check_int(name, field, getattr(self, field))
        for field in ("warmup_steps", "resample_every", "curriculum_every", "checkpoint_every",
                      "seed"):
            check_int(name, field, getattr(self, field), low=0)
        _check_choice(self, "optimizer", OPTIMIZERS)
        _check_choice(self, "schedule", SCHEDULES)
        _check_choice(self, "clip", CLIPS)
        _check_choice(self, "loss", LOSSES)
        _check_choice(self, "device", DEVICES)
        for field in ("lr", "clip_norm"):
            check_real(name, field, getattr(self, field), 0.0, low_open=True)
        check_real(name, "weight_decay", self.weight_decay, 0.0)
        check_real(name, "momentum", self.momentum, 0.0, 1.0, high_open=True)
        betas_ok = isinstance(self.betas, (tuple, list)) and len(self.betas) == 2 and all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
            for b in self.betas)
        if not betas_ok:  # NaN and inf fail the comparison
            raise ValueError(f"{name}.betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        for field in ("curriculum_dims", "curriculum_points"):
            value = getattr(self, field)
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                raise TypeError(f"{name}.{field} must be (start, increment), positive "
                                f"integers, got {value!r}")
            for v in value:
                check_int(name, field, v)
            object.__setattr__(self, field, tuple(value))
        if self.warmup_steps and self.schedule != "cosine":
            raise ValueError(f"{name}.warmup_steps applies to schedule='cosine' only, "
                             f"not {self.schedule!r}")

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

