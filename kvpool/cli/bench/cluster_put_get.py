"""RedisClusterStore on a three-master cluster against RedisStore on one server, 64 x 512 KiB.

Three cluster masters and one plain server are started on loopback
(:mod:`kvpool.cli.bench.localservers`, same flags, no persistence).  64 KV
chunks of 512 KiB live in a :class:`kvpool.MixedMemoryAllocator`.

* subject: :class:`~kvpool.remote.RedisClusterStore` ``batched_put`` /
  ``batched_get`` - keys hashed to their slots, grouped per master,
  pipelined per connection;
* baseline: :class:`~kvpool.remote.RedisStore` on the one server, the same
  calls.

Both use the same wire format and connection layer, so the ratio is the
price of routing.  The chunks read back are verified and freed after the
timing.  Run alone: ``kvpool bench --only cluster_put_get``.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

import numpy as np
import torch

from kvpool.cli.bench import needs
from kvpool.cli.bench.core import Benchmark, Case, Lack, Metric, MiB, Settings, SkipBenchmark
from kvpool.formats import MemoryFormat

__all__ = ["CLUSTER_PUT_GET", "cluster_binaries", "cluster_lacks", "kvpool_benchmark"]

_SHAPE = torch.Size([2, 16, 64, 128])  # 512 KiB of bfloat16
_DTYPE = torch.bfloat16
_CHUNK = _SHAPE.numel() * _DTYPE.itemsize
_CHUNKS = 64
_FMT = MemoryFormat.KV_2LTD


def cluster_lacks() -> str | None:
    """Why no cluster can be measured here (the redis client, a server, its cli), or None."""
    return needs.redis_client() or needs.redis_cluster_tools()


def cluster_binaries() -> tuple[str, str]:
    """``(redis-server, redis-cli)`` (or the valkey ones), or SkipBenchmark saying what lacks."""
    why = cluster_lacks()
    server = shutil.which("redis-server") or shutil.which("valkey-server")
    cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if why is not None or server is None or cli is None:
        raise SkipBenchmark(why or f"no redis-server or redis-cli on PATH ({needs.SERVER_FIX})")
    return server, cli


def _setup(settings: Settings) -> Case:
    from kvpool.allocators import MixedMemoryAllocator
    from kvpool.cli.bench.localservers import start_cluster, start_redis
    from kvpool.remote import RedisClusterStore, RedisStore

    server, cli = cluster_binaries()
    rounds = settings.count(8, minimum=2)
    per_round = _CHUNKS * _CHUNK
    cluster = start_cluster(server, cli)
    single = None
    stores: list[Any] = []
    pool = None
    try:
        single = start_redis(server)
        clustered = RedisClusterStore(cluster.url, timeout=30.0)
        stores.append(clustered)
        plain = RedisStore(single.url, timeout=30.0)
        stores.append(plain)
        pool = MixedMemoryAllocator(2 * per_round + 8 * MiB)
        src = pool.batched_allocate(_SHAPE, _DTYPE, _CHUNKS, _FMT)
        if src is None:
            raise RuntimeError("the benchmark pool is too small for its chunks")
    except BaseException:
        for store in stores:
            store.close()
        if pool is not None:
            pool.close()
        if single is not None:
            single.stop()
        cluster.stop()
        raise
    rng = np.random.default_rng(settings.seed)
    payload = [rng.integers(0, 256, size=_CHUNK, dtype=np.uint8).tobytes() for _ in range(_CHUNKS)]
    for obj, data in zip(src, payload, strict=True):
        obj.byte_array[:] = data
    keys = [f"bench-{i}" for i in range(_CHUNKS)]
    info: dict[str, Any] = {
        "chunks": _CHUNKS,
        "chunk_bytes": _CHUNK,
        "rounds_per_trial": rounds,
        "cluster": cluster.url,
        "masters": len(cluster.ports),
        "single": single.url,
        "verified": True,
    }

    def trial(store: Any) -> dict[str, float]:
        put_s = get_s = 0.0
        for _ in range(rounds):
            start = time.perf_counter()
            store.batched_put(keys, src)
            put_s += time.perf_counter() - start
            start = time.perf_counter()
            got = store.batched_get(keys, pool, _SHAPE, _DTYPE, _FMT)
            get_s += time.perf_counter() - start
            for i, obj in enumerate(got):
                if obj is None or bytes(obj.byte_array) != payload[i]:
                    info["verified"] = False
                    raise RuntimeError(f"{store!r}: chunk {i} read back differs from what was put")
            pool.batched_free(got)  # type: ignore[arg-type]
        return {"put": rounds * per_round / put_s / 1e9, "get": rounds * per_round / get_s / 1e9}

    trial(clustered)  # warm-up: connections, server memory
    trial(plain)

    def cleanup() -> None:
        for store in stores:
            store.close()
        pool.batched_free(src)
        pool.close()
        single.stop()
        cluster.stop()

    subject = "kvpool RedisClusterStore (3 masters)"
    baseline = "kvpool RedisStore (1 server)"
    return Case(
        metrics=[
            Metric("put", f"put {_CHUNKS} x 512 KiB", "GB/s", True),
            Metric("get", f"get {_CHUNKS} x 512 KiB", "GB/s", True),
        ],
        variants={subject: lambda: trial(clustered), baseline: lambda: trial(plain)},
        subject=subject,
        baseline=baseline,
        info=info,
        cleanup=cleanup,
    )


CLUSTER_PUT_GET = Benchmark(
    "cluster_put_get",
    "RedisClusterStore put/get of 64 x 512 KiB on 3 masters vs RedisStore on one server",
    _setup,
    lambda: [Lack("", why)] if (why := cluster_lacks()) else [],
)


def kvpool_benchmark() -> Benchmark:
    """The hook :mod:`kvpool.cli.bench` looks for."""
    return CLUSTER_PUT_GET
