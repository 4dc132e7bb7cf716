"""LMCache remote storage plugin: kvpool's stores behind LMCache's ``RemoteBackend``.

Configuration (LMCache 0.5.6's plugin framework; no ``remote_url``)::

    remote_serde: "naive"
    remote_storage_plugins: ["kvpool"]          # instances too: ["kvpool.hot", "kvpool.cold"]
    extra_config:
      remote_storage_plugin.kvpool.module_path: kvpool.integrations.lmcache.remote
      remote_storage_plugin.kvpool.class_name: KVPoolConnectorAdapter
      remote_storage_plugin.kvpool.url: "redis://127.0.0.1:6379/0"

LMCache then builds the backend ``RemoteBackend-kvpool`` (one per instance,
``RemoteBackend-kvpool.hot``...), whose connector this adapter makes for the
URL ``plugin://kvpool`` (``plugin://kvpool.<instance>``).

Settings, under ``remote_storage_plugin.<instance>.`` in ``extra_config``:

* ``url`` (required): the store, any spec
  :func:`kvpool.remote.open_async_store` takes - ``redis://[user:pass@]host:port/db``,
  ``rediss://...``, ``unix:///socket``, ``valkey://...``,
  ``redis-cluster://h1:p1,h2:p2``, ``mooncake://master:port?metadata=...``,
  ``file:///dir`` or a directory path (``/dev/shm/lmc`` keeps it in memory).
* Any keyword of that store's constructor, e.g. for Redis ``timeout``
  (seconds per call, 5.0), ``connect_timeout``, ``ttl`` (seconds, None),
  ``window`` (pipelined commands in flight), ``checksum`` (CRC-32 of each
  chunk, False), ``prefix`` (``"kvpool:"``), ``max_connections`` (the same
  for ``redis-cluster://``); for files ``checksum``, ``durable``,
  ``threads``, ``batch_threads``, ``reuse_files``; for Mooncake ``threads``, ``timeout``,
  ``segment_size``, ``local_buffer_size``, ``replicas``, ``prefix``,
  ``headerless`` (also in the URL query, ``&headerless=1``: entries without
  kvpool's header, as LMCache's ``save_chunk_meta: False``; it needs
  ``save_unfull_chunk`` and ``use_layerwise`` off).  The accepted names are the store's own
  signature: a misspelt one is refused with the closest name and the full
  list.

``remote_serde`` must be ``naive`` (``kivi``, the same in LMCache 0.5.6,
is taken too): the stores keep LMCache's tensors as they are, and
``cachegen``'s byte buffers are refused at start-up.

A missing URL, an unknown option or a refused value raises
:class:`PluginConfigError` while LMCache starts; LMCache logs it (an ERROR
line ``Failed to create remote backend for plugin kvpool: ...``) and runs
without that backend.

Seeing that it worked: at start-up the plugin logs one INFO line through
LMCache's logging (shown at ``LMCACHE_LOG_LEVEL=INFO``, the default)::

    kvpool plugin 'kvpool': AsyncRedisStore at redis://127.0.0.1:6379/0
        (LMCache backend RemoteBackend-kvpool)

Passwords in the URL are shown as ``***``.  In code:
``storage_manager.storage_backends["RemoteBackend-kvpool"].connection``
wraps a :class:`KVPoolConnector` (``.getWrappedConnector()``).  If
neither appears, LMCache did not load the plugin: look for its ERROR line
``Failed to load remote connector kvpool`` (a wrong ``module_path`` or
``class_name``) - LMCache then stores nothing remotely.  A ``class_name``
of ``KVPoolConnector`` (the connector, not its adapter) is refused at
start-up with a :class:`PluginConfigError` naming the fix.

Behaviour (see :mod:`~kvpool.integrations.lmcache.remote_connector`):
keys are ``CacheEngineKey.to_string()``; a chunk read back must be one
of the engine's layout (a partial last chunk too; with ``use_layerwise``,
one layer of it); chunks are read into memory of
LMCache's ``LocalCPUBackend`` (kvpool's when
:func:`kvpool.integrations.lmcache.install` ran) with no copy beyond the
store's own; a get never overtakes a put of the same key; a miss, an
unreachable server or a corrupt entry is a miss for LMCache; ``close()``
is bounded.  ``list()`` is not supported.  Metrics: LMCache's
``InstrumentedRemoteConnector`` reports the bytes and times to LMCache's
stats monitor; the connector's ``counters`` are exported by
:mod:`kvpool.metrics` (which this plugin installs in
``prometheus_client``'s default registry, the one LMCache uses).

Importing this module needs LMCache; ``import kvpool`` never does.
"""

from __future__ import annotations

from typing import Any

from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext

from kvpool.errors import KVPoolError, RemoteStoreError
from kvpool.integrations.lmcache.remote_config import (
    PLUGIN_TYPE,
    PluginConfigError,
    PluginSettings,
    instance_of,
    read_settings,
    refusal,
)
from kvpool.integrations.lmcache.remote_connector import KVPoolConnector
from kvpool.integrations.lmcache.remote_memory import register_backend_buffer
from kvpool.integrations.lmcache.remote_report import plugin_logger
from kvpool.remote import open_async_store

__all__ = [
    "PLUGIN_TYPE",
    "KVPoolConnector",
    "KVPoolConnectorAdapter",
    "PluginConfigError",
    "PluginSettings",
]


#: LMCache's ``remote_serde`` values the plugin takes: those that hand LMCache's
#: memory objects through unchanged (``kivi`` is ``naive`` in LMCache 0.5.6).
SERDES = ("naive", "kivi")


class KVPoolConnectorAdapter(ConnectorAdapter):
    """LMCache's adapter for ``plugin://kvpool`` and ``plugin://kvpool.<instance>``.

    LMCache makes one with no arguments (``class_name`` in its config) and
    asks it for the connector of each ``RemoteBackend-<instance>``.
    """

    def __init__(self) -> None:
        super().__init__(f"plugin://{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        """True for ``plugin://kvpool`` and ``plugin://kvpool.<instance>``."""
        return instance_of(url) is not None

    def create_connector(self, context: ConnectorContext) -> KVPoolConnector:
        """The connector of one plugin instance, over a new asyncio store.

        Args:
            context: LMCache's connector context (URL, loop, local CPU
                backend, config, metadata, plugin name).

        Returns:
            The connector (LMCache wraps it in its ``InstrumentedRemoteConnector``).

        Raises:
            PluginConfigError: a ``remote_serde`` other than ``naive`` (or
                ``kivi``), no ``url``, an unknown option, a store that
                refuses its settings (the message names the config key), a
                headerless store with ``save_unfull_chunk`` or ``use_layerwise``.
            RemoteStoreError: (``mooncake://``) the master does not answer;
                LMCache keeps the backend and its health check tries again.
        """
        instance = context.plugin_name or instance_of(context.url)
        if instance is None or instance_of(f"plugin://{instance}") is None:
            raise PluginConfigError(
                f"the kvpool plugin was asked for {context.url!r}; it serves "
                f"plugin://{PLUGIN_TYPE} and plugin://{PLUGIN_TYPE}.<instance>"
            )
        extra = context.config.extra_config if context.config is not None else None
        instances = getattr(context.config, "remote_storage_plugins", None) or ()
        settings = read_settings(extra, instance, instances)
        serde = getattr(context.config, "remote_serde", "naive")
        if serde not in SERDES:
            raise PluginConfigError(
                f"kvpool plugin {instance!r}: remote_serde is {serde!r}; the plugin stores "
                f"LMCache's chunks as they are, so it takes remote_serde: {' or '.join(SERDES)} "
                '(set remote_serde: "naive")'
            )
        try:
            store = open_async_store(settings.url, **settings.options)
        except RemoteStoreError:
            raise  # a server that does not answer yet: LMCache retries later
        except (KVPoolError, TypeError, ValueError) as exc:
            raise refusal(settings, exc) from None
        if getattr(store, "headerless", False):
            _refuse_layouts_headerless_cannot_keep(store, settings, context.config)
        metadata = context.metadata
        if metadata is None:
            metadata = getattr(context.local_cpu_backend, "metadata", None)
        try:
            connector = KVPoolConnector(
                store, settings, context.loop, context.local_cpu_backend, context.config, metadata
            )
        except BaseException:
            store.close()
            raise
        register_backend_buffer(store, context.local_cpu_backend)
        _export_metrics(connector)
        plugin_logger().info(
            "kvpool plugin %r: %s at %s (LMCache backend RemoteBackend-%s)",
            instance,
            type(store).__name__,
            settings.describe(),
            instance,
        )
        return connector


def _refuse_layouts_headerless_cannot_keep(store: Any, settings: Any, config: Any) -> None:
    """Close ``store`` and raise when LMCache stores chunks of more than one layout.

    A headerless entry is its bytes alone, read back in the full chunk's
    layout: partial chunks (``save_unfull_chunk``) and per-layer objects
    (``use_layerwise``) would come back wrong.

    Raises:
        PluginConfigError: either setting is on.
    """
    wanted = [
        name for name in ("save_unfull_chunk", "use_layerwise") if getattr(config, name, False)
    ]
    if not wanted:
        return
    store.close()
    raise PluginConfigError(
        f"kvpool plugin {settings.instance!r} ({settings.shown_url}): a headerless store keeps "
        f"no layout, so it cannot return the chunks LMCache stores with {' and '.join(wanted)}; "
        f"set {': False, '.join(wanted)}: False (as LMCache's RESP connector requires) or drop "
        "headerless"
    )


def _export_metrics(connector: Any) -> None:
    """Put kvpool's metrics (the connector's counters included) in LMCache's Prometheus registry."""
    try:
        import kvpool.metrics
    except ImportError:  # prometheus_client missing: LMCache has none to show either
        return
    kvpool.metrics.install()
    kvpool.metrics.watch(connector)
