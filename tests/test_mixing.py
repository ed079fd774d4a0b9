"""One row's similarity to mixes of columns from the columns' products (`measuring.mixing`).

Checked against every mix materialised as a column and compared by `similarity` (the
built-in metrics' own tables): the same values and bootstrap replicates to float64
round-off, on predictions and induced weights, with a zero column and a window.
"""

import pytest
import torch

from iclprobe.algorithms.base import Iterates
from iclprobe.alignment.measuring.mixing import mix_replicates, mix_scores
from iclprobe.alignment.measuring.similarities import similarity
from iclprobe.alignment.metrics import METRIC_INFO, register_metric

WEIGHTS = (0.35, 0.5, 0.65)


def _data(on_w: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shape = (12, 9, 3) if on_w else (12, 9)  # [batch, pos(, d)]
    ys = torch.randn(12, 9, generator=gen, dtype=torch.float64)
    row = torch.randn(*shape, generator=gen, dtype=torch.float64)
    groups = [(torch.randn(*shape, generator=gen, dtype=torch.float64),
               torch.randn(4, *shape, generator=gen, dtype=torch.float64)),
              (torch.randn(*shape, generator=gen, dtype=torch.float64),
               torch.randn(2, *shape, generator=gen, dtype=torch.float64))]
    groups[1][1][1] = groups[1][0]  # a part equal to its column: a mix of one column
    if not on_w:
        groups[0][1][2] = ys  # zero residuals: the error cosine's 0 at a zero vector
    return row, groups, ys


def _materialised(groups):
    w = torch.tensor(WEIGHTS, dtype=torch.float64)
    cols = []
    for mine, parts in groups:
        for part in parts:
            cols += [(1 - x) * mine + x * part for x in w]
    return torch.stack(cols)


@pytest.mark.parametrize("metric", ["error_cosine", "spd", "weight_cosine", "ilwd"])
def test_mixes_from_products_are_the_mixes_columns(metric):
    on_w = METRIC_INFO[metric].on == "weights"
    row, groups, ys = _data(on_w)
    cols = _materialised(groups)
    it = Iterates(torch.zeros(len(cols), dtype=torch.long),
                  cols if not on_w else cols[..., 0], cols if on_w else None, {}, "mix")
    want = similarity(row[None], it, ys, metric, t_min=2, t_max=7, n_boot=50, seed=3,
                      check=False)
    scores = mix_scores(row, groups, WEIGHTS, ys, metric, 2, 7, "positions")
    assert scores is not None and scores.shape == (len(cols), 12)
    value, boots = mix_replicates(scores, 50, 3)
    torch.testing.assert_close(value, want.values[0], rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(boots, want.boots[0], rtol=1e-12, atol=1e-13)


def test_no_product_form_for_other_metrics_or_across_sequences():
    row, groups, ys = _data(False)
    assert mix_scores(row, groups, WEIGHTS, ys, "error_cosine", 1, None, "sequences") is None

    @register_metric("mix_test_abs", on="preds", higher_is_better=False)
    def _abs(a, b, ys, t_min, t_max):
        return (a - b)[..., t_min:t_max + 1].abs().mean(-1)

    try:
        assert mix_scores(row, groups, WEIGHTS, ys, "mix_test_abs", 1, None, "positions") is None
    finally:
        METRIC_INFO.pop("mix_test_abs")
