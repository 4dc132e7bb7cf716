"""kvpool's own benchmark suite, run by ``kvpool bench``.

Every benchmark measures kvpool's way of doing something next to a naive
way of doing the same thing, in the same process, with the trials of the
two interleaved (see :mod:`kvpool.cli.bench.core`), and reports both
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
cluster_put_get    optional: RedisClusterStore, 3 masters      RedisStore, one server
mooncake_put_get   optional: MooncakeStore batched put/get     raw Mooncake batch calls
async_put_get      optional: asyncio cluster/Mooncake stores   their blocking stores
lmcache_remote     optional: LMCache round trip via plugin     LMCache's own connectors
sglang_hicache     optional: SGLang HiCache L3 via backend     SGLang's own backends
vllm_tier          optional: vLLM secondary tier (KVPoolTier)  vLLM's own ``fs`` tier
=================  ==========================================  ==========================

Every benchmark lives in this package, so that ``kvpool bench`` works after
``pip install kvpool``; the longer standalone runs are modules here too
(``python -m kvpool.cli.bench.populate_variants``, ``.store_rounds``,
``.soak``, ``.h2d_copy``).  The repository's ``docs/benchmarks.md`` has the
latest figures, ``docs/measurements.md`` the measured tables.

Registry and plug-ins
---------------------
:data:`BUILTIN` maps names to ``"module:attribute"`` of a
:class:`~kvpool.cli.bench.core.Benchmark`, imported only when the
benchmark runs.  :data:`OPTIONAL` names benchmarks whose module may be missing
or may need an optional dependency; each is imported by module name (never
by file path) and must define::

    def kvpool_benchmark() -> kvpool.cli.bench.Benchmark: ...

When none is found (or its imports fail) the benchmark is reported as
skipped, with the reason, and the run goes on.  :func:`register` adds a
benchmark at run time (for tools and tests).

What a benchmark needs that a machine may lack (a client, a server, Mooncake,
LMCache, SGLang) its ``check`` finds without running it
(:mod:`kvpool.cli.bench.needs`): ``--list`` marks it, a run skips a benchmark
that cannot run at all and prints the reason next to each "n/a" of the rows
it had to leave out.

JSON (``--json FILE``)
----------------------
``{"kvpool": version, "settings": {...}, "machine": {...},
"benchmarks": {name: {"title", "status" ("ok"/"skipped"/"error"), "note",
"subject", "baseline", "variants", "wall_s", "info", "metrics": {key:
{"label", "unit", "higher_is_better", "ratio", "ratio_median", "variants":
{variant: {"trials": [...], "best", "median"}}}}, "left_out": {key: why}}}}``.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from kvpool.cli.bench.core import (
    Benchmark,
    BenchmarkResult,
    Case,
    Lack,
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
    "Lack",
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
    "churn": "kvpool.cli.bench.placement:CHURN",
    "fragmentation": "kvpool.cli.bench.placement:FRAGMENTATION",
    "extent": "kvpool.cli.bench.chunks:EXTENT",
    "paged": "kvpool.cli.bench.chunks:PAGED",
    "byte_array": "kvpool.cli.bench.chunks:BYTE_ARRAY",
    "pool_ready": "kvpool.cli.bench.pool_ready:POOL_READY",
    "put_get": "kvpool.cli.bench.put_get:PUT_GET",
}

#: The hook function an optional benchmark's module or script must define.
HOOK = "kvpool_benchmark"


@dataclass(frozen=True)
class OptionalSource:
    """Where an optional benchmark may be found.

    Attributes:
        title: shown when it is skipped.
        modules: importable module names, tried in order.
        missing: why it cannot run when none of them is installed, in plain
            words for the user (not the module names).
    """

    title: str
    modules: tuple[str, ...] = ()
    missing: str = "its code is not installed"


#: Optional benchmarks, skipped with a note when their code is absent.
OPTIONAL: dict[str, OptionalSource] = {
    "remote_put_get": OptionalSource(
        "put/get through the remote stores (kvpool.remote)",
        modules=("kvpool.cli.bench.remote_put_get",),
        missing="this version of kvpool has no remote-store benchmark yet",
    ),
    # These two start local servers (skipped, with the reason, without them).
    "cluster_put_get": OptionalSource(
        "RedisClusterStore on 3 masters vs RedisStore on one server",
        modules=("kvpool.cli.bench.cluster_put_get",),
    ),
    "mooncake_put_get": OptionalSource(
        "MooncakeStore vs raw Mooncake calls on the same registered memory",
        modules=("kvpool.cli.bench.mooncake_put_get",),
    ),
    "async_put_get": OptionalSource(
        "AsyncRedisClusterStore / AsyncMooncakeStore vs their blocking stores, same servers",
        modules=("kvpool.cli.bench.async_put_get",),
    ),
    # Needs LMCache (the compat venv); starts the servers it measures on.
    "lmcache_remote": OptionalSource(
        "LMCache StorageManager round trip: kvpool's remote plugin vs LMCache's connectors",
        modules=("kvpool.cli.bench.lmcache_remote",),
    ),
    # Needs SGLang (its compat venv); starts the servers it measures on.
    "sglang_hicache": OptionalSource(
        "SGLang HiCache L3 set/get: kvpool's backend vs SGLang's own backends and redis-benchmark",
        modules=("kvpool.cli.bench.sglang_hicache",),
    ),
    # Needs vLLM (its scheduler side); starts the servers it measures on.
    "vllm_tier": OptionalSource(
        "vLLM secondary tier store/load: kvpool's tier vs vLLM's fs tier and redis-benchmark",
        modules=("kvpool.cli.bench.vllm_tier",),
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


def _from_hook(module: object, where: str) -> Benchmark:
    hook = getattr(module, HOOK, None)
    if not callable(hook):
        raise SkipBenchmark(f"{where} defines no {HOOK}() returning a kvpool.cli.bench.Benchmark")
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
            raise SkipBenchmark(f"it needs {exc.name or exc}, which is not installed") from exc
        return _from_hook(module, module_name)
    raise SkipBenchmark(source.missing)


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
