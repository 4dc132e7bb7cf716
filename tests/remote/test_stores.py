"""What every store must do: round trips, batched forms, layouts, misuse.

Each test runs on a FileStore and on a RedisStore against a real server
(the ``store`` fixture); the pools must be empty at the end of each test.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import kvpool
from kvpool.errors import (
    FeatureUnavailableError,
    InvalidArgumentError,
    InvalidHandleError,
    OutOfMemoryError,
    PoolClosedError,
)
from kvpool.remote import EntryInfo, RemoteStore

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, fill

MULTI_SHAPES = [torch.Size([2, 3, 5]), torch.Size([8]), torch.Size([4, 4])]
MULTI_DTYPES = [torch.float32, torch.int8, torch.bfloat16]


def test_round_trip(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 1)
    store.put("chunk", src)
    assert src.get_ref_count() == 1  # the put's own reference is gone
    assert store.exists("chunk")
    got = store.get("chunk", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None and got is not src
    assert bytes(got.byte_array) == data
    assert got.get_shapes() == [KV_SHAPE] and got.get_dtypes() == [KV_DTYPE]
    assert got.get_memory_format() is KV_FMT and got.get_ref_count() == 1
    assert torch.equal(got.tensor.view(torch.uint8), src.tensor.view(torch.uint8))
    for obj in (src, got):
        obj.ref_count_down()


def test_stored_layout_is_allocated_when_not_given(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    src = pool.allocate(MULTI_SHAPES, MULTI_DTYPES, kvpool.MemoryFormat.BINARY)
    data = fill(src, 2)
    store.put(b"multi", src)
    info = store.head("multi")
    assert isinstance(info, EntryInfo)
    assert info.shapes == MULTI_SHAPES and info.dtypes == MULTI_DTYPES
    assert info.fmt is kvpool.MemoryFormat.BINARY and info.size == src.get_size()
    for got in (
        store.get("multi", pool),
        store.get("multi", pool, MULTI_SHAPES, MULTI_DTYPES),  # fmt as stored
        store.get("multi", pool, MULTI_SHAPES, MULTI_DTYPES, kvpool.MemoryFormat.BINARY),
    ):
        assert got is not None
        assert bytes(got.byte_array) == data
        assert got.get_shapes() == MULTI_SHAPES and got.get_dtypes() == MULTI_DTYPES
        assert got.get_memory_format() is kvpool.MemoryFormat.BINARY
        for i in range(3):
            assert torch.equal(
                got.get_tensor(i).view(torch.uint8), src.get_tensor(i).view(torch.uint8)
            )
        got.ref_count_down()
    src.ref_count_down()


@pytest.mark.parametrize(
    ("shapes", "dtypes"),
    [
        (torch.Size([1]), torch.uint8),
        (torch.Size([3, 1, 7]), torch.float64),
        ([torch.Size([5, 2]), torch.Size([3])], [torch.int64, torch.bool]),
        (
            [torch.Size([2, 2])] * 5,
            [torch.float16, torch.bfloat16, torch.int32, torch.uint8, torch.float32],
        ),
    ],
)
def test_layouts(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator, shapes: object, dtypes: object
) -> None:
    src = pool.allocate(shapes, dtypes, kvpool.MemoryFormat.KV_T2D)
    data = fill(src, 3)
    store.put("k", src)
    got = store.get("k", pool, shapes, dtypes, kvpool.MemoryFormat.KV_T2D)
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()
    src.ref_count_down()


def test_missing_key_is_none_and_allocates_nothing(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    assert store.get("nope", pool, KV_SHAPE, KV_DTYPE, KV_FMT) is None
    assert store.get("nope", pool) is None
    assert store.head("nope") is None
    assert not store.exists("nope")
    assert store.delete("nope") is False
    assert pool.stats().active_objects == 0


def test_str_and_bytes_keys_name_the_same_entry(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 4)
    store.put("é/../x", src)
    assert store.exists("é/../x".encode())
    assert store.delete("é/../x".encode())
    assert not store.exists("é/../x")
    src.ref_count_down()


def test_put_replaces(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    b = pool.allocate(MULTI_SHAPES, MULTI_DTYPES, KV_FMT)
    fill(a, 5)
    data_b = fill(b, 6)
    store.put("k", a)
    store.put("k", b)
    got = store.get("k", pool)
    assert got is not None and bytes(got.byte_array) == data_b
    assert got.get_shapes() == MULTI_SHAPES
    for obj in (a, b, got):
        obj.ref_count_down()


def test_paged_pool_destination(
    store: RemoteStore,
    pool: kvpool.TensorMemoryAllocator,
    paged_pool: kvpool.PagedTensorMemoryAllocator,
) -> None:
    src = paged_pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 7)
    store.put("paged", src)
    got = store.get("paged", paged_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None and bytes(got.byte_array) == data
    also = store.get("paged", pool)  # into an extent pool, stored layout
    assert also is not None and bytes(also.byte_array) == data
    for obj in (src, got, also):
        obj.ref_count_down()


def test_narrowed_object_round_trip(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, kvpool.MemoryFormat.BINARY)
    fill(src, 8)
    src.set_used_size(1000)
    data = bytes(src.byte_array)
    store.put("narrow", src)
    info = store.head("narrow")
    assert info is not None and info.size == 1000 and info.layout_size == src.get_physical_size()
    for got in (
        store.get("narrow", pool, KV_SHAPE, KV_DTYPE, kvpool.MemoryFormat.BINARY),
        store.get("narrow", pool),
    ):
        assert got is not None and got.get_size() == 1000
        assert bytes(got.byte_array) == data
        got.ref_count_down()
    src.ref_count_down()


# -- kinds of objects --------------------------------------------------


def test_binary_buffer_destination(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    # A MixedMemoryAllocator answers BINARY_BUFFER with a Python byte buffer.
    src = pool.allocate(KV_SHAPE, KV_DTYPE, kvpool.MemoryFormat.BINARY_BUFFER)
    data = fill(src, 11)
    store.put("bb", src)
    src.ref_count_down()
    with kvpool.MixedMemoryAllocator(1 << 20) as mixed:
        for got in (
            store.get("bb", mixed),
            store.get("bb", mixed, KV_SHAPE, KV_DTYPE, kvpool.MemoryFormat.BINARY_BUFFER),
            store.batched_get(["bb"], mixed)[0],
        ):
            assert isinstance(got, kvpool.BytesBufferMemoryObj)
            assert got.get_size() == len(data) and bytes(got.byte_array) == data
            got.ref_count_down()


class _FixedAllocator(kvpool.MemoryAllocatorInterface):
    """Hands out one given object (a destination kind a real pool may produce)."""

    def __init__(self, make: object) -> None:
        self.make = make

    def allocate(self, shapes, dtypes, fmt=None, allocator_type=None):  # type: ignore[no-untyped-def]
        return self.make()  # type: ignore[operator]

    def batched_allocate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def free(self, memory_obj, allocator_type=None):  # type: ignore[no-untyped-def]
        pass

    def batched_free(self, memory_objs, allocator_type=None, update_stats=True):  # type: ignore[no-untyped-def]
        pass

    def close(self) -> None:
        pass


def _gds_object() -> kvpool.GDSMemoryObject:
    meta = kvpool.MemoryObjMetadata(
        shape=KV_SHAPE, dtype=KV_DTYPE, address=0, phy_size=8192, ref_count=1, fmt=KV_FMT
    )
    return kvpool.GDSMemoryObject(meta)


def test_device_objects_are_refused(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    device = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8, device="meta"))
    obj = device.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    with pytest.raises(FeatureUnavailableError, match="host"):
        store.put("dev", obj)
    assert obj.get_ref_count() == 1 and not store.exists("dev")
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 12)
    store.put("k", src)
    src.ref_count_down()
    for call in (
        lambda: store.get("k", device),
        lambda: store.get("k", device, KV_SHAPE, KV_DTYPE, KV_FMT),
        lambda: store.batched_get(["k"], device),
    ):
        with pytest.raises(FeatureUnavailableError, match="host"):
            call()
        assert device.stats().active_objects == 1  # only obj: the destination was freed
    obj.ref_count_down()
    assert device.memcheck() and device.stats().active_objects == 0
    device.close()


def test_gds_objects_are_refused(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    with pytest.raises(FeatureUnavailableError, match="slab file"):
        store.put("gds", _gds_object())
    with pytest.raises(FeatureUnavailableError, match="slab file"):
        store.batched_put(["gds"], [_gds_object()])
    assert not store.exists("gds")
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 13)
    store.put("k", src)
    src.ref_count_down()
    with pytest.raises(FeatureUnavailableError, match="slab file"):
        store.get("k", _FixedAllocator(_gds_object))


def test_read_only_or_wrong_size_destinations_are_refused(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 14)
    store.put("k", src)
    src.ref_count_down()
    nbytes = KV_SHAPE.numel() * KV_DTYPE.itemsize
    with pytest.raises(InvalidArgumentError, match="read-only"):
        store.get("k", _FixedAllocator(lambda: kvpool.BytesBufferMemoryObj(bytes(nbytes))))
    small = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    wrong = _FixedAllocator(lambda: small.allocate(torch.Size([16]), torch.uint8, KV_FMT))
    with pytest.raises(InvalidArgumentError, match="16 bytes"):
        store.get("k", wrong)
    assert small.stats().active_objects == 0  # the wrong object was freed
    small.close()


@pytest.mark.gpu
def test_cuda_objects_are_refused(cuda_device, store: RemoteStore) -> None:
    with kvpool.GPUMemoryAllocator(16 << 20) as gpu:
        obj = gpu.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        with pytest.raises(FeatureUnavailableError):
            store.put("cuda", obj)
        obj.ref_count_down()
        assert gpu.memcheck()


# -- batched -----------------------------------------------------------


def test_batched(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    objs = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 8, KV_FMT)
    assert objs is not None
    datas = [fill(o, 10 + i) for i, o in enumerate(objs)]
    keys = [f"b{i}" for i in range(8)]
    store.batched_put(keys, objs)
    assert all(o.get_ref_count() == 1 for o in objs)
    assert store.batched_exists([*keys, "none"]) == [True] * 8 + [False]
    got = store.batched_get([keys[3], "none", *keys], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got[1] is None
    assert [bytes(g.byte_array) for g in got[2:]] == datas  # type: ignore[union-attr]
    assert bytes(got[0].byte_array) == datas[3]  # type: ignore[union-attr]
    for g in got:
        if g is not None:
            g.ref_count_down()
    assert store.batched_get([], pool) == []
    store.batched_put([], [])
    assert store.batched_delete([*keys[:4], "none"]) == 4
    assert store.batched_exists(keys) == [False] * 4 + [True] * 4
    pool.batched_free(objs)


def test_batched_get_failure_frees_everything(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    b = pool.allocate(MULTI_SHAPES, MULTI_DTYPES, KV_FMT)
    fill(a, 1)
    fill(b, 2)
    store.batched_put(["a1", "a2", "b"], [a, a, b])
    with pytest.raises(InvalidArgumentError, match="layout mismatch"):
        store.batched_get(["a1", "a2", "b"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert pool.stats().active_objects == 2
    a.ref_count_down()
    b.ref_count_down()


def test_batched_put_length_mismatch(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    with pytest.raises(InvalidArgumentError, match="2 keys but 1"):
        store.batched_put(["x", "y"], [a])
    assert not store.exists("x")
    a.ref_count_down()


# -- layout checks -----------------------------------------------------


@pytest.mark.parametrize(
    ("shapes", "dtypes", "fmt", "match"),
    [
        (torch.Size([4, 2, 16, 32]), KV_DTYPE, KV_FMT, "layout mismatch"),  # same size
        (torch.Size([2, 4, 16, 16]), KV_DTYPE, KV_FMT, "layout mismatch"),  # smaller
        (torch.Size([2, 4, 16, 64]), KV_DTYPE, KV_FMT, "layout mismatch"),  # larger
        (KV_SHAPE, torch.bfloat16, KV_FMT, "layout mismatch"),  # same size, other dtype
        ([KV_SHAPE, torch.Size([1])], [KV_DTYPE, torch.uint8], KV_FMT, "layout mismatch"),
        (KV_SHAPE, KV_DTYPE, kvpool.MemoryFormat.KV_T2D, "format mismatch"),
    ],
)
def test_layout_mismatch_raises_and_frees(
    store: RemoteStore,
    pool: kvpool.TensorMemoryAllocator,
    shapes: object,
    dtypes: object,
    fmt: kvpool.MemoryFormat,
    match: str,
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 9)
    store.put("k", src)
    with pytest.raises(InvalidArgumentError, match=match):
        store.get("k", pool, shapes, dtypes, fmt)
    assert pool.stats().active_objects == 1 and pool.memcheck()
    # the entry is intact and the store still works
    got = store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None and torch.equal(
        got.tensor.view(torch.uint8), src.tensor.view(torch.uint8)
    )
    got.ref_count_down()
    src.ref_count_down()


# -- misuse ------------------------------------------------------------


@pytest.mark.parametrize("key", [1, None, 2.5, bytearray(b"k"), memoryview(b"k"), ["k"], "\udc80"])
def test_bad_keys(store: RemoteStore, pool: kvpool.TensorMemoryAllocator, key: object) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    with pytest.raises(InvalidArgumentError, match="key"):
        store.put(key, src)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="key"):
        store.get(key, pool)  # type: ignore[arg-type]
    for method in (store.exists, store.delete, store.head):
        with pytest.raises(InvalidArgumentError, match="key"):
            method(key)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="key"):
        store.batched_get(["ok", key], pool)  # type: ignore[list-item]
    assert src.get_ref_count() == 1
    src.ref_count_down()


def test_too_long_key(store: RemoteStore) -> None:
    with pytest.raises(InvalidArgumentError, match="longer than"):
        store.exists(b"x" * 65537)


def test_put_freed_object(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    src.ref_count_down()
    with pytest.raises(InvalidHandleError, match="freed"):
        store.put("k", src)
    with pytest.raises(InvalidHandleError, match="freed"):
        store.batched_put(["k"], [src])
    assert not store.exists("k")


def test_put_not_a_memory_object(store: RemoteStore) -> None:
    with pytest.raises(InvalidArgumentError, match="MemoryObj"):
        store.put("k", b"bytes")  # type: ignore[arg-type]
    bytes_obj = kvpool.BytesBufferMemoryObj(b"abc")
    with pytest.raises(InvalidArgumentError):
        store.put("k", bytes_obj)
    assert not store.exists("k")


def test_get_into_closed_pool(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    store.put("k", src)
    src.ref_count_down()
    other = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    other.close()
    with pytest.raises(PoolClosedError):
        store.get("k", other, KV_SHAPE, KV_DTYPE, KV_FMT)
    with pytest.raises(PoolClosedError):
        store.get("k", other)
    assert store.exists("k")  # the store is fine and the entry is intact
    got = store.get("k", pool)
    assert got is not None
    got.ref_count_down()


def test_get_into_full_pool(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    small = kvpool.TensorMemoryAllocator(torch.empty(12 << 10, dtype=torch.uint8))
    src = small.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    store.put("k", src)
    # a missing key is None even when the pool has no room
    assert store.get("missing", small, KV_SHAPE, KV_DTYPE, KV_FMT) is None
    assert store.batched_get(["missing"], small, KV_SHAPE, KV_DTYPE, KV_FMT) == [None]
    with pytest.raises(OutOfMemoryError, match="no room"):
        store.get("k", small, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert small.stats().active_objects == 1 and small.memcheck()
    src.ref_count_down()
    assert small.stats().active_objects == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shapes": KV_SHAPE}, "both shapes and dtypes"),
        ({"dtypes": KV_DTYPE}, "both shapes and dtypes"),
        ({"shapes": "x", "dtypes": KV_DTYPE}, "shape"),
        ({"shapes": KV_SHAPE, "dtypes": "float16"}, "dtype"),
        ({"fmt": 1}, "MemoryFormat"),
    ],
)
def test_bad_get_arguments(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator, kwargs: dict, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        store.get("k", pool, **kwargs)


@pytest.mark.parametrize("not_an_allocator", [None, b"bytes", torch.empty(4), object()])
def test_get_with_a_non_allocator_is_a_typed_error(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator, not_an_allocator: object
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 3)
    store.put("k", src)
    src.ref_count_down()
    for call in (
        lambda: store.get("k", not_an_allocator),  # type: ignore[arg-type]
        lambda: store.get("k", not_an_allocator, KV_SHAPE, KV_DTYPE, KV_FMT),  # type: ignore[arg-type]
        lambda: store.batched_get(["k", "missing"], not_an_allocator),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgumentError, match="allocate"):
            call()
    got = store.get("k", pool)  # the entry is intact
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()


def test_closed_store(store: RemoteStore, pool: kvpool.TensorMemoryAllocator) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    store.close()
    store.close()  # idempotent
    assert store.closed
    for call in (
        lambda: store.put("k", src),
        lambda: store.get("k", pool),
        lambda: store.exists("k"),
        lambda: store.delete("k"),
        lambda: store.head("k"),
        lambda: store.batched_get(["k"], pool),
        lambda: store.batched_put(["k"], [src]),
        lambda: store.batched_exists(["k"]),
        lambda: store.batched_delete(["k"]),
    ):
        with pytest.raises(PoolClosedError, match="closed"):
            call()
    assert src.get_ref_count() == 1
    src.ref_count_down()


def test_put_holds_a_reference_during_io(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    seen = []
    import kvpool.remote.objects as objects

    real = objects.describe

    def spy(obj: kvpool.MemoryObj) -> object:
        seen.append(obj.get_ref_count())
        obj.ref_count_down()  # the caller's own reference goes away mid-put
        return real(obj)

    for name, module in list(sys.modules.items()):  # wherever a store imported it
        if name.startswith("kvpool.remote") and getattr(module, "describe", None) is real:
            monkeypatch.setattr(module, "describe", spy)
    store.put("k", src)
    assert seen == [2]
    # The last reference was the store's: the object is freed after the put.
    assert not src.is_valid()
    assert pool.stats().active_objects == 0
    got = store.get("k", pool)
    assert got is not None
    got.ref_count_down()


def test_concurrent_put_get_see_whole_entries(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    b = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = {fill(a, 1), fill(b, 2)}
    store.put("k", a)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            i = 0
            while not stop.is_set():
                store.put("k", (a, b)[i % 2])
                i += 1
                # Mooncake refuses to read a key while a write of it is in
                # flight (REPLICA_IS_NOT_READY, retried until the timeout): a
                # writer that never pauses can starve the reader on a busy
                # machine. A short pause leaves it windows; puts and gets
                # still overlap.
                stop.wait(0.002)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(200):
            got = store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            assert got is not None
            assert bytes(got.byte_array) in data
            got.ref_count_down()
    finally:
        stop.set()
        thread.join()
    assert not errors
    a.ref_count_down()
    b.ref_count_down()
