"""MooncakeStore.mount_segment: kvpool shared memory as this node's share of a real Mooncake Store.

The storage node of these tests contributes only 16 MB, so most of the
chunks put land in the segment kvpool mounted: a second process attaches
that shared memory by name and finds their bytes there.  Also: unmount
and close free the memory, and bad arguments are refused before anything
is made.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import kvpool
from kvpool.errors import (
    PoolClosedError,
    SharedMemoryExistsError,
    SharedMemoryNotFoundError,
)
from kvpool.native.buffer import allocate_host, attach_shm
from kvpool.remote import MooncakeStore
from kvpool.remote.mooncake import MountedSegment

from .conftest import KV_FMT
from .mooncake_servers import MooncakeDeployment, start_mooncake

pytestmark = pytest.mark.mooncake

CHUNK = torch.Size([2, 16, 64, 128])  # 512 KiB of bfloat16
CHUNK_BYTES = CHUNK.numel() * 2
SEGMENT = 64 << 20

FIND = """
import sys
from kvpool.native.buffer import attach_shm
prefixes = [bytes.fromhex(h) for h in sys.stdin.read().split()]
with attach_shm(sys.argv[1], pin="none") as seg:
    data = bytes(seg.memoryview())
print(sum(1 for p in prefixes if data.find(p) >= 0))
"""


@pytest.fixture
def small_node() -> Iterator[MooncakeDeployment]:
    """A master and a storage node of 16 MB, for this test alone."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        env.setenv("MC_LOG_LEVEL", os.environ.get("MC_LOG_LEVEL", "ERROR"))
        deployment = start_mooncake(segment="16 MB")
        yield deployment
        deployment.stop()


def _shm_exists(name: str) -> bool:
    return Path("/dev/shm", name.lstrip("/")).exists()


def test_entries_live_in_the_mounted_kvpool_segment(
    small_node: MooncakeDeployment, python: str, child_env: dict[str, str]
) -> None:
    pool = kvpool.TensorMemoryAllocator(torch.empty(48 << 20, dtype=torch.uint8))
    store = MooncakeStore(small_node.master, metadata=small_node.metadata, timeout=10.0)
    try:
        segment = store.mount_segment(SEGMENT, pin="none")
        assert isinstance(segment, MountedSegment) and segment.mounted
        assert segment.size == SEGMENT and segment.segment_ids
        assert store.mounted_segments() == [segment]
        assert _shm_exists(segment.shm_name)
        rng = np.random.default_rng(7)
        objs = pool.batched_allocate(CHUNK, torch.bfloat16, 56, KV_FMT)
        assert objs is not None
        payloads = []
        for obj in objs:
            data = rng.integers(0, 256, CHUNK_BYTES, dtype=np.uint8).tobytes()
            obj.byte_array[:] = data
            payloads.append(data)
        keys = [f"seg-{uuid.uuid4().hex[:8]}-{i}" for i in range(len(objs))]
        store.batched_put(keys, objs)  # 28 MiB: at least 12 MiB beyond the node's 16 MB
        pool.batched_free(objs)
        got = store.batched_get(keys, pool, CHUNK, torch.bfloat16, KV_FMT)
        assert [bytes(g.byte_array) for g in got] == payloads  # type: ignore[union-attr]
        pool.batched_free(got)  # type: ignore[arg-type]
        # Another process attaches the segment by name and finds the chunks' bytes.
        out = subprocess.run(
            [python, "-c", FIND, segment.shm_name],
            input=" ".join(p[:64].hex() for p in payloads),
            env=child_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        found = int(out.stdout.strip())
        assert found >= 24, f"only {found} of {len(payloads)} chunks are in kvpool's segment"
        store.delete(keys[0])
        segment.unmount()
        assert not segment.mounted and store.mounted_segments() == []
        assert not _shm_exists(segment.shm_name)  # kvpool buffer is gone with it
        segment.unmount()  # idempotent
        # Entries that lived only in the segment left with it; the others still read.
        left = [store.get(k, pool, CHUNK, torch.bfloat16, KV_FMT) for k in keys[1:]]
        for obj, data in zip(left, payloads[1:], strict=True):
            if obj is not None:
                assert bytes(obj.byte_array) == data
                obj.ref_count_down()
        assert sum(obj is None for obj in left) >= 24
    finally:
        store.close()
        pool.close()


def test_close_unmounts_and_frees_every_segment(mooncake: MooncakeDeployment) -> None:
    store = MooncakeStore(mooncake.master, metadata=mooncake.metadata)
    name = f"/kvpool-test-seg-{uuid.uuid4().hex[:8]}"
    a = store.mount_segment(4 << 20, shm_name=name, pin="none")
    b = store.mount_segment(2 << 20, pin="mlock")
    assert a.shm_name == name and b.buffer.pinned == "mlock"
    assert _shm_exists(name)
    with pytest.raises(SharedMemoryExistsError):
        store.mount_segment(4 << 20, shm_name=name)
    assert store.mounted_segments() == [a, b]
    store.close()
    assert not a.mounted and not b.mounted
    assert not _shm_exists(name) and not _shm_exists(b.shm_name)
    with pytest.raises(SharedMemoryNotFoundError):
        attach_shm(name)
    with pytest.raises(PoolClosedError):
        store.mount_segment(4 << 20)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 0}, "size must be"),
        ({"size": 4096}, "size must be"),
        ({"size": 1 << 70}, "size must be"),
        ({"size": "4M"}, "size"),
        ({"size": 4 << 20, "shm_name": "/a/b"}, "name"),
        ({"size": 4 << 20, "pin": "cuda-alloc"}, "pin"),
        ({"size": 4 << 20, "numa_node": 4096}, "node"),
    ],
)
def test_bad_arguments_are_refused_and_leave_nothing(
    mooncake_store: MooncakeStore, kwargs: dict[str, object], match: str
) -> None:
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(kvpool.errors.KVPoolError, match=match):
        mooncake_store.mount_segment(**kwargs)  # type: ignore[arg-type]
    assert mooncake_store.mounted_segments() == []
    assert set(os.listdir("/dev/shm")) - before == set()


def test_a_name_without_its_slash_is_mounted_by_its_file(mooncake_store: MooncakeStore) -> None:
    name = f"kvpool-test-noslash-{uuid.uuid4().hex[:8]}"  # LMCache's style of name
    segment = mooncake_store.mount_segment(2 << 20, shm_name=name, pin="none")
    assert _shm_exists(name)
    segment.unmount()
    assert not _shm_exists(name)


def test_a_buffer_kvpool_made_is_not_mounted_twice(mooncake_store: MooncakeStore) -> None:
    # The name is taken by a buffer of this process: the store makes its own or refuses.
    name = f"/kvpool-test-taken-{uuid.uuid4().hex[:8]}"
    with allocate_host(2 << 20, shm_name=name, pin="none"):
        with pytest.raises(SharedMemoryExistsError):
            mooncake_store.mount_segment(2 << 20, shm_name=name)
        assert mooncake_store.mounted_segments() == []
