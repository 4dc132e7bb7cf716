"""Redirect-aware reply parsing for a Redis Cluster router: MOVED, ASK and ASKING.

A cluster node answers a command for a slot it does not serve with
``-MOVED <slot> <host>:<port>`` (the slot lives there now: update the map)
or ``-ASK <slot> <host>:<port>`` (the slot is being migrated and this key
is already there: send that one command to that node, preceded by
``ASKING``).  The entry parsers of :mod:`kvpool.remote.redis.wire` know
nothing of clusters; :func:`read_routed` runs in front of one of them:

* it reads the reply's first line; a redirect is returned as a
  :class:`Redirect` (after the other sub-commands' replies of the same
  key, which are redirects too, are consumed), so the router retries the
  key elsewhere while the connection stays in step;
* anything else is handed back to the wrapped parser, which then reads
  the reply from its first line as if nothing had happened.

With ``asking=True`` every sub-command was sent after an ``ASKING``,
whose ``+OK`` is consumed before each reply.

:class:`Lane` pipelines one node's share of a call on one connection, a
reply at a time, so the router can keep every node busy from one thread.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from kvpool.remote.cluster.slots import SLOTS, Address
from kvpool.remote.redis.resp import ProtocolError, Reader, Want, command

__all__ = ["ASKING", "Lane", "Redirect", "asking_parts", "parse_redirect", "read_routed"]

#: The ``ASKING`` command, sent before a command that follows an ``ASK`` redirect.
ASKING = command(b"ASKING")

_REDIRECT = re.compile(rb"-(MOVED|ASK) ([0-9]{1,5}) (\S{1,300}):([0-9]{1,5})")


@dataclass(frozen=True)
class Redirect:
    """A ``MOVED``/``ASK`` answer: the key's slot is served elsewhere.

    Attributes:
        ask: True for ``ASK`` (this one command only), False for ``MOVED``.
        slot: the slot.
        address: the node to ask.
    """

    ask: bool
    slot: int
    address: Address


def parse_redirect(line: bytes) -> Redirect | None:
    """The :class:`Redirect` a reply line carries, or None for any other line."""
    if not line.startswith((b"-MOVED ", b"-ASK ")):
        return None
    match = _REDIRECT.fullmatch(line)
    if match is None:
        raise ProtocolError(f"malformed redirect {line[:80]!r}")
    slot, port = int(match.group(2)), int(match.group(4))
    if slot >= SLOTS or not 0 < port < 65536:
        raise ProtocolError(f"redirect to slot {slot}, port {port}")
    host = match.group(3).decode("ascii", errors="replace")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return Redirect(match.group(1) == b"ASK", slot, (host, port))


def asking_parts(commands: list[list[Any]]) -> list[Any]:
    """The parts of ``commands`` (one list of parts each), each preceded by ``ASKING``."""
    out: list[Any] = []
    for parts in commands:
        out.append(ASKING)
        out.extend(parts)
    return out


class _AfterOk:
    """A reader that consumes the ``+OK`` of an ``ASKING`` before each of ``count`` replies.

    Every parser of :mod:`kvpool.remote.redis.wire` starts each reply with
    ``line()`` or ``reply()``; those are where the ``+OK`` comes first.
    """

    __slots__ = ("_count", "_reader")

    def __init__(self, reader: Any, count: int) -> None:
        self._reader = reader
        self._count = count

    def _ok(self) -> Generator[Want, None, None]:
        if self._count:
            self._count -= 1
            line = yield from self._reader.line()
            if line != b"+OK":
                raise ProtocolError(f"unexpected reply {line[:40]!r} to ASKING (expected +OK)")

    def line(self) -> Generator[Want, None, bytes]:
        yield from self._ok()
        return (yield from self._reader.line())

    def reply(self) -> Generator[Want, None, Any]:
        yield from self._ok()
        return (yield from self._reader.reply())

    def __getattr__(self, name: str) -> Any:  # read_bytes, read_into, crlf, limits
        return getattr(self._reader, name)


class _Replay:
    """A reader whose first ``line()`` returns a line that was already read."""

    __slots__ = ("_line", "_reader")

    def __init__(self, reader: Any, line: bytes) -> None:
        self._reader = reader
        self._line: bytes | None = line

    def line(self) -> Generator[Want, None, bytes]:
        saved, self._line = self._line, None
        if saved is not None:
            return saved
        return (yield from self._reader.line())

    def reply(self) -> Generator[Want, None, Any]:
        if self._line is not None:
            raise ProtocolError("a parser read a whole reply where a line was already read")
        return (yield from self._reader.reply())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def read_routed(
    reader: Reader,
    parse: Callable[[Any], Generator[Want, None, Any]],
    replies: int = 1,
    asking: bool = False,
) -> Generator[Want, None, Any]:
    """Read the replies of one key's command(s): a :class:`Redirect`, or what ``parse`` returns.

    Args:
        reader: the connection's reader.
        parse: ``reader -> parser`` of the replies (e.g. ``wire.read_entry``).
        replies: how many commands were sent for the key (all of one slot).
        asking: each was preceded by ``ASKING``.

    Raises:
        ProtocolError: a malformed redirect, or a later sub-reply of a
            redirected key that is not a redirect too.
        Whatever ``parse`` raises.
    """
    r: Any = _AfterOk(reader, replies) if asking else reader
    line = yield from r.line()
    redirect = parse_redirect(line)
    if redirect is None:
        return (yield from parse(_Replay(r, line)))
    for _ in range(replies - 1):
        more = yield from r.line()
        if parse_redirect(more) is None:
            raise ProtocolError(f"a redirected key's next reply is {more[:40]!r}")
    return redirect


class Lane:
    """One node's share of a routed call: its commands pipelined on one connection.

    The router runs the lanes of all the nodes of a call side by side in
    one thread (:meth:`start` each, then :meth:`step` them in turn), so
    every node has ``window`` commands queued while the client reads the
    others' replies: a batch spread over *n* masters costs about as much as
    the largest share, not the sum.  The last command carries the
    end-of-call marker (``PING <nonce>``), read after the last reply.

    Args:
        conn: the connection (a :class:`~kvpool.remote.redis.connection.RedisConnection`).
        count: commands to run.
        parts_of: ``j -> parts`` of command ``j`` (the marker included in the last).
        steps_of: ``j -> parser`` of reply ``j``.
        sentinel: ``() -> parser`` of the marker's echo.
        window: commands in flight, >= 1.
        deadline: ``time.monotonic()`` instant the call must end by.

    Attributes:
        out: the replies read so far, in order.
    """

    __slots__ = (
        "_parts_of",
        "_sent",
        "_sentinel",
        "_steps_of",
        "conn",
        "count",
        "deadline",
        "out",
        "window",
    )

    def __init__(
        self,
        conn: Any,
        count: int,
        parts_of: Callable[[int], Any],
        steps_of: Callable[[int], Any],
        sentinel: Callable[[], Any],
        window: int,
        deadline: float,
    ) -> None:
        self.conn = conn
        self.count = count
        self._parts_of = parts_of
        self._steps_of = steps_of
        self._sentinel = sentinel
        self.window = window
        self.deadline = deadline
        self.out: list[Any] = []
        self._sent = 0

    def start(self) -> None:
        """Send the first window of commands in one go."""
        first = min(self.window, self.count)
        parts: list[Any] = []
        for j in range(first):
            parts.extend(self._parts_of(j))
        self.conn.send(parts, self.deadline)
        self._sent = first

    def step(self) -> bool:
        """Read the next reply and send the next command; True once the lane is done.

        Raises:
            Whatever the connection or the parser raises (the caller drops
            the connection).
        """
        conn = self.conn
        self.out.append(conn.run(self._steps_of(len(self.out)), self.deadline))
        if self._sent < self.count:
            conn.send(self._parts_of(self._sent), self.deadline)
            self._sent += 1
        if len(self.out) < self.count:
            return False
        conn.run(self._sentinel(), self.deadline)
        return True
