"""Where a Redis-protocol store connects, and keeping its secrets out of messages.

A store is given a URL (``redis://[user:password@]host[:port][/db]``,
``rediss://``, ``unix:///path?db=N``), an existing ``redis.Redis`` client or
a ``redis.ConnectionPool``.  :func:`resolve_target` turns any of them into a
:class:`Target`: the ``redis`` client's connection class and options (which
kvpool uses to *open* its own connections; see
:func:`kvpool.remote.redis.opener.connector`), a label naming the
server in messages, and the secrets that must never appear in one.

No message, ``repr`` or log line of the stores contains a password, a
username or a token: URLs are shown through :func:`redact_url`, error
texts from elsewhere through :func:`scrub`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from kvpool.errors import FeatureUnavailableError, InvalidArgumentError

__all__ = [
    "Target",
    "check_redis_database",
    "import_redis",
    "redact_url",
    "resolve_target",
    "scrub",
    "url_secrets",
]

# Every "scheme://userinfo@", not only the first: a URL may carry another in
# its query (mooncake://master?metadata=redis://:password@host).
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s]*)@")
# A URL mistyped without "://" ("redis//:pw@h", "rediss:/u:pw@h", "redis:pw@h"): what
# follows a scheme-like start ("redis//", "rediss:/", "redis:") up to an "@", with no "/"
# in it (so "dir/a@b" is a path, not user information).
_LOOSE_USERINFO = re.compile(r"\A((?:[A-Za-z][A-Za-z0-9+.-]*(?://+|:/*))?)([^/?#\s]*)@")
_SECRET_QUERY = re.compile(
    r"([?&;](?:[^=&;#]*(?:pass|pwd|token|secret|auth|key|cred)[^=&;#]*)=)([^&;#]*)", re.IGNORECASE
)
_SECRET_OPTIONS = ("password", "ssl_password", "ssl_keyfile_password")
_MIN_SCRUB = 3  # shorter strings are scrubbed only as part of longer ones


def import_redis() -> Any:
    """The ``redis`` client module.

    Raises:
        FeatureUnavailableError: it is not installed.
    """
    try:
        import redis
        import redis.backoff
        import redis.retry
    except ImportError as exc:
        raise FeatureUnavailableError(
            "the Redis stores need the redis client, which is not installed: "
            "pip install 'kvpool[redis]'"
        ) from exc
    return redis


def check_redis_database(url: str) -> None:
    """Refuse a ``redis://`` / ``rediss://`` URL whose path is not a database number.

    The ``redis`` client reads ``/db0`` (or any path it cannot read as a number)
    as database 0, so a typo would quietly write to another database.

    Raises:
        InvalidArgumentError: the path is not ``/`` followed by a number.
    """
    try:
        path = urlsplit(url).path
    except ValueError:
        return  # malformed: the redis client's own parse names what is wrong
    if path in ("", "/"):
        return
    db = path[1:]
    # ASCII digits only: str.isdigit() takes "²", which the client then reads as database 0.
    if re.fullmatch(r"[0-9]+", db) is None:
        raise InvalidArgumentError(
            f"Redis URL {redact_url(url)!r}: the database {db!r} is not a number; "
            "write the database's number after the port, e.g. redis://host:6379/0"
        )


def redact_url(url: str) -> str:
    """``url`` with its user information and secret-looking query values replaced by ``***``.

    Works on malformed URLs too (no parsing that could fail), and on a URL written
    without ``://`` (``redis//:password@host``).
    """
    out = _userinfo_pattern(url).sub(lambda m: m.group(1) + "***@", url)
    return _SECRET_QUERY.sub(lambda m: m.group(1) + "***", out)


def _userinfo_pattern(text: str) -> re.Pattern[str]:
    """The pattern finding ``text``'s user information: a URL's, or a mistyped URL's."""
    if "://" in text or text.startswith(("/", ".", "~")):
        return _USERINFO  # a URL, or a path (whose "@" is no user information)
    return _LOOSE_USERINFO


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets ``url`` carries (user information, secret-looking query values).

    As written and percent-decoded, for :func:`scrub` to remove from texts
    that may quote them (an error from a server or a library).
    """
    found = [m.group(2) for m in _userinfo_pattern(url).finditer(url)]
    found += [m.group(2) for m in _SECRET_QUERY.finditer(url)]
    parts = {piece for text in found for piece in (text, *text.split(":", 1)) if piece}
    return tuple(sorted(parts | {unquote(p) for p in parts}, key=len, reverse=True))


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***``."""
    for secret in secrets:
        if len(secret) >= _MIN_SCRUB:
            text = text.replace(secret, "***")
    return text


@dataclass(frozen=True)
class Target:
    """How to open connections to one server.

    Attributes:
        connection_class: the ``redis`` client's connection class.
        options: its keyword arguments (secrets included: never shown).
        label: the server as messages name it (``host:port/db``), no secrets.
        secrets: strings to scrub from any message.
    """

    connection_class: type
    options: dict[str, Any] = field(repr=False)
    label: str
    secrets: tuple[str, ...] = field(repr=False, default=())

    def with_address(self, host: str, port: int) -> Target:
        """The same options aimed at another node (for cluster routers)."""
        options = {**self.options, "host": host, "port": port}
        label = f"{host}:{port}/{options.get('db', 0)}"
        return Target(self.connection_class, options, label, self.secrets)


def _label(options: dict[str, Any]) -> str:
    db = options.get("db", 0) or 0
    if "path" in options:
        return f"unix:{options['path']}/{db}"
    return f"{options.get('host', 'localhost')}:{options.get('port', 6379)}/{db}"


def _secrets(options: dict[str, Any], extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    found = [str(options[k]) for k in _SECRET_OPTIONS if options.get(k)]
    found += [s for s in extra if s]
    # Longest first, so a secret containing another is scrubbed whole.
    return tuple(sorted(set(found), key=len, reverse=True))


def _from_pool(pool: Any, extra: tuple[str, ...] = ()) -> Target:
    options = dict(pool.connection_kwargs)
    return Target(pool.connection_class, options, _label(options), _secrets(options, extra))


def _sync_class(async_class: type, redis: Any) -> type:
    """The blocking connection class matching a ``redis.asyncio`` one."""
    import redis.asyncio.connection as aconn

    if issubclass(async_class, aconn.UnixDomainSocketConnection):
        return redis.UnixDomainSocketConnection  # type: ignore[no-any-return]
    if issubclass(async_class, aconn.SSLConnection):
        return redis.SSLConnection  # type: ignore[no-any-return]
    if issubclass(async_class, aconn.Connection):
        return redis.Connection  # type: ignore[no-any-return]
    raise InvalidArgumentError(
        f"cannot use a redis.asyncio pool whose connections are {async_class.__name__}; "
        "pass a URL instead"
    )


def resolve_target(spec: Any, allow_asyncio: bool = False) -> Target:
    """A :class:`Target` from a URL, a ``redis.Redis`` client or a ``ConnectionPool``.

    Args:
        spec: the URL (``str``), client or pool.
        allow_asyncio: also accept ``redis.asyncio`` clients and pools (their
            options are used with the matching blocking connection class).

    Raises:
        FeatureUnavailableError: the ``redis`` client is not installed.
        InvalidArgumentError: a malformed URL (the message shows it with
            its secrets redacted), a cluster client, or another type.
    """
    redis = import_redis()
    if isinstance(spec, str):
        if spec.split("://", 1)[0].lower() in ("redis", "rediss"):
            check_redis_database(spec)
        userinfo = _USERINFO.match(spec)
        extra: tuple[str, ...] = ()
        if userinfo:
            raw = userinfo.group(2)
            # The whole user information and its password part, raw and decoded.
            extra = (raw, unquote(raw), raw.split(":", 1)[-1], unquote(raw.split(":", 1)[-1]))
        try:
            pool = redis.ConnectionPool.from_url(spec)
        except (ValueError, TypeError) as exc:
            raise InvalidArgumentError(
                f"bad Redis URL {redact_url(spec)!r}: {scrub(str(exc), extra)}; use "
                "redis://[user:password@]host[:port][/db], rediss://... or unix:///path?db=N"
            ) from None
        target = _from_pool(pool, extra)
        pool.disconnect()
        return target
    cluster = getattr(getattr(redis, "cluster", None), "RedisCluster", None)
    if cluster is not None and isinstance(spec, cluster):
        raise InvalidArgumentError(
            "a RedisCluster client was given: this store talks to one server; use the "
            "cluster store for a Redis Cluster"
        )
    if isinstance(spec, redis.Redis):
        return _from_pool(spec.connection_pool)
    if isinstance(spec, redis.ConnectionPool):
        return _from_pool(spec)
    try:
        import redis.asyncio as aredis
    except ImportError:  # pragma: no cover - redis >= 4.2 has it
        aredis = None
    if aredis is not None and isinstance(spec, (aredis.Redis, aredis.ConnectionPool)):
        if not allow_asyncio:
            raise InvalidArgumentError(
                "a redis.asyncio client or pool was given to a blocking store; use "
                "AsyncRedisStore, or give a URL or a redis.Redis client"
            )
        pool = spec.connection_pool if isinstance(spec, aredis.Redis) else spec
        options = dict(pool.connection_kwargs)
        return Target(
            _sync_class(pool.connection_class, redis), options, _label(options), _secrets(options)
        )
    raise InvalidArgumentError(
        f"expected a Redis URL, a redis.Redis client or a redis.ConnectionPool, got "
        f"{type(spec).__name__}"
    )
