"""How an entry lives in a Redis/Valkey key, and the commands that move it.

Shared by every Redis-protocol store (single node, asyncio, cluster):
each function builds the parts of one command or returns a reply parser
(a generator of :mod:`kvpool.remote.redis.resp`) for a
:class:`~kvpool.remote.redis.connection.RedisConnection` to send and serve.

The format
----------
One string key per entry, ``prefix + key``, whose value is the entry:
the header of :mod:`kvpool.remote.header` (with a *key tag*, the CRC-32
of the Redis key) followed by the object's bytes.

* ``put`` is one ``SET key <header><bytes> [PX ms]``: atomic without
  ``MULTI`` (a reader sees the old value or the new one), the bytes sent
  from the object's memory with no copy.
* ``get`` is one ``GET key``: the header is read into a small buffer and
  checked - magic, version, CRC, layout, sizes and the key tag - before
  the destination is allocated; the bytes are then received straight
  into it.  A reply carrying another key's tag (a reply frame duplicated
  or out of order) is refused, so a connection out of step can never
  return another key's bytes.
* Entries of the older hash format (``HSET key h <header> d <bytes>``)
  are refused with a :class:`~kvpool.errors.CorruptEntryError` that says
  so (``GET`` on a hash fails with ``WRONGTYPE``): delete them or put
  them again.

Every call ends with a ``PING <nonce>`` *sentinel*, sent with its last
command (the same ``sendmsg``: bytes, not a round trip): its echo must
come back exactly where expected, else a reply was duplicated or lost and
the call fails instead of reporting another command's answer.  A reply
that carries no key tag - ``+OK`` to ``SET``, a count, a missing key's
``$-1`` - cannot tell by itself whose it is: without the sentinel, a late
copy of an earlier reply arriving just before the real one would be taken
for it (a refused ``SET`` reported as stored, ``EXISTS`` true for a
missing key).  The check for unread bytes before a connection's reuse
catches only copies that arrived before the next command was sent.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Generator

from kvpool.errors import (
    CorruptEntryError,
    InvalidArgumentError,
    KVPoolError,
    RemoteStoreError,
    StoreConnectionError,
)
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import check_stored
from kvpool.remote.header import (
    FIXED_SIZE,
    EntryInfo,
    Layout,
    decode_header,
    layout_for,
    peek_header_size,
)
from kvpool.remote.objects import destination, discard
from kvpool.remote.redis.resp import (
    CRLF,
    ErrorReply,
    ProtocolError,
    Reader,
    Want,
    command,
    parse_length,
)

__all__ = [
    "AUTH_CODES",
    "HEAD_READ",
    "credentials_refused",
    "del_command",
    "exists_command",
    "get_command",
    "head_commands",
    "new_nonce",
    "read_count",
    "read_entry",
    "read_head",
    "read_ok",
    "read_sentinel",
    "refusal",
    "sentinel_command",
    "set_parts",
    "ttl_ms",
]

#: Bytes of a value read by ``head`` in one go (a longer header takes a second read).
HEAD_READ = 4096

_LONGEST = (1 << 63) - 1
_nonces = itertools.count(1)


def ttl_ms(ttl: float | None) -> int | None:
    """A TTL in seconds as whole milliseconds (rounded up), or None for no expiry.

    Raises:
        InvalidArgumentError: not a positive finite number of seconds.
    """
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < 1e12:
        raise InvalidArgumentError(f"ttl must be a number of seconds > 0, or None; got {ttl!r}")
    return max(1, -int(-ttl * 1000 // 1))


def set_parts(
    rkey: bytes, header: bytes, payload: memoryview, px: int | None
) -> list[bytes | memoryview]:
    """The parts of ``SET rkey <header><payload> [PX px]`` (the payload is not copied)."""
    size = len(header) + payload.nbytes
    if px is None:
        head = b"*3\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b" % (len(rkey), rkey, size, header)
        return [head, payload, CRLF]
    head = b"*5\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b" % (len(rkey), rkey, size, header)
    ms = b"%d" % px
    return [head, payload, b"\r\n$2\r\nPX\r\n$%d\r\n%b\r\n" % (len(ms), ms)]


def get_command(rkey: bytes) -> bytes:
    """``GET rkey``."""
    return b"*2\r\n$3\r\nGET\r\n$%d\r\n%b\r\n" % (len(rkey), rkey)


def exists_command(rkey: bytes) -> bytes:
    """``EXISTS rkey``."""
    return b"*2\r\n$6\r\nEXISTS\r\n$%d\r\n%b\r\n" % (len(rkey), rkey)


def del_command(*rkeys: bytes) -> bytes:
    """``DEL rkey...``."""
    return command(b"DEL", *rkeys)


def head_commands(rkey: bytes, length: int = HEAD_READ) -> bytes:
    """``EXISTS rkey``, ``STRLEN rkey``, ``GETRANGE rkey 0 length-1``."""
    return (
        exists_command(rkey)
        + command(b"STRLEN", rkey)
        + command(b"GETRANGE", rkey, b"0", b"%d" % (length - 1))
    )


def new_nonce() -> bytes:
    """A nonce for :func:`sentinel_command` (unique in this process)."""
    return b"kvpool-%d" % next(_nonces)


def sentinel_command(nonce: bytes) -> bytes:
    """``PING nonce``: its reply, ``$n nonce``, marks the end of a call's replies."""
    return b"*2\r\n$4\r\nPING\r\n$%d\r\n%b\r\n" % (len(nonce), nonce)


def read_sentinel(
    reader: Reader, nonce: bytes, where: str = "the call"
) -> Generator[Want, None, None]:
    """Read the sentinel's echo.

    Raises:
        StoreConnectionError: the server asks for credentials (``NOAUTH``...).
        RemoteStoreError: an error where the echo was due: the server
            refused ``PING`` (``LOADING``...), or a late error reply of an
            earlier command (which of the two cannot be told).
        ProtocolError: something else came: a reply was duplicated or lost.
    """
    if reader.take(b"$%d\r\n%b\r\n" % (len(nonce), nonce)):
        return  # the echo came with the replies before it: no parsing
    line = yield from reader.line()
    if line == b"$%d" % len(nonce):
        echo = yield from reader.read_bytes(len(nonce))
        yield from reader.crlf()
        if echo == nonce:
            return
    elif line[:1] == b"-":
        error = ErrorReply(line[1:501].decode("utf-8", errors="replace"))
        if error.code in AUTH_CODES:
            raise refusal(error, where)
        raise RemoteStoreError(
            f"{where}: the server answered {error.text!r} where the echo of the end-of-call "
            "PING was due (PING refused, or a reply out of step); the connection was dropped"
        )
    raise ProtocolError(
        f"{where}: the replies are out of step with the commands (the end-of-call marker did "
        f"not come where expected; got {line[:40]!r}); the connection was dropped"
    )


def read_ok(reader: Reader, what: str = "SET") -> Generator[Want, None, ErrorReply | None]:
    """The reply to ``SET`` (or another command answered ``+OK``, named by ``what``).

    Returns:
        None for ``+OK``, an :class:`ErrorReply` for a refusal.

    Raises:
        ProtocolError: any other reply.
    """
    line = yield from reader.line()
    if line == b"+OK":
        return None
    if line[:1] == b"-":
        return ErrorReply(line[1:501].decode("utf-8", errors="replace"))
    raise ProtocolError(f"unexpected reply {line[:40]!r} to {what} (expected +OK)")


def read_count(reader: Reader, what: str) -> Generator[Want, None, int | ErrorReply]:
    """An integer reply (``EXISTS``, ``DEL``, ``STRLEN``), or the server's refusal.

    Raises:
        ProtocolError: not an integer reply (``*-1``, a bulk string...) or
            a negative count.
    """
    line = yield from reader.line()
    if line[:1] == b":":
        n = parse_length(line, f"{what} reply", _LONGEST)
        if n >= 0:
            return n
    elif line[:1] == b"-":
        return ErrorReply(line[1:501].decode("utf-8", errors="replace"))
    raise ProtocolError(f"unexpected reply {line[:40]!r} to {what} (expected a count)")


#: Error codes that mean the connection is not allowed in (not a refusal of the command).
AUTH_CODES = ("NOAUTH", "WRONGPASS", "NOPERM")


def credentials_refused(text: str) -> str:
    """The message of a server that refused a connection's credentials (``text``: its answer).

    ``NOPERM`` (an ACL that does not let the user run a command) names
    that fix instead.
    """
    if text.startswith("NOPERM"):
        return (
            f"the server's ACL refused this user the command ({text}): grant it to the user "
            "(ACL SETUSER ...) or give another user in the URL"
        )
    return (
        f"the server refused the connection's credentials ({text}): check the user name and "
        "password in the URL (redis://USER:PASSWORD@host:port/db) or the client's options"
    )


def refusal(error: ErrorReply, where: str) -> RemoteStoreError:
    """The error for a command the server refused (``where`` names the call).

    Credentials (``NOAUTH``, ``WRONGPASS``, ``NOPERM``): a
    :class:`StoreConnectionError` naming the fix; ``WRONGTYPE``: a
    :class:`CorruptEntryError` (the key holds no kvpool entry); anything
    else a :class:`RemoteStoreError` quoting the server.
    """
    if error.code in AUTH_CODES:
        return StoreConnectionError(f"{where}: {credentials_refused(error.text)}")
    if error.code == "WRONGTYPE":
        return CorruptEntryError(
            f"{where}: the key holds a Redis value that is not a string - an entry in the hash "
            "format of earlier kvpool versions, or something kvpool did not write; delete it "
            "or put it again"
        )
    return RemoteStoreError(f"{where}: the server answered: {error.text}")


def _read_header(reader: Reader, total: int, where: str) -> Generator[Want, None, bytes]:
    """The header at the start of a value of ``total`` bytes, bounded before any allocation."""
    if total < FIXED_SIZE:
        raise CorruptEntryError(
            f"{where}: truncated: the value has {total} bytes, shorter than the "
            f"{FIXED_SIZE}-byte header (not a kvpool entry)"
        )
    fixed = yield from reader.read_bytes(FIXED_SIZE)
    header_size = peek_header_size(fixed, where)
    if header_size > total:
        raise CorruptEntryError(
            f"{where}: truncated header: the value has {total} bytes, its header {header_size}"
        )
    rest = yield from reader.read_bytes(header_size - FIXED_SIZE)
    return fixed + rest


def _check_tag(info: EntryInfo, tag: int, where: str) -> None:
    if info.key_tag == tag:
        return
    if info.key_tag is None:
        raise CorruptEntryError(
            f"{where}: the entry carries no key tag (it was not written by RedisStore); put it "
            "again"
        )
    raise CorruptEntryError(
        f"{where}: the value read belongs to another key (key tag {info.key_tag:#010x}, "
        f"expected {tag:#010x}): a reply out of step with its command, or a value copied or "
        "renamed from another key; the connection was dropped"
    )


def read_entry(
    reader: Reader,
    where: str,
    tag: int,
    allocator: MemoryAllocatorInterface,
    layout: Layout | None,
    fmt: MemoryFormat | None,
) -> Generator[Want, None, MemoryObj | None]:
    """Read the reply to ``GET`` into a new object from ``allocator``.

    With the layout and format given, the destination is allocated before
    the reply is awaited (while the server works), and freed again if the
    key turns out missing or the entry different; if that early allocation
    fails, it is retried (and its error raised) only once the entry is
    known, so a missing key still returns None from a full pool.

    Args:
        reader: the connection's reader.
        where: names the call in error messages.
        tag: the key tag the entry must carry (:func:`~kvpool.remote.header.key_tag`).
        allocator: where the destination comes from.
        layout: the layout asked for, or None for the stored one.
        fmt: the format asked for, or None for the stored one.

    Returns:
        The object, or None when the key does not exist.

    Raises:
        CorruptEntryError: damaged or foreign value, another key's entry,
            wrong length, payload CRC mismatch, a hash-format entry.
        InvalidArgumentError: the stored layout or format is not the one asked for.
        RemoteStoreError: the server refused.
        ProtocolError: a malformed reply.
        Any error of the allocator; the object is freed on every error.
    """
    obj = view = None
    if layout is not None and fmt is not None:
        try:
            obj, view = destination(allocator, layout, fmt, where)
        except (KVPoolError, MemoryError):
            obj = view = None  # raised again below if the entry exists
    try:
        line = yield from reader.line()
        if line[:1] != b"$":
            if line[:1] == b"-":
                raise refusal(ErrorReply(line[1:501].decode("utf-8", errors="replace")), where)
            raise ProtocolError(f"{where}: unexpected reply {line[:40]!r} to GET")
        total = parse_length(line, "value", _LONGEST)
        if total < 0:
            discard(obj, view)
            return None
        header = yield from _read_header(reader, total, where)
        size = total - len(header)
        if (
            layout is not None
            and fmt is not None
            and size == layout.nbytes
            and header == layout.tagged_header(fmt, tag)
        ):
            info = None  # the common case: exactly the entry asked for, no CRC
        else:
            info = decode_header(header, where)
            _check_tag(info, tag, where)
            check_stored(info, layout, fmt, where)
            if size != info.size:
                raise CorruptEntryError(
                    f"{where}: {size} payload bytes stored, the header announces {info.size}"
                )
            if layout is None:
                layout = layout_for(info.shapes, info.dtypes)
            if fmt is None:
                fmt = info.fmt
        if obj is None:
            obj, view = destination(allocator, layout, fmt, where)
        if info is not None and size != view.nbytes:  # type: ignore[union-attr]
            view = view[:size]  # type: ignore[index]
        yield from reader.read_into(view)  # type: ignore[arg-type]
        yield from reader.crlf()
        if info is not None:
            if info.payload_crc is not None and zlib.crc32(view) != info.payload_crc:  # type: ignore[arg-type]
                raise CorruptEntryError(f"{where}: payload CRC mismatch")
            if info.size != info.layout_size:
                obj.set_used_size(info.size)
    except BaseException:
        discard(obj, view)
        raise
    return obj


def read_head(
    reader: Reader, where: str, tag: int
) -> Generator[Want, None, EntryInfo | int | None]:
    """Read the replies to :func:`head_commands`.

    Returns:
        The entry's header, None when the key does not exist, or the
        header's size when it is longer than what was read (read again with
        ``head_commands(rkey, that size)``).

    Raises:
        CorruptEntryError: damaged header, wrong length, another key's
            entry, a hash-format entry.
        ProtocolError / RemoteStoreError: as :func:`read_entry`.
    """
    exists = yield from read_count(reader, "EXISTS")
    strlen = yield from read_count(reader, "STRLEN")
    data = yield from reader.reply()
    for reply in (exists, strlen, data):
        if isinstance(reply, ErrorReply):
            raise refusal(reply, where)
    if not isinstance(data, bytes):
        raise ProtocolError(f"{where}: unexpected reply {data!r:.40} to GETRANGE")
    if not exists:
        return None
    if len(data) < FIXED_SIZE:
        raise CorruptEntryError(
            f"{where}: truncated: the value has {strlen} bytes, shorter than the "
            f"{FIXED_SIZE}-byte header (not a kvpool entry)"
        )
    header_size = peek_header_size(data, where)
    if header_size > len(data):
        if header_size <= strlen and len(data) == HEAD_READ:  # type: ignore[operator]
            return header_size
        raise CorruptEntryError(
            f"{where}: truncated header: the value has {strlen} bytes, its header {header_size}"
        )
    info = decode_header(data, where)
    _check_tag(info, tag, where)
    if strlen != info.header_size + info.size:
        raise CorruptEntryError(
            f"{where}: {strlen - info.header_size} payload bytes stored, "  # type: ignore[operator]
            f"the header announces {info.size}"
        )
    return info


#: A parser factory for one reply of a pipeline: ``index -> steps``.
StepsOf = Callable[[int], Generator[Want, None, object]]
