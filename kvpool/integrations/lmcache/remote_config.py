"""The plugin's settings: ``remote_storage_plugin.<instance>.*`` of LMCache's ``extra_config``.

LMCache names each remote storage plugin instance in
``remote_storage_plugins`` (``"kvpool"``, ``"kvpool.hot"``...) and hands its
connector adapter the URL ``plugin://<instance>``.  Everything the kvpool
plugin needs sits in ``extra_config`` under ``remote_storage_plugin.<instance>.``:

* ``url`` (required): the store, any spec :func:`kvpool.remote.open_async_store`
  takes (``redis://``, ``rediss://``, ``unix://``, ``redis-cluster://h1:p1,h2:p2``,
  ``file:///path`` or a plain path, ``mooncake://...``);
* every other key is a keyword of that store's constructor (``timeout``,
  ``ttl``, ``window``, ``checksum``, ``prefix``...).  The accepted set is the
  store's own signature, checked by :func:`~kvpool.remote.open_async_store`;
* ``module_path`` and ``class_name`` are LMCache's (they load this plugin).

Anything wrong - no URL, an unknown or ill-typed option, a URL no store
takes - raises :class:`PluginConfigError` when LMCache builds the
connector, naming the full ``extra_config`` key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lmcache.v1.exceptions import IrrecoverableException

from kvpool.errors import InvalidArgumentError
from kvpool.integrations.shared.settings import StoreSettings
from kvpool.integrations.shared.settings import refusal as shared_refusal
from kvpool.remote.redis.config import redact_url

__all__ = ["LMCACHE_KEYS", "PLUGIN_TYPE", "PluginConfigError", "PluginSettings", "read_settings"]

#: The plugin type: ``remote_storage_plugins`` entries ``kvpool`` and ``kvpool.<instance>``.
PLUGIN_TYPE = "kvpool"

#: Keys under the instance's prefix that LMCache itself reads.
LMCACHE_KEYS = frozenset({"module_path", "class_name"})


class PluginConfigError(InvalidArgumentError, IrrecoverableException):
    """The kvpool plugin's settings in LMCache's config are wrong.

    Raised while LMCache builds the plugin's connector.  It is LMCache's
    ``IrrecoverableException``, so LMCache does not keep a remote backend
    with no connection (which would store nothing, silently): it logs this
    message and runs without the ``RemoteBackend-<instance>`` backend.
    """


#: One plugin instance's settings: the shared
#: :class:`~kvpool.integrations.shared.settings.StoreSettings` (``instance``,
#: ``url``, ``options``, ``prefix``; ``shown_url``, ``describe()``, ``secrets()``).
PluginSettings = StoreSettings


def instance_of(url: str) -> str | None:
    """The instance named by a connector URL ``plugin://kvpool[.<name>]``, else None."""
    if not isinstance(url, str) or not url.startswith("plugin://"):
        return None
    name = url[len("plugin://") :]
    if name == PLUGIN_TYPE or (
        name.startswith(PLUGIN_TYPE + ".") and len(name) > len(PLUGIN_TYPE) + 1
    ):
        return name
    return None


def read_settings(
    extra_config: Mapping[str, Any] | None, instance: str, instances: Sequence[str] = ()
) -> PluginSettings:
    """The settings of ``instance`` from LMCache's ``extra_config``.

    Args:
        extra_config: the engine config's ``extra_config`` (may be None).
        instance: ``kvpool`` or ``kvpool.<name>``.
        instances: every instance in LMCache's ``remote_storage_plugins``:
            the keys of ``kvpool.hot`` start with ``kvpool``'s prefix too,
            and are not ``kvpool``'s.

    Returns:
        The URL and the store options found under the instance's prefix.

    Raises:
        PluginConfigError: no ``url``, or a ``url`` that is not a non-empty str.
    """
    prefix = f"remote_storage_plugin.{instance}."
    theirs = tuple(
        f"remote_storage_plugin.{other}."
        for other in instances
        if isinstance(other, str) and other.startswith(f"{instance}.")
    )
    mine = {
        key[len(prefix) :]: value
        for key, value in (extra_config or {}).items()
        if isinstance(key, str) and key.startswith(prefix) and not key.startswith(theirs)
    }
    url = mine.pop("url", None)
    if url is None:
        raise PluginConfigError(
            f"kvpool plugin {instance!r}: extra_config has no {prefix}url; set it to the "
            f'store, e.g. {prefix}url: "redis://127.0.0.1:6379/0" (any spec '
            "kvpool.remote.open_async_store takes: redis://, rediss://, "
            "redis-cluster://h1:p1,h2:p2, file:///path, mooncake://...)"
        )
    if not isinstance(url, str) or not url.strip():
        raise PluginConfigError(
            f"kvpool plugin {instance!r}: {prefix}url must be a non-empty string, got "
            f"{type(url).__name__} {redact_url(str(url))!r}"
        )
    options = {k: v for k, v in mine.items() if k not in LMCACHE_KEYS}
    return PluginSettings(instance, url.strip(), options, prefix)


def refusal(settings: PluginSettings, exc: Exception) -> PluginConfigError:
    """The :class:`PluginConfigError` for a store that refused the settings.

    An unknown option (``ArgumentTypeError`` from the store's keyword
    check, which lists the accepted ones and the closest) is named by its
    full ``extra_config`` key; any other refusal is prefixed with the
    instance and its URL (redacted).  See
    :func:`kvpool.integrations.shared.settings.refusal`.
    """
    label = f"kvpool plugin {settings.instance!r} ({settings.shown_url})"
    return shared_refusal(settings, exc, label, PluginConfigError)  # type: ignore[return-value]
