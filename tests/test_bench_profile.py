"""bench/demo.py --profile names align's parts by file and function: each must exist."""

import importlib.util
import re
from pathlib import Path

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
    for (file, name), what in demo.PARTS.items():
        source = (ROOT / file).read_text()
        assert re.search(rf"^\s*def {name}\(", source, re.MULTILINE), (file, name, what)


def test_the_callers_closure_finds_a_part_run_inside_another():
    """The parts add up only if none runs inside another: the closure of a function's
    callers, on a call graph shaped as pstats holds it (key -> (..., callers)), reaches
    every ancestor through a cycle, and nothing else."""
    demo = _demo()
    graph = {"align": {}, "outer": {"align": 1}, "mid": {"outer": 1, "mid": 1},
             "inner": {"mid": 2}, "aside": {"align": 1}}
    stats = {key: (0, 0, 0.0, 0.0, callers) for key, callers in graph.items()}
    assert demo._callers_closure(stats, "inner") == {"mid", "outer", "align"}
    assert demo._callers_closure(stats, "aside") == {"align"}
    assert demo._callers_closure(stats, "align") == set()
