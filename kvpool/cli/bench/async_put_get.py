"""The asyncio cluster and Mooncake stores against their blocking stores, 32 x 2 MiB batches.

A three-master Redis Cluster and a Mooncake master + storage node are
started on loopback (:mod:`kvpool.cli.bench.localservers`).  32 KV chunks
of 2 MiB (``[2, 16, 256, 128]`` bfloat16, ``KV_2LTD``) live in
:class:`kvpool.MixedMemoryAllocator` pools; a round is one
``batched_put`` of the 32 chunks and one ``batched_get`` of them into new
objects (verified byte for byte, then freed).

A trial measures one store (the next one, in turn: cluster, Mooncake,
Mooncake headerless) with both variants back to back, in alternating
order, one round each (``--scale`` multiplies the rounds): the two
rounds compared are next to each other in time, so a burst of load on
the machine hits both.  ``--repeat N`` thus gives each store N / 3
rounds per variant: ``--repeat 15`` for 5 (each metric's trials are its
store's).

* subject: the asyncio stores, awaited on one event loop -
  :class:`~kvpool.remote.AsyncRedisClusterStore` (one task per master on
  the loop) and :class:`~kvpool.remote.AsyncMooncakeStore` (the blocking
  store's calls in a thread), with and without ``headerless``;
* baseline: the blocking stores, :class:`~kvpool.remote.RedisClusterStore`
  and :class:`~kvpool.remote.MooncakeStore`, on the same servers.

So each ratio is the price (or gain) of the asyncio path for the same
store and the same server.  Besides the table's ratios (best against
best, median against median), ``info["paired_ratio_median"]`` is the
median over trials of each trial's own ratio, and
``info["client_cpu_ms_median"]`` the CPU time this process spent per
batched call (all its threads: the asyncio Mooncake store's work is in
its threads), which load on the machine disturbs far less than the
wall-clock figures.  Each Mooncake store has a pool of its own (a
pool is registered with one client once) and each kind its own client;
Mooncake keys are new every round and removed after it (a Mooncake put
keeps the first value of a key).  A half that cannot run here (no redis
client or server, no Mooncake) is left out, its rows "n/a" with the reason
and the fix.  Run alone:
``kvpool bench --only async_put_get --repeat 15``.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kvpool.cli.bench import needs
from kvpool.cli.bench.core import Benchmark, Case, Lack, Metric, MiB, Settings, SkipBenchmark
from kvpool.formats import MemoryFormat

__all__ = ["ASYNC_PUT_GET", "kvpool_benchmark"]

_SHAPE = torch.Size([2, 16, 256, 128])  # 2 MiB of bfloat16
_DTYPE = torch.bfloat16
_CHUNK = _SHAPE.numel() * _DTYPE.itemsize
_CHUNKS = 32
_FMT = MemoryFormat.KV_2LTD
_PER_ROUND = _CHUNKS * _CHUNK
#: The stores measured, in the table's order: metric prefix -> label.
_LABELS = {
    "cluster": "cluster (3 masters)",
    "mooncake": "Mooncake",
    "headerless": "Mooncake headerless",
}


class _Side:
    """One store to measure: its put and get of a batch, and what follows a round."""

    def __init__(
        self,
        put: Callable[[list[str], list[Any]], None],
        get: Callable[[list[str]], list[Any]],
        pool: Any,
        src: list[Any],
        after: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.put = put
        self.get = get
        self.pool = pool
        self.src = src
        self.after = after


def _setup(settings: Settings) -> Case:
    from kvpool.cli.bench.cluster_put_get import cluster_binaries
    from kvpool.cli.bench.mooncake_put_get import mooncake_env, mooncake_folder

    rounds = settings.count(1, minimum=1)
    loop = asyncio.new_event_loop()
    undo: list[Callable[[], None]] = [loop.close]  # run in reverse by cleanup
    info: dict[str, Any] = {
        "chunks": _CHUNKS,
        "chunk_bytes": _CHUNK,
        "rounds_per_trial": rounds,
        "verified": True,
    }
    sides: dict[str, dict[str, _Side]] = {"async": {}, "blocking": {}}

    history: dict[str, list[dict[str, float]]] = {"async": [], "blocking": []}
    cpu_history: dict[str, list[dict[str, float]]] = {"async": [], "blocking": []}

    def cleanup() -> None:
        _paired(history, cpu_history, info)
        while undo:
            step = undo.pop()
            try:
                step()
            except Exception as exc:  # the other steps still run
                info.setdefault("cleanup_errors", []).append(f"{type(exc).__name__}: {exc}")

    skipped: dict[str, str] = {}  # store -> why it is left out here
    try:
        try:
            server, cli = cluster_binaries()
        except SkipBenchmark as exc:
            info["cluster"] = f"skipped: {exc}"
            skipped["cluster"] = str(exc)
        else:
            _cluster(settings, server, cli, loop, sides, info, undo)
        try:
            folder = mooncake_folder()
        except SkipBenchmark as exc:
            info["mooncake"] = f"skipped: {exc}"
            skipped["mooncake"] = skipped["headerless"] = str(exc)
        else:
            undo.append(mooncake_env())
            _mooncake(settings, folder, loop, sides, info, undo)
        if not sides["async"]:
            raise SkipBenchmark(f"no server to run: {info.get('cluster')}; {info.get('mooncake')}")
    except BaseException:
        cleanup()
        raise
    payload = _payload(settings.seed)
    counter = itertools.count()

    turns = {kind: itertools.cycle(list(sides[kind].items())) for kind in sides}

    def trial(kind: str) -> dict[str, float]:
        out: dict[str, float] = {}
        cpu: dict[str, float] = {}
        # The k-th trial of each variant measures the same store: trial k of the runner.
        for name, side in [next(turns[kind])]:
            put_s = get_s = put_cpu = get_cpu = 0.0
            for _ in range(rounds):
                keys = [f"bench-{next(counter)}-{i}" for i in range(_CHUNKS)]
                start, start_cpu = time.perf_counter(), time.process_time()
                side.put(keys, side.src)
                put_s += time.perf_counter() - start
                put_cpu += time.process_time() - start_cpu
                start, start_cpu = time.perf_counter(), time.process_time()
                got = side.get(keys)
                get_s += time.perf_counter() - start
                get_cpu += time.process_time() - start_cpu
                for i, obj in enumerate(got):
                    if obj is None or bytes(obj.byte_array) != payload[i]:
                        info["verified"] = False
                        raise RuntimeError(f"{kind} {name}: chunk {i} read back differs")
                side.pool.batched_free(got)
                if side.after is not None:
                    side.after(keys)
            out[f"{name}_put"] = rounds * _PER_ROUND / put_s / 1e9
            out[f"{name}_get"] = rounds * _PER_ROUND / get_s / 1e9
            cpu[f"{name}_put"] = put_cpu * 1e3 / rounds
            cpu[f"{name}_get"] = get_cpu * 1e3 / rounds
        history[kind].append(out)
        cpu_history[kind].append(cpu)
        return out

    for _ in sides["async"]:  # warm-up of every store: connections, registrations, memory
        for kind in sides:
            trial(kind)
    for kind in sides:
        history[kind].clear()
        cpu_history[kind].clear()
    metrics = [
        Metric(f"{n}_{op}", f"{label} {op} {_CHUNKS} x 2 MiB", "GB/s", True)
        for n, label in _LABELS.items()
        for op in ("put", "get")
    ]
    left_out = {f"{n}_{op}": why for n, why in skipped.items() for op in ("put", "get")}
    subject = "asyncio stores (awaited)"
    baseline = "blocking stores"
    return Case(
        metrics=metrics,
        variants={subject: lambda: trial("async"), baseline: lambda: trial("blocking")},
        subject=subject,
        baseline=baseline,
        info=info,
        cleanup=cleanup,
        left_out=left_out,
    )


def _paired(
    history: dict[str, list[dict[str, float]]],
    cpu_history: dict[str, list[dict[str, float]]],
    info: dict[str, Any],
) -> None:
    """Figures of the trials for ``info`` (see the module docstring)."""
    ratios: dict[str, list[float]] = {}
    for a, b in zip(history["async"], history["blocking"], strict=False):
        for key, value in a.items():
            ratios.setdefault(key, []).append(value / b[key])
    info["paired_ratio_median"] = {k: round(statistics.median(v), 3) for k, v in ratios.items()}
    info["client_cpu_ms_median"] = {
        kind: {k: round(statistics.median(t[k] for t in trials if k in t), 2) for k in ratios}
        for kind, trials in cpu_history.items()
    }


def _payload(seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=_CHUNK, dtype=np.uint8).tobytes() for _ in range(_CHUNKS)]


def _source(seed: int, undo: list[Callable[[], None]]) -> tuple[Any, list[Any]]:
    """A pool with the 32 source chunks filled (room for a round's gets too)."""
    from kvpool.allocators import MixedMemoryAllocator

    pool = MixedMemoryAllocator(2 * _PER_ROUND + 8 * MiB)
    undo.append(pool.close)
    src = pool.batched_allocate(_SHAPE, _DTYPE, _CHUNKS, _FMT)
    if src is None:
        raise RuntimeError("the benchmark pool is too small for its chunks")
    undo.append(lambda: pool.batched_free(src))
    for obj, data in zip(src, _payload(seed), strict=True):
        obj.byte_array[:] = data
    return pool, src


def _cluster(
    settings: Settings,
    server: str,
    cli: str,
    loop: asyncio.AbstractEventLoop,
    sides: dict[str, dict[str, _Side]],
    info: dict[str, Any],
    undo: list[Callable[[], None]],
) -> None:
    from kvpool.cli.bench.localservers import start_cluster
    from kvpool.remote import AsyncRedisClusterStore, RedisClusterStore

    cluster = start_cluster(server, cli)
    undo.append(cluster.stop)
    info["cluster"] = cluster.url
    pool, src = _source(settings.seed, undo)
    blocking = RedisClusterStore(cluster.url, timeout=30.0)
    undo.append(blocking.close)
    awaited = AsyncRedisClusterStore(cluster.url, timeout=30.0)
    undo.append(lambda: loop.run_until_complete(awaited.aclose()))
    run = loop.run_until_complete

    def delete(keys: list[str]) -> None:
        blocking.batched_delete(keys)

    sides["blocking"]["cluster"] = _Side(
        blocking.batched_put,
        lambda keys: blocking.batched_get(keys, pool, _SHAPE, _DTYPE, _FMT),
        pool,
        src,
        delete,
    )
    sides["async"]["cluster"] = _Side(
        lambda keys, objs: run(awaited.batched_put(keys, objs)),
        lambda keys: run(awaited.batched_get(keys, pool, _SHAPE, _DTYPE, _FMT)),
        pool,
        src,
        delete,
    )


def _mooncake(
    settings: Settings,
    folder: Any,
    loop: asyncio.AbstractEventLoop,
    sides: dict[str, dict[str, _Side]],
    info: dict[str, Any],
    undo: list[Callable[[], None]],
) -> None:
    from kvpool.cli.bench.localservers import start_mooncake
    from kvpool.remote import AsyncMooncakeStore, MooncakeStore

    deployment = start_mooncake(folder, "1 GB")
    undo.append(deployment.stop)
    info["mooncake"] = f"{deployment.master} (tcp, loopback)"
    run = loop.run_until_complete
    where = {"metadata": deployment.metadata, "timeout": 30.0}
    blocking = MooncakeStore(deployment.master, **where)
    undo.append(blocking.close)
    awaited = AsyncMooncakeStore(deployment.master, **where)
    undo.append(lambda: run(awaited.aclose()))
    raw_blocking = MooncakeStore(client=blocking.client, headerless=True, timeout=30.0)
    undo.append(raw_blocking.close)
    raw_awaited = AsyncMooncakeStore(client=awaited.store.client, headerless=True, timeout=30.0)
    undo.append(lambda: run(raw_awaited.aclose()))
    for name, store, asyncio_store in (
        ("mooncake", blocking, awaited),
        ("headerless", raw_blocking, raw_awaited),
    ):
        for kind, chosen in (("blocking", store), ("async", asyncio_store)):
            # A pool per store: a pool's memory is registered with one client once.
            pool, src = _source(settings.seed, undo)
            sides[kind][name] = _mooncake_side(chosen, kind == "async", pool, src, run)


def _mooncake_side(store: Any, awaited: bool, pool: Any, src: list[Any], run: Any) -> _Side:
    blocking = store.store if awaited else store
    client = blocking.client

    def remove(keys: list[str]) -> None:  # forced: the get's read lease would hold them
        client.batch_remove([blocking.object_key(k) for k in keys], True)

    if awaited:
        return _Side(
            lambda keys, objs: run(store.batched_put(keys, objs)),
            lambda keys: run(store.batched_get(keys, pool, _SHAPE, _DTYPE, _FMT)),
            pool,
            src,
            remove,
        )
    return _Side(
        store.batched_put,
        lambda keys: store.batched_get(keys, pool, _SHAPE, _DTYPE, _FMT),
        pool,
        src,
        remove,
    )


def _lacks() -> list[Lack]:
    """What this machine lacks for each half (both: for the whole benchmark)."""
    from kvpool.cli.bench.cluster_put_get import cluster_lacks

    halves = {"the cluster rows": cluster_lacks(), "the Mooncake rows": needs.mooncake()}
    missing = [Lack(part, why) for part, why in halves.items() if why is not None]
    if len(missing) == len(halves):
        return [Lack("", "; ".join(f"{lack.part}: {lack.reason}" for lack in missing))]
    return missing


ASYNC_PUT_GET = Benchmark(
    "async_put_get",
    "AsyncRedisClusterStore / AsyncMooncakeStore vs their blocking stores, 32 x 2 MiB batches",
    _setup,
    _lacks,
)


def kvpool_benchmark() -> Benchmark:
    """The hook :mod:`kvpool.cli.bench` looks for."""
    return ASYNC_PUT_GET
