"""Store specs read by one set of rules: which store a string names, or why it names none.

Every entry point that takes a store from a string - :func:`kvpool.remote.open_store`,
:func:`~kvpool.remote.open_async_store`, the LMCache plugin, the SGLang backend, the vLLM tier,
``kvpool demo --store`` - reads it through :func:`parse_spec`, so a typo is refused the same
way everywhere, naming the fix, instead of quietly becoming a directory that swallows puts:

* a string with ``://`` must name a known scheme (:data:`SCHEMES`); a near miss
  (``reddis://``) is refused naming the closest one;
* spaces and line ends around a spec are dropped (a spec read from a file or an
  environment variable often ends in one);
* a string without ``://`` is a directory (``~`` is the home directory), unless it looks like
  a URL or an address: ``redis//h:p``, ``rediss:/h``, ``redis:h`` (a scheme with a colon or a
  double slash), ``host:port`` and ``h1:p1,h2:p2`` are refused with "did you mean ...".  A
  directory whose name really is like that is written ``./redis:h`` (or as an absolute path);
* a ``file:`` URL is ``file:///absolute/path`` (or ``file://localhost/...``);
* a Redis URL names its server: ``redis://`` with no host and ``unix://`` with no socket
  path are refused, not sent to ``localhost:6379``;
* a Redis database is a number: ``redis://h:p/0``; ``/db0`` or ``/0/x`` is refused (the
  ``redis`` client would read it as database 0), and so is a ``?db=`` that says another
  number than the path.  A cluster has only database 0.

Whether a directory store may create missing parents is the store's rule
(:class:`~kvpool.remote.file.store.FileStore`'s ``make_parents``), not the spec's.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from kvpool.errors import InvalidArgumentError
from kvpool.remote.redis.config import check_redis_database, redact_url

__all__ = [
    "CLUSTER_SCHEMES",
    "REDIS_SCHEMES",
    "SCHEMES",
    "StoreSpec",
    "parse_spec",
]

#: Schemes of one Redis-protocol server (``valkey`` ones are read as ``redis`` ones).
REDIS_SCHEMES = ("redis", "rediss", "unix", "valkey", "valkeys")
#: Schemes of a Redis Cluster (the ``s`` ones use TLS).
CLUSTER_SCHEMES = ("redis-cluster", "rediss-cluster", "valkey-cluster", "valkeys-cluster")
#: Every scheme a store spec may use.
SCHEMES = ("file", *REDIS_SCHEMES, *CLUSTER_SCHEMES, "mooncake")

#: What each kind of spec looks like, for messages.
FORMS = (
    "a directory (/path/to/dir, ./dir), file:///path, redis://host:port/0, rediss://..., "
    "unix:///socket, redis-cluster://h1:p1,h2:p2 or mooncake://master:port?metadata=URL"
)

# A first path segment that reads as a scheme: "redis:", "redis//", "rediss:/".
_SCHEME_LIKE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)(:/*|//+)(.*)", re.DOTALL)
# host:port ([v6]:port too); then, with an optional /db or path after it, one of them, or
# several comma-separated (a cluster's seed nodes).
_ADDRESS = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.\-]*):[0-9]{1,5}"
_HOST_PORT = re.compile(rf"{_ADDRESS}(/.*)?")
_HOST_PORTS = re.compile(rf"{_ADDRESS}(?:,{_ADDRESS})+(/.*)?")
# The scheme a bare host:port is most likely meant with, for its "did you mean".
_DEFAULT_GUESS = "redis"


@dataclass(frozen=True)
class StoreSpec:
    """Which store a spec names, and what its store is given.

    Attributes:
        kind: ``"file"``, ``"redis"``, ``"redis-cluster"`` or ``"mooncake"``.
        where: the directory (``file``) or the URL (``valkey://`` read as ``redis://``).
    """

    kind: str
    where: str


def parse_spec(spec: object) -> StoreSpec:
    """Read a store spec by the rules of the module docstring.

    Args:
        spec: a ``str`` or path-like; spaces and line ends around it are dropped.

    Returns:
        The store's kind and what to open it with.

    Raises:
        InvalidArgumentError: not a non-empty string; an unknown scheme (naming the
            closest); a URL or address written without ``://`` (naming the URL meant);
            a ``file:`` URL with a host or no path; a Redis URL with no host (``unix://``:
            no path); a Redis database that is not a number, or two databases.
    """
    try:
        text = os.fspath(spec)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidArgumentError(
            f"a store spec must be a str, got {type(spec).__name__} ({spec!r:.80}); give " + FORMS
        ) from None
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError(
            f"a store spec must be a non-empty str, got {redact_url(str(spec))!r:.80}; give "
            + FORMS
        )
    # Every entry point drops them here, so " redis://h/0" and "./dir\n" mean one thing
    # everywhere (and no directory is made with a line end in its name).
    text = text.strip()
    if "://" in text:
        return _url(text)
    _refuse_url_like(text)
    return StoreSpec("file", os.path.expanduser(text))


def _url(text: str) -> StoreSpec:
    """A spec with ``://``: its scheme must be known."""
    scheme = text.split("://", 1)[0].lower()
    if scheme == "file":
        return StoreSpec("file", _file_path(text))
    if scheme in REDIS_SCHEMES:
        url = "redis" + text[len("valkey") :] if scheme.startswith("valkey") else text
        _check_redis_url(url, scheme)
        return StoreSpec("redis", url)
    if scheme in CLUSTER_SCHEMES:
        return StoreSpec("redis-cluster", text)  # its store refuses a path other than /0
    if scheme == "mooncake":
        return StoreSpec("mooncake", text)
    close = difflib.get_close_matches(scheme, SCHEMES, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}://?" if close else ""
    raise InvalidArgumentError(
        f"unknown store scheme {scheme!r} in {redact_url(text)!r}{hint} (a store spec is {FORMS})"
    )


def _check_redis_url(url: str, scheme: str) -> None:
    """Refuse a Redis URL that names no server, or whose database is not one number."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return  # malformed: the redis client's own parse names what is wrong
    shown = redact_url(url)
    if scheme == "unix":
        if not parts.path:
            raise InvalidArgumentError(
                f"Redis URL {shown!r} names no socket; write unix:///path/to/redis.sock"
            )
        return
    if not host:
        raise InvalidArgumentError(
            f"Redis URL {shown!r} names no host; write {scheme}://host:6379/0 "
            f"({scheme}://127.0.0.1:6379/0 for a server on this machine)"
        )
    check_redis_database(url)
    asked = parse_qs(parts.query).get("db")
    path_db = parts.path.strip("/")
    if asked and path_db and asked != [path_db]:
        raise InvalidArgumentError(
            f"Redis URL {shown!r} names database {path_db} in its path and db={','.join(asked)} "
            "in its query; name the database once: keep the one after the port and drop db= "
            "from the query"
        )


def _file_path(text: str) -> str:
    parts = urlsplit(text)
    shown = redact_url(text)
    if parts.netloc not in ("", "localhost"):
        host = parts.netloc.rpartition("@")[2]
        raise InvalidArgumentError(
            f"file URL {shown!r} names host {host!r}; a file URL names a local directory: "
            f"file:///{host}{parts.path} (three slashes)"
        )
    path = unquote(parts.path)
    if not path:
        raise InvalidArgumentError(f"file URL {shown!r} has no path; write file:///absolute/path")
    return path


def _refuse_url_like(text: str) -> None:
    """Refuse a spec without ``://`` that reads as a URL or an address (see the module)."""
    if text.startswith(("/", "./", "../", "~")) or text in (".", ".."):
        return  # written as a path: a directory, whatever its name
    first = text.split("/", 1)[0]
    shown = redact_url(text)
    if _HOST_PORT.fullmatch(text) is not None:
        meant = text if "/" in text else text + "/0"
        raise InvalidArgumentError(
            f"store spec {shown!r} looks like a server address, not a directory; did you mean "
            f"'{_DEFAULT_GUESS}://{meant}'? (a directory with that name: write './{shown}')"
        )
    if _HOST_PORTS.fullmatch(text) is not None:
        raise InvalidArgumentError(
            f"store spec {shown!r} looks like a list of server addresses, not a directory; did "
            f"you mean 'redis-cluster://{text}'? (a directory with that name: write './{shown}')"
        )
    match = _SCHEME_LIKE.fullmatch(text)
    if match is not None and (":" in first or match.group(2).startswith("//")):
        word, rest = match.group(1).lower(), match.group(3)
        meant = word if word in SCHEMES else _closest_scheme(word)
        if meant is not None:
            if meant != "file":
                url = f"{meant}://{rest}"
            else:  # file:/abs is the absolute directory, file:rel the relative one
                url = f"file:///{rest.lstrip('/')}" if "/" in match.group(2) else f"./{rest}"
            raise InvalidArgumentError(
                f"store spec {shown!r} looks like a URL without '://'; did you mean "
                f"{redact_url(url)!r}? (a directory with that name: write './{shown}')"
            )
    if ":" in first:
        raise InvalidArgumentError(
            f"store spec {shown!r} has a ':' in its first part, as a URL or an address has; a "
            f"store spec is {FORMS} (a directory with that name: write './{shown}')"
        )


def _closest_scheme(word: str) -> str | None:
    close = difflib.get_close_matches(word, SCHEMES, n=1, cutoff=0.75)
    return close[0] if close else None
