"""Test helpers: tiny seeded models and batches."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import numpy as np
import torch

from iclprobe import models, tasks


def tiny_gpt(attention: str = "softmax", layout: str = "interleaved", **kw) -> models.GPTRegressor:
    cfg = dict(n_dims=3, n_positions=8, n_layers=2, d_model=16, n_heads=2, seed=7,
               attention=attention, layout=layout)
    cfg.update(kw)
    model = models.GPTRegressor(models.GPTConfig(**cfg))
    # Random biases and norms too, so no parameter hides behind its zero/one init.
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def small_batch(n_dims: int = 3, n_points: int = 8, batch: int = 4, seed: int = 0):
    return tasks.RegressionTask(n_dims=n_dims, n_points=n_points).sample(batch, generator=seed)


def assert_queries_match_substitution(model, xs, ys, queries, atol, rtol=0.0):
    """``predict_queries`` equals putting each query at its position and reading preds."""
    with torch.no_grad():
        got = model.predict_queries(xs, ys, queries)
        for t in range(xs.shape[1]):
            for j in range(queries.shape[2]):
                subst = xs.clone()
                subst[:, t] = queries[:, t, j]
                torch.testing.assert_close(got[:, t, j], model(subst, ys)[:, t], atol=atol,
                                           rtol=rtol)


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen) -> None:
    """Poll until ``ready()``; fail if ``proc`` exits first.

    No wall-clock limit: on a loaded machine the child is only slower, and a hang is the
    test harness's to catch.
    """
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the process exited with {proc.returncode} before it was ready")
        time.sleep(0.05)


def linear_data(b: int = 3, n: int = 9, d: int = 3, seed: int = 0, noise: float = 0.0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Noiseless (or noisy) linear sequences in float64: ``xs [b, n, d]``, ``ys [b, n]``."""
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(b, n, d, generator=g, dtype=torch.float64)
    w = torch.randn(b, d, generator=g, dtype=torch.float64)
    ys = torch.einsum("bnd,bd->bn", xs, w) + noise * torch.randn(b, n, generator=g,
                                                                 dtype=torch.float64)
    return xs, ys


def tiny_pq() -> models.PQTransformer:
    """A random 3-layer, 2-head PQ transformer on d = 3."""
    return models.PQTransformer(models.PQConfig(n_dims=3, n_layers=3, n_heads=2, init_std=0.2))


def one_line_error(capsys, *needles: str) -> str:
    """The one line of stderr (progress-bar lines aside), with every needle in it."""
    err = "\n".join(x for x in capsys.readouterr().err.splitlines()
                    if x.strip() and not x.startswith("train:"))
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def gpt_parameters(cfg):
    """GPTRegressor's weights in closed form (read-in, positions, blocks, final norm, read-out)."""
    m, f = cfg.d_model, cfg.d_mlp_resolved
    block = 4 * m * m + 2 * m * f + 9 * m + f  # two norms, attention (h d_head = m), MLP
    return (cfg.token_dim + 1) * m + cfg.n_ctx * m + cfg.n_layers * block + 2 * m + m + 1


def gdpp_loop(x, y, xq, lr: float, gamma: float, steps: int) -> float:
    """GD++ by its definition (numpy, one prefix): a GD step on the mean loss, then every
    covariate, the query's included, maps by ``I − γ XᵀX/t``; the query's prediction."""
    x, r, xq, pred = x.copy(), y.copy(), xq.copy(), 0.0
    eye = np.eye(x.shape[1])
    for _ in range(steps):
        g = x.T @ r / len(r)
        pred, r = pred + lr * xq @ g, r - lr * x @ g
        transform = eye - gamma * x.T @ x / len(r)
        x, xq = x @ transform.T, transform @ xq
    return pred


def designed_text(done) -> str:
    """`Designed.lines` as one text, each line checked to fit the screen's 100 columns."""
    lines = done.lines()
    assert all(len(line) <= 100 for line in lines), [line for line in lines if len(line) > 100]
    return " ".join(line.strip() for line in lines)


def listed_models(out: str) -> dict[str, str]:
    """``iclprobe models``' output: name -> summary (continuation lines joined).

    Checks that every line fits the screen's 100 columns.
    """
    entries: dict[str, str] = {}
    name = ""
    for line in out.splitlines():
        assert len(line) <= 100, line
        if line.startswith(" "):
            entries[name] += " " + line.strip()
        else:
            name, _, summary = line.partition(" ")
            entries[name] = summary.strip()
    return entries
