"""MooncakeStore.put_ranges/get_ranges against a real Mooncake master and storage node.

Registered host ranges move as they are, with no memory objects: written
and read back byte for byte, a missing key is False, an existing key keeps
its entry (``replace=False``: a key twice in one batch keeps its first
range) or is replaced (``replace=True``: the last range wins); a range of another size is a
CorruptEntryError naming it; what is refused before any call (a store with
headers, unregistered memory, lists of different lengths) leaves nothing
stored; the calls are counted with their entries, bytes and misses; the
entries are the same as ``batched_put``'s headerless ones.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch

from kvpool.errors import ArgumentTypeError, CorruptEntryError, InvalidArgumentError
from kvpool.remote import MooncakeStore

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE

pytestmark = pytest.mark.mooncake

SIZE = 4096


def _prefix() -> str:
    return f"r-{uuid.uuid4().hex[:12]}:"


def _buffer(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n * SIZE,), generator=gen, dtype=torch.uint8)


def _ranges(buf: torch.Tensor, n: int) -> tuple[list[int], list[int]]:
    base = buf.data_ptr()
    return [base + i * SIZE for i in range(n)], [SIZE] * n


def test_ranges_round_trip_miss_and_keep(mooncake_client: Any) -> None:
    src, dst = _buffer(4, 1), torch.zeros(5 * SIZE, dtype=torch.uint8)
    with MooncakeStore(client=mooncake_client, prefix=_prefix(), headerless=True) as store:
        store.register_memory(src)
        store.register_memory(dst)
        keys = [f"p{i}" for i in range(4)]
        addrs, sizes = _ranges(src, 4)
        store.put_ranges(keys, addrs, sizes)
        assert mooncake_client.get(store.object_key("p2")) == bytes(src[2 * SIZE : 3 * SIZE])
        out_addrs, out_sizes = _ranges(dst, 5)
        assert store.get_ranges([*keys, "none"], out_addrs, out_sizes) == [True] * 4 + [False]
        assert torch.equal(dst[: 4 * SIZE], src)
        snap = store.counters.snapshot()
        assert (snap["put_ranges"].calls, snap["put_ranges"].entries) == (1, 4)
        assert snap["put_ranges"].nbytes == 4 * SIZE
        got = snap["get_ranges"]
        assert (got.entries, got.nbytes, got.misses) == (5, 4 * SIZE, 1)
        store.batched_delete(keys)


@pytest.mark.parametrize("replace", [False, True])
def test_an_existing_key_is_kept_or_replaced(mooncake_client: Any, replace: bool) -> None:
    first, second = _buffer(1, 2), _buffer(1, 3)
    back = torch.zeros(SIZE, dtype=torch.uint8)
    with MooncakeStore(
        client=mooncake_client, prefix=_prefix(), headerless=True, replace=replace
    ) as store:
        for buf in (first, second, back):
            store.register_memory(buf)
        store.put_ranges(["k"], [first.data_ptr()], [SIZE])
        store.put_ranges(["k"], [second.data_ptr()], [SIZE])
        assert store.get_ranges(["k"], [back.data_ptr()], [SIZE]) == [True]
        assert torch.equal(back, second if replace else first)
        # A key twice in one batch: written in rounds, the last range wins.
        store.put_ranges(["t", "t"], [first.data_ptr(), second.data_ptr()], [SIZE, SIZE])
        assert store.get_ranges(["t"], [back.data_ptr()], [SIZE]) == [True]
        assert torch.equal(back, second if replace else first)
        store.batched_delete(["k", "t"])


def test_ranges_and_objects_read_each_others_entries(mooncake_client: Any, pool: Any) -> None:
    nbytes = KV_SHAPE.numel() * KV_DTYPE.itemsize
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    back = torch.zeros(nbytes + SIZE, dtype=torch.uint8)
    with MooncakeStore(client=mooncake_client, prefix=_prefix(), headerless=True) as store:
        store.register_memory(src)
        store.register_memory(back)
        store.put_ranges(["a"], [src.data_ptr()], [nbytes])
        obj = store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert obj is not None and bytes(obj.byte_array) == bytes(src)
        store.put("b", obj)
        obj.ref_count_down()
        assert store.get_ranges(["b"], [back.data_ptr()], [nbytes]) == [True]
        assert torch.equal(back[:nbytes], src)
        # An entry of another size than its range is named, not read as a page.
        with pytest.raises(CorruptEntryError, match=f"'b'.*holds {nbytes} bytes, its range {SIZE}"):
            store.get_ranges(
                ["a", "b"], [back.data_ptr(), back.data_ptr() + nbytes], [nbytes, SIZE]
            )
        store.batched_delete(["a", "b"])


def test_what_ranges_refuse(mooncake_client: Any) -> None:
    buf = _buffer(2, 4)
    loose = _buffer(1, 5)  # never registered
    with MooncakeStore(client=mooncake_client, prefix=_prefix()) as headed:
        headed.register_memory(buf)
        with pytest.raises(InvalidArgumentError, match="only a headerless store"):
            headed.put_ranges(["x"], [buf.data_ptr()], [SIZE])
        with pytest.raises(InvalidArgumentError, match="only a headerless store"):
            headed.get_ranges(["x"], [buf.data_ptr()], [SIZE])
    with MooncakeStore(client=mooncake_client, prefix=_prefix(), headerless=True) as store:
        store.register_memory(buf)
        with pytest.raises(InvalidArgumentError, match="not inside memory registered"):
            store.put_ranges(["x", "y"], [buf.data_ptr(), loose.data_ptr()], [SIZE, SIZE])
        with pytest.raises(InvalidArgumentError, match="not inside memory registered"):
            store.put_ranges(["x"], [buf.data_ptr() + SIZE], [SIZE + 1])  # runs past its end
        with pytest.raises(InvalidArgumentError, match="at least one byte"):
            store.put_ranges(["x"], [buf.data_ptr()], [0])
        with pytest.raises(InvalidArgumentError, match="2 keys, 1 addresses and 1 sizes"):
            store.get_ranges(["x", "y"], [buf.data_ptr()], [SIZE])
        for call in (store.put_ranges, store.get_ranges):  # a refused keyword: counted too
            with pytest.raises(ArgumentTypeError, match="unexpected keyword"):
                call(["x"], [buf.data_ptr()], [SIZE], bogus=1)
        assert store.batched_exists(["x", "y"]) == [False, False]  # nothing was stored
        snap = store.counters.snapshot()
        assert snap["put_ranges"].errors == {"InvalidArgumentError": 3, "ArgumentTypeError": 1}
        assert snap["get_ranges"].errors == {"InvalidArgumentError": 1, "ArgumentTypeError": 1}
    with pytest.raises(Exception, match="closed"):
        store.put_ranges(["x"], [buf.data_ptr()], [SIZE])
