"""bench/demo.py --profile times align's parts by module and function: each must exist, and
the clock must count each call once and find a part run inside another."""

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _demo():
    spec = importlib.util.spec_from_file_location("bench_demo", ROOT / "bench" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def test_every_part_the_profile_names_is_a_function_of_the_package():
    """A part renamed or moved would read 0 s (the bench exits naming it); caught here first."""
    demo = _demo()
    assert len(demo.PARTS) == 10
    assert len(demo.FLOOR_PARTS) == 2 and demo.FAMILIES in demo.PARTS.values()
    for (module, name), what in demo.PARTS.items():
        owner = importlib.import_module(module)
        for attr in name.split("."):
            owner = getattr(owner, attr)
        assert callable(owner), (module, name, what)


class FakeClock:
    """``perf_counter`` of a clock the toy parts advance (no wall clock in a test)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def toy_parts(monkeypatch):
    """Three parts in a module of their own, one calling another, one calling itself, one
    also bound by a from-import in another module; each takes 1 s of a fake clock."""
    clock = FakeClock()
    mod = types.ModuleType("toy_pkg.parts")
    user = types.ModuleType("toy_pkg.user")

    def leaf(x):
        clock.now += 1.0
        return x + 1

    def outer(x):
        clock.now += 1.0
        return mod.leaf(x) * 2  # a part inside another

    def again(x, depth=2):
        clock.now += 1.0
        return mod.again(x, depth - 1) if depth else x  # a part inside itself

    class Base:
        def method(self, x):
            clock.now += 1.0
            return x

    class Model(Base):  # the timed part is inherited: the base class keeps its own
        pass

    mod.leaf, mod.outer, mod.again, mod.Model = leaf, outer, again, Model
    user.leaf = leaf
    monkeypatch.setitem(sys.modules, "toy_pkg.parts", mod)
    monkeypatch.setitem(sys.modules, "toy_pkg.user", user)
    return mod, user, clock


def test_the_clock_times_each_part_once_and_finds_one_inside_another(monkeypatch, toy_parts):
    demo = _demo()
    mod, user, fake = toy_parts
    monkeypatch.setattr(demo, "time", fake)
    monkeypatch.setattr(demo, "PARTS", {("toy_pkg.parts", "leaf"): "leaf",
                                        ("toy_pkg.parts", "outer"): "outer",
                                        ("toy_pkg.parts", "again"): "again",
                                        ("toy_pkg.parts", "Model.method"): "method"})
    real = mod.leaf
    with demo.PartClock() as clock:
        assert user.leaf(1) == 2 and mod.again(0) == 0  # the from-import is timed too
        assert clock.nested == set()  # a part inside itself is no part inside another
        assert mod.outer(1) == 4
        assert mod.Model().method(5) == 5
    assert mod.leaf is real and user.leaf is real  # put back
    assert "method" not in vars(mod.Model) and mod.Model().method(6) == 6
    assert clock.nested == {("outer", "leaf")}
    # leaf: its own call and the one inside outer; again: its three levels counted once
    assert clock.seconds == {"leaf": 2.0, "outer": 2.0, "again": 3.0, "method": 1.0}


def test_a_clock_that_cannot_install_puts_back_what_it_replaced(monkeypatch, toy_parts):
    demo = _demo()
    mod, user, _ = toy_parts
    real = mod.leaf
    monkeypatch.setattr(demo, "PARTS", {("toy_pkg.parts", "leaf"): "leaf",
                                        ("toy_pkg.parts", "gone"): "a part renamed"})
    with pytest.raises(AttributeError, match="gone"):
        with demo.PartClock():
            pass
    assert mod.leaf is real and user.leaf is real
