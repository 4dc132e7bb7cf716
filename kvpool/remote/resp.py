"""A minimal reader of Redis replies (RESP2/RESP3) that reads bulk strings in place.

The ``redis`` client parses a reply into a ``bytes`` object (after
buffering it), so a 512 KiB value would be copied twice before it even
reached a pool object.  :class:`RespReader` reads a reply straight from
the connection's socket: the short lines (``*2``, ``$524288``) go through
a small buffer, and a bulk payload is received with ``recv_into`` directly
into the destination memory.  Only the few bytes that arrived together
with a line (at most the buffer's size) are copied from the buffer.

It reads exactly the replies asked for: bytes of later replies that were
already received stay in the buffer for the next call, and the caller
checks :meth:`RespReader.pending` when it is done.
"""

from __future__ import annotations

import socket

from kvpool.errors import RemoteStoreError

__all__ = ["RespReader", "bulk_length"]

_CRLF = b"\r\n"


class ServerClosed(ConnectionError):
    """The server closed the connection in the middle of a reply."""


def bulk_length(line: bytes) -> int | None:
    """Length announced by a bulk-string line, or None for a null.

    Accepts ``$<n>``, ``$-1`` (RESP2 null) and ``_`` (RESP3 null).

    Raises:
        RemoteStoreError: an error reply or any other line.
    """
    if line[:1] == b"$":
        try:
            n = int(line[1:])
        except ValueError:
            raise RemoteStoreError(f"malformed reply line {line[:80]!r}") from None
        return None if n < 0 else n
    if line == b"_":
        return None
    if line[:1] == b"-":
        raise RemoteStoreError(f"the server answered: {line[1:200].decode(errors='replace')}")
    raise RemoteStoreError(f"unexpected reply line {line[:80]!r} (expected a bulk string)")


class RespReader:
    """Read replies from ``sock`` (blocking, with the socket's own timeout).

    Socket errors (``TimeoutError``, ``ConnectionError``, ``OSError``) and
    :class:`ServerClosed` propagate; the caller maps them and drops the
    connection.

    Args:
        sock: a connected socket (plain, UNIX or TLS).
        size: bytes of the line buffer (a line longer than this is refused).
    """

    __slots__ = ("_buf", "_end", "_mv", "_sock", "_start")

    def __init__(self, sock: socket.socket, size: int = 4096) -> None:
        self._sock = sock
        self._buf = bytearray(size)
        self._mv = memoryview(self._buf)
        self._start = 0
        self._end = 0

    def pending(self) -> int:
        """Bytes received but not consumed yet."""
        return self._end - self._start

    def _fill(self) -> None:
        start, end = self._start, self._end
        if start == end:
            start = end = 0
        elif end == len(self._buf):
            if start == 0:
                raise RemoteStoreError(f"reply line longer than {len(self._buf)} bytes")
            self._mv[: end - start] = self._mv[start:end]
            start, end = 0, end - start
        n = self._sock.recv_into(self._mv[end:])
        if n == 0:
            self._start, self._end = start, end
            raise ServerClosed("the server closed the connection")
        self._start, self._end = start, end + n

    def line(self) -> bytes:
        """The next line, without its CRLF."""
        while True:
            i = self._buf.find(_CRLF, self._start, self._end)
            if i >= 0:
                out = bytes(self._mv[self._start : i])
                self._start = i + 2
                return out
            self._fill()

    def read_into(self, view: memoryview) -> None:
        """Fill ``view`` (format ``'B'``) with the next ``len(view)`` bytes."""
        want = view.nbytes
        got = min(want, self._end - self._start)
        if got:
            view[:got] = self._mv[self._start : self._start + got]
            self._start += got
        recv_into = self._sock.recv_into
        while got < want:
            n = recv_into(view[got:])
            if n == 0:
                raise ServerClosed("the server closed the connection in the middle of a value")
            got += n

    def read_bytes(self, n: int) -> bytes:
        """The next ``n`` bytes as ``bytes``."""
        out = bytearray(n)
        self.read_into(memoryview(out))
        return bytes(out)

    def crlf(self) -> None:
        """Consume the CRLF that ends a bulk string.

        Raises:
            RemoteStoreError: something else is there.
        """
        if self.read_bytes(2) != _CRLF:
            raise RemoteStoreError("malformed reply: a bulk string does not end with CRLF")

    def bulk(self) -> bytes | None:
        """The next bulk string (None for a null)."""
        n = bulk_length(self.line())
        if n is None:
            return None
        data = self.read_bytes(n)
        self.crlf()
        return data
