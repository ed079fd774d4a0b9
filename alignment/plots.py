"""Figures of the report (matplotlib, written as PNG files)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from iclprobe.alignment.matching import Match  # noqa: E402
from iclprobe.alignment.similarity import Similarity  # noqa: E402

LEARNER_STYLE = {"ols": ("black", "--"), "gd": ("tab:red", ":"), "newton": ("tab:blue", "-."),
                 "pgd": ("tab:orange", ":"), "cg": ("tab:green", "--")}


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def error_curves(result: Any, path: Path) -> Path:
    """Normalized error vs number of in-context examples: a curve per layer + learners."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    n_layers = len(result.layer_error_by_t)
    cmap = plt.get_cmap("viridis")
    for layer, curve in enumerate(result.layer_error_by_t):
        ax.plot(range(len(curve)), curve, color=cmap(layer / max(1, n_layers - 1)), lw=1.2,
                label=f"layer {layer}" if layer in (0, n_layers - 1) or n_layers <= 6 else None)
    for label, curve in result.learner_error_by_t.items():
        color, style = LEARNER_STYLE.get(label.split(" ")[0], ("gray", "--"))
        ax.plot(range(len(curve)), curve, color=color, ls=style, lw=2,
                label=label if label != "ols" else "OLS")
    d = result.task["n_dims"]
    ax.axvline(d, color="gray", lw=0.8, alpha=0.5)
    ax.set_yscale("log")
    floor = min(min(c[1:]) for c in result.layer_error_by_t if len(c) > 1)
    ax.set_ylim(bottom=max(floor / 30, 1e-6))
    ax.set_xlabel("in-context examples t")
    ax.set_ylabel("normalized squared error (÷ d)")
    ax.set_title(f"{result.name}: error by layer; learners at the last layer's best step",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def similarity_heatmap(sim: Similarity, match: Match, path: Path, title: str) -> Path:
    """Layer × step similarity, best step per layer marked."""
    fig, ax = plt.subplots(figsize=(max(5, 0.3 * len(sim.steps) + 2), 0.35 * sim.values.shape[0]
                                    + 1.8))
    im = ax.imshow(sim.values.numpy(), aspect="auto", cmap="magma",
                   origin="lower", interpolation="nearest")
    for layer, step in enumerate(match.best_step):
        ax.plot(sim.steps.index(step), layer, "c*" if match.above_zero[layer] else "wx", ms=7)
    ax.set_xticks(range(len(sim.steps)))
    ax.set_xticklabels([str(s) for s in sim.steps], rotation=90, fontsize=7)
    ax.set_xlabel(f"{sim.learner} steps")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label=sim.metric)
    return _save(fig, path)


def matched_steps(matches: Sequence[tuple[str, Match]], path: Path) -> Path:
    """Best-matching step vs layer with the fitted line, several models on one axis."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    markers = "osD^v<>"
    for i, (label, match) in enumerate(matches):
        layers = list(range(len(match.best_step)))
        steps = match.best_step
        line = ax.plot(layers, steps, markers[i % len(markers)], label=label)[0]
        fit = match.fit
        if fit is not None:
            xs = [min(fit.layers), max(fit.layers)]
            ys = [fit.slope * x + fit.intercept for x in xs]
            if fit.log2:
                ys = [2**y for y in ys]
            ax.plot(xs, ys, "-", color=line.get_color(), alpha=0.7,
                    label=f"  fit: slope {fit.slope:.2f}{' (log2)' if fit.log2 else ''}, "
                          f"R² {fit.r2:.2f}")
    if matches and matches[0][1].fit is not None and matches[0][1].fit.log2:
        ax.set_yscale("log", base=2)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"best-matching {matches[0][1].learner} step" if matches else "step")
    ax.legend(fontsize=7)
    ax.set_title("Matched step vs layer (stars in the heatmaps mark these steps)", fontsize=9)
    return _save(fig, path)


def preconditioner_distances(rows: Sequence[tuple[str, Any]], path: Path) -> Path:
    """Per PQ model: distance of A_l to Σ⁻¹ and to I, and the scales a_l."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for name, analysis in rows:
        layers = list(range(len(analysis.dist_to_inv_cov)))
        line = axes[0].plot(layers, analysis.dist_to_inv_cov, "o-", label=f"{name}: to Σ⁻¹")[0]
        axes[0].plot(layers, analysis.dist_to_identity, "s--", color=line.get_color(),
                     label=f"{name}: to I")
        axes[1].plot(layers, analysis.scale, "o-", color=line.get_color(), label=name)
    axes[0].set_ylim(0, max(1.0, *[max(a.dist_to_identity) for _, a in rows]) * 1.05)
    axes[0].set_xlabel("layer")
    axes[0].set_ylabel("min_a ‖A − aM‖_F / ‖A‖_F")
    axes[0].legend(fontsize=7)
    axes[0].set_title("Distance of A_l to Σ⁻¹ and to I", fontsize=9)
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel("a_l (A_l ≈ a_l Σ⁻¹)")
    axes[1].set_title("Fitted scales a_l", fontsize=9)
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.set_xticks(range(max(len(a.scale) for _, a in rows)))
    return _save(fig, path)


def nice_float(x: float) -> str:
    """Compact formatting for tables."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    return f"{x:.3f}" if abs(x) >= 1e-2 else f"{x:.1e}"
