"""Put/get throughput of FileStore on /dev/shm against a numpy copy of the same bytes.

::

    python -m kvpool.cli.bench.store_rounds                 # 8 rounds, native pinned pool
    python -m kvpool.cli.bench.store_rounds --rounds 16 --pool torch --json

A round moves 64 KV chunks of 512 KiB (``[2, 4, 256, 128]`` float16, 32 MiB,
as workload W7 of ``shared/bench``): ``put`` of each chunk under its own
key, then ``get`` of each into a new object of the same pool (freed after
the round).  In the same run, interleaved with the store's rounds, the
reference ``np.copyto`` copies a 32 MiB array; every figure is the best
round (GB/s, 1 GB = 1e9 bytes) and the ratios are against the best numpy
round.

The other rows show where the time goes, with the same chunks and files
but without the store: ``write fresh`` (create + one writev + close of a
new file, i.e. tmpfs page allocation + copy), ``write+rename`` (what a put
does, minus Python), ``overwrite`` (write into an existing file: the copy
alone, as W7 does), ``preadv`` (open + preadv + close into existing
objects: what a get does, minus allocation and checks).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kvpool.formats import MemoryFormat
from kvpool.pool.extent import TensorMemoryAllocator
from kvpool.remote import FileStore

KV_SHAPE = torch.Size([2, 4, 256, 128])
KV_DTYPE = torch.float16
KV_FMT = MemoryFormat.KV_2LTD
CHUNK = KV_SHAPE.numel() * KV_DTYPE.itemsize  # 512 KiB
N_CHUNKS = 64
ROUND_BYTES = N_CHUNKS * CHUNK  # 32 MiB
now = time.perf_counter


def make_pool(kind: str, size: int) -> tuple[Any, Any]:
    """An extent pool on native (pinned where possible) or torch memory, every page touched."""
    if kind == "native":
        from kvpool.native.buffer import allocate_host

        buf = allocate_host(size, hugepages="auto")
        pool = TensorMemoryAllocator(buf.tensor(), byte_view=buf.memoryview())
        return pool, buf
    tensor = torch.zeros(size, dtype=torch.uint8)  # zeros: every page resident
    return TensorMemoryAllocator(tensor), None


def run(
    rounds: int = 8,
    *,
    pool_kind: str = "native",
    directory: str | None = None,
    threads: int = 2,
) -> dict[str, Any]:
    """Measure; return the figures (GB/s, best round) and ratios to numpy."""
    base = directory or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    root = tempfile.mkdtemp(prefix="kvpool-putget-", dir=base)
    pool, owner = make_pool(pool_kind, 8 * ROUND_BYTES)
    rng = np.random.default_rng(7)
    src = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(N_CHUNKS)]
    dst = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(N_CHUNKS)]
    payload = rng.integers(0, 256, size=ROUND_BYTES, dtype=np.uint8)
    for i, obj in enumerate(src):
        obj.byte_array[:] = payload[i * CHUNK : (i + 1) * CHUNK].data
    src_views = [o.byte_array for o in src]
    dst_views = [o.byte_array for o in dst]
    keys = [f"chunk-{i}" for i in range(N_CHUNKS)]
    stores = {
        "plain": FileStore(os.path.join(root, "plain")),
        "checksum": FileStore(os.path.join(root, "crc"), checksum=True),
        "threads": FileStore(os.path.join(root, "threads"), io_threads=threads),
    }
    raw_dir = os.path.join(root, "raw")
    os.makedirs(raw_dir)
    raw = [os.path.join(raw_dir, k) for k in keys]
    a = payload.copy()
    b = np.empty_like(a)

    def numpy_copy() -> None:
        np.copyto(b, a)

    def put_with(store: FileStore) -> Callable[[], None]:
        def f() -> None:
            put = store.put
            for k, o in zip(keys, src, strict=True):
                put(k, o)

        return f

    def get_with(store: FileStore) -> Callable[[], None]:
        def f() -> None:
            get = store.get
            got = [get(k, pool, KV_SHAPE, KV_DTYPE, KV_FMT) for k in keys]
            t_end.append(now())
            pool.batched_free(got)  # type: ignore[arg-type]

        return f

    def batched_put(store: FileStore) -> Callable[[], None]:
        return lambda: store.batched_put(keys, src)

    def batched_get(store: FileStore) -> Callable[[], None]:
        def f() -> None:
            got = store.batched_get(keys, pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            t_end.append(now())
            pool.batched_free(got)  # type: ignore[arg-type]

        return f

    def write_fresh() -> None:
        for p, v in zip(raw, src_views, strict=True):
            tmp = p + ".new"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.writev(fd, (v,))
            os.close(fd)
            os.unlink(tmp)

    def write_rename() -> None:
        for p, v in zip(raw, src_views, strict=True):
            tmp = p + ".new"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.writev(fd, (v,))
            os.close(fd)
            os.rename(tmp, p)

    def overwrite() -> None:
        for p, v in zip(raw, src_views, strict=True):
            fd = os.open(p, os.O_WRONLY)
            os.pwritev(fd, (v,), 0)
            os.close(fd)

    def preadv() -> None:
        for p, v in zip(raw, dst_views, strict=True):
            fd = os.open(p, os.O_RDONLY)
            os.preadv(fd, (v,), 0)
            os.close(fd)

    # t_end: a get's clock stops before the objects are freed again.
    t_end: list[float] = []
    cases: dict[str, Callable[[], None]] = {
        "numpy_copy": numpy_copy,
        "put": put_with(stores["plain"]),
        "get": get_with(stores["plain"]),
        "put_checksum": put_with(stores["checksum"]),
        "get_checksum": get_with(stores["checksum"]),
        f"batched_put_{threads}threads": batched_put(stores["threads"]),
        f"batched_get_{threads}threads": batched_get(stores["threads"]),
        "raw_write_fresh": write_fresh,
        "raw_write_rename": write_rename,
        "raw_overwrite": overwrite,
        "raw_preadv": preadv,
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for fn in cases.values():  # warm-up: files exist, caches are hot
            fn()
        for _ in range(rounds):
            for name, fn in cases.items():
                t_end.clear()
                t0 = now()
                fn()
                t1 = t_end[0] if t_end else now()
                times[name].append(t1 - t0)
        # correctness of what was timed
        for name in ("plain", "checksum", "threads"):
            got = stores[name].batched_get(keys, pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            for i, o in enumerate(got):
                assert o is not None and o.byte_array == src_views[i], f"{name}: chunk {i} differs"
            pool.batched_free(got)  # type: ignore[arg-type]
    finally:
        for store in stores.values():
            store.close()
        shutil.rmtree(root, ignore_errors=True)
    gbps = {name: ROUND_BYTES / 1e9 / min(ts) for name, ts in times.items()}
    med = {name: ROUND_BYTES / 1e9 / sorted(ts)[len(ts) // 2] for name, ts in times.items()}
    ref = gbps["numpy_copy"]
    res = {
        "pool": pool_kind,
        "rounds": rounds,
        "round_MiB": ROUND_BYTES / 2**20,
        "directory": base,
        "GBps": {k: round(v, 3) for k, v in gbps.items()},
        "median_GBps": {k: round(v, 3) for k, v in med.items()},
        "ratio_to_numpy": {k: round(v / ref, 3) for k, v in gbps.items()},
    }
    pool.batched_free(src + dst)
    pool.close()
    if owner is not None:
        owner.close()
    return res


def main(argv: list[str] | None = None) -> int:
    """Command line: measure and print a table (or JSON)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--pool", choices=("native", "torch"), default="native")
    p.add_argument("--dir", default=None, help="where the store lives (default /dev/shm)")
    p.add_argument("--threads", type=int, default=2, help="io_threads of the batched rows")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    res = run(args.rounds, pool_kind=args.pool, directory=args.dir, threads=args.threads)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"FileStore on {res['directory']}, {N_CHUNKS} x 512 KiB per round, "
        f"best of {res['rounds']} rounds, {res['pool']} pool"
    )
    print(f"{'':28} {'GB/s':>7} {'median':>7} {'/numpy':>7}")
    for name, v in res["GBps"].items():
        print(
            f"{name:28} {v:7.2f} {res['median_GBps'][name]:7.2f} {res['ratio_to_numpy'][name]:7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
