"""The LMCache remote plugin tests' scenarios: LMCache's StorageManager on a YAML config.

Used by ``test_remote_plugin*.py`` in the test process (kvpool memory: the
compat conftest ran ``install()``) and by ``plugin_child.py`` in a child
process that never installs kvpool (LMCache's own allocators and memory
objects).  The config is the README's, verbatim, with the store's URL put
in its ``url`` line, after a few test sizes (16-token chunks of 16 KiB,
a 64 MiB CPU cache).

Every scenario returns evidence (digests of the bytes written and read
back, shapes, types, what LMCache's backend answered), never a verdict:
the tests compare.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

#: The plugin configuration of the README (and of issue 24), verbatim.
PLUGIN_BLOCK = """\
remote_serde: "naive"
remote_storage_plugins: ["kvpool"]          # instances too: ["kvpool.hot", "kvpool.cold"]
extra_config:
  remote_storage_plugin.kvpool.module_path: kvpool.integrations.lmcache.remote
  remote_storage_plugin.kvpool.class_name: KVPoolConnectorAdapter
  remote_storage_plugin.kvpool.url: "redis://127.0.0.1:6379/0"   # any URL open_store takes: file:///dev/shm/lmc, redis-cluster://h1:p1,h2:p2, mooncake://...
"""  # noqa: E501 - verbatim
VERBATIM_URL = '"redis://127.0.0.1:6379/0"'

#: Test sizes, before the plugin block.
SIZES = """\
chunk_size: 16
local_cpu: true
max_local_cpu_size: 0.0625
lmcache_instance_id: kvpool-plugin-tests
"""

CHUNK_TOKENS = 16
CHUNK_SHAPE = torch.Size([2, 2, CHUNK_TOKENS, 128])  # [kv, layers, tokens, hidden]: 16 KiB
DTYPE = torch.float16
BACKEND = "RemoteBackend-kvpool"
LIVENESS = 30.0
#: The plugin's logger (set up by LMCache's init_logger: it does not propagate).
PLUGIN_LOGGER = "kvpool.integrations.lmcache.remote"


class Collect(logging.Handler):
    """Keeps every record at ``level`` or above that the loggers it is attached to let through."""

    def __init__(self, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep ``record``."""
        self.records.append(record)

    def messages(self) -> list[str]:
        """Every message kept, formatted."""
        return [r.getMessage() for r in self.records]

    def at(self, level: int) -> list[str]:
        """The messages logged at exactly ``level``."""
        return [r.getMessage() for r in self.records if r.levelno == level]


@contextmanager
def collecting(*names: str, level: int = logging.DEBUG) -> Iterator[Collect]:
    """A :class:`Collect` attached to the loggers ``names`` for the ``with`` block.

    LMCache's loggers and the plugin's do not propagate, so a test reads
    them here rather than through pytest's ``caplog``.
    """
    handler = Collect(level)
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


class Opened:
    """A StorageManager with the plugin on ``url``, its remote backend and the plugin's connector.

    Args:
        url: the store URL for the config's ``url`` line.
        folder: where the config file is written.
        *extra: more ``extra_config`` lines.
    """

    def __init__(self, url: str, folder: Path, *extra: str) -> None:
        self.manager = make_manager(load_config(config_text(url, *extra), folder))
        self.backend = self.manager.storage_backends[BACKEND]
        self.connector = self.backend.connection.getWrappedConnector()
        self.allocator = self.manager.allocator_backend.memory_allocator

    def chunk(self, seed: int, tokens: int = CHUNK_TOKENS) -> tuple[Any, str]:
        """A chunk allocated through LMCache and filled; its digest."""
        from lmcache.v1.memory_management import MemoryFormat

        shape = torch.Size([2, 2, tokens, 128])
        obj = self.manager.allocate(shape, DTYPE, MemoryFormat.KV_2LTD)
        return obj, fill(obj, seed)

    def close(self) -> None:
        """Close the manager (and with it the plugin's backend)."""
        self.manager.close()


def kvpool_threads() -> list[str]:
    """The names of the live threads kvpool's stores started (``kvpool-`` prefix)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("kvpool-")]


def config_text(url: str, *extra: str, head: str = "") -> str:
    """The YAML text: test sizes, ``head`` lines, the verbatim block with ``url``, ``extra`` keys.

    Args:
        url: the store URL for the ``url`` line.
        *extra: more ``extra_config`` lines (``"remote_storage_plugin.kvpool.timeout: 2"``).
        head: top-level YAML lines (``"save_unfull_chunk: true\\n"``).
    """
    block = PLUGIN_BLOCK.replace(VERBATIM_URL, json.dumps(url))
    return SIZES + head + block + "".join(f"  {line}\n" for line in extra)


def load_config(text: str, folder: Path) -> Any:
    """``LMCacheEngineConfig.from_file`` of ``text`` (written to ``folder/lmcache.yaml``)."""
    from lmcache.v1.config import LMCacheEngineConfig

    path = folder / f"lmcache-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(text)
    return LMCacheEngineConfig.from_file(str(path))


def metadata() -> Any:
    """Engine metadata of a small model: 2 layers, 4 heads of 32, fp16, 16-token chunks."""
    from lmcache.v1.metadata import LMCacheMetadata

    return LMCacheMetadata(
        model_name="kvpool/plugin",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=DTYPE,
        kv_shape=(2, 2, CHUNK_TOKENS, 4, 32),
        chunk_size=CHUNK_TOKENS,
    )


def make_manager(config: Any) -> Any:
    """LMCache's StorageManager, as its cache engine makes it."""
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    return StorageManager(config, metadata(), EventManager())


def make_keys(n: int, tag: str | None = None) -> list[Any]:
    """``n`` chunk keys of a model name unique to this call (tests share servers)."""
    from lmcache.utils import CacheEngineKey

    model = f"kvpool/plugin-{tag or uuid.uuid4().hex[:10]}"
    return [CacheEngineKey(model, 1, 0, 1000 + i, DTYPE) for i in range(n)]


def digest(data: bytes | memoryview) -> str:
    """A short digest of bytes (the evidence compares digests, not megabytes)."""
    return hashlib.sha256(data).hexdigest()[:24]


def fill(obj: Any, seed: int) -> str:
    """Write seeded random values into ``obj``; return the digest of its bytes."""
    gen = torch.Generator().manual_seed(seed)
    obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=gen).to(obj.tensor.dtype))
    return digest(obj.byte_array)


def write_chunks(manager: Any, n: int, partial: int | None, seed: int = 0) -> dict[str, Any]:
    """Allocate ``n`` full chunks (and one of ``partial`` tokens) through LMCache and put them.

    Returns:
        ``keys``, ``digests`` and ``shapes`` of what was put (the partial
        chunk last), after ``StorageManager.batched_put`` (which takes over
        the references).
    """
    from lmcache.v1.memory_management import MemoryFormat

    objs = list(manager.batched_allocate(CHUNK_SHAPE, DTYPE, n, MemoryFormat.KV_2LTD))
    if partial is not None:
        shape = torch.Size([2, 2, partial, 128])
        objs.append(manager.allocate(shape, DTYPE, MemoryFormat.KV_2LTD))
    keys = make_keys(len(objs))
    digests = [fill(obj, seed + i) for i, obj in enumerate(objs)]
    shapes = [list(obj.get_shape()) for obj in objs]
    manager.batched_put(keys, objs)
    return {"keys": keys, "digests": digests, "shapes": shapes}


def wait_stored(backend: Any, keys: list[Any], timeout: float = LIVENESS) -> None:
    """Poll ``backend.contains`` until it holds every key (a liveness bound, not a timing)."""
    end = time.monotonic() + timeout
    while not all(backend.contains(k) for k in keys):
        if time.monotonic() > end:
            raise AssertionError(f"{backend} did not hold all {len(keys)} keys after {timeout} s")
        time.sleep(0.01)


def describe(obj: Any) -> dict[str, Any] | None:
    """What a read-back object is: digest, shape, class, module (None for a miss)."""
    if obj is None:
        return None
    out = {
        "digest": digest(obj.byte_array),
        "shape": list(obj.get_shape()),
        "type": f"{type(obj).__module__}.{type(obj).__name__}",
    }
    obj.ref_count_down()
    return out


def round_trip(manager: Any, n: int = 6, partial: int | None = 5, name: str = BACKEND) -> dict:
    """Put through the manager, read back from the plugin's backend, miss, remove.

    Returns:
        ``written`` (digests, shapes), ``batched`` and ``single`` (what
        ``batched_get_blocking`` / ``get_blocking`` returned, via
        :func:`describe`), ``misses`` (unknown keys read), ``removed``
        (``remove`` result, ``contains`` and ``get_blocking`` after it),
        ``connector`` (its class) and ``counters`` (the connector's
        snapshot: entries per operation).
    """
    written = write_chunks(manager, n, partial)
    keys = written.pop("keys")
    backend = manager.storage_backends[name]
    wait_stored(backend, keys)
    batched = [describe(o) for o in backend.batched_get_blocking(keys)]
    single = [describe(backend.get_blocking(k)) for k in keys]
    unknown = make_keys(2)
    mixed = backend.batched_get_blocking([keys[1], unknown[0]])
    misses = {
        "single": describe(backend.get_blocking(unknown[1])),
        "mixed": [describe(o) for o in mixed],
        "contains": backend.contains(unknown[0]),
    }
    removed = {
        "result": backend.remove(keys[0]),
        "contains": backend.contains(keys[0]),
        "get": describe(backend.get_blocking(keys[0])),
        "others": backend.contains(keys[1]),
    }
    connector = backend.connection.getWrappedConnector()
    counts = connector.counters.snapshot()
    return {
        "written": written,
        "batched": batched,
        "single": single,
        "misses": misses,
        "removed": removed,
        "connector": type(connector).__name__,
        "store": type(connector.store).__name__,
        "counters": {op: [c.entries, c.misses, dict(c.errors)] for op, c in counts.items()},
        "unusable": connector.report.corrupt,
    }
