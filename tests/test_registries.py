"""A name in a registry belongs to its first registrant; plugins are loaded without harm.

Written as a newcomer would: a package of their own in ``tmp_path`` (a module, and for a
plugin a ``.dist-info`` with an ``iclprobe.plugins`` entry point) that registers a learner,
a metric or a model family under a name iclprobe already uses. Registering a taken name is
refused, naming the earlier registrant; replacing is an explicit ``replace=True``, and then
every command says which plugin replaced what. A plugin that prints, exits, is interrupted
or fails to register is named and never takes a command's output or status with it.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest
import torch

from iclprobe import algorithms, plugins
from iclprobe.alignment.metrics import METRIC_INFO
from iclprobe.cli import main
from iclprobe.models import registry

#: What a newcomer writes to register under each registry's most used built-in name.
REGISTRATIONS = {
    "learner": ("gd", "iclprobe.algorithms.learners", '''
from iclprobe import algorithms

@algorithms.register("gd", steps=(1, 2){replace})
def my_gd(xs, ys, steps=None, weights=True):
    return algorithms.gd(xs, ys, steps=steps, weights=weights)
'''),
    "metric": ("error_cosine", "iclprobe.alignment.metrics", '''
from iclprobe.alignment import register_metric

@register_metric("error_cosine", on="preds", higher_is_better=True{replace})
def my_cosine(a, b, ys, t_min, t_max):
    return (a - b)[..., t_min:t_max + 1].abs().mean(-1)
'''),
    "model family": ("gpt", "iclprobe.models.registry", '''
from iclprobe.models import LSTMConfig, register_family

register_family("gpt", LSTMConfig, "iclprobe.models.lstm:LSTMRegressor", "mine"{replace})
'''),
}


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory on sys.path for the newcomer's package; the registries restored after."""
    saved = [(reg, dict(reg)) for reg in (algorithms.LEARNERS, METRIC_INFO, registry.FAMILIES)]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(plugins, "REPLACED", {})
    yield tmp_path
    for reg, items in saved:
        reg.clear()
        reg.update(items)
    for name in [m for m in sys.modules if m.startswith("mine")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def write_package(root, source, plugin=False):
    """The package ``mine`` in ``root``; with ``plugin``, installed as an iclprobe plugin."""
    (root / "mine.py").write_text(textwrap.dedent(source), encoding="utf-8")
    if plugin:
        info = root / "mine-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mine\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text("[iclprobe.plugins]\nmine = mine\n")
    importlib.invalidate_caches()


@pytest.mark.parametrize("kind", list(REGISTRATIONS))
def test_a_taken_name_is_refused_naming_who_took_it(site, kind):
    name, owner, source = REGISTRATIONS[kind]
    write_package(site, source.format(replace=""))
    with pytest.raises(ValueError, match=f"{kind} '{name}' is already registered by module "
                                         f"{owner}; register under another name, or pass "
                                         "replace=True to replace it"):
        importlib.import_module("mine")
    assert algorithms.LEARNERS["gd"].fn.__module__ == "iclprobe.algorithms.learners"
    assert METRIC_INFO["error_cosine"].across is not None  # the built-in, across form kept
    assert registry.FAMILIES["gpt"].config.__name__ == "GPTConfig"


@pytest.mark.parametrize("kind", list(REGISTRATIONS))
def test_replace_needs_a_registration_to_replace(site, kind):
    name, _, source = REGISTRATIONS[kind]
    write_package(site, source.replace(f'"{name}"', '"not_taken_x"').format(
        replace=", replace=True"))
    with pytest.raises(ValueError, match=f"{kind} 'not_taken_x': replace=True, but no "
                                         f"{kind} 'not_taken_x' is registered"):
        importlib.import_module("mine")


@pytest.mark.parametrize("kind", list(REGISTRATIONS))
def test_a_plugin_taking_a_name_is_skipped_naming_the_plugin(site, kind, caplog, capsys):
    name, owner, source = REGISTRATIONS[kind]
    write_package(site, source.format(replace=""), plugin=True)
    with pytest.raises(SystemExit):
        main(["align", "--help"])
    assert f"iclprobe plugin 'mine' (mine) failed to load, skipped: InputError: {kind} " \
           f"'{name}' is already registered by module {owner}" in caplog.text
    assert algorithms.LEARNERS["gd"].fn.__module__ == "iclprobe.algorithms.learners"
    assert registry.FAMILIES["gpt"].config.__name__ == "GPTConfig"


@pytest.mark.parametrize("kind", list(REGISTRATIONS))
def test_a_plugin_replacing_a_built_in_is_said_by_every_command(site, kind, capsys):
    name, owner, source = REGISTRATIONS[kind]
    write_package(site, source.format(replace=", replace=True"), plugin=True)
    sentence = (f"note: {kind} '{name}' of module {owner} is replaced by plugin 'mine' "
                "(module mine)")
    for command in ("align", "train"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert f"iclprobe {command}: {sentence}" in capsys.readouterr().err
    registered = {"learner": algorithms.LEARNERS, "metric": METRIC_INFO,
                  "model family": registry.FAMILIES}[kind]
    registered.pop(name)  # the replacement undone: no longer said
    with pytest.raises(SystemExit):
        main(["align", "--help"])
    assert "replaced" not in capsys.readouterr().err


def test_a_plugin_that_prints_leaves_json_output_valid(site, tmp_path, capsys):
    from iclprobe import models, tasks

    write_package(site, 'print("hello from mine")\n', plugin=True)
    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 2)
    ckpt = model.save(tmp_path / "pq", task=tasks.RegressionTask(n_dims=3, n_points=7))
    assert main(["align", str(ckpt), "--n-sequences", "16", "--n-boot", "10",
                 "--no-separation", "--json"]) == 0
    out = capsys.readouterr()
    assert "pq" in json.loads(out.out)
    assert "hello from mine" in out.err


def test_a_learner_that_prints_leaves_json_output_valid(site, tmp_path, capsys):
    """The sibling of a printing plugin: its learner printing while align runs."""
    from iclprobe import models, tasks

    @algorithms.register("chatty_test", steps=(1, 2))
    def chatty_test(xs, ys, steps=None, weights=True):
        print("computing chatty_test")
        return algorithms.gd(xs, ys, steps=steps, weights=weights)

    model = models.PQTransformer.from_matrices(A=[0.3 * torch.eye(3)] * 2)
    ckpt = model.save(tmp_path / "pq", task=tasks.RegressionTask(n_dims=3, n_points=7))
    assert main(["align", str(ckpt), "--n-sequences", "16", "--n-boot", "10",
                 "--no-separation", "--algorithms", "chatty_test", "--json"]) == 0
    out = capsys.readouterr()
    assert "chatty_test" in json.loads(out.out)["pq"]["similarities"]
    assert "computing chatty_test" in out.err


@pytest.mark.parametrize(("source", "said"), [
    ("import sys\nsys.exit(3)\n", "failed to load, skipped: called sys.exit(3)"),
    ("raise RuntimeError('no GPU here')\n", "failed to load, skipped: RuntimeError: no GPU"),
])
def test_a_plugin_that_exits_or_fails_is_skipped_naming_it(site, source, said, caplog):
    write_package(site, source, plugin=True)
    with pytest.raises(SystemExit) as exit_:
        main(["align", "--help"])
    assert exit_.value.code == 0  # the command ran: its help
    assert f"iclprobe plugin 'mine' (mine) {said}" in caplog.text


def test_a_plugin_interrupted_at_import_is_one_line(site, capsys):
    write_package(site, "raise KeyboardInterrupt\n", plugin=True)
    assert main(["align", "--help"]) == 130
    err = capsys.readouterr().err.strip()
    assert err == ("iclprobe align: interrupted while loading iclprobe plugin 'mine' (mine); "
                   "nothing was written")
