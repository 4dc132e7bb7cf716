"""Header layouts whose byte size cannot fit int64 are corrupt entries, on every store.

torch's ``numel()`` is an int64 and wraps around: dims ``(4096, 2**52 + 1)``
of ``uint8`` make ``2**64 + 4096`` bytes, which ``numel()`` reports as
4096, the payload's size.  A header declaring such a layout (its CRC
recomputed, so it looks intact) must be refused as :class:`CorruptEntryError`
by ``get`` (with and without a layout), ``batched_get`` and ``head``, and
``head`` must never report a wrapped size.  The entries are written behind
the store's back, on every kind of store (:mod:`.store_targets`): a real
FileStore, redis-server, Redis Cluster and Mooncake deployment, blocking
and asyncio.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import CorruptEntryError
from kvpool.formats import MAX_LAYOUT_BYTES
from kvpool.remote.header import decode_header, encode_header, key_tag, layout_for

from .store_targets import KINDS, Target, make_target

FMT = kvpool.MemoryFormat.BINARY
PAYLOAD = 4096
#: 2**64 + 4096 bytes; torch's numel() wraps it to 4096.
WRAPPING = [torch.Size([4096, (1 << 52) + 1])]
#: Two groups of 2**62 bytes each: every group fits, the sum does not.
WRAPPING_SUM = [torch.Size([1 << 62]), torch.Size([1 << 62])]


def _entry(shapes: list[torch.Size], tag: bytes | None = None) -> bytes:
    """Header (CRC valid) + payload of an entry declaring ``shapes`` of uint8."""
    layout = layout_for(shapes, [torch.uint8] * len(shapes))
    assert layout.nbytes > MAX_LAYOUT_BYTES  # Python ints: the encoder does not wrap
    header = encode_header(layout, FMT, PAYLOAD, None, None if tag is None else key_tag(tag))
    return header + bytes(range(256)) * (PAYLOAD // 256)


def test_torch_numel_wraps_for_the_test_layout() -> None:
    """The premise: torch reports the payload's size for the first layout."""
    assert WRAPPING[0].numel() == PAYLOAD


@pytest.mark.parametrize("shapes", [WRAPPING, WRAPPING_SUM], ids=["one-group", "sum"])
def test_decode_header_refuses_a_layout_beyond_int64(shapes: list[torch.Size]) -> None:
    with pytest.raises(CorruptEntryError, match="the int64 limit"):
        decode_header(_entry(shapes), "entry k")


def test_decode_header_takes_a_layout_of_exactly_the_limit() -> None:
    layout = layout_for([torch.Size([MAX_LAYOUT_BYTES])], [torch.uint8])
    info = decode_header(encode_header(layout, FMT, PAYLOAD, None), "entry k")
    assert info.layout_size == MAX_LAYOUT_BYTES and info.size == PAYLOAD


# -- the stores -----------------------------------------------------------


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """Every kind of store, blocking and asyncio, with its raw entries behind its back."""
    yield from make_target(request, request.param, tmp_path)


@pytest.mark.parametrize("shapes", [WRAPPING, WRAPPING_SUM], ids=["one-group", "sum"])
def test_every_read_refuses_a_layout_beyond_int64(
    target: Target, pool: kvpool.TensorMemoryAllocator, shapes: list[torch.Size]
) -> None:
    # No key tag: the size is refused while the header is decoded, before
    # the tag is compared.
    target.write_raw("k", _entry(shapes))
    layout = (torch.Size([PAYLOAD]), torch.uint8, FMT)
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("head", ("k",)),
        ("get", ("k", pool)),
        ("get", ("k", pool, *layout)),
        ("batched_get", (["k"], pool)),
        ("batched_get", (["k"], pool, *layout)),
    ]
    for method, args in calls:
        before = pool.stats()
        with pytest.raises(CorruptEntryError, match="the int64 limit") as info:
            got = target.call(method, *args)
            pytest.fail(f"{method}{args} returned {got!r}")
        assert "4096 bytes)" not in str(info.value), (
            f"{method} reported a wrapped size: {info.value}"
        )
        assert pool.stats() == before, method
