"""The import graph of iclprobe's modules has no cycles, and models/ never reaches training/.

Every import that runs counts: at module level and inside a function (a late import hides
a circle, it does not remove it). A name imported from a package that exports it lazily
(``_EXPORTS`` in its ``__init__.py``) counts as an import of the module defining it, and a
package depends on every module it exports. Imports under ``if TYPE_CHECKING:`` never run:
counted with them, the one cycle allowed is `RENDERING` (a result class and the modules that
render it name each other's types); models/ may not import training/ even there.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = {"tests", "scripts", "bench", "docs"}  # not installed: they may import anything


def _module_files() -> dict[str, Path]:
    files = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in SKIP or any(p.startswith(".") for p in rel.parts):
            continue
        parts = ["iclprobe", *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """A package's ``_EXPORTS = {name: module}`` map (empty where it has none)."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "_EXPORTS"
                and isinstance(node.value, ast.Dict)):
            return {ast.literal_eval(k): ast.literal_eval(v)
                    for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if k is not None}
    return {}


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports for annotations only."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(nodes: Iterable[ast.AST], annotations: bool) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement among ``nodes`` and inside them; under ``if TYPE_CHECKING:``
    too where ``annotations`` (else only its ``else:`` branch)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif _is_type_checking(node) and not annotations:
            found += _imports(node.orelse, annotations)  # type: ignore[attr-defined]
        else:
            found += _imports(ast.iter_child_nodes(node), annotations)
    return found


@functools.cache
def _parsed() -> dict[str, ast.Module]:
    """Every module's syntax tree, parsed once per test session (the files do not change)."""
    return {name: ast.parse(path.read_text(), str(path)) for name, path in _module_files().items()}


def import_graph(annotations: bool = False) -> dict[str, set[str]]:
    """Module name -> the iclprobe modules it imports (anywhere in its source).

    ``annotations``: also the imports under ``if TYPE_CHECKING:``, which never run (a type
    named in an annotation; a result type and the module that renders it may name each
    other there).
    """
    files = _module_files()
    trees = _parsed()
    exports = {name: _lazy_exports(tree) for name, tree in trees.items()}

    def targets(source: str, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Import):
            return {a.name for a in node.names}
        assert isinstance(node, ast.ImportFrom)
        base = _absolute(source, files[source].name == "__init__.py", node)
        found = set()
        for alias in node.names:
            if f"{base}.{alias.name}" in files:
                found.add(f"{base}.{alias.name}")
            elif alias.name in exports.get(base, {}):
                found.add(exports[base][alias.name])
            else:
                found.add(base)
        return found

    graph: dict[str, set[str]] = {}
    for name, tree in trees.items():
        deps: set[str] = set()
        for node in _imports(tree.body, annotations):
            deps |= {t for t in targets(name, node) if t in files and t != name}
        deps |= {m for m in exports[name].values() if m in files}  # what the package exports
        graph[name] = deps
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def _cycle_in(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One closed path through a component, to print (a -> b -> ... -> a)."""
    members = set(component)
    path, seen = [component[0]], {component[0]}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = [w for w in nxt if w in seen]
        if back:
            return [*path[path.index(back[0]):], back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


def test_the_graph_is_read():
    graph = import_graph()
    assert "iclprobe.alignment.pipeline" in graph
    assert "iclprobe.models.config" in graph["iclprobe.models.gpt"]
    # a name from a lazy package counts as its defining module; function-level imports count
    assert "iclprobe.models.registry" in graph["iclprobe.alignment.config"]
    assert "iclprobe.models.lstm" in graph["iclprobe.models"]
    # annotations only: left out unless asked for
    assert "iclprobe.alignment.result" not in graph["iclprobe.alignment.output.display"]
    assert "iclprobe.alignment.result" in import_graph(True)["iclprobe.alignment.output.display"]


def test_find_cycles_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert _cycle_in(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def _report(graph: dict[str, set[str]], cycles: list[list[str]]) -> list[str]:
    return [" -> ".join(_cycle_in(graph, c)) + f"  ({len(c)} modules)" for c in cycles]


def test_no_import_cycles():
    graph = import_graph()
    lines = _report(graph, find_cycles(graph))
    print("\n".join(lines) or "no import cycles")
    if lines:
        pytest.fail("import cycles among iclprobe's modules:\n" + "\n".join(lines))


#: The one cycle of annotations allowed: `AlignResult` renders itself (repr, HTML, a
#: DataFrame) through the modules that format results, and those name its type.
RENDERING = ["iclprobe.alignment.output.display", "iclprobe.alignment.output.screen",
             "iclprobe.alignment.output.tables", "iclprobe.alignment.result"]


def test_no_other_cycle_even_of_annotations():
    graph = import_graph(annotations=True)
    cycles = find_cycles(graph)
    print("\n".join(_report(graph, cycles)) or "no cycles of annotations")
    others = [c for c in cycles if c != RENDERING]
    assert not others, _report(graph, others)


def test_models_import_nothing_from_training():
    graph = import_graph(annotations=True)  # not even a type
    offenders = {m: sorted(d for d in deps if d.startswith("iclprobe.training"))
                 for m, deps in graph.items() if m.startswith("iclprobe.models")}
    assert {m: d for m, d in offenders.items() if d} == {}
