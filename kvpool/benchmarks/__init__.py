"""kvpool's own benchmark suite, run by ``kvpool bench``.

Every benchmark measures kvpool's way of doing something next to a naive
way of doing the same thing, in the same process, with the trials of the
two interleaved (see :mod:`kvpool.benchmarks.core`), and reports both
figures and their ratio (> 1: kvpool is better).

=================  ==========================================  ==========================
name               kvpool                                      baseline
=================  ==========================================  ==========================
churn              AddressManager, random allocate/free        first-fit sorted free list
fragmentation      AddressManager past 10,000 holes            first-fit sorted free list
extent             TensorMemoryAllocator, 512 KiB KV chunks    ``torch.empty`` per chunk
paged              PagedTensorMemoryAllocator                  free list + tensor slice
byte_array         ``obj.byte_array``                          ctypes array per access
pool_ready         ``allocate_host(size, hugepages="auto")``   ``torch.zeros(size)``
put_get            ``byte_array`` to a /dev/shm file and back  ``np.copyto`` (memcpy)
remote_put_get     optional: the remote stores' benchmark      (its own)
=================  ==========================================  ==========================

The code lives in the package (not in the repository's top-level
``bench/``) so that ``kvpool bench`` works after ``pip install kvpool``;
``bench/`` holds scripts and notes that build on these modules.

Registry and plug-ins
---------------------
:data:`BUILTIN` maps names to ``"module:attribute"`` of a
:class:`~kvpool.benchmarks.core.Benchmark`, imported only when the
benchmark runs.  :data:`OPTIONAL` names benchmarks that live elsewhere and
may be missing; each is looked up, in order, as a module of the installed
package and as a script of a source checkout, and must define::

    def kvpool_benchmark() -> kvpool.benchmarks.Benchmark: ...

When none is found (or its imports fail) the benchmark is reported as
skipped, with the reason, and the run goes on.  :func:`register` adds a
benchmark at run time (for tools and tests).

JSON (``--json FILE``)
----------------------
``{"kvpool": version, "settings": {...}, "machine": {...},
"benchmarks": {name: {"title", "status" ("ok"/"skipped"/"error"), "note",
"subject", "baseline", "variants", "wall_s", "info", "metrics": {key:
{"label", "unit", "higher_is_better", "ratio", "ratio_median", "variants":
{variant: {"trials": [...], "best", "median"}}}}}}}``.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from kvpool.benchmarks.core import (
    Benchmark,
    BenchmarkResult,
    Case,
    Metric,
    MetricResult,
    Settings,
    SkipBenchmark,
    run_benchmark,
)

__all__ = [
    "BUILTIN",
    "OPTIONAL",
    "Benchmark",
    "BenchmarkResult",
    "Case",
    "Metric",
    "MetricResult",
    "OptionalSource",
    "Settings",
    "SkipBenchmark",
    "names",
    "register",
    "resolve",
    "run_benchmark",
]

#: Built-in benchmarks: name -> "module:attribute", in the order they run.
BUILTIN: dict[str, str] = {
    "churn": "kvpool.benchmarks.placement:CHURN",
    "fragmentation": "kvpool.benchmarks.placement:FRAGMENTATION",
    "extent": "kvpool.benchmarks.chunks:EXTENT",
    "paged": "kvpool.benchmarks.chunks:PAGED",
    "byte_array": "kvpool.benchmarks.chunks:BYTE_ARRAY",
    "pool_ready": "kvpool.benchmarks.pool_ready:POOL_READY",
    "put_get": "kvpool.benchmarks.put_get:PUT_GET",
}

#: The hook function an optional benchmark's module or script must define.
HOOK = "kvpool_benchmark"


@dataclass(frozen=True)
class OptionalSource:
    """Where an optional benchmark may be found.

    Attributes:
        title: shown when it is skipped.
        modules: importable module names tried first (installed package).
        scripts: paths relative to a source checkout's root, tried next.
    """

    title: str
    modules: tuple[str, ...] = ()
    scripts: tuple[str, ...] = ()


#: Optional benchmarks, skipped with a note when their code is absent.
OPTIONAL: dict[str, OptionalSource] = {
    "remote_put_get": OptionalSource(
        "put/get through the remote stores (kvpool.remote)",
        modules=("kvpool.benchmarks.remote_put_get",),
        scripts=("bench/put_get.py",),
    ),
}

_registered: dict[str, Benchmark] = {}


def register(bench: Benchmark) -> None:
    """Add (or replace) a benchmark for this process; it runs after the built-in ones."""
    _registered[bench.name] = bench


def names() -> list[str]:
    """Every benchmark name, in run order: built-in, optional, then registered."""
    out = list(BUILTIN) + [n for n in OPTIONAL if n not in BUILTIN]
    return out + [n for n in _registered if n not in out]


def _checkout_root() -> Path | None:
    """The source checkout kvpool runs from, or None for an installed package."""
    root = Path(__file__).resolve().parent.parent.parent
    return root if (root / "libpinmem" / "pinmem.h").is_file() else None


def _from_hook(module: object, where: str) -> Benchmark:
    hook = getattr(module, HOOK, None)
    if not callable(hook):
        raise SkipBenchmark(f"{where} defines no {HOOK}() returning a kvpool.benchmarks.Benchmark")
    bench = hook()
    if not isinstance(bench, Benchmark):
        raise TypeError(f"{where}: {HOOK}() returned {type(bench).__name__}, not a Benchmark")
    return bench


def _load_optional(name: str, source: OptionalSource) -> Benchmark:
    for module_name in source.modules:
        if importlib.util.find_spec(module_name) is None:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise SkipBenchmark(f"{module_name} cannot be imported: {exc}") from exc
        return _from_hook(module, module_name)
    root = _checkout_root()
    for script in source.scripts:
        path = root / script if root is not None else None
        if path is None or not path.is_file():
            continue
        spec = importlib.util.spec_from_file_location(f"_kvpool_bench_{name}", path)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as exc:
            raise SkipBenchmark(f"{script} cannot be imported: {exc}") from exc
        return _from_hook(module, script)
    tried = list(source.modules) + list(source.scripts)
    raise SkipBenchmark(f"not available yet (looked for {', '.join(tried)} with {HOOK}())")


def resolve(name: str) -> Benchmark:
    """Return the benchmark called ``name``, importing its code.

    Raises:
        KeyError: no such benchmark.
        SkipBenchmark: an optional benchmark whose code is absent.
    """
    if name in _registered:
        return _registered[name]
    if name in BUILTIN:
        module_name, attr = BUILTIN[name].split(":")
        return getattr(importlib.import_module(module_name), attr)  # type: ignore[no-any-return]
    if name in OPTIONAL:
        return _load_optional(name, OPTIONAL[name])
    raise KeyError(f"no benchmark named {name!r}; choose from {', '.join(names())}")
