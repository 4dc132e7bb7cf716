"""A Redis-protocol server on loopback that can lie: the attack tests' fake server.

:class:`HostileServer` is a real socket server (one thread per client) that
speaks enough of the protocol to serve both the current store (``SET``,
``GET``, ``EXISTS``, ``DEL``, ``STRLEN``, ``GETRANGE``, ``PING``) and the
hash format of earlier versions (``MULTI``/``EXEC``, ``HSET``, ``HMGET``,
``HGET``, ``HSTRLEN``), so that every attack can be replayed against the
code before and after a fix.  A test installs a *rule* for a command
name; the rule sees the command and the honest reply and returns what to
send instead: bytes (``b""``: answer nothing, keep the connection open),
:class:`Trickle` (bytes sent one at a time, slowly), :class:`Cut` (some
bytes, then the connection closed) or :data:`CLOSE`.  A *greeting* sent
on every new connection before anything is read (e.g. a trickle where a
TLS server's hello should come) and :meth:`HostileServer.drop_clients`
(every open connection closed, so the stores must open new ones) test
the way connections are opened.  ``CLUSTER SLOTS`` is answered with this
server as the only master, so a cluster store can be pointed at it too.

Nothing here can hang a test: the server stops trickling after
``Trickle.max_seconds``, every client thread ends when its socket closes,
and :meth:`HostileServer.close` closes every socket and joins every thread
with a bound.  :func:`bounded` runs a call in a thread and fails the test
if it has not returned after a bound (instead of hanging the run).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CLOSE", "Cut", "HostileServer", "Trickle", "bounded", "bulk", "encode"]


@dataclass
class Trickle:
    """Send ``prefix`` at once, then ``data`` one byte every ``interval`` seconds.

    The server gives up (closes) after ``max_seconds``; ``sent`` is set
    once the prefix is out.
    """

    data: bytes
    interval: float = 0.25
    max_seconds: float = 4.0
    prefix: bytes = b""
    sent: threading.Event = field(default_factory=threading.Event)


@dataclass
class Cut:
    """Send ``data`` at once, then close the connection (a reply cut off in the middle)."""

    data: bytes


#: A rule's answer: close the connection without replying.
CLOSE = object()

Rule = Callable[[list[bytes], bytes], Any]


def bulk(value: bytes | None) -> bytes:
    """A bulk string reply."""
    if value is None:
        return b"$-1\r\n"
    return b"$%d\r\n%b\r\n" % (len(value), value)


def encode(value: Any) -> bytes:
    """A reply for a Python value (bytes -> bulk, int, None, list, Exception -> error)."""
    if isinstance(value, Exception):
        return b"-%s\r\n" % str(value).encode()
    if value is None or isinstance(value, bytes):
        return bulk(value)
    if isinstance(value, int):
        return b":%d\r\n" % int(value)
    if isinstance(value, str):
        return b"+%s\r\n" % value.encode()
    if isinstance(value, list):
        return b"*%d\r\n" % len(value) + b"".join(encode(v) for v in value)
    raise TypeError(value)


class _Parser:
    """Commands out of a client's byte stream (RESP arrays of bulk strings)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def commands(self) -> list[list[bytes]]:
        out = []
        while True:
            cmd = self._one()
            if cmd is None:
                return out
            out.append(cmd)

    def _one(self) -> list[bytes] | None:
        buf = self.buf
        if not buf:
            return None
        i = buf.find(b"\r\n")
        if i < 0:
            return None
        if buf[:1] != b"*":  # inline command
            line = bytes(buf[:i])
            del buf[: i + 2]
            return line.split()
        n = int(buf[1:i])
        pos = i + 2
        args = []
        for _ in range(n):
            j = buf.find(b"\r\n", pos)
            if j < 0:
                return None
            size = int(buf[pos + 1 : j])
            start = j + 2
            if len(buf) < start + size + 2:
                return None
            args.append(bytes(buf[start : start + size]))
            pos = start + size + 2
        del buf[:pos]
        return args


class HostileServer:
    """A Redis-protocol server on a free loopback port, with rules that lie.

    Args:
        greeting: sent on every new connection before anything is read
            (bytes or a :class:`Trickle`); None: nothing.

    Attributes:
        data: the keyspace (bytes -> bytes for strings, dict for hashes).
        rules: command name (upper-case bytes) -> rule.
        fallback: the rule of every command without one of its own (None:
            answer honestly).
        log: every command received, in order.
        greeting: as the argument (may be changed between connections).
    """

    def __init__(self, greeting: bytes | Trickle | None = None) -> None:
        self.greeting = greeting
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.data: dict[bytes, Any] = {}
        self.rules: dict[bytes, Rule] = {}
        self.fallback: Rule | None = None
        self.log: list[list[bytes]] = []
        self.connections = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._clients: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def rule(self, name: bytes, fn: Rule) -> None:
        """Answer command ``name`` with ``fn(args, honest_reply)``."""
        self.rules[name.upper()] = fn

    def drop_clients(self) -> None:
        """Close every connection open now (the stores' pooled ones with them)."""
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)

    def once(self, name: bytes, fn: Rule) -> None:
        """Like :meth:`rule`, for the next such command only."""

        def wrapped(args: list[bytes], honest: bytes) -> Any:
            del self.rules[name.upper()]
            return fn(args, honest)

        self.rules[name.upper()] = wrapped

    # -- serving -----------------------------------------------------

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            with self._lock:
                self.connections += 1
                self._clients.append(client)
                thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
                self._threads.append(thread)
            thread.start()

    def _serve(self, client: socket.socket) -> None:
        parser = _Parser()
        queued: list[list[bytes]] | None = None
        client.settimeout(0.2)
        try:
            if self.greeting is not None and not self._send(client, self.greeting):
                return
            while not self._stop.is_set():
                try:
                    chunk = client.recv(1 << 20)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                parser.buf += chunk
                for args in parser.commands():
                    self.log.append(args)
                    name = args[0].upper()
                    if queued is not None and name not in (b"EXEC", b"MULTI"):
                        queued.append(args)
                        out: Any = b"+QUEUED\r\n"
                    elif name == b"MULTI":
                        queued = []
                        out = b"+OK\r\n"
                    elif name == b"EXEC":
                        replies = [self._honest(a) for a in queued or []]
                        queued = None
                        out = b"*%d\r\n" % len(replies) + b"".join(replies)
                    else:
                        out = self._honest(args)
                    rule = self.rules.get(name, self.fallback)
                    if rule is not None:
                        out = rule(args, out)
                    if not self._send(client, out):
                        return
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                client.close()

    def _send(self, client: socket.socket, out: Any) -> bool:
        if out is CLOSE:
            client.close()
            return False
        if isinstance(out, Cut):
            client.sendall(out.data)
            client.close()
            return False
        if isinstance(out, Trickle):
            if out.prefix:
                client.sendall(out.prefix)
            out.sent.set()
            waited = 0.0
            for i in range(len(out.data)):
                if self._stop.wait(out.interval) or waited >= out.max_seconds:
                    client.close()
                    return False
                waited += out.interval
                client.sendall(out.data[i : i + 1])
            return True
        client.sendall(out)
        return True

    def _honest(self, args: list[bytes]) -> bytes:
        """What a real server would answer (enough of it for the stores)."""
        name = args[0].upper()
        data = self.data
        try:
            if name in (b"CLIENT", b"SELECT", b"AUTH"):
                return b"+OK\r\n"
            if name == b"HELLO":  # redis-py >= 8 asks for RESP3 unless told otherwise
                proto = int(args[1]) if len(args) > 1 else 2
                if proto == 3:
                    return b"%1\r\n$5\r\nproto\r\n:3\r\n"
                return b"*2\r\n$5\r\nproto\r\n:2\r\n"
            if name == b"CLUSTER" and args[1].upper() == b"SLOTS":
                return encode([[0, 16383, [b"127.0.0.1", self.port, b"hostile"]]])
            if name == b"PING":
                return bulk(args[1]) if len(args) > 1 else b"+PONG\r\n"
            if name == b"SET":
                data[args[1]] = args[2]
                return b"+OK\r\n"
            if name == b"GET":
                value = data.get(args[1])
                if isinstance(value, dict):
                    return b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
                return bulk(value)
            if name == b"EXISTS":
                return encode(sum(k in data for k in args[1:]))
            if name == b"DEL":
                return encode(sum(data.pop(k, None) is not None for k in args[1:]))
            if name == b"STRLEN":
                return encode(len(data.get(args[1], b"")))
            if name == b"GETRANGE":
                value = data.get(args[1], b"")
                return bulk(value[int(args[2]) : int(args[3]) + 1])
            if name == b"HSET":
                h = data.setdefault(args[1], {})
                fields = args[2:]
                for i in range(0, len(fields), 2):
                    h[fields[i]] = fields[i + 1]
                return encode(len(fields) // 2)
            if name == b"HMGET":
                h = data.get(args[1], {})
                return encode([h.get(f) for f in args[2:]])
            if name == b"HGET":
                return bulk(data.get(args[1], {}).get(args[2]))
            if name == b"HSTRLEN":
                return encode(len(data.get(args[1], {}).get(args[2], b"")))
        except (IndexError, ValueError):
            return b"-ERR wrong arguments\r\n"
        return b"-ERR unknown command '%s'\r\n" % name

    def close(self) -> None:
        """Stop serving: close every socket, join every thread (bounded)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            clients, threads = list(self._clients), list(self._threads)
        for client in clients:
            with contextlib.suppress(OSError):
                client.close()
        self._acceptor.join(5)
        for thread in threads:
            thread.join(5)


def bounded(fn: Callable[[], Any], seconds: float = 15.0) -> Any:
    """Run ``fn()`` in a thread; return its value, raise its error, or fail after ``seconds``.

    A call that does not return in time fails the test (its thread is left
    behind as a daemon) instead of hanging the run.
    """
    import pytest

    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"the call did not return within {seconds} s")
    if error:
        raise error[0]
    return result[0]
