"""bench/demo.py --profile names align's parts by file and function: each must exist."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_part_the_profile_names_is_a_function_of_the_package():
    """A part renamed or moved would read 0 s (the bench exits naming it); caught here first."""
    spec = importlib.util.spec_from_file_location("bench_demo", ROOT / "bench" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert len(demo.PARTS) == 10
    for (file, name), what in demo.PARTS.items():
        source = (ROOT / file).read_text()
        assert re.search(rf"^\s*def {name}\(", source, re.MULTILINE), (file, name, what)
