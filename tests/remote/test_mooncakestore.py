"""MooncakeStore against a real Mooncake master and storage node on loopback.

The contract every store meets runs in ``test_stores.py``; here: KV-sized
chunks byte for byte, pool registration and its end at pool close,
replacing, leases, damaged entries written behind kvpool's back, URLs, and
a storage node and a master that die.  Without Mooncake: the codes table
and the missing-client error.
"""

from __future__ import annotations

import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

import kvpool
from kvpool.errors import (
    CorruptEntryError,
    FeatureUnavailableError,
    InvalidArgumentError,
    RemoteStoreError,
    StoreConnectionError,
    StoreTimeoutError,
)
from kvpool.remote import MooncakeStore, open_store
from kvpool.remote.header import encode_header, layout_for
from kvpool.remote.mooncake import codes

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, assert_clean, fill
from .mooncake_servers import LEASE_MS, MooncakeDeployment, start_mooncake

CHUNK = torch.Size([2, 16, 64, 128])  # 512 KiB of bfloat16, a typical KV chunk
CHUNK_DTYPE = torch.bfloat16
CHUNK_BYTES = CHUNK.numel() * CHUNK_DTYPE.itemsize


@pytest.fixture
def big_pool() -> Iterator[kvpool.TensorMemoryAllocator]:
    """A 48 MiB pool (two batches of 32 chunks), empty at the end."""
    p = kvpool.TensorMemoryAllocator(torch.empty(48 << 20, dtype=torch.uint8))
    yield p
    if not p.closed:
        assert_clean(p)
    p.close()


def _store(client: Any, **kwargs: Any) -> MooncakeStore:
    return MooncakeStore(client=client, prefix=f"t-{uuid.uuid4().hex[:12]}:", **kwargs)


def _bounded(fn: Callable[[], Any], seconds: float) -> Any:
    """Run ``fn`` in a thread; fail the test if it has not returned after ``seconds``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"the call did not return within {seconds} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# -- byte for byte ------------------------------------------------------


@pytest.mark.mooncake
def test_chunks_single_and_batched_byte_for_byte(
    mooncake_store: MooncakeStore, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = big_pool.batched_allocate(CHUNK, CHUNK_DTYPE, 32, KV_FMT)
    assert objs is not None
    datas = [fill(o, 100 + i) for i, o in enumerate(objs)]
    keys = [f"chunk-{i}" for i in range(32)]
    mooncake_store.put(keys[0], objs[0])
    mooncake_store.batched_put(keys[1:], objs[1:])
    big_pool.batched_free(objs)
    got = mooncake_store.batched_get(keys, big_pool, CHUNK, CHUNK_DTYPE, KV_FMT)
    assert [bytes(g.byte_array) for g in got] == datas  # type: ignore[union-attr]
    big_pool.batched_free(got)  # type: ignore[arg-type]
    one = mooncake_store.get(keys[7], big_pool, CHUNK, CHUNK_DTYPE, KV_FMT)
    stored = mooncake_store.get(keys[8], big_pool)  # layout read from the header
    assert one is not None and bytes(one.byte_array) == datas[7]
    assert stored is not None and bytes(stored.byte_array) == datas[8]
    assert stored.get_shapes() == [CHUNK] and stored.get_dtypes() == [CHUNK_DTYPE]
    for obj in (one, stored):
        obj.ref_count_down()
    assert mooncake_store.batched_delete(keys) == 32


@pytest.mark.mooncake
def test_concurrent_batches_from_threads(
    mooncake_store: MooncakeStore, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for round_ in range(3):
                objs = big_pool.batched_allocate(CHUNK, CHUNK_DTYPE, 4, KV_FMT)
                assert objs is not None
                datas = [fill(o, 1000 * t + 10 * round_ + i) for i, o in enumerate(objs)]
                keys = [f"w{t}-{round_}-{i}" for i in range(4)]
                mooncake_store.batched_put(keys, objs)
                big_pool.batched_free(objs)
                got = mooncake_store.batched_get(keys, big_pool, CHUNK, CHUNK_DTYPE, KV_FMT)
                assert [bytes(g.byte_array) for g in got] == datas  # type: ignore[union-attr]
                big_pool.batched_free(got)  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


# -- registration -------------------------------------------------------


@pytest.mark.mooncake
def test_pool_registered_once_and_deregistered_at_pool_close(mooncake_client: Any) -> None:
    store = _store(mooncake_client)
    pool = kvpool.TensorMemoryAllocator(torch.empty(4 << 20, dtype=torch.uint8))
    region = pool.memory_region()
    assert region is not None
    a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    b = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(a, 1)
    fill(b, 2)
    assert store.registered_regions() == []
    store.put("a", a)
    store.batched_put(["b", "a2"], [b, a])
    assert store.registered_regions() == [region]  # once, for the whole pool
    # Mooncake knows the range: registering it again is refused as an overlap.
    assert mooncake_client.register_buffer(region[0], region[1]) != 0
    a.ref_count_down()
    b.ref_count_down()
    pool.close()
    assert store.registered_regions() == []
    # Deregistered in Mooncake too: it can be registered (and dropped) again.
    assert mooncake_client.register_buffer(region[0], region[1]) == 0
    assert mooncake_client.unregister_buffer(region[0]) == 0
    other = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    got = store.get("a", other)  # the store goes on with another pool
    assert got is not None
    assert store.registered_regions() == [other.memory_region()]
    got.ref_count_down()
    store.close()
    assert mooncake_client.unregister_buffer(other.memory_region()[0]) != 0  # type: ignore[index]
    other.close()  # its hook was removed with the store: nothing to drop twice


@pytest.mark.mooncake
def test_memory_pool_and_paged_pool_register_their_range(mooncake_client: Any) -> None:
    store = _store(mooncake_client)
    page = KV_SHAPE.numel() * KV_DTYPE.itemsize
    paged = kvpool.PagedTensorMemoryAllocator(
        torch.empty(8 * page, dtype=torch.uint8), [KV_SHAPE], [KV_DTYPE], KV_FMT
    )
    mixed = kvpool.MixedMemoryAllocator(4 << 20)
    try:
        for pool in (paged, mixed):
            obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
            data = fill(obj, 3)
            store.put("k", obj)
            obj.ref_count_down()
            got = store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            assert got is not None and bytes(got.byte_array) == data
            got.ref_count_down()
        assert sorted(store.registered_regions()) == sorted(
            [paged.memory_region(), mixed.memory_region()]
        )
        mixed.close()
        assert store.registered_regions() == [paged.memory_region()]
    finally:
        store.close()
        paged.close()
        mixed.close()


@pytest.mark.mooncake
def test_hand_built_object_is_registered_for_the_call(mooncake_store: MooncakeStore) -> None:
    raw = torch.arange(4096, dtype=torch.int32).view(torch.uint8)
    meta = kvpool.MemoryObjMetadata(
        torch.Size([4096]), torch.int32, 0, raw.numel(), 1, fmt=kvpool.MemoryFormat.BINARY
    )
    obj = kvpool.TensorMemoryObj(raw, meta, None)
    mooncake_store.put("hand", obj)
    assert mooncake_store.registered_regions() == []
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    got = mooncake_store.get("hand", pool)
    assert got is not None and bytes(got.byte_array) == raw.numpy().tobytes()
    got.ref_count_down()
    pool.close()


# -- replacing ----------------------------------------------------------


@pytest.mark.mooncake
def test_replace_after_a_read_and_in_mixed_batches(
    mooncake_store: MooncakeStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    a, b, c = (pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(3))
    data = [fill(o, 20 + i) for i, o in enumerate((a, b, c))]
    mooncake_store.put("k", a)
    first = mooncake_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)  # now leased
    assert first is not None and bytes(first.byte_array) == data[0]
    first.ref_count_down()
    mooncake_store.put("k", b)  # replaced at once despite the reader's lease
    mooncake_store.batched_put(["k", "new"], [c, a])  # one existing, one new
    got = mooncake_store.batched_get(["k", "new"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert [bytes(g.byte_array) for g in got] == [data[2], data[0]]  # type: ignore[union-attr]
    for obj in (a, b, c, *got):
        obj.ref_count_down()  # type: ignore[union-attr]


@pytest.mark.mooncake
def test_repeated_keys_in_one_batch(
    mooncake_store: MooncakeStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    a, b = (pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(2))
    fill(a, 1)
    data_b = fill(b, 2)
    mooncake_store.batched_put(["k", "k"], [a, b])  # in order: the last wins
    got = mooncake_store.batched_get(["k", "k", "k"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert [bytes(g.byte_array) for g in got] == [data_b] * 3  # type: ignore[union-attr]
    assert len({g.data_ptr for g in got}) == 3  # type: ignore[union-attr]
    for obj in (a, b, *got):
        obj.ref_count_down()  # type: ignore[union-attr]


@pytest.mark.mooncake
def test_replacing_more_than_the_local_buffer_says_so(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator
) -> None:
    store = _store(mooncake_client, local_buffer_size=4096)
    a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(a, 1)
    store.put("k", a)  # new: the zero-copy path, no local buffer involved
    with pytest.raises(RemoteStoreError, match="local_buffer_size >= "):
        store.put("k", a)
    got = store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)  # the old entry is intact
    assert got is not None and bytes(got.byte_array) == data
    for obj in (a, got):
        obj.ref_count_down()
    store.close()


# -- leases -------------------------------------------------------------


@pytest.mark.mooncake
def test_delete_waits_out_a_read_lease_or_times_out(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator
) -> None:
    prefix = f"t-{uuid.uuid4().hex[:12]}:"
    quick = MooncakeStore(client=mooncake_client, prefix=prefix, timeout=LEASE_MS / 1000 / 6)
    patient = MooncakeStore(client=mooncake_client, prefix=prefix, timeout=10.0)
    a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(a, 1)
    quick.put("k", a)
    got = quick.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None
    got.ref_count_down()
    with pytest.raises(StoreTimeoutError, match="OBJECT_HAS_LEASE") as info:
        quick.delete("k")
    assert info.value.mooncake_code == codes.HAS_LEASE  # type: ignore[attr-defined]
    assert quick.exists("k")
    assert patient.delete("k") is True  # waits for the lease to end
    assert not quick.exists("k")
    a.ref_count_down()
    quick.close()
    patient.close()


# -- entries kvpool did not write ---------------------------------------


def _raw_put(client: Any, mkey: str, data: bytes) -> None:
    assert client.upsert_parts(mkey, data) == 0


@pytest.mark.mooncake
@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda h, p: b"not a kvpool entry, just bytes" * 10, "not a kvpool entry"),
        (lambda h, p: h[:20], "truncated"),
        (lambda h, p: h + p[:-1], "holds"),  # one payload byte short
        (lambda h, p: h + p + b"x", "holds"),  # one byte too many
        (lambda h, p: h[:40] + bytes([h[40] ^ 1]) + h[41:] + p, "corrupted header"),
    ],
)
def test_damaged_entries_are_corrupt_and_free_the_object(
    mooncake_store: MooncakeStore,
    pool: kvpool.TensorMemoryAllocator,
    make: Callable[[bytes, bytes], bytes],
    match: str,
) -> None:
    header = encode_header(layout_for([KV_SHAPE], [KV_DTYPE]), KV_FMT, 8192, None)
    _raw_put(mooncake_store.client, mooncake_store.object_key("k"), make(header, bytes(8192)))
    for call in (
        lambda: mooncake_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        lambda: mooncake_store.get("k", pool),
        lambda: mooncake_store.batched_get(["k"], pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        lambda: mooncake_store.head("k"),
    ):
        with pytest.raises(CorruptEntryError, match=match):
            call()
        assert pool.stats().active_objects == 0


@pytest.mark.mooncake
def test_checksum_catches_a_flipped_payload_byte(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator
) -> None:
    store = _store(mooncake_client, checksum=True)
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 5)
    store.put("k", src)
    got = store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()
    mkey = store.object_key("k")
    size = mooncake_client.get_size(mkey)
    raw = np.zeros(size, dtype=np.uint8)
    assert mooncake_client.get_into(mkey, raw.ctypes.data, size) == size
    raw[-100] ^= 0xFF
    _raw_put(mooncake_client, mkey, raw.tobytes())
    with pytest.raises(CorruptEntryError, match="CRC"):
        store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert pool.stats().active_objects == 1
    src.ref_count_down()
    store.close()


# -- URLs and construction ----------------------------------------------


@pytest.mark.mooncake
def test_open_store_url(mooncake: MooncakeDeployment, pool: kvpool.TensorMemoryAllocator) -> None:
    url = f"{mooncake.url}&prefix=url-{uuid.uuid4().hex[:8]}:&replicas=1&checksum=1&replace=0"
    with open_store(url, timeout=3.0) as store:
        assert isinstance(store, MooncakeStore) and store.timeout == 3.0
        assert store.replace is False
        src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        data = fill(src, 9)
        store.put("u", src)
        got = store.get("u", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert got is not None and bytes(got.byte_array) == data
        assert store.head("u").payload_crc is not None  # type: ignore[union-attr]
        for obj in (src, got):
            obj.ref_count_down()


@pytest.mark.parametrize(
    ("url", "kwargs", "match"),
    [
        ("mooncake://", {}, "not a Mooncake URL"),
        ("mooncake://host:1/path", {}, "has a path"),
        ("mooncake://host", {}, "no port"),
        ("mooncake://host:1?nope=1", {}, "unknown parameter 'nope'"),
        ("mooncake://host:1?replicas=two", {}, "replicas='two' is not a int"),
        ("mooncake://host:1?checksum=maybe", {}, "checksum"),
        ("mooncake://host:1?protocol=tcp&protocol=rdma", {}, "twice"),
        ("mooncake://host:1?timeout=1", {"timeout": 2}, "both in the URL"),
        ("mooncake://host:1?protocol=udp", {}, "protocol must be"),
        ("mooncake://host:1?replicas=0", {}, "replicas must be"),
        ("mooncake://host:1?replicas=18446744073709551616", {}, "replicas must be"),
        (f"mooncake://host:1?local_buffer_size={2**70}", {}, "local_buffer_size must be"),
        (f"mooncake://host:1?segment_size={2**70}", {}, "segment_size must be"),
    ],
)
def test_bad_urls_and_arguments(url: str, kwargs: dict[str, Any], match: str) -> None:
    pytest.importorskip("mooncake.store", reason="Mooncake's client is not installed")
    with pytest.raises(InvalidArgumentError, match=match):
        open_store(url, **kwargs)


def test_unreachable_master_fails_fast() -> None:
    pytest.importorskip("mooncake.store", reason="Mooncake's client is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(StoreConnectionError, match="cannot be reached"):
        _bounded(lambda: MooncakeStore(f"127.0.0.1:{port}", timeout=1.0), 10)


def test_missing_client_is_feature_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mooncake.store", None)
    with pytest.raises(FeatureUnavailableError, match=r"kvpool\[mooncake\]"):
        MooncakeStore("127.0.0.1:1")


def test_codes_map_to_typed_errors() -> None:
    assert codes.code_name(-704) == "OBJECT_NOT_FOUND" and codes.code_name(-12345) == "code -12345"
    assert codes.code_name(-707) == "LEASE_EXPIRED" and codes.LEASE_EXPIRED in codes.RETRYABLE
    cases = [
        (codes.HAS_LEASE, StoreTimeoutError),
        (codes.LEASE_EXPIRED, StoreTimeoutError),
        (codes.NOT_READY, StoreTimeoutError),
        (codes.RPC_FAIL, StoreConnectionError),
        (codes.TRANSFER_FAIL, StoreConnectionError),
        (-200, RemoteStoreError),
        (-12345, RemoteStoreError),
    ]
    for code, kind in cases:
        exc = codes.error_for(code, "put b'k' on m")
        assert type(exc) is kind and exc.mooncake_code == code  # type: ignore[attr-defined]
        assert str(code) in str(exc) and codes.code_name(code) in str(exc)
    backoff = codes.Backoff(0.0)
    assert backoff.wait() is False


# -- servers that die ---------------------------------------------------


@pytest.fixture
def own_mooncake() -> Iterator[MooncakeDeployment]:
    """A master and storage node for this test alone (it kills them)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        deployment = start_mooncake(segment="64 MB")
        yield deployment
        deployment.stop()


@pytest.mark.mooncake
@pytest.mark.slow
def test_dead_storage_node_then_dead_master_give_typed_errors(
    own_mooncake: MooncakeDeployment, pool: kvpool.TensorMemoryAllocator
) -> None:
    store = MooncakeStore(own_mooncake.master, metadata=own_mooncake.metadata, timeout=2.0)
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    store.put("k", src)
    own_mooncake.kill("node")
    with pytest.raises(StoreConnectionError, match="TRANSFER_FAIL"):
        _bounded(lambda: store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT), 30)
    with pytest.raises(StoreConnectionError):
        _bounded(lambda: store.put("other", src), 30)
    assert pool.stats().active_objects == 1
    own_mooncake.kill("master")
    for call in (
        lambda: store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        lambda: store.exists("k"),
        lambda: store.put("k2", src),
    ):
        with pytest.raises(StoreConnectionError, match="RPC_FAIL"):
            _bounded(call, 30)
    assert pool.stats().active_objects == 1
    src.ref_count_down()
    _bounded(store.close, 30)


class _Calls:
    """A Mooncake client that counts the calls made through it."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.client, name)
        if not name.startswith("batch_"):
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return real(*args, **kwargs)

        return call


@pytest.mark.mooncake
@pytest.mark.parametrize("headerless", [False, True])
def test_without_replace_a_put_keeps_existing_entries_in_one_call(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator, headerless: bool
) -> None:
    counted = _Calls(mooncake_client)
    store = _store(counted, replace=False, headerless=headerless)
    a, b, c = (pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(3))
    data = [fill(o, 40 + i) for i, o in enumerate((a, b, c))]
    store.batched_put(["k", "new"], [a, b])
    assert counted.calls == ["batch_put_from" if headerless else "batch_put_from_multi_buffers"]
    store.batched_put(["k", "other", "other"], [c, c, a])  # "k" exists; "other" twice
    got = store.batched_get(["k", "new", "other"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    # The entries stay the first ones written: nothing replaced, no existence check.
    assert [bytes(g.byte_array) for g in got] == [data[0], data[1], data[2]]  # type: ignore[union-attr]
    assert "batch_is_exist" not in counted.calls
    for obj in (a, b, c, *got):
        obj.ref_count_down()  # type: ignore[union-attr]
    with pytest.raises(kvpool.errors.ArgumentTypeError, match="replace must be True or False"):
        _store(mooncake_client, replace="no")
    store.close()
