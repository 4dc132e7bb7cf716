"""The package layout: no import cycles, no imports from a layer above, small files.

Every module's imports are read from its syntax tree, function-level imports
included; imports under ``if TYPE_CHECKING:`` are skipped because they never
run.  A cycle is any strongly connected group of two or more modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kvpool"

# Rank of each room: a module may import only from its own room or a lower one.
# The facade (kvpool/__init__.py) and the entry point sit above everything.
LAYER_RANK = {
    "kvpool.errors": 0,
    "kvpool.formats": 0,
    "kvpool.checks": 0,
    "kvpool.misuse": 0,
    "kvpool.native": 1,
    "kvpool.native.buffer": 1,
    "kvpool.native.machine": 1,
    "kvpool.pool": 2,
    "kvpool.allocators": 3,
    "kvpool.devdax": 3,
    "kvpool.helpers": 3,
    "kvpool.remote": 4,
    "kvpool.metrics": 5,
    "kvpool.integrations.shared": 5,
    "kvpool.integrations": 6,
    "kvpool.cli": 7,
    "kvpool.__main__": 8,
    "kvpool": 9,
}
MAX_TOP_LEVEL_MODULES = 12
MAX_LINES = 700


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(id(sub) for sub in ast.walk(child))
    return skipped


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "_pinmem_ffi" not in p.name}
    known = set(files)
    return {name: _imports(path, name, known) for name, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iterative; groups of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        group.append(top)
                        if top == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def _rank(module: str) -> int:
    best = ""
    for room in LAYER_RANK:
        if (module == room or module.startswith(room + ".")) and len(room) > len(best):
            best = room
    if not best:
        raise LookupError(f"{module} belongs to no room in LAYER_RANK; add it there")
    return LAYER_RANK[best]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (function-level imports count): " + "; ".join(
        " <-> ".join(group) for group in cycles
    )


def test_no_import_from_a_layer_above() -> None:
    upward = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in sorted(targets)
        if _rank(target) > _rank(module)
    ]
    assert not upward, "imports that run up a layer: " + "; ".join(upward)


def test_top_level_stays_small() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py") if "_pinmem_ffi" not in p.name)
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {top}"


# _pinmem_ffi.py is generated by cffi at build time, not written by us.
_SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "_pinmem_ffi" not in p.name)


@pytest.mark.parametrize("path", _SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_is_small_and_says_its_job(path: Path) -> None:
    text = path.read_text()
    lines = text.count("\n")
    assert lines <= MAX_LINES, f"{path.name}: {lines} lines (limit {MAX_LINES}); split it by job"
    doc = ast.get_docstring(ast.parse(text))
    assert doc and doc.strip(), f"{path.name}: the first line must say the module's one job"
