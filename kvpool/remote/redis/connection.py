"""One Redis/Valkey connection driven by kvpool, and a checked pool of them.

This is the layer every Redis-protocol store builds on (RedisStore here; a
cluster router keeps one :class:`NodePool` per node):

* :class:`RedisConnection` owns one socket.  ``send(parts, deadline)``
  writes a command whose parts may be memoryviews of pool memory with one
  ``sendmsg`` (no copy in Python); ``run(steps, deadline)`` serves a
  reply parser of :mod:`kvpool.remote.redis.resp`, which receives a value
  straight into its destination (one ``recv_into`` with ``MSG_WAITALL``).
  Every wait is bounded by the call's *deadline* (a ``time.monotonic()``
  instant): a plain socket blocks in the kernel with ``SO_RCVTIMEO`` /
  ``SO_SNDTIMEO`` set to the time left, a TLS socket is non-blocking and
  polled; so a server that trickles bytes cannot stretch a call past it:
  :class:`TimeoutError` is raised instead.
* :func:`pipelined` is a plan that keeps a bounded window of commands in
  flight on one connection (send ``window`` commands, then one more per
  reply read).
* :class:`NodePool` hands out connections to one server.  A connection
  goes back to the pool only when its call ended cleanly, and before it
  is used again it is checked to hold no unread byte - neither in its
  reader's buffer nor in the kernel's socket buffer (``MSG_PEEK``) - so a
  reply that arrived late or twice is never read as the answer to a later
  command.  Anything else drops it.

Connections are *opened* by :func:`kvpool.remote.redis.opener.connector`
(socket, TLS and the ``AUTH``/``SELECT`` handshake, all within the call's
deadline), which hands the socket to a :class:`RedisConnection`.

Errors raised here are the low-level ones; the stores map them to
kvpool's (with the server and key in the message): :class:`TimeoutError`
(deadline passed), :class:`~kvpool.remote.redis.resp.ServerClosed` and other
:class:`OSError` (connection lost), :class:`~kvpool.remote.redis.resp.ProtocolError`
(a reply broke the protocol).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvpool.remote.redis.resp import DEFAULT_LIMITS, Limits, Reader, Send, ServerClosed, Steps

__all__ = [
    "NodePool",
    "RedisConnection",
    "pipelined",
]

_T = TypeVar("_T")
_IOV_MAX = 512  # parts per sendmsg (Linux allows 1024)
_POLLIN = select.POLLIN
_POLLOUT = select.POLLOUT
_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT
_WOULD_BLOCK_READ = (BlockingIOError, InterruptedError, ssl.SSLWantReadError)
_WOULD_BLOCK_WRITE = (BlockingIOError, InterruptedError, ssl.SSLWantWriteError)

now = time.monotonic


class RedisConnection:
    """One connection to one server: zero-copy sends, in-place reads, a deadline per call.

    Not thread-safe: one caller at a time (the pool guarantees it).

    Args:
        sock: a connected socket (plain TCP, UNIX or ``ssl.SSLSocket``),
            made non-blocking here.
        label: the server as messages name it (``host:port/db``).
        owner: the object that opened the socket (its ``disconnect()``
            is called on close), or None to close the socket itself.
        limits: bounds on replies.
    """

    __slots__ = (
        "_events",
        "_poller",
        "_ssl",
        "_timeo",
        "_waited",
        "label",
        "owner",
        "reader",
        "sock",
    )

    def __init__(
        self, sock: socket.socket, label: str, owner: Any = None, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self._ssl = isinstance(sock, ssl.SSLSocket)
        # Plain sockets block in the kernel, bounded by SO_RCVTIMEO/SO_SNDTIMEO
        # set from the deadline (one system call per receive, a value read
        # whole with MSG_WAITALL); TLS sockets are non-blocking and polled.
        sock.setblocking(not self._ssl)
        self._timeo = -1.0
        self.sock = sock
        self.label = label
        self.owner = owner
        self.reader = Reader(limits)
        self._poller = select.poll()
        self._poller.register(sock.fileno(), _POLLIN)
        self._events = _POLLIN
        self._waited = False  # True after a send: the next read waits first

    # -- waiting -----------------------------------------------------

    def _arm(self, deadline: float) -> None:
        """(plain sockets) Bound the next blocking call by the deadline; TimeoutError past it.

        The socket's timeouts are set again only when they drifted from the
        time left by more than 10 ms, so most calls cost no system call here.
        """
        remaining = deadline - now()
        if remaining <= 0:
            raise TimeoutError("the call's deadline passed")
        if abs(self._timeo - remaining) > 0.01:
            sec = int(remaining)
            timeval = struct.pack("ll", sec, max(1, int((remaining - sec) * 1e6)))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            self._timeo = remaining

    def _wait(self, events: int, deadline: float) -> None:
        """Wait until the socket is ready for ``events``; TimeoutError past the deadline.

        On a plain (blocking) socket this follows a timed-out system call:
        it re-arms the timeouts with the time left, or raises.
        """
        if not self._ssl:
            self._arm(deadline)
            return
        if events != self._events:
            self._poller.modify(self.sock.fileno(), events)
            self._events = events
        while True:
            remaining = deadline - now()
            if remaining <= 0:
                raise TimeoutError("the call's deadline passed")
            if self._poller.poll(math.ceil(remaining * 1000)):
                return

    # -- sending -----------------------------------------------------

    def send(self, parts: Sequence[bytes | memoryview], deadline: float) -> None:
        """Write every part, in order (memoryviews are not copied).

        Args:
            parts: ``bytes`` and one-dimensional byte memoryviews.
            deadline: ``time.monotonic()`` instant the send must end by.

        Raises:
            TimeoutError: the deadline passed (the connection must be dropped).
            OSError: the connection failed.
        """
        todo: list[bytes | memoryview] | None = [p for p in parts if len(p)]
        try:
            self._send_all(todo, deadline)  # type: ignore[arg-type]
        except BaseException:
            todo.clear()  # type: ignore[union-attr]  # views not kept by the traceback
            todo = parts = None  # type: ignore[assignment]
            raise
        self._waited = True

    def _send_all(self, todo: list[bytes | memoryview], deadline: float) -> None:
        if self._ssl:
            self._send_tls(todo, deadline)
        else:
            sendmsg = self.sock.sendmsg
            i, count = 0, len(todo)
            while i < count:
                self._arm(deadline)
                try:
                    sent = sendmsg(todo[i : i + _IOV_MAX] if i or count > _IOV_MAX else todo)
                except _WOULD_BLOCK_WRITE:
                    self._wait(_POLLOUT, deadline)
                    continue
                while sent:
                    size = len(todo[i])
                    if sent >= size:
                        sent -= size
                        i += 1
                    else:
                        todo[i] = memoryview(todo[i])[sent:]
                        sent = 0

    def _send_tls(self, parts: list[bytes | memoryview], deadline: float) -> None:
        # TLS sockets have no sendmsg: small parts are joined (fewer records),
        # large views are written as they are.
        batches: list[bytes | memoryview] = []
        small: list[bytes | memoryview] = []
        for part in parts:
            if len(part) < 16384:
                small.append(part)
                continue
            if small:
                batches.append(b"".join(small))
                small = []
            batches.append(part)
        if small:
            batches.append(b"".join(small))
        send = self.sock.send
        for part in batches:
            view = memoryview(part)
            while view.nbytes:
                try:
                    sent = send(view)
                except _WOULD_BLOCK_WRITE:
                    self._wait(_POLLOUT, deadline)
                    continue
                except ssl.SSLWantReadError:
                    self._wait(_POLLIN, deadline)
                    continue
                view = view[sent:]

    # -- receiving ---------------------------------------------------

    def _fill(self, deadline: float) -> None:
        reader = self.reader
        view = reader.space()
        recv_into = self.sock.recv_into
        plain = not self._ssl
        if self._waited and not plain:
            # Right after a send the reply is rarely there yet: poll first
            # (two system calls instead of a failed recv, a poll and a recv).
            self._waited = False
            self._wait(_POLLIN, deadline)
        while True:
            if plain:
                self._arm(deadline)
            try:
                n = recv_into(view)
            except _WOULD_BLOCK_READ:
                self._wait(_POLLIN, deadline)
                continue
            except ssl.SSLWantWriteError:
                self._wait(_POLLOUT, deadline)
                continue
            if n == 0:
                raise reader.closed()
            reader.commit(n)
            return

    def _recv_exact(self, view: memoryview | None, deadline: float) -> None:
        recv_into = self.sock.recv_into
        want = view.nbytes  # type: ignore[union-attr]
        got = 0
        self._waited = False
        # A plain socket receives the whole view in one call (MSG_WAITALL),
        # returning early only at the timeout or the end of the stream.
        flags = 0 if self._ssl else socket.MSG_WAITALL
        plain = not self._ssl
        try:
            while got < want:
                if plain:
                    self._arm(deadline)
                try:
                    n = recv_into(view[got:] if got else view, 0, flags)  # type: ignore[index]
                except _WOULD_BLOCK_READ:
                    self._wait(_POLLIN, deadline)
                    continue
                except ssl.SSLWantWriteError:
                    self._wait(_POLLOUT, deadline)
                    continue
                if n == 0:
                    raise ServerClosed("the server closed the connection in the middle of a value")
                got += n
        except BaseException:
            view = None  # not kept alive by the traceback (see run)
            raise

    def run(self, steps: Steps, deadline: float) -> Any:
        """Serve the plan or reply parser ``steps`` until it returns; return its value.

        ``steps`` yields what it needs (:mod:`kvpool.remote.redis.resp`): bytes
        into the reader's buffer, bytes straight into a view, or a
        :class:`~kvpool.remote.redis.resp.Send` of a command.

        On any error the parser is closed first (so a destination it
        allocated is freed by its own cleanup), then the error propagates;
        the caller must drop the connection.

        Raises:
            TimeoutError, OSError, ServerClosed: from the socket.
            ProtocolError / any error of the parser.
        """
        try:
            want = steps.send(None)
            while True:
                if want is None:
                    self._fill(deadline)
                elif want.__class__ is Send:
                    self.send(want.parts, deadline)  # type: ignore[union-attr]
                else:
                    self._recv_exact(want, deadline)  # type: ignore[arg-type]
                want = steps.send(None)
        except StopIteration as stop:
            return stop.value
        except BaseException:
            # The traceback keeps this frame: drop the view it holds, so a
            # freed destination's memory is not held by a kept exception.
            want = None
            steps.close()
            raise

    # -- state -------------------------------------------------------

    def idle(self) -> bool:
        """True when nothing unread is buffered here or in the kernel and the peer is there.

        A connection that is not idle must not be reused: its next reply
        would not be the answer to its next command.
        """
        if self.reader.pending():
            return False
        sock = self.sock
        try:
            if self._ssl:
                if sock.pending():  # type: ignore[attr-defined]
                    return False
                if self._events != _POLLIN:
                    self._poller.modify(sock.fileno(), _POLLIN)
                    self._events = _POLLIN
                return not self._poller.poll(0)
            sock.recv(1, _PEEK)
        except (BlockingIOError, InterruptedError):
            return True
        except (OSError, ValueError):
            return False
        return False  # a byte is waiting, or the peer closed (recv returned b"")

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.reader.clear()
        owner, self.owner = self.owner, None
        with contextlib.suppress(Exception):
            if owner is not None:
                owner.disconnect()
            else:
                self.sock.close()

    def __repr__(self) -> str:
        return f"<RedisConnection {self.label}>"


def pipelined(
    count: int,
    parts_of: Callable[[int], Sequence[bytes | memoryview]],
    steps_of: Callable[[int], Steps],
    window: int,
    results: list[Any],
) -> Steps:
    """A plan running ``count`` commands with at most ``window`` of them in flight.

    The first ``window`` commands go out in one send; then each reply read
    sends the next command, so the server always has work queued while
    the client reads.  Serve it with :meth:`RedisConnection.run` (or the
    asyncio driver); the connection must be dropped on any error.

    Args:
        count: commands to run.
        parts_of: ``i -> parts`` of command ``i``.
        steps_of: ``i -> parser`` of reply ``i``.
        window: commands in flight, >= 1.
        results: the list the replies are appended to, in order (given by
            the caller, so that on an error it still holds what was read,
            e.g. objects to free).

    Returns:
        ``results``.
    """
    first = min(window, count)
    parts: list[bytes | memoryview] = []
    for i in range(first):
        parts.extend(parts_of(i))
    yield Send(parts)
    sent = first
    append = results.append
    for i in range(count):
        append((yield from steps_of(i)))
        if sent < count:
            yield Send(parts_of(sent))
            sent += 1
    return results


class NodePool:
    """The connections of one store to one server.

    ``acquire`` returns an idle connection that passed :meth:`RedisConnection.idle`
    (dropping any that did not) or opens a new one; ``release`` keeps a
    connection only when its call ended cleanly with nothing unread.

    Thread-safe.  After a ``fork`` the child forgets the parent's
    connections (they are closed in the child only, never shut down) and
    opens its own.

    Args:
        connect: ``deadline -> RedisConnection``, opens a connection.
        label: the server as messages name it.
        max_connections: most connections open at once (None: no limit);
            ``acquire`` waits for one to be released, until the deadline.
    """

    def __init__(
        self,
        connect: Callable[[float], RedisConnection],
        label: str,
        max_connections: int | None = None,
    ) -> None:
        self._connect = connect
        self.label = label
        self._max = max_connections
        self._idle: list[RedisConnection] = []
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        self._open = 0
        self._pid = os.getpid()
        self._closed = False

    def _after_fork(self) -> None:
        """(lock held) Forget the parent's connections in a forked child."""
        inherited, self._idle = self._idle, []
        self._open = 0
        self._pid = os.getpid()
        for conn in inherited:
            conn.close()

    def acquire(self, deadline: float) -> RedisConnection:
        """A connection ready for a command.

        Raises:
            TimeoutError: no connection free (``max_connections``) or none
                could be opened before the deadline.
            ConnectionError / OSError / the ``redis`` client's errors: the
                server cannot be reached.
        """
        while True:
            conn = None
            with self._lock:
                if self._pid != os.getpid():
                    self._after_fork()
                if self._closed:
                    raise ConnectionError(f"the connections to {self.label} were closed")
                while not self._idle and self._max is not None and self._open >= self._max:
                    remaining = deadline - now()
                    timed_out = remaining <= 0 or not self._released.wait(remaining)
                    if timed_out and not self._idle and self._open >= self._max:
                        raise TimeoutError(
                            f"all {self._max} connections to {self.label} stayed busy"
                        )
                if self._idle:
                    conn = self._idle.pop()
                else:
                    self._open += 1
            if conn is None:
                try:
                    return self._connect(deadline)
                except BaseException:
                    self._forget()
                    raise
            if conn.idle():
                return conn
            self.discard(conn)

    def release(self, conn: RedisConnection) -> None:
        """Give back a connection whose call ended cleanly (dropped if anything is unread)."""
        if conn.reader.pending():
            self.discard(conn)
            return
        with self._lock:
            if not self._closed and self._pid == os.getpid():
                self._idle.append(conn)
                self._released.notify()
                return
        conn.close()

    def discard(self, conn: RedisConnection) -> None:
        """Close a connection that must not be reused (its call failed)."""
        conn.close()
        self._forget()

    def _forget(self) -> None:
        with self._lock:
            if self._pid == os.getpid() and self._open > 0:
                self._open -= 1
            self._released.notify()

    @property
    def idle_count(self) -> int:
        """Connections waiting in the pool."""
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        """Close the idle connections; those in use close when released."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            mine = self._pid == os.getpid()
            self._released.notify_all()
        if mine:
            for conn in idle:
                conn.close()

    def __repr__(self) -> str:
        return f"<NodePool {self.label}>"
