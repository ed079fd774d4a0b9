"""A throwaway extension package written from docs/architecture.md's three recipes.

`write_package(root)` writes ``tinyext`` (a learner, a metric and a model family, the
learner and metric blocks copied from the docs verbatim) and its ``.dist-info`` with an
``iclprobe.plugins`` entry point into ``root``, outside iclprobe: put ``root`` on
``sys.path`` or ``PYTHONPATH`` and the package is importable and installed as a plugin.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
PACKAGE = "tinyext"
#: What the learner recipe leaves to the reader (``preds, w = ...``): heavy-ball momentum.
LEARNER_BODY = "_momentum(xs, ys, steps, lr, beta, weights)"

PREAMBLE = '''\
"""A throwaway extension of iclprobe, written from docs/architecture.md's recipes."""

from iclprobe.models import registry
from tinyext.config import TinyConfig


def _momentum(xs, ys, steps, lr, beta, weights):
    it = algorithms.momentum(xs, ys, steps=steps, lr=lr, beta=beta, weights=weights)
    return it.preds, it.weights

'''

FAMILY_LINE = '''
registry.register_family("tinymean", TinyConfig, "tinyext.model:TinyRegressor",
                         "a prefix-mean regressor (iclprobe's recipe test)")
'''

CONFIG = '''\
"""The config of the "tiny" family (recipe step 1)."""

import dataclasses

from iclprobe._checks import option
from iclprobe.models.config import _ConfigMixin


@dataclasses.dataclass(frozen=True)
class TinyConfig(_ConfigMixin):
    """A prefix-mean regressor: each block reads the mean of the examples seen so far."""

    n_dims: int = option(help="covariate dimension d")
    n_layers: int = option(2, "blocks")
    d_model: int = option(16, "residual width")
    seed: int = option(0, "initialization seed")

    def __post_init__(self):
        for name in ("n_dims", "n_layers", "d_model"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyConfig.{name} must be an integer >= 1, got {value!r}")
'''

MODEL = '''\
"""TinyRegressor, the model of the "tiny" family (recipe step 2)."""

import torch
from torch import nn

from iclprobe.models._tl import HookPoint
from iclprobe.models.base import Regressor


class TinyBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.mix = nn.Linear(2 * cfg.d_model, cfg.d_model)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, h, context):  # context: the prefix means, broadcast to h
        h = self.hook_resid_pre(h)
        mixed = self.mix(torch.cat([h, context.expand_as(h)], -1))
        return self.hook_resid_post(h + torch.tanh(mixed))


class TinyRegressor(Regressor):
    """Position t: the query x_t embedded, and per block the mean of examples 0..t-1."""

    curriculum = False

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.task = None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.embed_x = nn.Linear(cfg.n_dims, cfg.d_model)
            self.embed_xy = nn.Linear(cfg.n_dims + 1, cfg.d_model)
            self.blocks = nn.ModuleList(TinyBlock(cfg) for _ in range(cfg.n_layers))
            self.read_out = nn.Linear(cfg.d_model, 1)
        self.setup()

    def _context(self, xs, ys):
        ex = self.embed_xy(torch.cat([xs, ys[..., None]], -1))  # [batch, pos, d_model]
        count = torch.arange(xs.shape[1], dtype=xs.dtype).clamp(min=1)
        return (torch.cumsum(ex, 1) - ex) / count[None, :, None]

    def _layers(self, queries, context):
        layers = [self.embed_x(queries)]
        for block in self.blocks:
            layers.append(block(layers[-1], context))
        return layers

    def forward(self, xs, ys, last_only=False):
        self.check_inputs(xs, ys)
        preds = self.readout_residual(self._layers(xs, self._context(xs, ys))[-1])
        return preds[:, -1:] if last_only else preds

    def query_residuals(self, xs, ys, queries, reduce=None):
        self.check_queries(xs, ys, queries)
        out = torch.stack(self._layers(queries, self._context(xs, ys)[:, :, None]))
        return reduce(out) if reduce is not None else out  # [L+1, batch, pos, T, d_model]

    def predict_queries(self, xs, ys, queries):
        return self.query_residuals(xs, ys, queries,
                                    reduce=lambda r: self.readout_residual(r[-1]))

    def readout_residual(self, resid):
        return self.read_out(resid)[..., 0]

    def readout_rows(self, activation, n_points):
        return activation

    def set_readout_rows(self, activation, rows):
        return rows.clone()

    def n_points_of(self, activation):
        return activation.shape[1]
'''


def recipe_blocks() -> tuple[str, str]:
    """The learner and the metric recipes' code blocks, as docs/architecture.md has them."""
    text = DOCS.read_text(encoding="utf-8")
    blocks = []
    for title in ("## Recipe: add a learner", "## Recipe: add a metric"):
        section = text[text.index(title):]
        blocks.append(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    return blocks[0], blocks[1]


def package_source() -> str:
    """``tinyext/__init__.py``: the two recipes' code, completed, and the family's line."""
    learner, metric = recipe_blocks()
    if "preds, w = ..." not in learner:
        raise AssertionError("the learner recipe no longer reads `preds, w = ...`")
    learner = learner.replace("preds, w = ...", f"preds, w = {LEARNER_BODY}")
    return PREAMBLE + learner + "\n\n" + metric + FAMILY_LINE


def write_package(root: Path) -> Path:
    """Write ``tinyext`` and its plugin metadata into ``root``; returns ``root``."""
    pkg = root / PACKAGE
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(package_source(), encoding="utf-8")
    (pkg / "config.py").write_text(CONFIG, encoding="utf-8")
    (pkg / "model.py").write_text(MODEL, encoding="utf-8")
    info = root / f"{PACKAGE}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 0.1\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text(textwrap.dedent(f"""\
        [iclprobe.plugins]
        {PACKAGE} = {PACKAGE}
        """), encoding="utf-8")
    return root
