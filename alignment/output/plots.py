"""Figures of the report (matplotlib, written as PNG files)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import torch  # noqa: E402

from iclprobe.alignment.measuring.matching import Match  # noqa: E402
from iclprobe.alignment.measuring.similarities import Similarity  # noqa: E402
from iclprobe.alignment.metrics import metric_info  # noqa: E402
from iclprobe.alignment.output.tables import level  # noqa: E402

LEARNER_STYLE = {"ols": ("black", "--"), "gd": ("tab:red", ":"), "newton": ("tab:blue", "-."),
                 "pgd": ("tab:orange", ":"), "cg": ("tab:green", "--"),
                 "online_gd": ("tab:purple", (0, (3, 1, 1, 1))), "pgd_own": ("tab:brown", "-."),
                 "pgd_inv_cov": ("tab:pink", ":")}
MARKERS = "osD^v<>P*"

__all__ = ["error_curves", "learner_comparison", "matched_steps",
           "preconditioner_distances", "similarity_heatmaps"]


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def overlapping_groups(curves: Sequence[Sequence[float]], rtol: float = 0.02) -> list[list[int]]:
    """Consecutive curves within ``rtol`` of the first of their group (drawn as one)."""
    groups: list[list[int]] = []
    for i, curve in enumerate(curves):
        if groups:
            ref = curves[groups[-1][0]]
            close = all(abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)
                        for a, b in zip(curve[1:], ref[1:]))
            if close:
                groups[-1].append(i)
                continue
        groups.append([i])
    return groups


def error_curves(result: Any, path: Path) -> Path:
    """Normalized error vs number of in-context examples: a curve per layer + learners."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    curves = result.layer_error_by_t
    n_layers = len(curves)
    cmap = plt.get_cmap("viridis")
    norm = matplotlib.colors.Normalize(vmin=0, vmax=max(1, n_layers - 1))
    for group in overlapping_groups(curves):
        layer = group[0]
        label = (f"layers {group[0]}–{group[-1]} (overlapping)" if len(group) > 1 else None)
        ax.plot(range(len(curves[layer])), curves[layer], color=cmap(norm(group[-1])), lw=1.4,
                label=label)
    for label, curve in result.learner_error_by_t.items():
        color, style = LEARNER_STYLE.get(label.split(" ")[0], ("gray", "--"))
        ax.plot(range(len(curve)), curve, color=color, ls=style, lw=2,
                label=label if label != "ols" else "OLS")
    d = result.task["n_dims"]
    ax.axvline(d, color="gray", lw=0.9, ls=":", label=f"t = d = {d} (OLS interpolates)")
    ax.set_yscale("log")
    floor = min(min(c[1:]) for c in curves if len(c) > 1)
    top = 10 * max(max(c) for c in curves)  # a learner's early blow-up must not squash layers
    clipped = any(max(c) > top for c in result.learner_error_by_t.values())
    ax.set_ylim(bottom=max(floor / 30, 1e-6), top=top if clipped else None)
    ax.set_xlabel("in-context examples t")
    ax.set_ylabel("normalized squared error (÷ d)")
    ax.set_title(f"{result.name}: error by layer; learners at the last layer's best step"
                 + (" (learner curves clipped at the top)" if clipped else ""), fontsize=9)
    bar = fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax)
    bar.locator = matplotlib.ticker.MaxNLocator(integer=True)
    bar.update_ticks()
    bar.set_label("layer (0 = embedding)")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def color_range(sim: Similarity, match: Match) -> tuple[float, float]:
    """The heatmap's colour range: from the 5th percentile of the live layers' values.

    Dead layers and far-off steps would otherwise stretch the scale and wash out the
    differences between the steps that matter.
    """
    live = torch.tensor(match.above_zero)
    shown = sim.values[live] if bool(live.any()) else sim.values
    vmin = float(torch.quantile(shown.flatten(), 0.05))
    return vmin, max(float(shown.max()), vmin + 1e-9)


def _heatmap_panel(fig: Any, ax: Any, sim: Similarity, match: Match, title: str) -> None:
    n_layers, n_steps = sim.values.shape
    vmin, vmax = color_range(sim, match)
    im = ax.imshow(sim.values.numpy(), aspect="auto", cmap="magma", origin="lower",
                   interpolation="nearest", vmin=vmin, vmax=vmax)
    for layer, k in enumerate(match.best_column):
        if match.above_zero[layer]:
            ax.plot(k, layer, marker="*", ms=11, mfc="cyan", mec="black", mew=0.8, ls="none")
        else:
            ax.plot(k, layer, marker="X", ms=8, mfc="white", mec="black", mew=0.8, ls="none")
    ax.set_xticks(range(n_steps))
    ax.set_xticklabels([sim.column_label(k) for k in range(n_steps)], rotation=90, fontsize=7)
    ax.set_yticks(range(n_layers))
    ax.set_xlabel(f"{sim.learner} steps")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    bar = fig.colorbar(im, ax=ax, extend="min")
    bar.set_label(f"{metric_info(sim.metric).label}\n(clipped below {vmin:.2f})", fontsize=8)


def similarity_heatmaps(panels: Sequence[tuple[Similarity, Match, str]], path: Path,
                        title: str) -> Path:
    """Layer × step similarity of several learners, one panel each, best steps marked.

    ★ marks each layer's best step, ✕ a best step whose match is not above the zero
    predictor's. One figure per model and metric keeps the report fast to write.
    """
    widths = [max(5.5, 0.32 * len(sim.steps) + 2.5) for sim, _, _ in panels]
    heights = [0.32 * sim.values.shape[0] + 1.6 for sim, _, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(widths), sum(heights) + 0.6),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    for i, (ax, (sim, match, label)) in enumerate(zip(axes[:, 0], panels)):
        head = f"{title} (★ best step, ✕ not above the zero predictor)\n" if i == 0 else ""
        _heatmap_panel(fig, ax, sim, match, head + label)
    return _save(fig, path)


def matched_steps(matches: Sequence[tuple[str, Match]], path: Path) -> Path:
    """Best-matching step vs layer, hollow where not live, fitted line where defined.

    One legend entry per model (its fit, or why there is none), one for hollow points.
    """
    fig, ax = plt.subplots(figsize=(8.6, 4.3))
    for i, (label, match) in enumerate(matches):
        marker = MARKERS[i % len(MARKERS)]
        live = [layer for layer, ok in enumerate(match.above_zero) if ok]
        dead = [layer for layer, ok in enumerate(match.above_zero) if not ok]
        fit = match.fit
        defined = fit is not None and fit.defined
        if defined:
            assert fit is not None and fit.slope is not None and fit.r2 is not None
            label += f" (fit: slope {fit.slope:.2f}{' log2' if fit.log2 else ''}, R² {fit.r2:.2f})"
        else:
            reason = fit.reason if fit is not None and fit.reason else "undefined"
            label += f" (no fit: {reason.split(' (')[0]})"
        line = ax.plot(live, [match.best_step[x] for x in live], marker, label=label)[0]
        if dead:
            ax.plot(dead, [match.best_step[x] for x in dead], marker, mfc="none",
                    color=line.get_color())
        if defined:
            assert fit is not None and fit.slope is not None and fit.intercept is not None
            xs = [min(fit.layers), max(fit.layers)]
            ys = [fit.slope * x + fit.intercept for x in xs]
            if fit.log2:
                ys = [2**y for y in ys]
            ax.plot(xs, ys, "-", color=line.get_color(), alpha=0.7)
    ax.plot([], [], "o", mfc="none", color="grey", label="hollow: not above the zero predictor")
    if matches and matches[0][1].fit is not None and matches[0][1].fit.log2:
        ax.set_yscale("log", base=2)
    else:
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("layer")
    ax.set_ylabel(f"best-matching {matches[0][1].learner} step" if matches else "step")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title("Matched step vs layer (lines fitted over live layers)", fontsize=9)
    return _save(fig, path)


def _interval_bars(ax: Any, xs: list[float], lower: list[float], upper: list[float],
                   color: str, cap: bool) -> None:
    """Each bootstrap interval drawn from its bounds.

    Not as error bars around the estimate: a best-over-steps estimate can lie outside its
    own interval (the best step is re-picked in every replicate), and matplotlib refuses
    the negative error that would take.
    """
    ax.vlines(xs, lower, upper, colors=color, lw=1)
    if cap:
        ax.plot(xs + xs, list(lower) + list(upper), "_", color=color, ms=5)


def learner_comparison(result: Any, metric: str, path: Path) -> Path:
    """Per layer: each learner's best similarity with CI; paired differences with CI."""
    comp = result.comparisons[metric]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    layers = list(range(result.n_layers + 1))
    offset = 0.8 / max(1, len(comp.scores))
    for i, (run, score) in enumerate(comp.scores.items()):
        color = LEARNER_STYLE.get(run, ("gray", "-"))[0]
        xs = [x - 0.4 + (i + 0.5) * offset for x in layers]
        iv = score.score
        _interval_bars(left, xs, iv.lower, iv.upper, color, cap=False)
        for x, v, ok in zip(xs, iv.value, comp.live):
            left.plot(x, v, MARKERS[i % len(MARKERS)], color=color,
                      mfc=color if ok else "none")
        left.plot([], [], MARKERS[i % len(MARKERS)], color=color, label=run)
    words = metric_info(metric).label
    left.set_xlabel("layer")
    left.set_ylabel(f"best {words} over steps")
    left.set_title(f"{result.name}: learners' best {words} ({level(result)} CI)", fontsize=9)
    left.legend(fontsize=7)
    for i, pair in enumerate(comp.pairs):
        iv = pair.difference
        xs = [x + (i - (len(comp.pairs) - 1) / 2) * 0.15 for x in layers]
        color = f"C{i}"
        _interval_bars(right, xs, iv.lower, iv.upper, color, cap=True)
        for x, v, ok in zip(xs, iv.value, comp.live):
            right.plot(x, v, MARKERS[i % len(MARKERS)], ms=5, color=color,
                       mfc=color if ok else "none")
        right.plot([], [], MARKERS[i % len(MARKERS)], color=color, label=f"{pair.a} − {pair.b}")
    right.axhline(0, color="gray", lw=0.8)
    right.set_xlabel("layer")
    right.set_ylabel("difference of best similarities")
    right.set_title(f"Paired differences ({level(result)} CI; above 0: the first learner is "
                    "closer)"
                    if comp.pairs else "Paired differences: no learner pair among these",
                    fontsize=9)
    if comp.pairs:  # a legend of nothing warns
        right.legend(fontsize=7)
    for ax in (left, right):
        ax.set_xticks(layers)
    return _save(fig, path)


def preconditioner_distances(rows: Sequence[tuple[str, Any]], path: Path) -> Path:
    """Per PQ model: distance of A_l to Σ⁻¹ and to I, and the scales a_l (layers 1..L)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for name, analysis in rows:
        layers = list(range(1, len(analysis.dist_to_inv_cov) + 1))
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
        ax.set_xticks(range(1, max(len(a.scale) for _, a in rows) + 1))
    return _save(fig, path)
