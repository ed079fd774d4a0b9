"""Command-line flags generated from the config dataclasses (one flag per field).

Defaults are left out of the namespace (``argparse.SUPPRESS``) so a command can tell which
flags were given, and the dataclass's own default applies to the rest. No heavy imports.
"""

from __future__ import annotations

import argparse
from typing import Any

# Field types for the fields whose default does not tell (None defaults).
_NONE_DEFAULT_TYPES: dict[str, tuple[type, str | None]] = {
    "d_mlp": (int, None), "active_dims": (int, None), "eigenvalues": (float, "+"),
    "n_positions": (int, None),
}


def add_fields(group: Any, fields: list[tuple[str, Any, str]],
               rename: dict[str, str] | None = None) -> None:
    """Add ``--field-name`` flags for ``(name, default, help)`` triples."""
    rename = rename or {}
    for name, default, help_text in fields:
        flag = "--" + rename.get(name, name).replace("_", "-")
        kw: dict[str, Any] = {"dest": rename.get(name, name), "default": argparse.SUPPRESS,
                              "help": f"{help_text} (default: {default})"}
        if isinstance(default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        elif isinstance(default, tuple):
            kw.update(type=type(default[0]), nargs=len(default), metavar=name.upper()[:1])
        elif default is None:
            kind, nargs = _NONE_DEFAULT_TYPES.get(name, (str, None))
            kw.update(type=kind, nargs=nargs)
        else:
            kw["type"] = type(default)
        group.add_argument(flag, **kw)


def given(args: argparse.Namespace, names: list[str],
          rename: dict[str, str] | None = None) -> dict[str, Any]:
    """The values of the flags among ``names`` that were given on the command line."""
    rename = rename or {}
    out = {}
    for name in names:
        dest = rename.get(name, name)
        if hasattr(args, dest):
            value = getattr(args, dest)
            out[name] = tuple(value) if isinstance(value, list) else value
    return out


# Field lists with help text, kept in step with the dataclasses by tests/test_cli.py.
TASK_FIELDS = [
    ("n_dims", 8, "covariate dimension d"),
    ("n_points", 24, "examples per sequence"),
    ("cov", "isotropic", "isotropic | rotated | ill-conditioned"),
    ("w_prior", "standard", "standard (w ~ N(0, I)) | inverse-cov (w ~ N(0, Σ⁻¹))"),
    ("noise_std", 0.0, "label noise standard deviation"),
    ("seed", 0, "seed of the rotated covariance"),
    ("condition_number", 100.0, "κ of the ill-conditioned covariance"),
    ("eigenbasis", "sequence", "ill-conditioned eigenbasis per sequence | batch"),
    ("eigenvalues", None, "Σ's eigenvalues for cov=rotated"),
    ("active_dims", None, "Garg's truncation: only the first k coordinates are non-zero"),
]
TASK_RENAME = {"seed": "task_seed"}

MODEL_FIELDS = [
    ("n_positions", None, "GPT, LSTM: most examples per sequence (default: n_points)"),
    ("n_layers", 8, "layers (PQ and LSTM default: 3)"),
    ("d_model", 64, "GPT: residual width; LSTM: hidden width (LSTM default: 128)"),
    ("n_heads", 4, "heads (PQ default: 1)"),
    ("d_mlp", None, "GPT: MLP width (default: 4 d_model)"),
    ("attention", "softmax", "GPT: softmax | linear"),
    ("layout", "interleaved", "GPT, LSTM: interleaved | paired"),
    ("ln_eps", 1e-5, "GPT: LayerNorm epsilon"),
    ("final_norm", True, "GPT: LayerNorm before the read-out (off: Fu et al.'s probing runs)"),
    ("sparse", True, "PQ: Eq. 8 sparse P and Q"),
    ("kernel", "linear", "PQ: linear | softmax | relu | softmax-ahn"),
    ("init_std", 0.01, "PQ: initialization standard deviation"),
    ("seed", 0, "initialization seed"),
]
MODEL_RENAME = {"seed": "model_seed"}


TRAIN_FIELDS = [
    ("steps", 1000, "optimizer steps"),
    ("batch_size", 64, "sequences per step and rank"),
    ("optimizer", "adam", "adam | adamw | sgd | lbfgs"),
    ("lr", 1e-3, "peak learning rate"),
    ("betas", (0.9, 0.999), "Adam/AdamW betas"),
    ("weight_decay", 0.0, "AdamW/SGD weight decay"),
    ("momentum", 0.9, "SGD momentum"),
    ("history_size", 100, "L-BFGS history size"),
    ("max_iter", 20, "L-BFGS iterations per step"),
    ("schedule", "constant", "constant | step (halve every --step-every) | cosine"),
    ("step_every", 2000, "halve the learning rate every k steps (schedule=step)"),
    ("warmup_steps", 0, "linear warm-up steps (schedule=cosine)"),
    ("clip", "none", "gradient clipping: none | global | per-matrix"),
    ("clip_norm", 1.0, "clipping threshold"),
    ("resample_every", 1, "fresh data every k steps (0: one fixed dataset)"),
    ("loss", "all", "all: every prefix (Garg) | last: last position (Ahn)"),
    ("curriculum_every", 0, "GPT, LSTM: grow dims/points every k steps (0: off)"),
    ("curriculum_dims", (5, 1), "curriculum (start, increment) of the active dims"),
    ("curriculum_points", (11, 2), "curriculum (start, increment) of the points"),
    ("project_sparse", False, "dense PQ: project onto Eq. 8 after every step"),
    ("zero_b", False, "PQ: keep B = 0 (Ahn et al.'s p0)"),
    ("seed", 0, "run seed: data of step s on rank r come from (seed, r, s)"),
    ("log_every", 50, "metrics-log period"),
    ("checkpoint_every", 500, "checkpoint period (0: only at the end)"),
    ("device", "cpu", "cpu | cuda"),
]
