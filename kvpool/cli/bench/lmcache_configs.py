"""The contenders of the ``lmcache_remote`` benchmark: their LMCache configs, their pairs, targets.

Every contender is an LMCache engine config (YAML, read by LMCache's
``LMCacheEngineConfig.from_file``) that differs from the others only in
its remote storage.  LMCache's built-in connectors are configured as
LMCache's own code reads them: the plugin form (``remote_storage_plugins``
+ ``extra_config``) where LMCache 0.5.6 has a built-in plugin type
(``redis``, ``fs``, ``mooncakestore``), the deprecated ``remote_url``
where it has none (``resp://``, ``redis-cluster://``).  kvpool's plugin is
configured as its users configure it::

    remote_serde: "naive"
    remote_storage_plugins: ["kvpool"]
    extra_config:
      remote_storage_plugin.kvpool.module_path: kvpool.integrations.lmcache.remote
      remote_storage_plugin.kvpool.class_name: KVPoolConnectorAdapter
      remote_storage_plugin.kvpool.url: "redis://127.0.0.1:6379/0"

Mooncake: LMCache 0.5.6 documents ``master_server_address``, but the
Mooncake client installed here (0.3.x) reads ``master_server_addr`` from
its setup dict and ignores the other (it then tries ``localhost:50051``
twenty times and fails).  LMCache forwards any ``mooncake_<name>`` key of
``extra_config`` to the client as ``<name>``, so the LMCache contenders set
both.  They contribute no memory of their own (``global_segment_size: 0``),
as kvpool's store does by default: in both cases the bytes live in the one
storage node the benchmark starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONTENDERS",
    "PAIRS",
    "STORES",
    "Contender",
    "Endpoints",
    "Pair",
    "engine_yaml",
]

#: The ``--only-stores`` names, each a kind of server the benchmark starts.
STORES = ("redis", "cluster", "file", "mooncake")


@dataclass(frozen=True)
class Contender:
    """One LMCache configuration under test.

    Attributes:
        name: its identifier (JSON, logs).
        side: ``"kvpool"`` (kvpool's plugin) or ``"lmcache"`` (a built-in connector).
        store: which server it talks to (one of :data:`STORES`).
        label: what the table calls it.
    """

    name: str
    side: str
    store: str
    label: str


@dataclass(frozen=True)
class Pair:
    """kvpool's plugin against one of LMCache's connectors, on the same server.

    Attributes:
        key: the row's identifier (JSON, metric keys).
        kvpool: the kvpool contender's name.
        lmcache: the LMCache contender's name.
        target: the least ratio (LMCache's seconds / kvpool's) the issue asks
            for, on put and on get.
    """

    key: str
    kvpool: str
    lmcache: str
    target: float


CONTENDERS: dict[str, Contender] = {
    c.name: c
    for c in (
        Contender("kvpool-redis", "kvpool", "redis", "kvpool redis://"),
        Contender("kvpool-cluster", "kvpool", "cluster", "kvpool redis-cluster://"),
        Contender("kvpool-file", "kvpool", "file", "kvpool file://"),
        Contender("kvpool-mooncake", "kvpool", "mooncake", "kvpool mooncake://"),
        Contender(
            "kvpool-mooncake-headerless", "kvpool", "mooncake", "kvpool mooncake:// headerless=1"
        ),
        Contender("lmcache-redis", "lmcache", "redis", "LMCache redis://"),
        Contender("lmcache-resp", "lmcache", "redis", "LMCache resp:// (no chunk meta)"),
        Contender("lmcache-cluster", "lmcache", "cluster", "LMCache redis-cluster://"),
        Contender("lmcache-fs", "lmcache", "file", "LMCache fs://"),
        Contender("lmcache-mooncake", "lmcache", "mooncake", "LMCache mooncakestore:// (meta on)"),
        Contender(
            "lmcache-mooncake-nometa", "lmcache", "mooncake", "LMCache mooncakestore:// (meta off)"
        ),
    )
}

#: The comparisons the issue sets targets for, in the order they are reported.
PAIRS: tuple[Pair, ...] = (
    Pair("redis", "kvpool-redis", "lmcache-redis", 1.5),
    Pair("resp", "kvpool-redis", "lmcache-resp", 1.0),
    Pair("cluster", "kvpool-cluster", "lmcache-cluster", 1.5),
    Pair("file", "kvpool-file", "lmcache-fs", 1.0),
    Pair("mooncake", "kvpool-mooncake", "lmcache-mooncake", 1.5),
    Pair("mooncake_nometa", "kvpool-mooncake-headerless", "lmcache-mooncake-nometa", 0.9),
)


@dataclass(frozen=True)
class Endpoints:
    """Where the servers the benchmark started listen.

    Attributes:
        redis: ``host:port`` of the plain redis-server (or None).
        cluster: ``host:port,host:port,...`` of the cluster masters (or None).
        directory: the folder under which each file contender gets its own (or None).
        mooncake_master: ``host:port`` of the Mooncake master (or None).
        mooncake_metadata: the master's HTTP metadata URL (or None).
    """

    redis: str | None = None
    cluster: str | None = None
    directory: str | None = None
    mooncake_master: str | None = None
    mooncake_metadata: str | None = None


def _kvpool_plugin(url: str) -> dict[str, Any]:
    return {
        "remote_storage_plugins": ["kvpool"],
        "extra_config": {
            "remote_storage_plugin.kvpool.module_path": "kvpool.integrations.lmcache.remote",
            "remote_storage_plugin.kvpool.class_name": "KVPoolConnectorAdapter",
            "remote_storage_plugin.kvpool.url": url,
        },
    }


def _lmcache_mooncake(at: Endpoints, chunk_meta: bool) -> dict[str, Any]:
    return {
        "remote_storage_plugins": ["mooncakestore"],
        "extra_config": {
            "save_chunk_meta": chunk_meta,
            "master_server_address": at.mooncake_master,
            "mooncake_master_server_addr": at.mooncake_master,
            "metadata_server": at.mooncake_metadata,
            "local_hostname": "127.0.0.1",
            "protocol": "tcp",
            "global_segment_size": 0,
        },
    }


def remote_section(name: str, at: Endpoints) -> dict[str, Any]:
    """The remote-storage keys of contender ``name`` for the servers at ``at``."""
    mooncake = f"mooncake://{at.mooncake_master}?metadata={at.mooncake_metadata}&protocol=tcp"
    sections: dict[str, Any] = {
        "kvpool-redis": lambda: _kvpool_plugin(f"redis://{at.redis}/0"),
        "kvpool-cluster": lambda: _kvpool_plugin(f"redis-cluster://{at.cluster}"),
        "kvpool-file": lambda: _kvpool_plugin(f"file://{at.directory}/kvpool-file"),
        "kvpool-mooncake": lambda: _kvpool_plugin(mooncake),
        "kvpool-mooncake-headerless": lambda: _kvpool_plugin(mooncake + "&headerless=1"),
        "lmcache-redis": lambda: {
            "remote_storage_plugins": ["redis"],
            "extra_config": {"remote_storage_plugin.redis.redis_url": f"redis://{at.redis}/0"},
        },
        "lmcache-resp": lambda: {
            "remote_url": f"resp://{at.redis}",
            "extra_config": {"save_chunk_meta": False},
        },
        "lmcache-cluster": lambda: {"remote_url": f"redis-cluster://{at.cluster}"},
        "lmcache-fs": lambda: {
            "remote_storage_plugins": ["fs"],
            "extra_config": {"remote_storage_plugin.fs.base_path": f"{at.directory}/lmcache-fs"},
        },
        "lmcache-mooncake": lambda: _lmcache_mooncake(at, True),
        "lmcache-mooncake-nometa": lambda: _lmcache_mooncake(at, False),
    }
    if name not in sections:
        raise KeyError(f"no contender named {name!r}; known: {', '.join(sections)}")
    return sections[name]()  # type: ignore[no-any-return]


def engine_config(name: str, at: Endpoints, tokens: int, cpu_gb: float) -> dict[str, Any]:
    """The whole engine config of contender ``name``, as a dict.

    Args:
        name: a key of :data:`CONTENDERS`.
        at: the servers.
        tokens: LMCache's ``chunk_size`` (tokens per chunk).
        cpu_gb: ``max_local_cpu_size`` in GB (the local CPU backend holds
            the chunks put and the chunks read back).
    """
    config: dict[str, Any] = {
        "chunk_size": tokens,
        "local_cpu": True,
        "max_local_cpu_size": cpu_gb,
        "remote_serde": "naive",
        "lmcache_instance_id": f"kvpool-bench-{name}",
    }
    config.update(remote_section(name, at))
    return config


def engine_yaml(name: str, at: Endpoints, tokens: int, cpu_gb: float) -> str:
    """:func:`engine_config` as the YAML text LMCache reads."""
    import yaml

    return str(yaml.safe_dump(engine_config(name, at, tokens, cpu_gb), sort_keys=False))
