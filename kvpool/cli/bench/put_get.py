"""Put/get of KV chunks through ``byte_array``: a file on /dev/shm against memcpy.

64 chunks of 512 KiB live in a :class:`kvpool.MixedMemoryAllocator`
(pinned host memory).  *put* writes every chunk's ``byte_array`` to a
file on /dev/shm (``file.write``), *get* reads the file back into 64
other chunks (``file.readinto``).  Both are a single copy through the
kernel, with no intermediate Python bytes.  The baseline copies the same
chunks into the same destination chunks with ``np.copyto`` (plain
memcpy, no system call), the bound a put/get can approach.  The chunks
read back are verified after each trial (untimed).

This is the local stand-in for a remote store; the remote stores' own
put/get benchmark plugs in as ``remote_put_get`` (see
:mod:`kvpool.cli.bench`).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import numpy as np
import torch

from kvpool.cli.bench.core import Benchmark, Case, Metric, MiB, Settings
from kvpool.formats import MemoryFormat

__all__ = ["PUT_GET"]

_SHAPE = torch.Size([2, 4, 256, 128])
_DTYPE = torch.float16
_CHUNK = _SHAPE.numel() * _DTYPE.itemsize
_CHUNKS = 64


def _setup(settings: Settings) -> Case:
    from kvpool.allocators import MixedMemoryAllocator

    rounds = settings.count(8, minimum=2)
    per_round = _CHUNKS * _CHUNK
    pool = MixedMemoryAllocator(2 * per_round + 4 * MiB)
    fmt = MemoryFormat.KV_2LTD
    try:
        src = pool.batched_allocate(_SHAPE, _DTYPE, _CHUNKS, fmt)
        dst = pool.batched_allocate(_SHAPE, _DTYPE, _CHUNKS, fmt)
        if src is None or dst is None:
            raise RuntimeError("the put/get pool is too small for its chunks")
        payload = np.random.default_rng(settings.seed).integers(
            0, 256, size=per_round, dtype=np.uint8
        )
        src_np = [np.frombuffer(o.byte_array, dtype=np.uint8) for o in src]
        dst_np = [np.frombuffer(o.byte_array, dtype=np.uint8) for o in dst]
        for i, a in enumerate(src_np):
            a[:] = payload[i * _CHUNK : (i + 1) * _CHUNK]
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix="kvpool-bench-", suffix=".bin", dir=directory)
        f = os.fdopen(fd, "w+b", buffering=0)
    except BaseException:
        pool.close()
        raise
    src_views = [o.byte_array for o in src]
    dst_views = [o.byte_array for o in dst]
    info: dict[str, Any] = {
        "file": path,
        "chunks": _CHUNKS,
        "chunk_bytes": _CHUNK,
        "rounds_per_trial": rounds,
        "pool": str(pool),
        "verified": True,
    }

    def put_round() -> None:
        f.seek(0)
        write = f.write
        for view in src_views:
            write(view)

    def get_round() -> None:
        f.seek(0)
        readinto = f.readinto
        for view in dst_views:
            if readinto(view) != _CHUNK:
                raise RuntimeError(f"short read from {path}")

    def verify() -> None:
        for i, a in enumerate(dst_np):
            if not np.array_equal(a, payload[i * _CHUNK : (i + 1) * _CHUNK]):
                info["verified"] = False
                raise RuntimeError(f"chunk {i} read back from {path} differs from what was written")
        for a in dst_np:
            a.fill(0)

    def rate(step: Any) -> float:
        start = time.perf_counter()
        for _ in range(rounds):
            step()
        return rounds * per_round / (time.perf_counter() - start) / 1e9

    def kv_trial() -> dict[str, float]:
        put = rate(put_round)
        get = rate(get_round)
        verify()
        return {"put": put, "get": get}

    def copy_round() -> None:
        copyto = np.copyto
        for d, s in zip(dst_np, src_np, strict=True):
            copyto(d, s)

    def baseline_trial() -> dict[str, float]:
        value = rate(copy_round)
        verify()
        return {"put": value, "get": value}

    # Warm-up: the file's tmpfs pages and every chunk page exist before timing.
    put_round()
    get_round()
    verify()
    copy_round()

    def cleanup() -> None:
        f.close()
        os.unlink(path)
        src_views.clear()
        dst_views.clear()
        src_np.clear()
        dst_np.clear()
        pool.batched_free(src)
        pool.batched_free(dst)
        pool.close()

    subject = "kvpool byte_array write/readinto"
    baseline = "np.copyto (memcpy bound)"
    return Case(
        metrics=[
            Metric("put", f"put {_CHUNKS} x 512 KiB to a /dev/shm file", "GB/s", True, bound=True),
            Metric("get", f"get {_CHUNKS} x 512 KiB from the file", "GB/s", True, bound=True),
        ],
        variants={subject: kv_trial, baseline: baseline_trial},
        subject=subject,
        baseline=baseline,
        info=info,
        cleanup=cleanup,
    )


PUT_GET = Benchmark(
    "put_get", "put/get of KV chunks: byte_array to a /dev/shm file and back, vs memcpy", _setup
)
