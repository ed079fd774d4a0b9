"""The spectral-filter view: the order of a layer's filter, whatever its step size and count.

A learner started at w = 0 that only multiplies ``b = Xᵀy`` by a function of ``S = XᵀX``
gives ``w = g(S) b``. In S's eigenbasis its **filter factors** ``φ_i = λ_i (Vᵀw)_i /
(Vᵀb)_i = λ_i g(λ_i)`` depend on the eigenvalue alone:

- GD, k steps of size η: ``φ = 1 − (1 − ηλ)^k``, so ``−log(1 − φ) = −k log(1 − ηλ) ≈ kηλ``;
- Newton–Schulz, k steps from ``M_0 = αS``: ``φ = 1 − (1 − αλ²)^(2^k)``, ``≈ 2^k αλ²``.

In the small-step limit the **order** p in ``−log(1 − φ) ∝ λ^p`` is 1 for GD and 2 for
Newton, whatever the step size or count: no step grid to fall between. p is the slope of
``log(−log(1 − φ))`` on ``log λ`` with one intercept per (sequence, prefix), over the
directions with φ in (0.02, 0.6), weighted by each direction's share of ‖b‖² (a direction
b barely touches has a noisy φ). Measured on the learners (d = 8, n = 24, t ≥ 10, 256
sequences): GD at 1/λ_max 1.01–1.21 over steps 1–16, Newton at 1/‖SSᵀ‖_F 2.00–2.13 over
steps 1–6; with φ up to 0.98 the curvature of −log(1 − φ) lifts GD's step 1 to 1.38.
Near a learner's stability bound the curve bends (Newton at 2/‖SSᵀ‖_F overshoots its top
eigenvalue: 0.7–1.3 at steps 1–4, isotropic), so the view also
reports the order of each learner's best fitted match (`alignment.views.fitted`) on the same
data: a layer is read as GD-like or Newton-like when its interval contains that learner's
order and excludes the other's.

Through probes each layer's interval is the union of its own and those of the layer read
with the probes' noise sample added and subtracted (`spectral_view`'s ``noisy``): a probe's
error is shared by the sequences it reads, so resampling sequences alone does not see it.
On the known-answer benchmark this took the view's false calls through probes from 69 to 62
of 1085 live layers; most of them are a bias of the probes' reading that no noise sample
shows (with the induced weights' queries drawn from the evaluation seed's stream, as
before 2026-12-06, the same view made 33).

It judges learners of the form g(S)Xᵀy started at 0 (GD, Newton–Schulz, ridge, OLS,
CG and preconditioned GD with a preconditioner that commutes with S), not online GD from a
random start. Every number is basis-free: directions whose eigenvalues agree to 1e-6
(relative) are pooled into one eigenspace, with ``φ_E = λ_E ⟨P_E w, P_E b⟩ / ‖P_E b‖²``
(P_E the projector onto it), which no choice of eigenvectors or signs inside it changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from iclprobe.algorithms.prefix import PrefixStats
from iclprobe.alignment.measuring.bootstrap import bootstrap_weights, interval

PHI_RANGE = (0.02, 0.6)  # −log(1 − φ) within 1.53× of φ: the small-step regime
TIE_RTOL = 1e-6
ORDERS = {"gd": 1.0, "newton": 2.0}  # the small-step limits


@dataclasses.dataclass
class SpectralOrder:
    """Per layer: the filter order p with its bootstrap interval, and what it reads as."""

    order: list[float | None]  # None: fewer than two usable directions (see `reading`)
    lower: list[float | None]
    upper: list[float | None]
    directions: list[int]  # (sequence, prefix, eigenspace) triples that entered the fit
    reference: dict[str, list[float | None]]  # learner -> the order of its best fitted match
    reading: list[str]  # "gd-like", "newton-like", "cannot tell", "too few usable directions"
    t_min: int  # prefixes t >= t_min entered (S full rank with a margin)
    #: readings of the layers with the readout's noise whose intervals each layer's interval
    #: was joined with (2: its sample added and subtracted; 0: none, e.g. read exactly)
    noisy_readings: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dataclasses.asdict(self)


def filter_factors(weights: Tensor, stats: PrefixStats) -> tuple[Tensor, Tensor, Tensor]:
    """``(φ, λ, share)`` per (…, sequence, prefix, eigenspace), basis-free.

    ``weights``: ``[..., B, n, d]`` weights at each prefix (a layer's induced weights or a
    learner's); ``stats`` of the same B sequences. Eigenspaces of tied eigenvalues are
    pooled (see the module doc); a pooled direction's λ, φ and share sit at the position of
    its largest eigenvalue, and the others get share 0.
    """
    lam = stats.eigvals  # [B, n, d], ascending
    wb = torch.einsum("...bnd,bnde->...bne", weights.to(torch.float64),
                      stats.eigvecs) * stats.xty_eig  # (Vᵀw)_i (Vᵀb)_i
    bb = stats.xty_eig.pow(2)
    top = lam[..., -1:].clamp(min=1e-300)
    new = torch.ones_like(lam, dtype=torch.bool)
    new[..., 1:] = (lam[..., 1:] - lam[..., :-1]) > TIE_RTOL * top  # a new eigenspace starts
    space = new.long().cumsum(-1) - 1  # eigenspace index per direction
    pooled_wb = torch.zeros_like(wb).scatter_add_(-1, space.expand_as(wb), wb)
    pooled_bb = torch.zeros_like(bb).scatter_add_(-1, space, bb)
    last = torch.ones_like(new)
    last[..., :-1] = new[..., 1:]  # the last (largest) direction of each eigenspace
    at = space  # gather each direction's pooled sums, kept at its eigenspace's last one
    wb_d = pooled_wb.gather(-1, at.expand_as(wb))
    bb_d = pooled_bb.gather(-1, at)
    scale = stats.x_scale / stats.y_scale  # φ of the unscaled data
    phi = torch.where(bb_d > 0, lam * wb_d / torch.where(bb_d > 0, bb_d, 1.0), 0.0) * scale
    total = bb.sum(-1, keepdim=True)
    share = torch.where(last & (total > 0), bb_d / torch.where(total > 0, total, 1.0), 0.0)
    return phi, lam.expand_as(phi), share.expand_as(phi)


def _sums(phi: Tensor, lam: Tensor, share: Tensor, t_min: int, t_max: int
          ) -> tuple[Tensor, Tensor, Tensor]:
    """Per sequence, the within-(sequence, prefix) weighted sums ``Σ w u z``, ``Σ w u²``.

    u = log λ and z = log(−log(1 − φ)), centred on their weighted means per (sequence,
    prefix); ``[..., B]`` each, and the count of directions used.
    """
    lo, hi = PHI_RANGE
    sl = slice(t_min, t_max + 1)
    phi, lam, share = phi[..., sl, :], lam[..., sl, :], share[..., sl, :]
    ok = (phi > lo) & (phi < hi) & (lam > 0) & (share > 0)
    w = torch.where(ok, share, 0.0)
    u = torch.where(ok, lam.clamp(min=1e-300).log(), 0.0)
    z = torch.where(ok, (-torch.log1p(-phi.clamp(lo, hi))).log(), 0.0)
    wsum = w.sum(-1, keepdim=True)
    enough = (ok.sum(-1, keepdim=True) >= 2) & (wsum > 0)
    w = torch.where(enough, w, 0.0)
    safe = torch.where(wsum > 0, wsum, 1.0)
    uc = u - (w * u).sum(-1, keepdim=True) / safe
    zc = z - (w * z).sum(-1, keepdim=True) / safe
    return (w * uc * zc).sum((-1, -2)), (w * uc * uc).sum((-1, -2)), \
        (ok & enough).sum((-1, -2))


def spectral_order(weights: Tensor, stats: PrefixStats, t_min: int, t_max: int,
                   n_boot: int, confidence: float, seed: int
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The filter order per leading index (e.g. layer): ``(p, lower, upper, directions)``.

    ``weights``: ``[..., B, n, d]``; the interval resamples sequences (the bootstrap of
    the similarity tables, same seed). p is NaN where fewer than two directions qualify,
    the interval where fewer than 90% of the resamples hold any.
    """
    uz, uu, count = _sums(*filter_factors(weights, stats), t_min, t_max)
    boot = bootstrap_weights(uz.shape[-1], n_boot, seed)  # [boot, B]
    den = uu.sum(-1)
    p = torch.where(den > 0, uz.sum(-1) / torch.where(den > 0, den, 1.0), torch.nan)
    bden = uu @ boot.T
    bp = torch.where(bden > 0, (uz @ boot.T) / torch.where(bden > 0, bden, 1.0), torch.nan)
    # a resample can miss the few sequences with usable directions: the interval is over
    # the resamples that have some, and undefined unless 90% of them do; its width is
    # widened for those sequences, the ones the ratio resamples
    lower, upper = interval(bp, confidence, (uu > 0).sum(-1), skip_nan=True)
    enough = torch.isfinite(bp).double().mean(-1) >= 0.9
    nan = torch.full_like(lower, torch.nan)
    return p, torch.where(enough, lower, nan), torch.where(enough, upper, nan), count.sum(-1)


def reading(lower: float, upper: float, reference: dict[str, float]) -> str:
    """What an order interval says, read against the learners' own orders on these data.

    "X-like" when the interval excludes every other learner's order and reaches X's to
    within a quarter of the gap between X's order and the nearest other's, and X is the
    only such learner; else "cannot tell".
    """
    if not (lower == lower and upper == upper):  # NaN: too few usable directions
        return "too few usable directions"
    near = []
    for name, p in reference.items():
        others = [q for k, q in reference.items() if k != name]
        if not others or any(lower <= q <= upper for q in others):
            continue
        margin = 0.25 * min(abs(p - q) for q in others)
        if lower - margin <= p <= upper + margin:
            near.append(name)
    return f"{near[0]}-like" if len(near) == 1 else "cannot tell"


def spectral_view(layer_weights: Tensor, learner_weights: dict[str, Tensor],
                  stats: PrefixStats, window: tuple[int, int], live: list[bool],
                  n_boot: int, confidence: float, seed: int,
                  noisy: Sequence[Tensor] = ()) -> SpectralOrder:
    """The order of every layer, and of each learner's best fitted match per layer.

    ``layer_weights``: ``[L+1, B, n, d]``; ``learner_weights``: learner -> ``[L+1, B, n, d]``,
    the weights of that learner's column best matching each layer; ``stats``: of the B
    sequences. Prefixes ``t >= d + 2`` of the window enter (S full rank with a margin).

    ``noisy``: the layer weights read with the readout's own noise (where probes read the
    layers: `probes.ReadoutNoise`'s sample added and subtracted, as the answer's margins
    use them). Each layer's interval becomes the union of its own and theirs: the bootstrap
    resamples sequences, but a probe's error is one map shared by every sequence it reads,
    so it moves the order in a way no resample sees.
    """
    d = layer_weights.shape[-1]
    t_min = max(window[0], d + 2)
    if t_min > window[1]:
        n = layer_weights.shape[0]
        return SpectralOrder([None] * n, [None] * n, [None] * n, [0] * n, {}, [
            f"too few usable directions: the window ends before t = d + 2 = {d + 2}"] * n,
            t_min)
    p, lo, hi, count = spectral_order(layer_weights, stats, t_min, window[1], n_boot,
                                      confidence, seed)
    for draw in noisy:  # an interval stays undefined where the layer's own is
        _, lo_n, hi_n, _ = spectral_order(draw, stats, t_min, window[1], n_boot, confidence,
                                          seed)
        lo = torch.where(torch.isnan(lo), lo, torch.fmin(lo, lo_n))
        hi = torch.where(torch.isnan(hi), hi, torch.fmax(hi, hi_n))
    ref = {k: spectral_order(w, stats, t_min, window[1], 2, confidence, seed)[0]
           for k, w in learner_weights.items()}
    readings = []
    for layer in range(p.shape[0]):
        if not live[layer]:
            readings.append("computes nothing")
            continue
        at = {k: float(v[layer]) for k, v in ref.items() if bool(torch.isfinite(v[layer]))}
        readings.append(reading(float(lo[layer]), float(hi[layer]), at))
    return SpectralOrder(_listed(p), _listed(lo), _listed(hi), [int(c) for c in count.tolist()],
                         {k: _listed(v) for k, v in ref.items()}, readings, t_min, len(noisy))


def _listed(values: Tensor) -> list[float | None]:
    """A float list with None where a value is undefined (NaN), never a silent number."""
    return [float(x) if x == x else None for x in values.tolist()]
