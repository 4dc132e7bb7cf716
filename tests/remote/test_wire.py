"""The header format and the in-place RESP reader (no server needed)."""

from __future__ import annotations

import socket
import struct
import threading
import time
import zlib

import pytest
import torch

from kvpool.errors import CorruptEntryError, InvalidArgumentError
from kvpool.formats import MemoryFormat
from kvpool.remote import header as hdr
from kvpool.remote.redis.connection import RedisConnection
from kvpool.remote.redis.resp import Limits, ProtocolError, ServerClosed, parse_length

SHAPES = [torch.Size([2, 4, 16, 32]), torch.Size([3]), torch.Size([])]
DTYPES = [torch.float16, torch.int64, torch.float8_e4m3fn]


# -- header ------------------------------------------------------------


def test_header_round_trip() -> None:
    layout = hdr.layout_for(SHAPES, DTYPES)
    assert layout.nbytes == 2 * 4 * 16 * 32 * 2 + 3 * 8 + 1
    for crc in (None, 0, 0xDEADBEEF):
        raw = hdr.encode_header(layout, MemoryFormat.KV_MLA_FMT, layout.nbytes - 5, crc)
        assert len(raw) == layout.header_size and layout.header_size % hdr.HEADER_ALIGN == 0
        assert raw[:4] == hdr.MAGIC
        info = hdr.decode_header(raw + b"payload follows", "t")
        assert info.shapes == SHAPES and info.dtypes == DTYPES
        assert info.fmt is MemoryFormat.KV_MLA_FMT and info.payload_crc == crc
        assert info.size == layout.nbytes - 5 and info.layout_size == layout.nbytes
        assert hdr.matches(raw, layout)
        assert not hdr.matches(raw, hdr.layout_for([torch.Size([1])], [torch.uint8]))


def test_header_documented_offsets() -> None:
    layout = hdr.layout_for([torch.Size([5, 7])], [torch.bfloat16])
    raw = hdr.encode_header(layout, MemoryFormat.KV_T2D, 70, 1234)
    magic, version, flags, size, crc = struct.unpack_from("<4sHHII", raw)
    assert (magic, version, flags, size) == (b"KVPS", 1, hdr.FLAG_PAYLOAD_CRC, 64)
    assert crc == zlib.crc32(raw[16:], zlib.crc32(raw[:12]))
    assert struct.unpack_from("<QIHH", raw, 16) == (70, 1234, MemoryFormat.KV_T2D.value, 1)
    assert raw[32:34] == bytes([2, len("bfloat16")]) and raw[34:42] == b"bfloat16"
    assert struct.unpack_from("<2q", raw, 42) == (5, 7)
    assert raw[58:] == bytes(6)


def test_every_flipped_header_bit_is_detected() -> None:
    layout = hdr.layout_for(SHAPES, DTYPES)
    raw = bytearray(hdr.encode_header(layout, MemoryFormat.KV_2LTD, layout.nbytes, 77))
    for i in range(len(raw)):
        for bit in (0x01, 0x80):
            raw[i] ^= bit
            with pytest.raises(CorruptEntryError):
                hdr.decode_header(raw, "t")
            assert not hdr.matches(raw, layout)
            raw[i] ^= bit
    hdr.decode_header(raw, "t")


def test_layout_cache_is_bounded() -> None:
    for n in range(1, 600):
        hdr.layout_for([torch.Size([n])], [torch.uint8])
    assert len(hdr._cache) <= 256


@pytest.mark.parametrize(
    ("shapes", "dtypes"),
    [([], []), ([torch.Size([1])], []), ([torch.Size([1])], ["float16"])],
)
def test_bad_layouts(shapes: list, dtypes: list) -> None:
    with pytest.raises(InvalidArgumentError):
        hdr.layout_for(shapes, dtypes)


def test_malformed_group_records() -> None:
    layout = hdr.layout_for([torch.Size([4])], [torch.float32])
    raw = bytearray(hdr.encode_header(layout, MemoryFormat.UNDEFINED, 16, None))

    def resign(buf: bytearray) -> bytes:
        crc = hdr.header_crc(buf, len(buf))
        return bytes(buf[:12]) + crc.to_bytes(4, "little") + bytes(buf[16:])

    bad_dtype = bytearray(raw)
    bad_dtype[34:41] = b"float99"
    with pytest.raises(CorruptEntryError, match="malformed layout"):
        hdr.decode_header(resign(bad_dtype), "t")
    too_big = bytearray(raw)
    struct.pack_into("<Q", too_big, 16, 17)  # payload larger than its layout
    with pytest.raises(CorruptEntryError, match="larger than its layout"):
        hdr.decode_header(resign(too_big), "t")
    bad_fmt = bytearray(raw)
    struct.pack_into("<H", bad_fmt, 28, 999)
    with pytest.raises(CorruptEntryError, match="unknown memory format"):
        hdr.decode_header(resign(bad_fmt), "t")
    no_groups = bytearray(raw)
    struct.pack_into("<H", no_groups, 30, 0)
    with pytest.raises(CorruptEntryError, match="malformed layout"):
        hdr.decode_header(resign(no_groups), "t")
    many_groups = bytearray(raw)
    struct.pack_into("<H", many_groups, 30, 50)
    with pytest.raises(CorruptEntryError, match="malformed layout"):
        hdr.decode_header(resign(many_groups), "t")


# -- RESP reader -------------------------------------------------------


def _pair(
    data: bytes, chunk: int = 0, close: bool = True, limits: Limits | None = None
) -> tuple[RedisConnection, threading.Thread, socket.socket]:
    """A connection that receives ``data`` (in pieces of ``chunk`` bytes) from a thread."""
    a, b = socket.socketpair()

    def send() -> None:
        step = chunk or len(data) or 1
        for i in range(0, len(data), step):
            b.sendall(data[i : i + step])
        if close:
            b.close()

    thread = threading.Thread(target=send)
    thread.start()
    conn = RedisConnection(a, "test", limits=limits or Limits())
    return conn, thread, b


def _deadline(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


@pytest.mark.parametrize("chunk", [0, 1, 3, 7, 4096])
def test_reader_reads_values_in_place(chunk: int) -> None:
    payload = bytes(range(256)) * 40
    wire = b"*2\r\n$5\r\nhello\r\n$%d\r\n%b\r\n:42\r\n" % (len(payload), payload)
    conn, thread, _ = _pair(wire, chunk)
    r = conn.reader
    dest = bytearray(len(payload))

    def steps():  # type: ignore[no-untyped-def]
        assert (yield from r.line()) == b"*2"
        assert (yield from r.reply()) == b"hello"
        n = parse_length((yield from r.line()), "bulk", 1 << 20)
        assert n == len(payload)
        yield from r.read_into(memoryview(dest))
        yield from r.crlf()
        return (yield from r.reply())

    assert conn.run(steps(), _deadline()) == 42
    assert bytes(dest) == payload and r.pending() == 0
    thread.join()
    conn.close()


def test_reader_generic_replies() -> None:
    wire = b"*3\r\n+OK\r\n*2\r\n:1\r\n$-1\r\n*0\r\n-ERR boom\r\n*-1\r\n"
    conn, thread, _ = _pair(wire, 2)
    r = conn.reader
    assert conn.run(r.reply(), _deadline()) == [b"OK", [1, None], []]
    err = conn.run(r.reply(), _deadline())
    assert err.text == "ERR boom" and err.code == "ERR"
    assert conn.run(r.reply(), _deadline()) is None
    thread.join()
    conn.close()


def test_reader_server_closes_mid_value() -> None:
    conn, thread, _ = _pair(b"$100\r\n" + b"x" * 50)

    def steps():  # type: ignore[no-untyped-def]
        assert parse_length((yield from conn.reader.line()), "bulk", 100) == 100
        yield from conn.reader.read_into(memoryview(bytearray(100)))

    with pytest.raises(ServerClosed):
        conn.run(steps(), _deadline())
    thread.join()
    conn.close()


def test_reader_server_closes_mid_line() -> None:
    conn, thread, _ = _pair(b"*2\r\n$1")
    with pytest.raises(ServerClosed):
        conn.run(conn.reader.reply(), _deadline())
    thread.join()
    conn.close()


def test_reader_deadline_bounds_the_whole_reply() -> None:
    conn, thread, peer = _pair(b"$3\r\nab", close=False)
    with pytest.raises(TimeoutError):
        conn.run(conn.reader.reply(), _deadline(0.1))
    thread.join()
    peer.close()
    conn.close()


def test_reader_refuses_long_lines_and_bad_endings() -> None:
    limits = Limits(max_line=32, buffer=64)
    conn, thread, _ = _pair(b"+" + b"y" * 100 + b"\r\n", limits=limits)
    with pytest.raises(ProtocolError, match="longer than"):
        conn.run(conn.reader.reply(), _deadline())
    thread.join()
    conn.close()
    conn, thread, _ = _pair(b"$2\r\nabXY")
    with pytest.raises(ProtocolError, match="CRLF"):
        conn.run(conn.reader.reply(), _deadline())
    thread.join()
    conn.close()


@pytest.mark.parametrize(
    ("line", "expected"),
    [(b"$5", 5), (b"$0", 0), (b"$-1", -1), (b"*7", 7)],
)
def test_parse_length(line: bytes, expected: int) -> None:
    assert parse_length(line, "bulk", 100) == expected


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (b"$x", "malformed"),
        (b"$ 5", "malformed"),
        (b"$1_0", "malformed"),
        (b"$+5", "malformed"),
        (b"$-2", "limit"),
        (b"$101", "limit"),
        (b"$%d" % (1 << 62), "limit"),
        (b"$%d" % (1 << 64), "malformed"),
    ],
)
def test_parse_length_errors(line: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        parse_length(line, "bulk", 100)
