"""The grid of the fitted view (`iclprobe.alignment.views.fitted`), torch-free.

Its one home: `fitted` builds the step-size variants from it, and `AlignConfig`'s
``--fitted`` help counts them from it (`FITTED_SIZE`).
"""

from __future__ import annotations

GD_SCALES = (0.125, 0.25, 0.5, 1.0, 1.5)  # 2 / λ_max is on the boundary
# Newton's step count doubles its effective step (α λ² → 2^k α λ²): multiples an octave
# apart are nearly redundant, so Newton's are √2 apart within [1/2, 2] (2/‖SSᵀ‖_F still
# converges at rank >= 2), and its fixed steps' likewise below the bound
NEWTON_SCALES = (0.5, 0.71, 1.0, 1.41, 2.0)
NEWTON_FIXED = (0.35, 0.5, 0.71, 1.0, 1.41)
GD_STEPS = tuple(sorted({0} | {round(2 ** (j / 2)) for j in range(25)}))
NEWTON_STEPS = tuple(range(25))
#: Step-size variants per learner: GD's per-prefix rule, fixed mean-loss and fixed
#: summed-loss steps at each of `GD_SCALES`; Newton's per-prefix rule at each of
#: `NEWTON_SCALES`, its fixed per-prefix and constant α at each of `NEWTON_FIXED`.
N_VARIANTS = {"newton": len(NEWTON_SCALES) + 2 * len(NEWTON_FIXED), "gd": 3 * len(GD_SCALES)}
N_STEPS = {"newton": len(NEWTON_STEPS), "gd": len(GD_STEPS)}


def fitted_size() -> str:
    """The fitted view's size in words: ``15 step-size variants x 25 steps each``."""
    sizes = {name: (N_VARIANTS[name], N_STEPS[name]) for name in N_VARIANTS}
    if len(set(sizes.values())) == 1:
        variants, steps = next(iter(sizes.values()))
        return f"{variants} step-size variants x {steps} steps each"
    return ", ".join(f"{name}: {v} step-size variants x {s} steps" for name, (v, s)
                     in sizes.items())


FITTED_SIZE = fitted_size()
