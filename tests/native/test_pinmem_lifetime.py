"""Ownership: views keep the mapping alive; close() is idempotent; no double free."""

from __future__ import annotations

import gc
import threading

import pytest

from kvpool import errors, native
from kvpool.native.buffer import allocate_host, live_mappings

MIB = 1 << 20


def test_close_with_live_memoryview_defers_the_unmap(smaps) -> None:
    count = live_mappings()[0]
    buf = allocate_host(4 * MIB, pin="none")
    view = buf.memoryview()
    buf.close()
    assert buf.closed
    assert not buf.unmapped
    assert smaps.mapped(buf.address)
    view[123] = 45  # still valid after close()
    assert view[123] == 45
    assert live_mappings()[0] == count + 1
    del view
    gc.collect()
    assert buf.unmapped
    assert not smaps.mapped(buf.address)
    assert live_mappings()[0] == count


def test_close_with_live_tensor_defers_the_unmap(smaps) -> None:
    count = live_mappings()[0]
    buf = allocate_host(4 * MIB, pin="none")
    t = buf.tensor()
    buf.close()
    t[10] = 99
    t[-1] = 7
    assert int(t[10]) == 99 and int(t[-1]) == 7
    assert smaps.mapped(buf.address)
    assert not buf.unmapped
    del t
    gc.collect()
    assert buf.unmapped
    assert not smaps.mapped(buf.address)
    assert live_mappings()[0] == count


def test_slices_and_derived_tensors_also_keep_it_alive(smaps) -> None:
    buf = allocate_host(4 * MIB, pin="none")
    view = buf.memoryview()[MIB : 2 * MIB]
    part = buf.tensor()[:MIB].view(-1, 1024)
    buf.close()
    view[0] = 1
    part[0, 0] = 2
    del view
    gc.collect()
    assert not buf.unmapped
    assert int(part[0, 0]) == 2
    del part
    gc.collect()
    assert buf.unmapped


def test_mapping_goes_at_close_without_views(smaps) -> None:
    buf = allocate_host(2 * MIB, pin="none")
    address = buf.address
    buf.close()
    assert buf.unmapped
    assert not smaps.mapped(address)


def test_close_is_idempotent_and_context_manager() -> None:
    with allocate_host(MIB, pin="none") as buf:
        assert not buf.closed
    assert buf.closed
    buf.close()
    buf.close()
    assert buf.unmapped


def test_no_new_views_after_close() -> None:
    buf = allocate_host(MIB, pin="none")
    buf.close()
    with pytest.raises(errors.PoolClosedError, match="closed"):
        buf.memoryview()
    with pytest.raises(errors.InvalidHandleError):
        buf.tensor()


def test_del_is_a_backstop(smaps) -> None:
    buf = allocate_host(2 * MIB, pin="none")
    address = buf.address
    del buf
    gc.collect()
    assert not smaps.mapped(address)


def test_double_free_and_unknown_pointer_are_typed_errors() -> None:
    region = native.alloc(MIB, pin="none")
    with pytest.raises(errors.InvalidHandleError, match="inside the mapping"):
        native.free(region.address + 4096)
    native.free(region.address)
    with pytest.raises(errors.InvalidHandleError, match="not a live mapping"):
        native.free(region.address)
    with pytest.raises(errors.InvalidHandleError):
        native.free(0)
    with pytest.raises(errors.InvalidHandleError):
        native.query(region.address)


def test_concurrent_close_frees_once() -> None:
    for _ in range(10):
        count = live_mappings()[0]
        buf = allocate_host(MIB, pin="none")
        barrier = threading.Barrier(4)
        failures: list[BaseException] = []

        def closer(b=buf, bar=barrier, out=failures) -> None:
            bar.wait()
            try:
                b.close()
            except BaseException as exc:  # pragma: no cover - recorded for the assert
                out.append(exc)

        threads = [threading.Thread(target=closer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert buf.unmapped
        assert live_mappings()[0] == count


def test_concurrent_native_frees_succeed_exactly_once() -> None:
    region = native.alloc(MIB, pin="none")
    barrier = threading.Barrier(4)
    results: list[str] = []
    lock = threading.Lock()

    def free() -> None:
        barrier.wait()
        try:
            native.free(region.address)
            outcome = "ok"
        except errors.InvalidHandleError:
            outcome = "unknown"
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=free) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ok", "unknown", "unknown", "unknown"]
