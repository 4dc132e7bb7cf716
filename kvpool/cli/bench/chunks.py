"""KV-chunk benchmarks: extent and paged allocation, and ``byte_array`` views.

* ``extent`` -- :class:`kvpool.TensorMemoryAllocator` handing out 512 KiB
  KV chunks (one at a time, and 64 at a time) against a ``torch.empty``
  per chunk, which is what code without a pool does.
* ``paged`` -- :class:`kvpool.PagedTensorMemoryAllocator` against
  :class:`~kvpool.cli.bench.naive.SlicePagedPool` (a free list of pages
  and a fresh tensor slice per allocation).
* ``byte_array`` -- the cost of ``obj.byte_array`` (a zero-copy memoryview)
  against a ctypes array built at the object's address on every access
  (the reference's way), on 16 objects of 16 sizes; then the first view of
  many distinct sizes and the memory that leaves behind.  An extra
  variant caches the ctypes array type per size, as the reference's newer
  code does, to show what that cache costs in memory.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from kvpool.cli.bench.core import Benchmark, Case, Metric, MiB, Settings
from kvpool.cli.bench.naive import SlicePagedPool
from kvpool.formats import MemoryFormat
from kvpool.native.machine import rss_bytes
from kvpool.pool.extent import TensorMemoryAllocator
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.paged import PagedTensorMemoryAllocator

__all__ = ["BYTE_ARRAY", "EXTENT", "KV_DTYPE", "KV_SHAPE", "PAGED", "rss_bytes"]

#: One KV chunk: [K/V, layers=4, tokens=256, head dim=128] in fp16 = 512 KiB.
KV_SHAPE = torch.Size([2, 4, 256, 128])
KV_DTYPE = torch.float16
_KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize
_BATCH = 64
_POOL_BYTES = 256 * MiB  # 512 chunks
_FMT = MemoryFormat.KV_2LTD


_PAGE = os.sysconf("SC_PAGESIZE")
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only


def _release_free_heap() -> None:
    """Collect garbage and hand free heap pages back to the OS (glibc ``malloc_trim``).

    Without it, memory one variant freed is reused by the next one and
    hides that variant's growth, so the RSS figures would depend on the
    order in which the variants ran.
    """
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


def _must(obj: TensorMemoryObj | None) -> TensorMemoryObj:
    """The object, or RuntimeError when the pool returned None (full)."""
    if obj is None:
        raise RuntimeError("the benchmark's pool is unexpectedly full")
    return obj


def _alloc_metrics() -> list[Metric]:
    return [
        Metric("single", "allocate+free, 512 KiB chunk", "us/obj"),
        Metric("batched", f"batched allocate+free x{_BATCH}", "us/obj"),
    ]


def _time_pairs(n: int, pair: Callable[[], None]) -> float:
    start = time.perf_counter()
    for _ in range(n):
        pair()
    return (time.perf_counter() - start) / n * 1e6


# ---------------------------------------------------------------------------
# extent
# ---------------------------------------------------------------------------


def _setup_extent(settings: Settings) -> Case:
    pairs = settings.count(50_000, minimum=100)
    rounds = settings.count(1_000, minimum=10)
    pool = TensorMemoryAllocator(torch.empty(_POOL_BYTES, dtype=torch.uint8))
    subject, baseline = "kvpool TensorMemoryAllocator", "torch.empty per chunk"

    def kv_pair() -> None:
        pool.allocate(KV_SHAPE, KV_DTYPE, _FMT).ref_count_down()  # type: ignore[union-attr]

    def kv_batch() -> None:
        pool.batched_free(pool.batched_allocate(KV_SHAPE, KV_DTYPE, _BATCH, _FMT))  # type: ignore[arg-type]

    def torch_pair() -> None:
        torch.empty(KV_SHAPE, dtype=KV_DTYPE)

    def torch_batch() -> None:
        chunks = [torch.empty(KV_SHAPE, dtype=KV_DTYPE) for _ in range(_BATCH)]
        del chunks

    def variant(pair: Callable[[], None], batch: Callable[[], None]) -> Callable[[], dict]:
        def trial() -> dict[str, float]:
            return {
                "single": _time_pairs(pairs, pair),
                "batched": _time_pairs(rounds, batch) / _BATCH,
            }

        return trial

    info: dict[str, Any] = {"pairs": pairs, "batch_rounds": rounds, "chunk_bytes": _KV_BYTES}

    def cleanup() -> None:
        info["memcheck"] = pool.memcheck()
        info["active_allocations_end"] = pool.num_active_allocations
        pool.close()

    return Case(
        metrics=_alloc_metrics(),
        variants={subject: variant(kv_pair, kv_batch), baseline: variant(torch_pair, torch_batch)},
        subject=subject,
        baseline=baseline,
        info=info,
        cleanup=cleanup,
    )


EXTENT = Benchmark(
    "extent", "extent pool: allocate+free of 512 KiB KV chunks, one and 64 at a time", _setup_extent
)


# ---------------------------------------------------------------------------
# paged
# ---------------------------------------------------------------------------


def _setup_paged(settings: Settings) -> Case:
    pairs = settings.count(50_000, minimum=100)
    rounds = settings.count(2_000, minimum=10)
    pool = PagedTensorMemoryAllocator(
        torch.empty(_POOL_BYTES, dtype=torch.uint8), [KV_SHAPE], [KV_DTYPE], _FMT
    )
    naive = SlicePagedPool(torch.empty(_POOL_BYTES, dtype=torch.uint8), KV_SHAPE, KV_DTYPE)
    subject, baseline = "kvpool PagedTensorMemoryAllocator", "free list + tensor slice"

    def kv_pair() -> None:
        pool.allocate(KV_SHAPE, KV_DTYPE, _FMT).ref_count_down()  # type: ignore[union-attr]

    def kv_batch() -> None:
        pool.batched_free(pool.batched_allocate(KV_SHAPE, KV_DTYPE, _BATCH, _FMT))  # type: ignore[arg-type]

    def naive_pair() -> None:
        naive.free(naive.allocate()[0])  # type: ignore[index]

    def naive_batch() -> None:
        free = naive.free
        for page, _ in naive.batched_allocate(_BATCH):  # type: ignore[union-attr]
            free(page)

    def variant(pair: Callable[[], None], batch: Callable[[], None]) -> Callable[[], dict]:
        def trial() -> dict[str, float]:
            return {
                "single": _time_pairs(pairs, pair),
                "batched": _time_pairs(rounds, batch) / _BATCH,
            }

        return trial

    info: dict[str, Any] = {
        "pairs": pairs,
        "batch_rounds": rounds,
        "pages": pool.num_pages,
        "page_bytes": _KV_BYTES,
    }

    def cleanup() -> None:
        info["memcheck"] = pool.memcheck()
        info["active_allocations_end"] = pool.num_active_allocations
        pool.close()

    return Case(
        metrics=_alloc_metrics(),
        variants={subject: variant(kv_pair, kv_batch), baseline: variant(naive_pair, naive_batch)},
        subject=subject,
        baseline=baseline,
        info=info,
        cleanup=cleanup,
    )


PAGED = Benchmark(
    "paged", "paged pool: allocate+free of one-page KV chunks, one and 64 at a time", _setup_paged
)


# ---------------------------------------------------------------------------
# byte_array
# ---------------------------------------------------------------------------

_c_ubyte = ctypes.c_ubyte


def _ctypes_view(address: int, size: int) -> memoryview:
    """A fresh ctypes array (type looked up or built for ``size``) at ``address``."""
    return memoryview((_c_ubyte * size).from_address(address))


def _setup_byte_array(settings: Settings) -> Case:
    accesses = settings.count(200_000, minimum=1_000)
    distinct = settings.count(20_000, minimum=200)
    pool = TensorMemoryAllocator(torch.empty(64 * MiB, dtype=torch.uint8))
    objs = [
        _must(pool.allocate(torch.Size([2, 4, 16 * k, 128]), KV_DTYPE, _FMT)) for k in range(1, 17)
    ]
    where = [(o.data_ptr, o.get_size()) for o in objs]
    for o, (_, size) in zip(objs, where, strict=True):
        if len(o.byte_array) != size:
            raise RuntimeError(f"byte_array of {o!r} has the wrong length")
    # Distinct sizes come from a second pool: 4 KiB + 8 i bytes, BINARY objects.
    scratch = TensorMemoryAllocator(torch.empty(16 * MiB + 8 * distinct, dtype=torch.uint8))
    subject = "kvpool byte_array"
    baseline = "ctypes array per access"
    cached = "ctypes type cached per size"

    def kv_access() -> float:
        start = time.perf_counter()
        for i in range(accesses):
            objs[i & 15].byte_array  # noqa: B018 - the access is what is timed
        return (time.perf_counter() - start) / accesses * 1e9

    def make_ctypes_access(view: Callable[[int, int], memoryview]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            for i in range(accesses):
                view(*where[i & 15])
            return (time.perf_counter() - start) / accesses * 1e9

        return run

    def distinct_sizes(view: Callable[[Any], Any]) -> tuple[float, float]:
        """Allocate objects of ``distinct`` new sizes and view each once.

        Returns (microseconds per first view, RSS growth in MiB).
        """
        _release_free_heap()
        rss0 = rss_bytes()
        spent = 0
        clock = time.perf_counter_ns
        for i in range(distinct):
            obj = _must(
                scratch.allocate(torch.Size([4096 + 8 * i]), torch.uint8, MemoryFormat.BINARY)
            )
            start = clock()
            mv = view(obj)
            spent += clock() - start
            del mv
            obj.ref_count_down()
        gc.collect()
        return spent / distinct / 1e3, (rss_bytes() - rss0) / MiB

    def kv_trial() -> dict[str, float]:
        new, rss = distinct_sizes(lambda o: o.byte_array)
        return {"access": kv_access(), "new_size": new, "rss": rss}

    baseline_access = make_ctypes_access(_ctypes_view)

    def baseline_trial() -> dict[str, float]:
        new, rss = distinct_sizes(lambda o: _ctypes_view(o.data_ptr, o.get_size()))
        return {"access": baseline_access(), "new_size": new, "rss": rss}

    def cached_trial() -> dict[str, float]:
        # A fresh cache per trial, so each trial starts from the same state.
        array_type = functools.lru_cache(maxsize=None)(lambda n: _c_ubyte * n)

        def view(address: int, size: int) -> memoryview:
            return memoryview(array_type(size).from_address(address))

        access = make_ctypes_access(view)()
        new, rss = distinct_sizes(lambda o: view(o.data_ptr, o.get_size()))
        array_type.cache_clear()
        return {"access": access, "new_size": new, "rss": rss}

    info: dict[str, Any] = {
        "accesses": accesses,
        "object_sizes": [size for _, size in where],
        "distinct_sizes": distinct,
        "distinct_size_bytes": f"4096 + 8 i, i < {distinct}",
    }

    def cleanup() -> None:
        for o in objs:
            o.ref_count_down()
        info["memcheck"] = pool.memcheck() and scratch.memcheck()
        pool.close()
        scratch.close()

    return Case(
        metrics=[
            Metric("access", "view, 16 objects of 16 sizes", "ns/access"),
            Metric("new_size", f"first view of {distinct:,} new sizes", "us/size"),
            Metric("rss", f"RSS growth, {distinct:,} new sizes", "MiB", ratio=False),
        ],
        variants={subject: kv_trial, baseline: baseline_trial, cached: cached_trial},
        subject=subject,
        baseline=baseline,
        info=info,
        cleanup=cleanup,
    )


BYTE_ARRAY = Benchmark(
    "byte_array",
    "byte_array views: cost per access, and memory kept by many distinct sizes",
    _setup_byte_array,
)
