"""MooncakeStore against raw Mooncake calls on the same registered memory, 64 x 512 KiB.

A Mooncake master and one storage node are started on loopback
(:func:`~kvpool.cli.bench.localservers.start_mooncake`, TCP).  64 KV chunks
of 512 KiB live in a :class:`kvpool.MixedMemoryAllocator`; one
:class:`~kvpool.remote.MooncakeStore` registers that pool's memory.

* subject: ``store.batched_put(keys, chunks)`` (header slot + chunk as
  one object, reserved, sent and sealed in one batch) and
  ``store.batched_get(keys, pool, shape, dtype, fmt)`` (allocates the 64
  destination chunks, reads header + bytes, checks each header);
* baseline: the same client's ``batch_put_from(keys, data_ptrs, sizes)``
  and ``batch_get_into(keys, data_ptrs, sizes)`` into 64 chunks allocated
  beforehand - no header, no check, no allocation;
* also shown: the raw multi-buffer calls with a 64-byte header slot per
  chunk, what Mooncake itself charges for a second buffer per object.

Every round uses new keys for both (a Mooncake put keeps the first value
of a key); each round's chunks are verified and its keys removed after the
timing.  Run alone: ``kvpool bench --only mooncake_put_get``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvpool.cli.bench import needs
from kvpool.cli.bench.core import Benchmark, Case, Lack, Metric, MiB, Settings, SkipBenchmark
from kvpool.formats import MemoryFormat

__all__ = ["MOONCAKE_PUT_GET", "kvpool_benchmark", "mooncake_env", "mooncake_folder"]

_SHAPE = torch.Size([2, 16, 64, 128])  # 512 KiB of bfloat16
_DTYPE = torch.bfloat16
_CHUNK = _SHAPE.numel() * _DTYPE.itemsize
_CHUNKS = 64
_FMT = MemoryFormat.KV_2LTD


def mooncake_folder() -> Path:
    """The installed ``mooncake`` package folder (its binaries), or SkipBenchmark saying why not."""
    why = needs.mooncake()
    folder = needs.mooncake_folder()
    if why is not None or folder is None:
        raise SkipBenchmark(why or "Mooncake is not installed (pip install 'kvpool[mooncake]')")
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        raise SkipBenchmark(f"Mooncake's client does not load: {exc}") from exc
    return folder


def mooncake_env() -> Callable[[], None]:
    """Set the Mooncake client's environment for a run; returns what restores it.

    Loopback (``MC_TCP_BIND_ADDRESS``), and only Mooncake's errors on
    stderr, not its INFO lines (``MC_LOG_LEVEL``); values already set stay.
    """
    saved = {name: os.environ.get(name) for name in ("MC_TCP_BIND_ADDRESS", "MC_LOG_LEVEL")}
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")

    def restore_env() -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return restore_env


def _setup(settings: Settings) -> Case:
    from kvpool.allocators import MixedMemoryAllocator
    from kvpool.cli.bench.localservers import start_mooncake
    from kvpool.remote import MooncakeStore

    folder = mooncake_folder()
    rounds = settings.count(8, minimum=2)
    per_round = _CHUNKS * _CHUNK
    restore_env = mooncake_env()  # restored in cleanup
    try:
        deployment = start_mooncake(folder, "1 GB")
    except BaseException:
        restore_env()
        raise
    pool = store = None
    try:
        store = MooncakeStore(deployment.master, metadata=deployment.metadata, timeout=30.0)
        pool = MixedMemoryAllocator(3 * per_round + 8 * MiB)
        src = pool.batched_allocate(_SHAPE, _DTYPE, _CHUNKS, _FMT)
        dst = pool.batched_allocate(_SHAPE, _DTYPE, _CHUNKS, _FMT)
        if src is None or dst is None:
            raise RuntimeError("the benchmark pool is too small for its chunks")
    except BaseException:
        if store is not None:
            store.close()
        if pool is not None:
            pool.close()
        deployment.stop()
        restore_env()
        raise
    client = store.client
    rng = np.random.default_rng(settings.seed)
    payload = [rng.integers(0, 256, size=_CHUNK, dtype=np.uint8).tobytes() for _ in range(_CHUNKS)]
    for obj, data in zip(src, payload, strict=True):
        obj.byte_array[:] = data
    src_ptrs = [o.data_ptr for o in src]
    dst_ptrs = [o.data_ptr for o in dst]
    sizes = [_CHUNK] * _CHUNKS
    counter = iter(range(1 << 62))
    info: dict[str, Any] = {
        "chunks": _CHUNKS,
        "chunk_bytes": _CHUNK,
        "rounds_per_trial": rounds,
        "protocol": "tcp (loopback)",
        "master": deployment.master,
        "verified": True,
    }

    def fresh_keys(tag: str) -> list[str]:
        n = next(counter)
        return [f"bench-{tag}-{n}-{i}" for i in range(_CHUNKS)]

    def check(views: list[Any], what: str) -> None:
        for i, view in enumerate(views):
            if bytes(view) != payload[i]:
                info["verified"] = False
                raise RuntimeError(f"{what}: chunk {i} read back differs from what was put")

    def store_trial() -> dict[str, float]:
        put_s = get_s = 0.0
        for _ in range(rounds):
            keys = fresh_keys("store")
            start = time.perf_counter()
            store.batched_put(keys, src)
            put_s += time.perf_counter() - start
            start = time.perf_counter()
            got = store.batched_get(keys, pool, _SHAPE, _DTYPE, _FMT)
            get_s += time.perf_counter() - start
            check([g.byte_array for g in got], "MooncakeStore")  # type: ignore[union-attr]
            pool.batched_free(got)  # type: ignore[arg-type]
            client.batch_remove([store.object_key(k) for k in keys], True)
        return {"put": rounds * per_round / put_s / 1e9, "get": rounds * per_round / get_s / 1e9}

    def raw_trial() -> dict[str, float]:
        put_s = get_s = 0.0
        for _ in range(rounds):
            keys = fresh_keys("raw")
            start = time.perf_counter()
            put = client.batch_put_from(keys, src_ptrs, sizes)
            put_s += time.perf_counter() - start
            start = time.perf_counter()
            got = client.batch_get_into(keys, dst_ptrs, sizes)
            get_s += time.perf_counter() - start
            if any(rc != 0 for rc in put) or any(rc != _CHUNK for rc in got):
                raise RuntimeError(f"raw Mooncake calls failed: put {put[:4]}, get {got[:4]}")
            check([o.byte_array for o in dst], "raw Mooncake")
            for obj in dst:
                obj.byte_array[:16] = bytes(16)
            client.batch_remove(keys, True)
        return {"put": rounds * per_round / put_s / 1e9, "get": rounds * per_round / get_s / 1e9}

    slots = torch.zeros(64 * _CHUNKS, dtype=torch.uint8)
    if client.register_buffer(slots.data_ptr(), slots.numel()) != 0:
        raise RuntimeError("Mooncake refused to register the header slots")
    header_ptrs = [slots.data_ptr() + 64 * i for i in range(_CHUNKS)]

    def multi_trial() -> dict[str, float]:
        # Raw, but with kvpool's two buffers per object: a 64-byte header slot
        # and the chunk.  What Mooncake itself charges for the second buffer.
        put_s = get_s = 0.0
        buffers = [[h, p] for h, p in zip(header_ptrs, src_ptrs, strict=True)]
        into = [[h, p] for h, p in zip(header_ptrs, dst_ptrs, strict=True)]
        both = [[64, _CHUNK]] * _CHUNKS
        for _ in range(rounds):
            keys = fresh_keys("multi")
            start = time.perf_counter()
            put = client.batch_put_from_multi_buffers(keys, buffers, both)
            put_s += time.perf_counter() - start
            start = time.perf_counter()
            got = client.batch_get_into_multi_buffers(keys, into, both)
            get_s += time.perf_counter() - start
            if any(rc != 0 for rc in put) or any(rc != 64 + _CHUNK for rc in got):
                raise RuntimeError(f"raw Mooncake calls failed: put {put[:4]}, get {got[:4]}")
            check([o.byte_array for o in dst], "raw multi-buffer Mooncake")
            client.batch_remove(keys, True)
        return {"put": rounds * per_round / put_s / 1e9, "get": rounds * per_round / get_s / 1e9}

    store_trial()  # warm-up: registration, connections, segment pages
    raw_trial()
    multi_trial()

    def cleanup() -> None:
        client.unregister_buffer(slots.data_ptr())
        pool.batched_free(src)
        pool.batched_free(dst)
        store.close()
        pool.close()
        deployment.stop()
        restore_env()

    subject = "kvpool MooncakeStore batched_put/get"
    baseline = "raw batch_put_from/batch_get_into"
    return Case(
        metrics=[
            Metric("put", f"put {_CHUNKS} x 512 KiB", "GB/s", True),
            Metric("get", f"get {_CHUNKS} x 512 KiB", "GB/s", True),
        ],
        variants={
            subject: store_trial,
            baseline: raw_trial,
            "raw multi-buffer calls (header slot + chunk)": multi_trial,
        },
        subject=subject,
        baseline=baseline,
        info=info,
        cleanup=cleanup,
    )


MOONCAKE_PUT_GET = Benchmark(
    "mooncake_put_get",
    "MooncakeStore put/get of 64 x 512 KiB vs raw Mooncake calls on the same memory",
    _setup,
    lambda: [Lack("", why)] if (why := needs.mooncake()) else [],
)


def kvpool_benchmark() -> Benchmark:
    """The hook :mod:`kvpool.cli.bench` looks for."""
    return MOONCAKE_PUT_GET
