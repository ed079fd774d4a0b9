"""Data that tell the learners apart: align where the candidates disagree most.

On a model's own task the candidate learners can resemble each other as much as any of
them resembles a layer (Newton, GD, CG and heavy ball within 0.01 of each other on
isotropic data): the answer is then "cannot tell", whatever the model runs. Which data
separate the learners is a property of the learners alone, so it is chosen before the
model is run there.

**The family** (`DesignFamily`): evaluation distributions of the model's dimension d, each
a `RegressionTask` with

- Σ's spectrum: condition number κ ∈ {1, 10, 100, 1000} and the shape of its decay,
  *geometric* (eigenvalues κ^(−i/(d−1))) or *linear* (from 1 down to 1/κ in equal
  steps), in a random basis. The chosen distribution's data are then scaled (x and y by
  one factor, `matched_scale`) so that their curvature — the largest λ_max(S_t/t) over the
  evaluation sequences and the aligned window, of which a fixed step size is a multiple —
  is the model's own task's: a fixed step size keeps its multiple of the stability bound,
  so it stays stable and within its family's reach. Keeping Σ's largest eigenvalue
  instead, a spread spectrum's sequences are shorter (‖x‖² ≈ tr Σ): on the benchmark the
  Newton constructions' fixed α fell below their family's smallest step size there and 13
  of their live layers matched no learner; scaled to tr Σ = d, the GD construction at 0.9
  of its bound diverged on κ = 100 data (read as Newton at one layer). Every distribution
  tried is judged at its own scale: the built-in candidates' rules are relative to the
  data (and the error cosine to their scale), so for them the scale does not change the
  objective, but a model's own learner — a PQ model's fixed preconditioner — is not;
- the number of examples n: the model's own, and m·d + 1 for m ∈ {1, 1.5, 2} below it
  (a model aligned at its trained length only keeps its own);
- label noise σ ∈ {0, 0.5};
- the query: drawn as the context is, or along Σ's low-variance directions
  (``query="low-variance"``: x_n ~ N(0, s Σ⁻¹), the same mean energy), where GD has moved
  least and Newton most; such data are aligned at their last position only.

The prior of w is the model's own task's, not a factor: w ~ N(0, Σ⁻¹) for the designed Σ
where the own prior is "inverse-cov" (the PQ models'), the own Σ_w where it is "rotated".

**The objective** (`separation`): the layers' matched columns, taken from the answer on the
model's own task (each candidate's best column per layer: its hyperparameter rule and
step), are run on the candidate distribution. For each live layer the contenders are the
answer's learner and those it could not be told from (the runner-up where it named one, or
found none): a pair's separation is 1 minus the best similarity (error cosine) with which
either learner's family imitates the other's matched column — the learners' own
resemblance, the yardstick the answer judges a layer by — or either family imitates the two
columns' average (a layer between two learners is neither's only where no family reaches
their mix; measured: without this term the benchmark's GD/Newton average was named GD on
designed data). A layer's separation is that of its closest pair; the objective is the
mean over the live layers. It is 0 on a distribution where the learner matched at the
deepest answered layer does no regression (`regresses`: its error there not below
``OOD_ERROR`` × the zero predictor's), where a model that runs that learner would be judged
out of distribution and its answer not used; and 0 where the learner some answered layer
matched (one live at its matched column on the own task) is not live there (`keeps`: its
matched column run on the very sequences `align` would read, by `align`'s liveness rule),
where a model that runs it would lose that layer's answer. The 64 sequences the objective
is judged on cannot show that: online GD's noisy first passes on κ 1000 data with label
noise did regression on them and none on the evaluation's 256 (the known-answer
benchmark's online GD oracles lost 5 layers on such designs).

**The search** (`design_evaluation`): coordinate ascent from the distribution nearest the
model's own task (its κ, shape, n, noise, query): each factor in turn (spectrum, examples,
noise, query) takes the value with the largest objective, the others held; a tie keeps the
earlier value. Every candidate distribution is sampled with the same seed, so rerunning
reproduces the choice (on one machine and torch, to the last digit).

`align_designed` aligns the model on its own task and on the designed data and returns both
answers, with the model's error on each: where the model's output error on the designed
data is not below ``OOD_ERROR`` × the zero predictor's, the model no longer does
regression there, and that answer is marked out of distribution and not used.
"""

from iclprobe.alignment.design.designed import Designed, align_designed
from iclprobe.alignment.design.family import (
    FACTORS,
    SHAPES,
    DesignFamily,
    Distribution,
    nearest_distribution,
    spectrum,
)
from iclprobe.alignment.design.search import (
    METRIC,
    OOD_ERROR,
    Design,
    contending_pairs,
    design_evaluation,
    regresses,
    separation,
)

__all__ = ["FACTORS", "METRIC", "OOD_ERROR", "SHAPES", "Design", "DesignFamily", "Designed",
           "Distribution", "align_designed", "contending_pairs", "design_evaluation",
           "nearest_distribution", "regresses", "separation", "spectrum"]
