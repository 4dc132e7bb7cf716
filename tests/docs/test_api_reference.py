"""The API reference lists every public name: each ``::: path`` directive resolves to the object.

``docs/reference/*.md`` render objects with mkdocstrings' ``::: dotted.path``
directives.  For each module whose public names the reference promises
(``kvpool``, ``kvpool.remote``, ``kvpool.integrations.lmcache``), every
name in its ``__all__`` must have a directive whose path ends in that name
and resolves (by import) to the very object the module exports (or the
function its export wraps).  Modules
that need LMCache to import are read with ``ast`` instead.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.MULTILINE)

IMPORTED = ["kvpool", "kvpool.remote", "kvpool.integrations.lmcache"]
# Modules that import LMCache, SGLang or vLLM (a module of kvpool.integrations.vllm
# imports vLLM through its package): their __all__ is read from the source.
STATIC = [
    "kvpool.integrations.vllm.tier",
    "kvpool.integrations.vllm.config",
    "kvpool.integrations.vllm.keys",
    "kvpool.integrations.vllm.metrics",
    "kvpool.integrations.lmcache.remote",
    "kvpool.integrations.sglang.storage",
    "kvpool.integrations.sglang.config",
    "kvpool.integrations.sglang.metrics",
]


def directives() -> list[str]:
    """Every ``:::`` path of the reference pages."""
    pages = sorted(REFERENCE.glob("*.md"))
    return [m for page in pages for m in DIRECTIVE.findall(page.read_text())]


def resolve(path: str) -> object:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def same(documented: object, exported: object) -> bool:
    """True when both are one object, seen through wrappers (``functools.wraps``).

    kvpool wraps some public functions in its package namespace (a check of
    their keywords); the reference renders the function the wrapper wraps.
    """
    return inspect.unwrap(documented) is inspect.unwrap(exported)  # type: ignore[arg-type]


def static_all(module: str) -> list[str]:
    """``__all__`` of a module, read from its source without importing it."""
    source = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no __all__")


def test_every_directive_resolves() -> None:
    bad = []
    for path in directives():
        if any(path.startswith(m + ".") for m in STATIC):
            continue
        try:
            resolve(path)
        except (ImportError, AttributeError) as exc:
            bad.append(f"{path}: {exc!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", IMPORTED)
def test_reference_lists_every_public_name(module: str) -> None:
    mod = importlib.import_module(module)
    listed: dict[str, list[str]] = {}
    for path in directives():
        listed.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    missing = []
    for name in mod.__all__:
        exported = getattr(mod, name)
        paths = [
            p
            for p in listed.get(name, [])
            if not any(p.startswith(m + ".") for m in STATIC) and same(resolve(p), exported)
        ]
        if not paths:
            missing.append(name)
    assert not missing, f"{module}.__all__ names missing from docs/reference: {missing}"


@pytest.mark.parametrize("module", STATIC)
def test_reference_lists_every_public_name_of_lmcache_modules(module: str) -> None:
    if not ROOT.joinpath(*module.split(".")).with_suffix(".py").exists():
        pytest.fail(f"{module} is named in STATIC but does not exist")
    listed = set(directives())
    missing = [n for n in static_all(module) if f"{module}.{n}" not in listed]
    assert not missing, f"{module}.__all__ names missing from docs/reference: {missing}"
