"""RESP2 without I/O: command encoding and a bounded, iterative reply reader.

The reader never touches a socket.  Its methods are *generators* that
parse what is in a small buffer and, when they need more, ``yield`` a
request that the connection's driver serves (a thread's driver in
:mod:`kvpool.remote.redis.connection`, an event loop's in
:mod:`kvpool.remote.aio`)::

    FILL             receive some bytes into the reader's buffer
    a memoryview     receive exactly that many bytes straight into it
    Send(parts)      send a command (a *plan* - a whole call: commands and
                     their replies - is such a generator too)

So one parser serves blocking and asyncio code alike, and a value's bytes
can be received with ``recv_into`` straight into pool memory: only bytes
that arrived together with a reply line (at most :data:`FILL_BYTES`) pass
through the buffer.

Peers are hostile until proven otherwise:

* every length is parsed strictly (``-?[0-9]+``, at most 19 digits) and
  checked against :class:`Limits` (or the destination, by the caller)
  before anything is allocated;
* nested arrays are parsed with an explicit stack, not recursion, and
  refused past ``Limits.max_depth``;
* anything unexpected raises :class:`ProtocolError` (a
  :class:`~kvpool.errors.RemoteStoreError`); the caller then drops the
  connection, since its position in the reply stream is unknown;
* a reply line that starts with no RESP type byte means the peer is not a
  Redis server at all (an HTTP server on the port answers
  ``HTTP/1.1 400 Bad Request``): the error says so and quotes the line.

Only RESP2 is spoken (the stores force ``protocol=2`` on their
connections), so the RESP3 types are protocol errors too.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.errors import ProtocolError

__all__ = [
    "CRLF",
    "DEFAULT_LIMITS",
    "FILL",
    "FILL_BYTES",
    "ErrorReply",
    "Limits",
    "ProtocolError",
    "Reader",
    "Send",
    "ServerClosed",
    "Want",
    "command",
    "command_head",
    "not_redis",
    "parse_length",
]

CRLF = b"\r\n"

#: Yielded by a reader generator: receive more bytes into the buffer.
FILL = None

#: Largest single receive into the buffer (bytes that arrive with a reply
#: line beyond this stay in the kernel and go straight to the destination).
FILL_BYTES = 8192


class Send:
    """Yielded by a plan (a generator that also sends): write these parts, then go on.

    Attributes:
        parts: ``bytes`` and one-dimensional byte memoryviews, sent in order
            without copying the views.
    """

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[bytes | memoryview]) -> None:
        self.parts = parts


#: What a reader generator yields: FILL, a view to fill completely, or a Send.
Want = memoryview | Send | None

#: A reader generator returning ``T``.
Steps = Generator[Want, None, Any]

_DIGITS = re.compile(rb"-?[0-9]{1,19}")


# The first byte of every reply line a RESP2 or RESP3 server sends.
_RESP_TYPES = frozenset(b"+-:$*_,#!=(%~>|")


def not_redis(line: bytes) -> ProtocolError:
    """The error for a reply ``line`` no Redis server sends: the peer speaks another protocol."""
    http = line.startswith(b"HTTP/") or line.lower().startswith((b"<!doctype html", b"<html"))
    kind = " (an HTTP server)" if http else ""
    return ProtocolError(
        f"the server does not speak Redis{kind}: it answered {_text(line[:80])!r}; "
        "check the URL's host and port"
    )


class ServerClosed(ConnectionError):
    """The server closed the connection in the middle of a reply."""


@dataclass(frozen=True)
class Limits:
    """Bounds on what a reply may make the reader do.

    Attributes:
        max_line: longest reply line (``+OK``, ``-ERR ...``, ``$524288``).
        max_bulk: longest bulk string of a generic reply, read into
            memory the reader allocates (an entry's value is read into its
            destination instead, bounded by the caller).
        max_depth: deepest nesting of arrays.
        max_elements: most array elements in one reply, all levels.
        buffer: bytes of the reader's buffer (>= ``max_line + 2``).
    """

    max_line: int = 64 << 10
    max_bulk: int = 4 << 20
    max_depth: int = 16
    max_elements: int = 1 << 20
    buffer: int = (64 << 10) + 2


#: The limits every store uses unless told otherwise.
DEFAULT_LIMITS = Limits()


class ErrorReply:
    """A ``-ERR ...`` reply, kept as a value (a pipeline reads on past it).

    Attributes:
        text: the message, decoded (at most 500 characters).
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    @property
    def code(self) -> str:
        """The first word (``ERR``, ``WRONGTYPE``, ``OOM``, ``MOVED``...)."""
        return self.text.split(" ", 1)[0]

    def __repr__(self) -> str:
        return f"<ErrorReply {self.text!r}>"


def _text(raw: bytes) -> str:
    return raw[:500].decode("utf-8", errors="replace")


def parse_length(line: bytes, what: str, limit: int) -> int:
    """The number after the type byte of ``line`` (``$n``, ``*n``, ``:n``), checked.

    Args:
        line: the reply line, type byte included.
        what: names the reply in the error message.
        limit: largest value accepted; -1 (a null) is always accepted.

    Raises:
        ProtocolError: not a plain decimal number, below -1 or above ``limit``.
    """
    digits = line[1:]
    if _DIGITS.fullmatch(digits) is None:
        raise ProtocolError(f"malformed {what} line {line[:40]!r}")
    n = int(digits)
    if n < -1 or n > limit:
        raise ProtocolError(f"{what} announces {n}; the limit is {limit} (and -1 for a null)")
    return n


def command(*args: bytes) -> bytes:
    """A command in RESP (for small arguments; see :func:`command_head` for a payload)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


def command_head(args: Sequence[bytes], payload_bytes: int) -> bytes:
    """Everything of a command before its last argument, a payload sent separately.

    The command is ``args + [payload]``: send this head, the payload's
    bytes (e.g. a memoryview of pool memory) and :data:`CRLF`.
    """
    parts = [b"*%d\r\n" % (len(args) + 1)]
    for arg in args:
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    parts.append(b"$%d\r\n" % payload_bytes)
    return b"".join(parts)


class Reader:
    """The receive buffer of one connection and the generators that parse it.

    The driver that owns the socket serves the generators' requests:
    for FILL it receives at most :data:`FILL_BYTES` into :meth:`space` and
    calls :meth:`commit`; for a memoryview it receives until the view is
    full.

    Args:
        limits: the bounds replies are held to.
    """

    __slots__ = ("_buf", "_end", "_mv", "_spoke", "_start", "limits")

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        if limits.buffer < limits.max_line + 2:
            raise ValueError(f"a reader buffer of {limits.buffer} bytes cannot hold a line")
        self.limits = limits
        self._buf = bytearray(limits.buffer)
        self._mv = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._spoke = False  # a well-formed reply line came: the peer speaks RESP

    # -- the driver's side -------------------------------------------

    def pending(self) -> int:
        """Bytes received but not parsed yet."""
        return self._end - self._start

    def space(self) -> memoryview:
        """Where the driver receives the next bytes (compacting the buffer first)."""
        start, end = self._start, self._end
        if start == end:
            self._start = self._end = start = end = 0
        elif end + FILL_BYTES > len(self._buf) and start:
            self._mv[: end - start] = self._mv[start:end]
            self._start, self._end = 0, end - start
            end -= start
        room = min(FILL_BYTES, len(self._buf) - end)
        if room <= 0:
            raise ProtocolError(f"reply line longer than {self.limits.max_line} bytes")
        return self._mv[end : end + room]

    def commit(self, n: int) -> None:
        """Record ``n`` bytes received into :meth:`space`."""
        self._end += n

    def closed(self) -> Exception:
        """The error to raise when the server closed the connection (the driver read 0 bytes).

        :class:`ServerClosed`; or, when the peer never sent a reply line
        and what it sent cannot start one (an HTTP server's error page),
        the :class:`ProtocolError` saying that it does not speak Redis.
        """
        pending = bytes(self._mv[self._start : self._end])
        if not self._spoke and pending and pending[0] not in _RESP_TYPES:
            return not_redis(pending.split(b"\n", 1)[0].rstrip(b"\r"))
        return ServerClosed("the server closed the connection")

    def clear(self) -> None:
        """Forget everything buffered (the connection is being dropped)."""
        self._start = self._end = 0

    # -- the parser's side (generators) ------------------------------

    def line(self) -> Generator[Want, None, bytes]:
        """The next line, without its CRLF."""
        buf = self._buf
        done = 0  # bytes after the start already scanned (offsets move when compacted)
        while True:
            start = self._start
            i = buf.find(CRLF, start + done, self._end)
            if i >= 0:
                out = bytes(self._mv[start:i])
                self._start = i + 2
                if not out or out[0] not in _RESP_TYPES:
                    if self._spoke:
                        raise ProtocolError(f"malformed reply line {out[:40]!r}")
                    raise not_redis(out)
                self._spoke = True
                return out
            done = max(0, self._end - start - 1)
            if done > self.limits.max_line:
                raise ProtocolError(f"reply line longer than {self.limits.max_line} bytes")
            yield FILL

    def take(self, expected: bytes) -> bool:
        """Consume ``expected`` if the buffered bytes start with it; True when they did.

        Never waits: a fast path for a reply known in advance (the
        end-of-call marker's echo), which mostly arrives with the reply
        before it.  False leaves the buffer as it was.
        """
        start = self._start
        end = start + len(expected)
        if end <= self._end and self._mv[start:end] == expected:
            self._start = end
            return True
        return False

    def read_into(self, view: memoryview) -> Generator[Want, None, None]:
        """Fill ``view`` (a writable byte view) with the next ``len(view)`` bytes."""
        want = view.nbytes
        got = min(want, self._end - self._start)
        if got:
            view[:got] = self._mv[self._start : self._start + got]
            self._start += got
        if got < want:
            yield view[got:]

    def read_bytes(self, n: int) -> Generator[Want, None, bytes]:
        """The next ``n`` bytes (``n`` must already be bounded by the caller)."""
        start = self._start
        if self._end - start >= n:
            self._start = start + n
            return bytes(self._mv[start : start + n])
        out = bytearray(n)
        yield from self.read_into(memoryview(out))
        return bytes(out)

    def crlf(self) -> Generator[Want, None, None]:
        """Consume the CRLF that ends a bulk string.

        Raises:
            ProtocolError: something else is there.
        """
        while self._end - self._start < 2:
            yield FILL
        start = self._start
        if self._buf[start : start + 2] != CRLF:
            raise ProtocolError("malformed reply: a bulk string does not end with CRLF")
        self._start = start + 2

    def reply(self) -> Generator[Want, None, Any]:
        """One whole reply, of any RESP2 type, bounded by :attr:`limits`.

        Returns:
            ``bytes`` for a simple string or bulk string, ``int``, ``None``
            for a null, a ``list`` for an array, an :class:`ErrorReply`.

        Raises:
            ProtocolError: malformed, too deep, too many elements, a bulk
                string over ``max_bulk`` or an unknown type.
        """
        limits = self.limits
        stack: list[list[Any]] = []  # [elements, remaining]
        elements = 0
        while True:
            line = yield from self.line()
            kind = line[:1]
            value: Any
            if kind == b"$":
                n = parse_length(line, "bulk string", limits.max_bulk)
                if n < 0:
                    value = None
                else:
                    value = yield from self.read_bytes(n)
                    yield from self.crlf()
            elif kind == b"+":
                value = line[1:]
            elif kind == b":":
                if _DIGITS.fullmatch(line[1:]) is None:
                    raise ProtocolError(f"malformed integer reply {line[:40]!r}")
                value = int(line[1:])
            elif kind == b"-":
                value = ErrorReply(_text(line[1:]))
            elif kind == b"*":
                n = parse_length(line, "array", limits.max_elements)
                if n < 0:
                    value = None
                elif n == 0:
                    value = []
                else:
                    elements += n
                    if elements > limits.max_elements:
                        raise ProtocolError(
                            f"reply has more than {limits.max_elements} array elements"
                        )
                    if len(stack) >= limits.max_depth:
                        raise ProtocolError(
                            f"reply nests arrays deeper than {limits.max_depth} levels"
                        )
                    stack.append([[], n])
                    continue
            else:
                raise ProtocolError(f"unexpected reply line {line[:40]!r}")
            while stack:
                top = stack[-1]
                top[0].append(value)
                top[1] -= 1
                if top[1]:
                    break
                value = top[0]
                stack.pop()
            else:
                return value
