"""A cache workload, as a serving engine drives a store: quiet, typed, and exact at the end.

Several threads (blocking stores) or many tasks on one event loop (the
asyncio stores) share one store and one small pool that fills up.  Each
worker, from its own seeded random stream and for a bounded number of
operations, mixes what an engine does: put chunks (kept a while in its
local cache, like an engine's hot set), get them back with and without
the layout (hits and misses), batched gets, ``head``, deletes, and entries
damaged behind the store's back (truncated, bit-flipped, foreign bytes).
When the pool is full the engine evicts its own cache and retries, as a
user would: ``allocate`` returning None and a get's ``OutOfMemoryError``
are normal events.

Under strict mode and with the ``kvpool`` logger captured at DEBUG, the
run must log nothing, raise nothing but the typed errors each case allows
(``CorruptEntryError`` for a damaged entry, ``OutOfMemoryError`` when the
pool is full), return only whole entries (every hit is checked), and leave
the pool with no object, no byte held by a view and no free under a view.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import kvpool
from kvpool.errors import CorruptEntryError, OutOfMemoryError
from kvpool.remote.header import EntryInfo

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE
from .store_targets import KINDS, Target, make_target

KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize
POOL_OBJECTS = 12  # the pool: room for 12 chunks, fewer than the workers keep
KEYS = 24
THREADS = 3
OPS_PER_THREAD = 120
TASKS = 12
OPS_PER_TASK = 30
CACHE = 5  # chunks each worker keeps before it evicts the oldest
READS = ("get", "get-stored", "batched_get", "head")  # head allocates nothing: last


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    yield from make_target(request, request.param, tmp_path)


def _fill(obj: Any, stamp: int) -> None:
    np.frombuffer(obj.byte_array, dtype=np.uint64)[:] = stamp


def _whole(obj: Any) -> bool:
    words = np.frombuffer(obj.byte_array, dtype=np.uint64)
    return bool((words == words[0]).all()) and int(words[0]) >> 32 == 0x5EED


class Engine:
    """One worker's side of the workload: its random stream, hot set and tallies."""

    def __init__(self, target: Target, pool: Any, seed: int, template: bytes) -> None:
        self.target = target
        self.pool = pool
        self.rng = random.Random(seed)
        self.seed = seed
        self.template = template
        self.hot: list[Any] = []
        self.seen: Counter[str] = Counter()
        self.count = 0

    def keep(self, obj: Any) -> None:
        self.hot.append(obj)
        while len(self.hot) > CACHE:
            self.hot.pop(0).ref_count_down()

    def evict(self) -> None:
        for obj in self.hot:
            obj.ref_count_down()
        self.hot.clear()

    def allocate(self) -> Any:
        obj = self.pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        if obj is None:  # full: drop our own hot set, as an engine evicts, and retry
            self.seen["full"] += 1
            self.evict()
            obj = self.pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        return obj

    def damaged(self) -> bytes:
        kind = self.rng.choice(("truncated", "flipped", "foreign"))
        entry = self.template
        if kind == "truncated":
            return entry[: self.rng.randrange(0, len(entry))]
        if kind == "flipped":
            at = self.rng.randrange(0, len(entry))
            return entry[:at] + bytes([entry[at] ^ 0x04]) + entry[at + 1 :]
        return b"foreign bytes, not an entry " * self.rng.randrange(1, 300)

    def plan(self) -> tuple[str, Any]:
        """The next operation and its argument (drawn from the worker's own stream)."""
        key = f"k{self.rng.randrange(KEYS)}"
        op = self.rng.choices(
            ("put", "get", "get-stored", "batched_get", "head", "delete", "damage"),
            weights=(30, 25, 10, 10, 5, 10, 10),
        )[0]
        if op == "batched_get":
            return op, [f"k{self.rng.randrange(KEYS)}" for _ in range(3)]
        return op, key

    def outcome(self, op: str, arg: Any, result: Any) -> None:
        """Check and tally a result; keep what was read."""
        if op in ("get", "get-stored"):
            results = [result]
        elif op == "batched_get":
            results = result
        else:
            if op == "head":
                assert result is None or isinstance(result, EntryInfo), result
                self.seen["head-" + ("miss" if result is None else "hit")] += 1
            return
        for got in results:
            if got is None:
                self.seen["miss"] += 1
                continue
            assert _whole(got), f"{op} {arg}: a torn or foreign payload was returned"
            self.seen["hit"] += 1
            self.keep(got)

    def prepare(self, op: str, arg: Any) -> Any:
        """What a put stores (None: the pool stayed full, the put is skipped)."""
        obj = self.allocate()
        if obj is None:
            self.seen["skipped-put"] += 1
            return None
        self.count += 1
        _fill(obj, (0x5EED << 32) | (self.seed << 16) | (self.count & 0xFFFF))
        return obj

    def failed(self, op: str, arg: Any, exc: BaseException) -> None:
        """A typed error the case allows (anything else fails the run)."""
        if isinstance(exc, CorruptEntryError) and op in READS:
            self.seen["corrupt"] += 1
            return
        if isinstance(exc, OutOfMemoryError) and op in READS[:-1]:
            self.seen["oom"] += 1
            self.evict()
            return
        raise exc


def _call_args(op: str, arg: Any, pool: Any, obj: Any) -> tuple[str, tuple[Any, ...]]:
    if op == "put":
        return "put", (arg, obj)
    if op == "get":
        return "get", (arg, pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    if op == "get-stored":
        return "get", (arg, pool)
    if op == "batched_get":
        return "batched_get", (arg, pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    return op, (arg,)


def _step_blocking(engine: Engine) -> None:
    op, arg = engine.plan()
    if op == "damage":
        engine.target.write_raw(arg, engine.damaged())
        engine.seen["damage"] += 1
        return
    obj = engine.prepare(op, arg) if op == "put" else None
    if op == "put" and obj is None:
        return
    method, args = _call_args(op, arg, engine.pool, obj)
    try:
        result = getattr(engine.target.store, method)(*args)
    except Exception as exc:
        engine.failed(op, arg, exc)
    else:
        engine.outcome(op, arg, result)
    finally:
        if obj is not None:
            engine.keep(obj)  # the engine keeps what it stored, a while


async def _step_async(engine: Engine) -> None:
    op, arg = engine.plan()
    if op == "damage":
        engine.target.write_raw(arg, engine.damaged())
        engine.seen["damage"] += 1
        return
    obj = engine.prepare(op, arg) if op == "put" else None
    if op == "put" and obj is None:
        return
    method, args = _call_args(op, arg, engine.pool, obj)
    try:
        result = await getattr(engine.target.store, method)(*args)
    except Exception as exc:
        engine.failed(op, arg, exc)
    else:
        engine.outcome(op, arg, result)
    finally:
        if obj is not None:
            engine.keep(obj)


def _template(target: Target, pool: Any) -> bytes:
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    _fill(obj, 0x5EED << 32)
    target.call("put", "template", obj)
    obj.ref_count_down()
    return target.read_raw("template")


def test_a_cache_workload_is_quiet_typed_and_exact(
    target: Target, strict: None, caplog: pytest.LogCaptureFixture
) -> None:
    pool = kvpool.TensorMemoryAllocator(torch.empty(POOL_OBJECTS * KV_BYTES, dtype=torch.uint8))
    template = _template(target, pool)
    errors: list[BaseException] = []
    engines: list[Engine] = []
    with caplog.at_level(logging.DEBUG, logger="kvpool"):
        if target.loop is None:
            engines = [Engine(target, pool, 1000 + i, template) for i in range(THREADS)]

            def work(engine: Engine) -> None:
                try:
                    for _ in range(OPS_PER_THREAD):
                        _step_blocking(engine)
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    engine.evict()

            threads = [threading.Thread(target=work, args=(e,)) for e in engines]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert not any(t.is_alive() for t in threads), "a worker is stuck"
        else:
            engines = [Engine(target, pool, 2000 + i, template) for i in range(TASKS)]

            async def task(engine: Engine) -> None:
                try:
                    for _ in range(OPS_PER_TASK):
                        await _step_async(engine)
                        await asyncio.sleep(0)
                finally:
                    engine.evict()

            async def all_tasks() -> list[Any]:
                return await asyncio.gather(*(task(e) for e in engines), return_exceptions=True)

            outcomes = target.loop.run_until_complete(asyncio.wait_for(all_tasks(), 60))
            errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise errors[0]
    records = [r for r in caplog.records if r.name.startswith("kvpool")]
    assert not records, [f"{r.levelname} {r.getMessage()}" for r in records]
    seen = sum((e.seen for e in engines), Counter())
    # The run did what it says: hits, misses, damaged entries read, a full pool.
    for case in ("hit", "miss", "corrupt", "damage", "full"):
        assert seen[case] > 0, (case, dict(seen))
    stats = pool.stats()
    assert (stats.used_bytes, stats.active_objects, stats.held_by_views_bytes) == (0, 0, 0), stats
    assert stats.freed_under_views == 0, stats
    assert pool.memcheck()
    pool.close()
