"""LMCache on kvpool's stores: the remote storage plugin in LMCache's own StorageManager.

    python examples/lmcache_remote_plugin.py [URL] [--kvpool-memory]
    # URL: the plugin's store (default: a temporary directory on /dev/shm), e.g.
    #      redis://127.0.0.1:6379/0, redis-cluster://h1:p1,h2:p2, mooncake://..., /some/dir

Needs LMCache 0.5.6: ``python -m kvpool install-lmcache`` installs it, and
the packages its code imports, into the environment of that ``python``.  The
script writes the plugin configuration of the README into a YAML file,
loads it as LMCache does (``LMCacheEngineConfig.from_file``), builds
LMCache's ``StorageManager`` - which creates the backend
``RemoteBackend-kvpool`` through the plugin - then puts 8 chunks and a
partial last one through the manager, waits until that backend holds
them, reads them back from it, checks every byte and shape, removes them
and closes.  ``--kvpool-memory`` runs LMCache on kvpool's memory
(``kvpool.integrations.lmcache.install()``) instead of its own.

LMCache logs at INFO by default: look for the plugin's line
``kvpool plugin 'kvpool': <store> at <url>`` to see that it loaded.
"""

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")  # no telemetry from an example

CONFIG = """\
chunk_size: 256
local_cpu: true
max_local_cpu_size: 0.25
remote_serde: "naive"
remote_storage_plugins: ["kvpool"]
extra_config:
  remote_storage_plugin.kvpool.module_path: kvpool.integrations.lmcache.remote
  remote_storage_plugin.kvpool.class_name: KVPoolConnectorAdapter
  remote_storage_plugin.kvpool.url: "{url}"
"""
MODEL = "kvpool-example/model"
CHUNKS = 8
PARTIAL_TOKENS = 100


def round_trip(url: str, folder: Path) -> None:
    """The round trip of the module docstring; SystemExit on any difference."""
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    config_file = folder / "lmcache.yaml"
    config_file.write_text(CONFIG.format(url=url))
    config = LMCacheEngineConfig.from_file(str(config_file))
    dtype = torch.bfloat16
    metadata = LMCacheMetadata(
        model_name=MODEL,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=dtype,
        kv_shape=(4, 2, 256, 4, 64),  # 4 layers, K and V, 256 tokens, 4 heads of 64: 1 MiB
        chunk_size=256,
    )
    manager = StorageManager(config, metadata, EventManager())
    try:
        backend = manager.storage_backends.get("RemoteBackend-kvpool")
        if backend is None or backend.connection is None:
            raise SystemExit("LMCache did not load the kvpool plugin: see its ERROR lines above")
        print("backends:", ", ".join(manager.storage_backends))
        print("connector:", backend.connection.getWrappedConnector())

        fmt = MemoryFormat.KV_2LTD
        chunks = list(manager.batched_allocate(metadata.get_shapes()[0], dtype, CHUNKS, fmt))
        chunks.append(manager.allocate(metadata.get_shapes(PARTIAL_TOKENS)[0], dtype, fmt))
        expected = []
        for chunk in chunks:
            chunk.tensor.copy_(torch.randn(chunk.tensor.shape).to(dtype))
            expected.append((bytes(chunk.byte_array), tuple(chunk.get_shape())))
        print("memory objects:", type(chunks[0]).__module__ + "." + type(chunks[0]).__name__)
        first = random.getrandbits(48)  # fresh keys: a shared server may hold older runs
        keys = [CacheEngineKey(MODEL, 1, 0, first + i, dtype) for i in range(len(chunks))]
        manager.batched_put(keys, chunks)  # the manager takes over our references

        deadline = time.monotonic() + 30
        while not all(backend.contains(key) for key in keys):
            if time.monotonic() > deadline:
                raise SystemExit("the remote backend did not hold every chunk within 30 s")
            time.sleep(0.01)
        back = backend.batched_get_blocking(keys)
        for i, (obj, (data, shape)) in enumerate(zip(back, expected, strict=True)):
            if obj is None:
                raise SystemExit(f"chunk {i} did not come back from {url}")
            if tuple(obj.get_shape()) != shape or bytes(obj.byte_array) != data:
                raise SystemExit(f"chunk {i} came back different")
            obj.ref_count_down()
        print(f"read back {len(back)} chunks, the last of {shape[2]} tokens")
        removed = sum(backend.remove(key) for key in keys)
        print(f"removed: {removed} of {len(keys)}")
    finally:
        manager.close()


def main() -> int:
    """Run the round trip of the command line; 0 when every chunk came back, 2 without LMCache."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "url", nargs="?", help="the plugin's store (default: a temporary directory)"
    )
    parser.add_argument(
        "--kvpool-memory", action="store_true", help="run LMCache on kvpool memory (install())"
    )
    args = parser.parse_args()
    import kvpool

    print(f"kvpool {kvpool.__version__} from {Path(kvpool.__file__).parent}")
    if args.kvpool_memory:
        import kvpool.integrations.lmcache as kv_lmcache

        kv_lmcache.install()  # before LMCache's memory management is imported
    try:
        import lmcache  # noqa: F401
    except ImportError:
        from kvpool.integrations.lmcache import INSTALL_COMMAND

        print(f"this example needs LMCache 0.5.6: {INSTALL_COMMAND} (with this Python: "
              f"{sys.executable})", file=sys.stderr)  # fmt: skip
        return 2
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        round_trip(args.url or str(Path(tmp) / "store"), Path(tmp))
    print("lmcache remote plugin round trip ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
