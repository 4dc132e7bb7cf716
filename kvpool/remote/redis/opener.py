"""Opening a connection to a Redis server, every step within one deadline.

A store opens a connection when its pool has none idle, inside a call; so
connecting is bounded by that call's deadline (or by ``connect_timeout``,
whichever comes first), not step by step.  :func:`connector` returns the
``deadline -> RedisConnection`` function the pools call; it runs:

1. the socket: TCP to each address the host name resolves to, in turn
   (``TCP_NODELAY``, the URL's keepalive options), or a UNIX socket; each
   ``connect`` waits at most the time left;
2. TLS (``rediss://``): the handshake runs on a socket whose timeout is
   the time left, which CPython applies to the handshake as a whole; the
   context is the ``redis`` client's, built from the URL's ``ssl_*``
   options;
3. the handshake: ``AUTH``, ``CLIENT SETNAME`` and ``SELECT``, as the URL
   or the client's options ask, pipelined (one round trip) and read by the
   deadline-bound driver every command uses
   (:meth:`~kvpool.remote.redis.connection.RedisConnection.run`), so a
   server that trickles its answers byte by byte cannot stretch it.

The ``redis`` client parses URLs and options
(:mod:`kvpool.remote.redis.config`) and builds the TLS context; it never
waits on the network here.  Connections speak RESP2 and send no
``HELLO``, so no push message can arrive unasked; they send no
``CLIENT SETINFO`` either (no round trip for a name tag).

Not bounded by the deadline: name resolution (``getaddrinfo``, which has
the system resolver's own timeouts; an IP address resolves at once) and a
``credential_provider``'s ``get_credentials()``.  The asyncio store also
stops waiting for them at the deadline (the connection, if it comes, is
closed).

Errors: :class:`TimeoutError` (the deadline passed), :class:`ConnectionError`
(the server cannot be reached or closed the connection),
:class:`HandshakeRefused` (it refused the credentials, the database or the
client name: the message names what to fix; the stores scrub secrets from
it), :class:`~kvpool.remote.redis.resp.ProtocolError` (a malformed answer).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import kvpool.remote.redis.wire as wire
from kvpool.errors import KVPoolError
from kvpool.remote.redis.connection import RedisConnection, now
from kvpool.remote.redis.resp import DEFAULT_LIMITS, Limits, Reader, Send, Steps, command

__all__ = ["HandshakeRefused", "connector", "handshake_plan"]


class HandshakeRefused(ConnectionError):
    """The server refused to set a new connection up: credentials, database or client name.

    The message says what was refused and what to fix; it may quote the
    server's answer, so show it through the store's secret scrubbing.
    """


#: Options of the ``redis`` client that do not apply to the TLS context's owner.
_DROPPED_OPTIONS = (
    "maint_notifications_config",
    "maint_notifications_pool_handler",
    "maintenance_state",
    "maintenance_notification_hash",
    "orig_host_address",
    "orig_socket_timeout",
    "orig_socket_connect_timeout",
    "oss_cluster_maint_notifications_handler",
    "retry_on_timeout",
    "retry_on_error",
    "health_check_interval",
    "socket_timeout",
    "socket_connect_timeout",
    "protocol",
    "retry",
    "redis_connect_func",
)


def _left(deadline: float, step: str) -> float:
    remaining = deadline - now()
    if remaining <= 0:
        raise TimeoutError(f"the deadline passed before {step}")
    return remaining


def _tcp(owner: Any, deadline: float) -> socket.socket:
    """A TCP socket to the owner's ``host:port``, each address tried until the deadline."""
    last: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(
        owner.host, owner.port, owner.socket_type, socket.SOCK_STREAM
    ):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if owner.socket_keepalive:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for key, value in owner.socket_keepalive_options.items():
                    sock.setsockopt(socket.IPPROTO_TCP, key, value)
            sock.settimeout(_left(deadline, "the TCP connection was made"))
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            if isinstance(exc, TimeoutError):
                raise
            last = exc
    if last is None:
        raise ConnectionError(f"{owner.host!r} resolved to no address")
    raise last


def _unix(owner: Any, deadline: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(_left(deadline, "the UNIX socket was connected"))
        sock.connect(owner.path)
    except BaseException:
        sock.close()
        raise
    return sock


def _tls(owner: Any, deadline: float) -> socket.socket:
    """A TCP socket with its TLS handshake done, by the ``redis`` client's TLS context.

    ``SSLConnection._wrap_socket_with_ssl`` (``redis`` >= 5.1) builds the
    context from the ``ssl_*`` options and does the handshake on the given
    socket, whose timeout (the time left) bounds it whole.  Older clients
    have only their own connect, TCP and TLS in one: each of its two
    steps is then bounded by the time left when the connection began.
    """
    wrap = getattr(owner, "_wrap_socket_with_ssl", None)
    if wrap is None:  # redis 5.0
        return owner._connect()  # type: ignore[no-any-return]
    sock = _tcp(owner, deadline)
    try:
        sock.settimeout(_left(deadline, "the TLS handshake"))
        return wrap(sock)  # type: ignore[no-any-return]
    except BaseException:
        sock.close()
        raise


def _credentials(owner: Any) -> tuple[bytes, ...]:
    """``AUTH``'s arguments (none when no password or provider is set)."""
    provider = owner.credential_provider
    if provider is not None:
        found = tuple(provider.get_credentials())
    elif owner.username:
        found = (owner.username, owner.password or "")
    elif owner.password:
        found = (owner.password,)
    else:
        return ()
    return tuple(owner.encoder.encode(c) for c in found)


def _refused(what: str, text: str, db: int) -> HandshakeRefused:
    code = text.split(" ", 1)[0]
    if what == "AUTH" or code in wire.AUTH_CODES:
        return HandshakeRefused(wire.credentials_refused(text))
    if what == "SELECT":
        return HandshakeRefused(
            f"the server refused SELECT {db} ({text}): check the database number in the URL "
            "(redis://host:port/DB)"
        )
    return HandshakeRefused(
        f"the server refused {what} ({text}): check client_name in the URL or client options"
    )


def handshake_plan(
    credentials: tuple[bytes, ...], client_name: bytes | None, db: int
) -> Callable[[Reader], Steps] | None:
    """The plan setting a new connection up (None when there is nothing to set).

    ``AUTH``, ``CLIENT SETNAME`` and ``SELECT`` go out in one send and
    their ``+OK`` replies are read in order.  A server older than Redis 6
    refuses ``AUTH user password`` for its number of arguments: the plan
    then tries ``AUTH password`` once, as the ``redis`` client does.

    Raises (from the plan):
        HandshakeRefused: a command was refused.
        ProtocolError: an answer that is neither ``+OK`` nor an error.
    """
    if not credentials and client_name is None and not db:
        return None

    def plan(reader: Reader) -> Steps:
        creds = credentials
        for _ in range(2):
            commands: list[tuple[str, bytes]] = []
            if creds:
                commands.append(("AUTH", command(b"AUTH", *creds)))
            if client_name is not None:
                commands.append(("CLIENT SETNAME", command(b"CLIENT", b"SETNAME", client_name)))
            if db:
                commands.append(("SELECT", command(b"SELECT", b"%d" % db)))
            yield Send([c for _, c in commands])
            refusals = []
            for what, _ in commands:
                reply = yield from wire.read_ok(reader, what)
                if reply is not None:
                    refusals.append((what, reply.text))
            if not refusals:
                return None
            what, text = refusals[0]
            if what == "AUTH" and len(creds) == 2 and "wrong number of arguments" in text:
                creds = creds[1:]  # a server before Redis 6: the password alone
                continue
            raise _refused(what, text, db)
        return None

    return plan


def connector(
    connection_class: type,
    options: dict[str, Any],
    label: str,
    connect_timeout: float,
    limits: Limits = DEFAULT_LIMITS,
) -> Callable[[float], RedisConnection]:
    """A ``deadline -> RedisConnection`` function: socket, TLS and handshake by that deadline.

    Args:
        connection_class: the ``redis`` client's connection class for the
            target (``Connection``, ``SSLConnection``,
            ``UnixDomainSocketConnection`` or a subclass): it says which
            kind of socket to open.
        options: its keyword arguments (a ``ConnectionPool``'s
            ``connection_kwargs``): address, credentials, database, client
            name, keepalive and TLS options.
        label: the server as messages name it.
        connect_timeout: longest time one connection may take to open,
            seconds (the call's own deadline applies too).
        limits: bounds on replies.

    Returns:
        The function the node pools call.  It raises :class:`TimeoutError`
        when the deadline (or ``connect_timeout``) passes at any step,
        :class:`ConnectionError` / :class:`OSError` when the server cannot
        be reached, :class:`HandshakeRefused` when it refuses the
        connection's set-up.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    if issubclass(connection_class, redis.UnixDomainSocketConnection):
        open_socket = _unix
    elif issubclass(connection_class, redis.SSLConnection):
        open_socket = _tls
    else:
        open_socket = _tcp
    base = {k: v for k, v in options.items() if k not in _DROPPED_OPTIONS}

    def connect(deadline: float) -> RedisConnection:
        deadline = min(deadline, now() + connect_timeout)
        remaining = _left(deadline, "a connection was opened")
        # The client's connection object, never connected: it holds the
        # options as the client resolves them (defaults, credentials, TLS).
        owner = connection_class(
            **base,
            protocol=2,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=remaining,
            socket_connect_timeout=remaining,
        )
        sock = open_socket(owner, deadline)
        try:
            conn = RedisConnection(sock, label, None, limits)
        except BaseException:
            sock.close()
            raise
        try:
            name = owner.client_name
            plan = handshake_plan(
                _credentials(owner),
                None if name is None else owner.encoder.encode(name),
                int(owner.db or 0),
            )
            if plan is not None:
                conn.run(plan(conn.reader), deadline)
        except BaseException:
            conn.close()
            raise
        return conn

    def opened(deadline: float) -> RedisConnection:
        try:
            return connect(deadline)
        except (TimeoutError, HandshakeRefused, KVPoolError):
            raise
        except OSError as exc:  # a refused port, an unknown host, a closed socket, TLS
            raise ConnectionError(f"cannot connect to {label}: {exc.strerror or exc}") from None

    return opened
