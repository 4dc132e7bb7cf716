"""The tier's settings: the keys of its ``secondary_tiers`` entry, checked at start-up.

vLLM's tier factory takes ``type``, ``module_path`` and ``backpressure`` out of the
tier's JSON entry and passes every other key to the tier's constructor.  The tier reads:

* ``url`` (required): the store, any spec :func:`kvpool.remote.open_store` takes - a
  directory, ``file:///path``, ``redis://``, ``rediss://``, ``redis-cluster://h1:p1,h2:p2``,
  ``mooncake://...`` (read by :mod:`kvpool.remote.urls`: a typo stops start-up);
* the tier's own keys (:data:`TIER_KEYS`): ``threads`` (I/O threads, default
  :data:`DEFAULT_THREADS`, :data:`DISK_THREADS` for a directory on a disk),
  ``enable_kv_events`` (report the tier's stores and removals as KV events when vLLM
  has events on; default true), ``locality`` (``LOCAL`` or ``REMOTE``; default
  ``LOCAL`` for a directory, ``REMOTE`` otherwise);
* every other key an option of the URL's blocking store (``max_bytes``, ``direct_io``,
  ``checksum``, ``make_parents`` for a directory; ``timeout``, ``ttl``, ``prefix`` for
  Redis...).

Defaults the tier sets for a store that takes them, unless the entry (or the URL's
query) does (:data:`ROW_DEFAULTS`): Redis and a cluster connect on first use (``ping``
off, so a server that is down costs misses, not vLLM's start) and bound each call by one
second (``timeout``; the tier splits a large job into calls of at most
:data:`CALL_BYTES`); Mooncake stores rows as their bytes alone (``headerless``) and leaves a
chunk stored already as it is (``replace`` off: a chunk's key names its content).

Anything wrong raises :class:`TierConfigError` from the tier's constructor, so vLLM does
not start with a tier that stores nothing; passwords show as ``***``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpool.errors import InvalidArgumentError
from kvpool.integrations.shared.settings import (
    StoreSettings,
    read_store_settings,
    with_defaults,
)
from kvpool.remote import store_kind
from kvpool.remote.file.aio import on_tmpfs
from kvpool.remote.urls import parse_spec

__all__ = [
    "CALL_BYTES",
    "DEFAULT_THREADS",
    "DISK_THREADS",
    "ROW_DEFAULTS",
    "TIER_KEYS",
    "TierConfigError",
    "TierOptions",
    "read_tier_config",
]

#: Keys of the tier's JSON entry the tier reads itself (the rest are store options).
TIER_KEYS = frozenset({"threads", "enable_kv_events", "locality"})

#: I/O threads per kind of store when ``threads`` is not given.  One Redis server
#: answers one call at a time: two threads keep it busy (one call in flight while
#: the other's replies are read); four fought over the GIL and the CPUs for less
#: (256 KiB loads next to a local server on 2 CPUs: 1.08-1.16x of redis-benchmark's
#: best with two, 0.76-0.91x with four; 2 MiB and stores alike).
DEFAULT_THREADS: Mapping[str, int] = {
    "file": 8,
    "redis": 2,
    "redis-cluster": 4,
    "mooncake": 4,
}

#: I/O threads of a directory that is not in memory (not tmpfs), when ``threads``
#: is not given.  A disk moves more with more requests in flight (vLLM's own ``fs``
#: tier runs 32 threads); on tmpfs every copy is CPU work and more threads than
#: :data:`DEFAULT_THREADS` only contend (256 KiB ``O_DIRECT`` loads on this VM's
#: disk: 0.98-1.01x of vLLM's ``fs`` with 16 threads, 0.92-0.98x with 8).
DISK_THREADS = 16

#: Most bytes of rows one store call moves: a larger job is split, so each call
#: stays well inside its deadline.
CALL_BYTES = 64 << 20

#: Store options the tier sets per kind of store, unless the entry or the URL's query does.
ROW_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "file": {},
    "redis": {"ping": False, "timeout": 1.0},
    "redis-cluster": {"ping": False, "timeout": 1.0},
    "mooncake": {"headerless": True, "replace": False},
}

_LOCALITIES = ("LOCAL", "REMOTE")


class TierConfigError(InvalidArgumentError):
    """The kvpool tier's entry in vLLM's ``secondary_tiers`` is wrong.

    Raised by the tier's constructor while vLLM builds its offloading manager,
    so the engine does not start with a tier that would store nothing; the
    message names the key and the fix.
    """


@dataclass(frozen=True)
class TierOptions:
    """The tier's own settings (see the module docstring).

    Attributes:
        kind: the store's kind (``file``, ``redis``, ``redis-cluster``, ``mooncake``).
        threads: I/O threads.
        enable_kv_events: report stores and removals as KV events when vLLM has events on.
        locality: ``"LOCAL"`` or ``"REMOTE"``.
    """

    kind: str
    threads: int
    enable_kv_events: bool
    locality: str


def read_tier_config(
    config: Mapping[str, Any], label: str = "kvpool vLLM tier"
) -> tuple[StoreSettings, TierOptions]:
    """The store settings and the tier's options in the keywords vLLM passed.

    Args:
        config: the constructor's keywords besides vLLM's own arguments.
        label: names the tier in messages.

    Returns:
        The blocking store's settings (defaults of :data:`ROW_DEFAULTS` added) and
        the tier's options.

    Raises:
        TierConfigError: no ``url``, a bad or mistyped URL, an unknown key (named with
            the closest accepted one), a bad ``threads``, ``enable_kv_events`` or
            ``locality``.
    """
    values = dict(config)
    settings = read_store_settings(
        values,
        instance=label,
        prefix="",
        engine_keys=TIER_KEYS,
        error=TierConfigError,
        example="redis://127.0.0.1:6379/0",
        asyncio=False,
    )
    kind = store_kind(settings.url)
    label = f"{label} ({settings.shown_url})"
    threads = values.get("threads")
    if threads is None:
        disk = kind == "file" and not _in_memory(settings.url)
        threads = DISK_THREADS if disk else DEFAULT_THREADS[kind]
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 256:
        raise TierConfigError(
            f"{label}: threads must be an int from 1 to 256, got {threads!r}; it is how many "
            "I/O threads the tier runs"
        )
    events = values.get("enable_kv_events", True)
    if not isinstance(events, bool):
        raise TierConfigError(f"{label}: enable_kv_events must be true or false, got {events!r}")
    locality = values.get("locality") or ("LOCAL" if kind == "file" else "REMOTE")
    if not isinstance(locality, str) or locality.upper() not in _LOCALITIES:
        raise TierConfigError(
            f"{label}: locality must be LOCAL or REMOTE, got {locality!r}; it tells vLLM "
            "whether the tier's storage is on this machine"
        )
    settings = with_defaults(settings, ROW_DEFAULTS)
    return settings, TierOptions(kind, threads, events, locality.upper())


def _in_memory(spec: str) -> bool:
    """True when a directory store's folder (or, before it exists, its parent) is on tmpfs."""
    path = os.path.abspath(parse_spec(spec).where)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return on_tmpfs(path)
