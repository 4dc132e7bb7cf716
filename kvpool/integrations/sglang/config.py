"""The backend's settings in SGLang's extra config (``url``, options), checked at start-up.

SGLang hands every key of the extra config to the backend
(``HiCacheStorageConfig.extra_config``), its own keys included.  The
backend reads:

* ``url`` (required): the store, any spec
  :func:`kvpool.remote.open_async_store` takes;
* ``interface_v1``: must be ``1`` - SGLang then hands the backend its host
  pages to read and write in place; without it SGLang copies every page
  through a staging tensor, which this backend refuses to do;
* ``call_timeout`` (seconds, default 10): the longest one SGLang call
  waits for the store (an outage costs at most this, then misses);
* every other key that the URL's store takes as an option (``timeout``,
  ``ttl``, ``prefix``, ``threads``...).

Defaults the backend sets for a store that takes them (Mooncake), unless
the configuration (or the URL's query) does (:data:`PAGE_DEFAULTS`):

* ``headerless``: each range is stored as its bytes alone, one Mooncake
  buffer instead of two, as SGLang's own Mooncake backend stores pages.
  What the header would check - layout, dtype, format - is in the key's
  tag already (:mod:`kvpool.integrations.sglang.pages`); the size is still
  checked.  ``"headerless": false`` keeps kvpool's header.
* ``replace`` off: a page's key names its content (SGLang's page hash and
  the configuration's tag), so a page stored already is left as it is and
  a set makes no existence check - one Mooncake call instead of two (SGLang's
  own backend checks, then skips the pages it finds).

SGLang's own keys (:data:`SGLANG_KEYS`) are left alone.  Anything else -
a misspelt option, a bad URL - raises :class:`HiCacheConfigError` while
SGLang attaches the backend, naming the key, the closest accepted name
and the fix; passwords are shown as ``***``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kvpool.errors import InvalidArgumentError
from kvpool.integrations.shared.settings import StoreSettings, read_store_settings
from kvpool.remote import store_options

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
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

#: Seconds one SGLang call waits for the store unless ``call_timeout`` says otherwise.
DEFAULT_CALL_TIMEOUT = 10.0

_OWN_KEYS = frozenset({"call_timeout"})

#: Store options the backend sets unless the configuration (or the URL's query) does.
PAGE_DEFAULTS: Mapping[str, Any] = {"headerless": True, "replace": False}


class HiCacheConfigError(InvalidArgumentError):
    """The kvpool backend's settings in SGLang's extra config are wrong.

    Raised while SGLang attaches the storage backend, so the server does
    not start with an L3 tier that would store nothing; the message names
    the key and the fix.
    """


def read_config(extra: Mapping[str, Any] | None) -> tuple[StoreSettings, float]:
    """The store settings and the call timeout from SGLang's extra config.

    Args:
        extra: ``HiCacheStorageConfig.extra_config``.

    Returns:
        ``(settings, call_timeout)``.

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
    timeout = values.get("call_timeout", DEFAULT_CALL_TIMEOUT)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise HiCacheConfigError(
            f"{label}: call_timeout must be a number of seconds > 0, got {timeout!r}; e.g. "
            '"call_timeout": 10'
        )
    settings = read_store_settings(
        values,
        instance=label,
        prefix="",
        engine_keys=SGLANG_KEYS | _OWN_KEYS,
        error=HiCacheConfigError,
    )
    return _with_defaults(settings), float(timeout)


def _with_defaults(settings: StoreSettings) -> StoreSettings:
    """``settings`` plus the :data:`PAGE_DEFAULTS` its store takes and nobody set."""
    accepted = store_options(settings.url)
    in_query = set(parse_qs(urlsplit(settings.url).query))
    added = {
        name: value
        for name, value in PAGE_DEFAULTS.items()
        if name in accepted and name not in settings.options and name not in in_query
    }
    if not added:
        return settings
    return dataclasses.replace(settings, options={**settings.options, **added})
