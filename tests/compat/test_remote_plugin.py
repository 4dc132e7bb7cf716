"""kvpool's LMCache remote storage plugin in LMCache 0.5.6's real StorageManager.

Every test builds LMCache's ``StorageManager`` from YAML text - the plugin
configuration of the README, verbatim, with the store's URL in its ``url``
line - against a real redis-server, a real three-master Redis Cluster, a
real Mooncake master + storage node, or a directory.  The round trip
(:func:`plugin_cases.round_trip`): six full chunks and a partial last one
(5 of 16 tokens) put through the manager's ``batched_put``, polled until
``RemoteBackend-kvpool`` contains every key, read back with its
``batched_get_blocking`` and ``get_blocking`` and compared by digest and
shape, two unknown keys read (misses), one key removed.

Two memory modes: in this process LMCache runs on kvpool memory (the
compat conftest ran ``install()``); ``plugin_child.py`` runs the same
round trip in a child process on LMCache's own allocators and objects.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import plugin_cases as cases
import pytest
import torch
from conftest import REPO

import kvpool

CHILD_TIMEOUT = 180

#: store kind -> (the async store class the plugin must open, what the round trip writes)
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "redis": ("AsyncRedisStore", {}),
    "redis-unfull": ("AsyncRedisStore", {"head": "save_unfull_chunk: true\n"}),
    "cluster": ("AsyncRedisClusterStore", {}),
    "file": ("AsyncFileStore", {}),
    "mooncake": ("AsyncMooncakeStore", {}),
    "mooncake-headerless": ("AsyncMooncakeStore", {"partial": None}),
}


@pytest.fixture
def plugin_log() -> Iterator[cases.Collect]:
    """Warnings and errors of the plugin's logger."""
    with cases.collecting(cases.PLUGIN_LOGGER, level=logging.WARNING) as handler:
        yield handler


@pytest.fixture(params=list(KINDS))
def target(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A store URL of each kind, on a real server, and what its round trip looks like."""
    kind = request.param
    store, options = KINDS[kind]
    if kind.startswith("redis"):
        url = request.getfixturevalue("redis_server").url + "/0"
    elif kind == "cluster":
        url = request.getfixturevalue("redis_cluster").url
    elif kind == "file":
        url = f"file://{tmp_path}/store"
    else:
        url = request.getfixturevalue("mooncake").url
        if kind == "mooncake-headerless":
            url += "&headerless=1"
    return {"kind": kind, "url": url, "store": store, "folder": str(tmp_path), **options}


def check_round_trip(ev: dict[str, Any], target: dict[str, Any], obj_type: str) -> None:
    """The evidence of :func:`plugin_cases.round_trip` shows a faithful plugin."""
    written = ev["written"]
    n = len(written["digests"])
    assert ev["connector"] == "KVPoolConnector" and ev["store"] == target["store"]
    for how in ("batched", "single"):
        got = ev[how]
        assert None not in got, (how, got)
        assert [g["digest"] for g in got] == written["digests"], how
        assert [g["shape"] for g in got] == written["shapes"], how  # the partial one too
        assert {g["type"] for g in got} == {obj_type}, how
    if target.get("partial", 5) is not None:
        assert written["shapes"][-1] == [2, 2, 5, 128]
    misses = ev["misses"]
    assert misses["single"] is None and misses["contains"] is False
    assert misses["mixed"][1] is None
    assert misses["mixed"][0]["digest"] == written["digests"][1]
    assert ev["removed"] == {
        "result": True,
        "contains": False,
        "get": None,
        "others": True,
    }
    assert ev["counters"]["batched_put"][0] == n
    assert ev["unusable"] == 0


def test_the_config_block_is_the_readmes_verbatim() -> None:
    # The block every test loads is the one users copy from the README and the guide.
    for doc in ("README.md", "docs/guide/lmcache.md"):
        assert "```yaml\n" + cases.PLUGIN_BLOCK + "```" in (REPO / doc).read_text(), doc
    text = cases.config_text("redis://h:1/0")
    assert '"redis://h:1/0"' in text and cases.VERBATIM_URL not in text


def test_round_trip_on_kvpool_memory(
    target: dict[str, Any], lmc, plugin_log: cases.Collect
) -> None:
    text = cases.config_text(target["url"], head=target.get("head", ""))
    manager = cases.make_manager(cases.load_config(text, Path(target["folder"])))
    try:
        assert list(manager.storage_backends) == ["LocalCPUBackend", cases.BACKEND]
        allocator = manager.allocator_backend.memory_allocator
        assert type(allocator) is kvpool.MixedMemoryAllocator
        partial = target.get("partial", 5)
        ev = cases.round_trip(manager, partial=partial)
        # Reads freed what they allocated: the CPU cache holds one reference per chunk put.
        assert allocator.memcheck()
        assert allocator.stats().active_objects == len(ev["written"]["digests"])
    finally:
        manager.close()
    check_round_trip(ev, target, "kvpool.pool.handle.TensorMemoryObj")
    assert not plugin_log.records, plugin_log.messages()


def run_child(spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Run ``plugin_child.py`` on ``spec``; return its JSON evidence."""
    path = folder / "spec.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "compat" / "plugin_child.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        cwd=str(REPO),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    evidence = json.loads(lines[-1])
    evidence["stderr"] = proc.stderr
    return evidence  # type: ignore[no-any-return]


def test_round_trip_on_lmcaches_own_memory(target: dict[str, Any], tmp_path: Path) -> None:
    spec = {
        "url": target["url"],
        "head": target.get("head", ""),
        "folder": str(tmp_path),
        "partial": target.get("partial", 5),
    }
    ev = run_child(spec, tmp_path)
    assert ev["kvpool_installed"] is False
    assert ev["allocator"].startswith("lmcache.v1.memory_allocators."), ev["allocator"]
    check_round_trip(ev, target, "lmcache.v1.memory_management.TensorMemoryObj")
    assert "kvpool plugin" not in ev["stderr"], ev["stderr"][-3000:]  # no warning of ours


@pytest.mark.parametrize("kind", ["redis", "file"])
def test_layerwise_chunks_round_trip(
    kind: str, tmp_path: Path, lmc, plugin_log: cases.Collect, request: pytest.FixtureRequest
) -> None:
    # With use_layerwise, LMCache's cache engine stores one object per layer and
    # chunk, [tokens, kv, hidden] in KV_T2D, the last chunk's with fewer tokens.
    from lmcache.v1.memory_management import MemoryFormat

    if kind == "redis":
        url = request.getfixturevalue("redis_server").url + "/0"
    else:
        url = f"file://{tmp_path}/store"
    text = cases.config_text(url, head="use_layerwise: true\n")
    manager = cases.make_manager(cases.load_config(text, tmp_path))
    try:
        backend = manager.storage_backends[cases.BACKEND]
        hidden = cases.CHUNK_SHAPE[3]
        objs = [
            manager.allocate(torch.Size([tokens, 2, hidden]), cases.DTYPE, MemoryFormat.KV_T2D)
            for tokens in (cases.CHUNK_TOKENS, cases.CHUNK_TOKENS, 5)
        ]
        keys = cases.make_keys(len(objs))
        digests = [cases.fill(obj, 70 + i) for i, obj in enumerate(objs)]
        shapes = [list(obj.get_shape()) for obj in objs]
        manager.batched_put(keys, objs)
        cases.wait_stored(backend, keys)
        batched = [cases.describe(o) for o in backend.batched_get_blocking(keys)]
        single = [cases.describe(backend.get_blocking(k)) for k in keys]
    finally:
        manager.close()
    for got in (batched, single):
        assert None not in got, got
        assert [g["digest"] for g in got] == digests
        assert [g["shape"] for g in got] == shapes == [[16, 2, 128], [16, 2, 128], [5, 2, 128]]
    assert not plugin_log.records, plugin_log.messages()
