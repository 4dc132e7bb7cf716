"""The backend's settings in SGLang's extra config (``url``, options), checked at start-up.

SGLang hands every key of the extra config to the backend
(``HiCacheStorageConfig.extra_config``), its own keys included.  The
backend reads:

* ``url`` (required): the store, any spec :func:`kvpool.remote.open_store`
  takes (the backend calls the blocking store from SGLang's own threads);
* ``interface_v1``: must be ``1`` - SGLang then hands the backend its host
  pages to read and write in place; without it SGLang copies every page
  through a staging tensor, which this backend refuses to do;
* every other key that the URL's store takes as an option (``timeout``,
  which bounds each call; ``ttl``, ``prefix``, ``io_threads``...).

Defaults the backend sets for a store that takes them, unless the
configuration (or the URL's query) does (:data:`PAGE_DEFAULTS`):

* ``io_threads`` (a directory): one per CPU, at most four
  (:func:`~kvpool.remote.file.parts.default_batch_threads`): a batch of
  pages is written and read in that many parts at once, the first in
  SGLang's thread (:mod:`kvpool.remote.file.parts`);
* ``ping`` off (Redis, a cluster): nothing is sent at start-up, so a server
  that is down then costs misses until it answers, not SGLang's start;
* ``headerless`` (Mooncake): each range is stored as its bytes alone, one Mooncake
  buffer instead of two, as SGLang's own Mooncake backend stores pages.
  What the header would check - layout, dtype, format - is in the key's
  tag already (:mod:`kvpool.integrations.sglang.pages`); the size is still
  checked.  ``"headerless": false`` keeps kvpool's header.
* ``replace`` off (Mooncake): a page's key names its content (SGLang's page hash and
  the configuration's tag), so a page stored already is left as it is and
  a set makes no existence check - one Mooncake call instead of two (SGLang's
  own backend checks, then skips the pages it finds).

SGLang's own keys (:data:`SGLANG_KEYS`) are left alone.  Anything else -
a misspelt option, a bad URL - raises :class:`HiCacheConfigError` while
SGLang attaches the backend, naming the key, the closest accepted name
and the fix; passwords are shown as ``***``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpool.errors import InvalidArgumentError
from kvpool.integrations.shared.settings import (
    StoreSettings,
    read_store_settings,
    with_defaults,
)
from kvpool.remote.file.parts import default_batch_threads

__all__ = [
    "PAGE_DEFAULTS",
    "SGLANG_KEYS",
    "HiCacheConfigError",
    "read_config",
]

#: Keys of the extra config that SGLang reads itself (0.5.23).
SGLANG_KEYS = frozenset(
    {
        "backend_name",
        "module_path",
        "class_name",
        "interface_v1",
        "tp_lcm_size",
        "prefetch_threshold",
        "prefetch_timeout_base",
        "prefetch_timeout_per_ki_token",
        "hicache_storage_pass_prefix_keys",
    }
)

#: Store options the backend sets, per kind of store, unless the configuration
#: (or the URL's query) does; ``None`` stands for :func:`default_batch_threads`.
PAGE_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "file": {"io_threads": None},
    "redis": {"ping": False},
    "redis-cluster": {"ping": False},
    "mooncake": {"headerless": True, "replace": False},
}


class HiCacheConfigError(InvalidArgumentError):
    """The kvpool backend's settings in SGLang's extra config are wrong.

    Raised while SGLang attaches the storage backend, so the server does
    not start with an L3 tier that would store nothing; the message names
    the key and the fix.
    """


def read_config(extra: Mapping[str, Any] | None) -> StoreSettings:
    """The store settings in SGLang's extra config.

    Args:
        extra: ``HiCacheStorageConfig.extra_config``.

    Returns:
        The settings of the blocking store to open.

    Raises:
        HiCacheConfigError: see the module docstring.
    """
    values = dict(extra or {})
    name = str(values.get("backend_name", "kvpool"))
    label = f"kvpool HiCache backend {name!r}"
    v1 = values.get("interface_v1", 0)
    if v1 in (0, False, None, "0", "false", "False"):
        raise HiCacheConfigError(
            f'{label}: the extra config has no interface_v1: 1; add "interface_v1": 1 so SGLang '
            "hands the backend its host pages to move in place (without it SGLang copies every "
            "page through a staging tensor)"
        )
    settings = read_store_settings(
        values,
        instance=label,
        prefix="",
        engine_keys=SGLANG_KEYS,
        error=HiCacheConfigError,
        asyncio=False,
    )
    return _with_defaults(settings)


def _with_defaults(settings: StoreSettings) -> StoreSettings:
    """``settings`` plus the :data:`PAGE_DEFAULTS` its store takes and nobody set."""
    return with_defaults(settings, PAGE_DEFAULTS, computed=lambda _: default_batch_threads())
