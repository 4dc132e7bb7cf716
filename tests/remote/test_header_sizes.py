"""Header layouts whose byte size cannot fit int64 are corrupt entries, on every store.

torch's ``numel()`` is an int64 and wraps around: dims ``(4096, 2**52 + 1)``
of ``uint8`` make ``2**64 + 4096`` bytes, which ``numel()`` reports as
4096, the payload's size.  A header declaring such a layout (its CRC
recomputed, so it looks intact) must be refused as :class:`CorruptEntryError`
by ``get`` (with and without a layout), ``batched_get`` and ``head``, and
``head`` must never report a wrapped size.  The entries are written behind
the store's back, on a real FileStore, redis-server and Mooncake deployment.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import kvpool
from kvpool.errors import CorruptEntryError
from kvpool.formats import MAX_LAYOUT_BYTES
from kvpool.remote import FileStore, RedisStore, RemoteStore
from kvpool.remote.header import decode_header, encode_header, key_tag, layout_for

from .conftest import RedisServer

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


def _raw_set(server: RedisServer, key: bytes, value: bytes) -> None:
    """SET ``key`` ``value`` on a plain socket (behind the store's back)."""
    args = [b"SET", key, value]
    parts = [b"*%d\r\n" % len(args)] + [b"$%d\r\n%b\r\n" % (len(a), a) for a in args]
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"".join(parts))
        assert s.recv(16) == b"+OK\r\n"


Writer = Callable[[list[torch.Size]], None]


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("mooncake", marks=pytest.mark.mooncake)])  # fmt: skip
def store_and_writer(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[RemoteStore, Writer]]:
    """A store and a function that writes a raw entry under its key ``"k"``."""
    if request.param == "file":
        with FileStore(tmp_path / "store") as fs:

            def write_file(shapes: list[torch.Size]) -> None:
                Path(fs.path("k")).write_bytes(_entry(shapes))

            yield fs, write_file
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix = f"t-{uuid.uuid4().hex[:12]}:".encode()
        with RedisStore(server.url, prefix=prefix.decode(), timeout=5.0) as rs:

            def write_redis(shapes: list[torch.Size]) -> None:
                _raw_set(server, prefix + b"k", _entry(shapes, tag=prefix + b"k"))

            yield rs, write_redis
    else:
        from kvpool.remote.mooncake.store import MooncakeStore

        client = request.getfixturevalue("mooncake_client")
        with MooncakeStore(client=client, prefix=f"t-{uuid.uuid4().hex[:12]}:") as ms:

            def write_mooncake(shapes: list[torch.Size]) -> None:
                assert client.upsert_parts(ms.object_key("k"), _entry(shapes)) == 0  # type: ignore[attr-defined]

            yield ms, write_mooncake


@pytest.mark.parametrize("shapes", [WRAPPING, WRAPPING_SUM], ids=["one-group", "sum"])
def test_every_read_refuses_a_layout_beyond_int64(
    store_and_writer: tuple[RemoteStore, Writer],
    pool: kvpool.TensorMemoryAllocator,
    shapes: list[torch.Size],
) -> None:
    store, write = store_and_writer
    write(shapes)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("head", lambda: store.head("k")),
        ("get", lambda: store.get("k", pool)),
        (
            "get with a layout",
            lambda: store.get("k", pool, torch.Size([PAYLOAD]), torch.uint8, FMT),
        ),
        ("batched_get", lambda: store.batched_get(["k"], pool)),
        (
            "batched_get with a layout",
            lambda: store.batched_get(["k"], pool, torch.Size([PAYLOAD]), torch.uint8, FMT),
        ),
    ]
    for name, call in calls:
        with pytest.raises(CorruptEntryError, match="the int64 limit") as info:
            got = call()
            pytest.fail(f"{name} returned {got!r}")
        assert "4096 bytes)" not in str(info.value), f"{name} reported a wrapped size: {info.value}"
        assert pool.stats().active_objects == 0, name
