"""Test helpers: tiny seeded models and batches."""

from __future__ import annotations

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
