"""kvpool's tier in vLLM's tiering manager: what only it does, beyond the shared-tier tests.

The round trips, a second engine and other layouts run on every store through
``SHARED_TIERS`` (test_harness.py).  Here: start-up refusals, chunks not written
twice, a bounded directory and its KV events, damaged entries, an outage and the
recovery after it, ``reset_cache`` (``drain_jobs``), ``shutdown`` with jobs in flight,
and the metrics - each through vLLM's own manager, built from the user's JSON.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from store_url_cases import BAD_IDS, BAD_SPECS, created_anything, missing_parent, unmakeable

from .conftest import kvpool_tier

LOGGER = "kvpool.integrations.vllm"
# What the issue allows a call from vLLM's scheduler to take, in seconds.
CALL_BOUND = 0.020
TIER_CALLS = (
    "lookup",
    "submit_store",
    "submit_load",
    "get_finished_jobs",
    "on_schedule_end",
    "on_request_finished",
    "has_pending_work",
    "take_events",
    "touch",
)


def tier_of(engine: Any) -> Any:
    """The engine's kvpool tier (its only secondary tier here)."""
    (tier,) = engine.tiers
    assert type(tier).__name__ == "KVPoolTier"
    return tier


def refusal(make: Callable[..., Any], tiers: list[dict[str, Any]]) -> str:
    """The message vLLM's start-up fails with for ``tiers``."""
    from kvpool.integrations.vllm import TierConfigError

    with pytest.raises(TierConfigError) as info:
        make(tiers)
    return str(info.value)


@pytest.fixture
def slowest(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any], dict[str, float]]]:
    """``watch(tier)``: times every call vLLM makes on the tier; returns the slowest of each."""
    worst: dict[str, float] = {}

    def watch(tier: Any) -> dict[str, float]:
        for name in TIER_CALLS:
            method = getattr(tier, name)

            def timed(*args: Any, _method: Any = method, _name: str = name, **kw: Any) -> Any:
                started = time.perf_counter()
                try:
                    out = _method(*args, **kw)
                    if _name == "take_events":
                        out = list(out)  # a generator does its work when consumed
                    return out
                finally:
                    took = time.perf_counter() - started
                    worst[_name] = max(worst.get(_name, 0.0), took)

            monkeypatch.setattr(tier, name, timed)
        return worst

    yield watch


# -- start-up ----------------------------------------------------------------


@pytest.mark.parametrize(("url", "fix"), BAD_SPECS, ids=BAD_IDS)
def test_a_mistyped_url_stops_start_up_naming_the_fix(
    engines: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, fix: str
) -> None:
    monkeypatch.chdir(tmp_path)
    message = refusal(engines, [kvpool_tier(url)])
    assert fix in message and "kvpool vLLM tier" in message
    assert created_anything(tmp_path) == []


def test_a_directory_whose_parent_is_missing_stops_start_up(engines: Any, tmp_path: Path) -> None:
    url, fix = missing_parent(tmp_path)
    message = refusal(engines, [kvpool_tier(url)])
    assert fix in message and "make_parents" in message
    assert created_anything(tmp_path) == []


def test_a_directory_that_cannot_be_made_stops_start_up(engines: Any, tmp_path: Path) -> None:
    # Not an outage: retried every second, it would never stop vLLM's start-up.
    url, fix = unmakeable(tmp_path)
    assert fix in refusal(engines, [kvpool_tier(url)])


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"timout": 2}, "did you mean timeout"),
        ({"threads": 0}, "threads must be an int from 1 to 256"),
        ({"locality": "nearby"}, "locality must be LOCAL or REMOTE"),
        ({"enable_kv_events": "yes"}, "enable_kv_events must be true or false"),
        ({"ttl": "soon"}, "refused its settings"),
    ],
    ids=["misspelt", "threads", "locality", "events", "bad-value"],
)
def test_bad_options_stop_start_up_and_never_show_a_password(
    engines: Any, options: dict[str, Any], expected: str
) -> None:
    url = "redis://:hunter22@127.0.0.1:1/0"
    message = refusal(engines, [kvpool_tier(url, **options)])
    assert expected in message
    assert "hunter22" not in message and "***" in message


def test_a_row_layout_the_store_cannot_serve_is_refused(engines: Any, tmp_path: Path) -> None:
    """direct_io needs rows of whole 4 KiB pages: a primary view of other rows is refused."""
    import numpy as np
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    from kvpool.integrations.vllm import TierConfigError

    engine = engines([kvpool_tier(str(tmp_path / "kv"))])
    rows = memoryview(np.zeros((4, 5000), dtype=np.int8))
    entry = kvpool_tier(str(tmp_path / "direct"), direct_io=True)
    with pytest.raises(TierConfigError, match="direct_io needs rows of a multiple of 4096"):
        SecondaryTierFactory.create_secondary_tier(entry, rows, engine.worker_spec)


def test_a_bound_or_a_value_with_no_room_for_one_entry_is_refused(
    engines: Any, tmp_path: Path
) -> None:
    """An entry is the row and kvpool's header: a bound, or a Redis value, must hold both."""
    import numpy as np
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    from kvpool.integrations.vllm import TierConfigError

    engine = engines([kvpool_tier(str(tmp_path / "kv"))])
    row = engine.row_bytes
    view = memoryview(np.zeros((4, row), dtype=np.int8))
    entry = kvpool_tier(str(tmp_path / "small"), max_bytes=row + 1)  # the row fits, its header not
    with pytest.raises(TierConfigError, match=f"give max_bytes of at least {row + 64} "):
        SecondaryTierFactory.create_secondary_tier(entry, view, engine.worker_spec)
    exact = kvpool_tier(str(tmp_path / "one"), max_bytes=row + 64)
    SecondaryTierFactory.create_secondary_tier(exact, view, engine.worker_spec).shutdown()
    # A row of exactly Redis's most bytes: with the header it is more (np.zeros maps no pages).
    rows = memoryview(np.zeros((1, 512 << 20), dtype=np.int8))
    with pytest.raises(TierConfigError, match="kvpool's header included"):
        SecondaryTierFactory.create_secondary_tier(
            kvpool_tier("redis://127.0.0.1:1/0"), rows, engine.worker_spec
        )


def test_start_up_logs_one_line_with_the_store_and_the_key_tag(
    engines: Any, redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    engine = engines([kvpool_tier(redis_server.url, prefix="t-startup:")])
    tier = tier_of(engine)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any(tier.space.tag in line and "2 I/O threads" in line for line in lines), lines
    assert tier.space.text.startswith("vllm;model=") and "world=1" in tier.space.text


# -- chunks, bound, damage ----------------------------------------------------


def test_a_directory_on_a_disk_gets_more_threads_than_one_in_memory() -> None:
    # A disk wants more requests in flight; on tmpfs more threads only contend.
    import tempfile

    from kvpool.integrations.vllm.config import DEFAULT_THREADS, DISK_THREADS, read_tier_config
    from kvpool.remote.file.aio import on_tmpfs

    disk = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="kvpool-tier-threads-"))
    try:
        if on_tmpfs(str(disk)):
            pytest.skip("/var/tmp is on tmpfs here: no disk folder to try")
        _, options = read_tier_config({"url": str(disk / "not-yet" / "kv")})
        assert options.threads == DISK_THREADS
        _, options = read_tier_config({"url": f"file://{disk}/kv", "threads": 3})
        assert options.threads == 3
    finally:
        disk.rmdir()
    if Path("/dev/shm").is_dir():
        _, options = read_tier_config({"url": "/dev/shm/kvpool-tier-threads/kv"})
        assert options.threads == DEFAULT_THREADS["file"] < DISK_THREADS


def test_chunks_in_the_tier_already_are_not_written_again(engines: Any, redis_server: Any) -> None:
    entry = kvpool_tier(redis_server.url, prefix="t-skip:")
    first, second = engines([entry]), engines([entry])
    keys = first.keys(21, chunks=4)
    with first.request() as req:
        first.store(keys, req)
    first.settle()
    with second.request() as req:
        assert second.store(keys, req).stored == keys  # second's primary tier lacked them
    second.settle()
    tier = tier_of(second)
    assert tier.tally.totals["kvpool:vllm_tier_chunks_skipped"] == len(keys)
    assert "batched_put" not in tier.store.counters.snapshot()  # no row sent to the server


def _six_entry_engine(engines: Any, tmp_path: Path) -> Any:
    """An engine whose tier is a directory bounded to six entries, KV events on."""
    probe = engines([kvpool_tier(str(tmp_path / "probe"))])
    row = probe.row_bytes
    probe.close()
    bound = 6 * (row + 4096)  # six entries, with room for their headers
    return engines([kvpool_tier(str(tmp_path / "kv"), max_bytes=bound)], kv_events=True)


def _tier_events(engine: Any, tier: Any) -> list[Any]:
    """The KV events the kvpool tier reported since the last take, in order."""
    with engine.manager.lock:
        return [e for e in engine.manager.take_events() if e.ownership == tier.tier_type]


def test_a_bounded_directory_evicts_the_oldest_chunks_and_reports_them(
    engines: Any, tmp_path: Path
) -> None:
    engine = _six_entry_engine(engines, tmp_path)
    old, new = engine.keys(31, chunks=4), engine.keys(32, chunks=4)
    for keys in (old, new):
        with engine.request() as req:
            engine.store(keys, req)
        engine.settle()
    tier = tier_of(engine)
    events = _tier_events(engine, tier)
    removed = [k for e in events if e.removed for k in e.keys]
    stored = [k for e in events if not e.removed for k in e.keys]
    assert set(stored) == set(old + new)
    assert removed and set(removed) <= set(old), "the oldest chunks go first"
    assert len(removed) >= 2  # eight chunks, room for six
    entries = [p for p in Path(tier.store.directory).iterdir() if not p.name.startswith(".")]
    assert len(entries) == 8 - len(removed) and len(entries) <= 6
    assert tier.tally.totals["kvpool:vllm_tier_chunks_evicted"] == len(removed)
    names = [tier.space.key(k.hex()) for k in new]
    assert tier.store.batched_exists(names) == [True] * len(new)  # the newest are still there
    gone = [tier.space.key(k.hex()) for k in removed]
    assert tier.store.batched_exists(gone) == [False] * len(removed)


def test_events_replayed_in_order_give_what_a_bounded_directory_holds(
    engines: Any, tmp_path: Path
) -> None:
    """One job puts more than the bound: the chunks its own put evicted are not 'stored' after."""
    engine = _six_entry_engine(engines, tmp_path)
    keys = engine.keys(33, chunks=8)
    with engine.request() as req:
        engine.store(keys, req)
    engine.settle()
    tier = tier_of(engine)
    events = _tier_events(engine, tier)
    replayed: set[Any] = set()
    for event in events:
        (replayed.difference_update if event.removed else replayed.update)(event.keys)
    there = tier.store.batched_exists([tier.space.key(k.hex()) for k in keys])
    held = {k for k, yes in zip(keys, there, strict=True) if yes}
    assert len(held) <= 6 and any(e.removed for e in events)
    assert replayed == held
    assert {k for k in keys if tier.known.touch(k)} == held


def test_a_damaged_entry_is_a_miss_that_is_removed_never_bytes(
    engines: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = engines([kvpool_tier(str(tmp_path / "kv"))])
    keys = engine.keys(41, chunks=4)
    with engine.request() as req:
        engine.store(keys, req)
    engine.settle()
    engine.evict(keys)
    tier = tier_of(engine)
    truncated = Path(tier.store.path(tier.space.key(keys[2].hex())))
    garbage = Path(tier.store.path(tier.space.key(keys[3].hex())))
    os.truncate(truncated, truncated.stat().st_size // 2)
    with open(garbage, "r+b") as f:
        f.write(b"\xff" * 64)  # the header
    caplog.set_level(logging.WARNING, logger=LOGGER)

    with engine.request() as req:
        got = engine.load(keys, req)
    assert got.hits == 2 and got.matched == keys[:2] and not got.mismatched
    assert not truncated.exists() and not garbage.exists()
    warned = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
    assert len(warned) == 2, warned
    assert tier.tally.totals["kvpool:vllm_tier_unusable_entries"] == 2
    with engine.request() as req:
        assert engine.load(keys[2:3], req).hits == 0  # a miss from now on, not a loop


# -- outages -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_outage_is_one_warning_misses_and_failed_jobs_then_it_recovers(
    engines: Any, caplog: pytest.LogCaptureFixture, slowest: Callable[[Any], dict[str, float]]
) -> None:
    from remote.redis_servers import need_redis, start_redis

    port = _free_port()
    caplog.set_level(logging.INFO, logger=LOGGER)
    engine = engines([kvpool_tier(f"redis://127.0.0.1:{port}/0")])  # down at start-up: no error
    tier = tier_of(engine)
    worst = slowest(tier)
    keys = engine.keys(51, chunks=4)
    with engine.request() as req:
        engine.store(keys, req)
    engine.settle()
    engine.evict(keys)
    with engine.request() as req:
        got = engine.load(keys, req)
    assert got.hits == 0 and got.steps <= 3  # misses, not a wait
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "StoreConnectionError" in warnings[0].getMessage()
    assert tier.report.outages == 1
    assert tier.tally.totals["kvpool:vllm_tier_outages"] == 1
    assert tier.tally.totals["kvpool:vllm_tier_jobs_failed_fast"] >= 1

    server = start_redis(need_redis(), port=port)
    try:
        time.sleep(1.2)  # the next probe reaches the server
        fresh = engine.keys(52, chunks=4)
        with engine.request() as req:
            engine.store(fresh, req)
        engine.settle()
        engine.evict(fresh)
        with engine.request() as req:
            back = engine.load(fresh, req)
        assert back.hits == len(fresh) and back.matched == fresh
        assert any("answers again" in r.getMessage() for r in caplog.records)
        assert tier.report.outages == 1
    finally:
        server.stop()
    assert max(worst.values()) < CALL_BOUND, worst


def test_chunks_known_to_be_stored_are_misses_during_an_outage(engines: Any) -> None:
    """A known chunk is not a HIT while the store is down: vLLM would promote it again and again."""
    from remote.redis_servers import need_redis, start_redis

    port = _free_port()
    server = start_redis(need_redis(), port=port)
    try:
        engine = engines([kvpool_tier(f"redis://127.0.0.1:{port}/0")])
        keys = engine.keys(53, chunks=4)
        with engine.request() as req:
            engine.store(keys, req)
        engine.settle()
        engine.evict(keys)
        tier = tier_of(engine)
        assert all(tier.known.touch(k) for k in keys)
    finally:
        server.stop()
    with engine.request() as req:
        got = engine.load(keys, req, timeout=30)  # before the fix: a livelock, promoted forever
    assert got.hits == 0 and got.steps <= 5, got
    assert not any(tier.known.touch(k) for k in keys)  # the failed load forgot them


def test_the_job_that_finds_the_outage_is_not_failed_fast_the_next_one_is(engines: Any) -> None:
    from remote.redis_servers import need_redis, start_redis

    port = _free_port()
    server = start_redis(need_redis(), port=port)
    try:
        engine = engines([kvpool_tier(f"redis://127.0.0.1:{port}/0")])
        tier = tier_of(engine)
        for thread in threading.enumerate():
            if thread.name == "kvpool-vllm-probe":
                thread.join()  # the start-up probe reached the server
        tier.gate.retry_after = 3600.0  # no probe between the two jobs, however slow
    finally:
        server.stop()
    for seed, fast in ((54, 0), (55, 1)):
        with engine.request() as req:
            engine.store(engine.keys(seed, chunks=2), req)
        engine.settle()
        assert tier.tally.totals["kvpool:vllm_tier_jobs_failed_fast"] == fast
    assert tier.tally.totals["kvpool:vllm_tier_outages"] == tier.report.outages == 1


def test_an_unexpected_error_is_one_outage_in_the_metric_and_the_log(
    engines: Any, tmp_path: Path
) -> None:
    """The outage metric follows the warning's rule, whatever the error's type."""
    engine = engines([kvpool_tier(str(tmp_path / "kv"))])
    tier = tier_of(engine)

    def broken(names: Any) -> Any:
        raise ValueError("a bug in a store")

    tier.store.batched_exists = broken
    keys = engine.keys(56, chunks=2)
    with engine.request() as req:
        assert engine.load(keys, req).hits == 0
    assert tier.report.outages == 1
    assert tier.tally.totals["kvpool:vllm_tier_outages"] == 1


def test_reset_cache_drains_every_job_and_the_chunks_stay_in_the_tier(
    engines: Any, redis_server: Any
) -> None:
    engine = engines([kvpool_tier(redis_server.url, prefix="t-reset:")])
    keys = engine.keys(61, chunks=8)
    with engine.request() as req:
        engine.store(keys, req)
    tier = tier_of(engine)
    with engine.manager.lock:
        engine.manager.reset_cache()  # calls drain_jobs: every cascade has ended
        assert not tier.has_pending_work()
        engine.manager.on_reset_flushed()
    names = [tier.space.key(k.hex()) for k in keys]
    assert tier.store.batched_exists(names) == [True] * len(keys)  # none cut short
    assert not any(engine.in_primary(k) for k in keys)
    with engine.request() as req:
        got = engine.load(keys, req)
    assert got.hits == len(keys) and got.matched == keys


def _hanging_server(seconds: float) -> Any:
    """A Redis-protocol server on loopback whose first SET answers after ``seconds``."""
    from remote.hostile_server import HostileServer

    server = HostileServer()

    def slow(args: list[bytes], honest: bytes) -> bytes:
        time.sleep(seconds)
        return honest

    server.once(b"SET", slow)
    return server


@pytest.mark.parametrize("hang", [0.8, 2.5], ids=["ends-in-grace", "outlives-grace"])
def test_shutdown_returns_in_two_seconds_with_jobs_in_flight(
    engines: Any, hang: float, caplog: pytest.LogCaptureFixture
) -> None:
    server = _hanging_server(hang)
    try:
        engine = engines([kvpool_tier(server.url, timeout=hang + 1.0)])
        keys = engine.keys(71, chunks=4)
        with engine.request() as req:
            engine.store(keys, req)  # the cascade's put now waits on the server
        tier = tier_of(engine)
        time.sleep(0.1)
        assert tier.has_pending_work()
        region = engine.manager.primary_tier._mmap_region  # vLLM's: unmapped at its close
        caplog.set_level(logging.WARNING, logger=LOGGER)
        started = time.perf_counter()
        tier.shutdown()
        took = time.perf_counter() - started
        assert took < 2.0, took
        assert tier.rows.released
        late = [r for r in caplog.records if "still running" in r.getMessage()]
        if hang < 1.0:
            assert not late  # the put ended in the grace
        else:
            assert len(late) == 1  # said once; the put holds its rows until it ends
            time.sleep(hang + 0.3 - took)
        engine.close()
        assert region.mmap_obj is None  # no view of the region was left: it was unmapped
        assert not engine.shm_path.exists()
    finally:
        server.close()


def test_shutdown_with_every_wait_taken_in_full_ends_under_its_bound(
    engines: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst case, on a clock of the test's: each wait lasts all it was given."""
    import kvpool.integrations.vllm.tier as tier_module
    from kvpool.integrations.shared.calls import CLOSE_STORE_WAIT

    engine = engines([kvpool_tier(str(tmp_path / "kv"))])
    tier = tier_of(engine)
    clock = [0.0]
    monkeypatch.setattr(tier_module, "_perf", lambda: clock[0])
    jobs_stop, lookups_stop, calls_close = tier._jobs.stop, tier._lookups.stop, tier._calls.close

    def stop_jobs(grace: float) -> int:
        clock[0] += grace
        return jobs_stop(grace)

    def stop_lookups(wait: float) -> None:
        clock[0] += wait
        lookups_stop(wait)

    def close_calls(close_store: Any, grace: float) -> int:
        clock[0] += max(grace, 0.0) + CLOSE_STORE_WAIT  # the grace, then the store's close
        return calls_close(close_store, grace=grace)

    monkeypatch.setattr(tier._jobs, "stop", stop_jobs)
    monkeypatch.setattr(tier._lookups, "stop", stop_lookups)
    monkeypatch.setattr(tier._calls, "close", close_calls)
    tier.shutdown()
    assert clock[0] < tier_module.SHUTDOWN_BOUND, clock[0]  # before: 1.2 + 0.3 + 0.5 = 2.0


def test_a_directory_put_that_outlives_shutdown_still_has_vllms_region(
    engines: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory moves rows by address (no lent objects): its registration holds the region."""
    engine = engines([kvpool_tier(str(tmp_path / "kv"))])
    tier = tier_of(engine)
    assert tier.transfers.ranges
    started, release, ended = threading.Event(), threading.Event(), threading.Event()
    real = tier.store.put_ranges

    def slow(*args: Any, **kw: Any) -> Any:  # a slow disk: the put outlives the grace
        started.set()
        release.wait()
        try:
            return real(*args, **kw)
        finally:
            ended.set()

    tier.store.put_ranges = slow
    keys = engine.keys(72, chunks=4)
    with engine.request() as req:
        engine.store(keys, req)
    assert started.wait(30)
    region = engine.manager.primary_tier._mmap_region
    caplog.set_level(logging.WARNING, logger=LOGGER)
    tier.shutdown()
    engine.close()
    assert region.mmap_obj is not None  # the store's registration kept it mapped
    release.set()
    assert ended.wait(30)
    directory = Path(tmp_path / "kv")
    for _ in range(300):  # the late call closes the store in a thread of its own
        if tier.store is None:
            break
        time.sleep(0.01)
    assert tier.store is None
    failed = [r.getMessage() for r in caplog.records if "store failed" in r.getMessage()]
    assert not failed  # before: EFAULT (Bad address) writing from the unmapped region
    assert len([p for p in directory.iterdir() if not p.name.startswith(".")]) == len(keys)


# -- metrics -----------------------------------------------------------------


def test_metrics_reach_vllms_stats_and_definitions(engines: Any, tmp_path: Path) -> None:
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    from kvpool.integrations.vllm.metrics import TIER_METRICS

    entry = kvpool_tier(str(tmp_path / "kv"))
    defined = TieringOffloadingSpec.build_metric_definitions({"secondary_tiers": [entry]})
    assert set(TIER_METRICS) <= set(defined)
    first, second = engines([entry]), engines([entry])
    keys = first.keys(81, chunks=3)
    for engine in (first, second):
        with engine.request() as req:
            engine.store(keys, req)
        engine.settle()
    with second.manager.lock:
        stats = second.manager.get_stats()
    flat = stats.reduce()
    assert flat["kvpool:vllm_tier_chunks_skipped:('file',)"] == len(keys), json.dumps(
        flat, default=str
    )
    assert any(k.startswith("vllm:kv_offload_tiering_write_bytes") for k in flat), flat
    assert tier_of(second).config_info() == {"kvpool_store": "file"}


def test_a_store_the_tier_cannot_adopt_is_closed_not_leaked(
    engines: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store opened lazily (Mooncake unreachable at start-up) whose set-up fails is closed."""
    import kvpool.integrations.vllm.tier as tier_module

    engine = engines([kvpool_tier(str(tmp_path / "kv"))])
    tier = tier_of(engine)
    tier.store.close()
    tier.store = None  # as if it was unreachable at start-up
    opened: list[Any] = []
    real_open = tier_module.open_settings_store

    def open_store(*args: Any, **kw: Any) -> Any:
        opened.append(real_open(*args, **kw))
        return opened[-1]

    def adopt(store: Any) -> None:
        raise RuntimeError("set-up failed")

    monkeypatch.setattr(tier_module, "open_settings_store", open_store)
    monkeypatch.setattr(tier, "_adopt", adopt)
    with pytest.raises(RuntimeError, match="set-up failed"):
        tier._open_store()
    assert len(opened) == 1 and opened[0].closed and tier.store is None
