"""A throwaway extension package written from docs/architecture.md's three recipes.

`write_package(root)` writes ``tinyext`` (a learner, a metric and a model family, every
code block copied from the docs verbatim) and its ``.dist-info`` with an
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

from iclprobe import models
from tinyext.config import TinyConfig


def _momentum(xs, ys, steps, lr, beta, weights):
    it = algorithms.momentum(xs, ys, steps=steps, lr=lr, beta=beta, weights=weights)
    return it.preds, it.weights

'''

FAMILY_LINE = '''
models.register_family("tinymean", TinyConfig, "tinyext.model:TinyRegressor",
                       "a prefix-mean regressor (iclprobe's recipe test)")
'''


def _blocks(title: str) -> list[str]:
    """The ``python`` code blocks of docs/architecture.md's section ``title``."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index(title):]
    section = section[:section.find("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def recipe_blocks() -> tuple[str, str]:
    """The learner and the metric recipes' code blocks, as docs/architecture.md has them."""
    return _blocks("## Recipe: add a learner")[0], _blocks("## Recipe: add a metric")[0]


def family_blocks() -> tuple[str, str]:
    """The family recipe's two code blocks (the config, the model), verbatim."""
    config, model = _blocks("## Recipe: add a model family")
    return config, model


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
    config, model = family_blocks()
    (pkg / "config.py").write_text(f'"""The family recipe\'s config."""\n\n{config}',
                                   encoding="utf-8")
    (pkg / "model.py").write_text(f'"""The family recipe\'s model."""\n\n{model}',
                                  encoding="utf-8")
    info = root / f"{PACKAGE}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 0.1\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text(textwrap.dedent(f"""\
        [iclprobe.plugins]
        {PACKAGE} = {PACKAGE}
        """), encoding="utf-8")
    return root
