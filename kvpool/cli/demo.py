"""``kvpool demo``: the whole library in one verified round trip.

On a host pool as kvpool makes one by default (pinned as well as the
machine allows, 4 KiB pages unless ``--hugepages`` or
``KVPOOL_HUGEPAGES=auto``, optionally NUMA-bound or shared), fill N KV
chunks with a known pattern, put them to a store (a :class:`~kvpool.remote.FileStore` in a temporary
directory by default, or any ``--store``), free them, get them back into
new chunks, verify every byte, and print the throughput, the pool's
statistics and the resident memory before and after.  The exit status is
1 on any mismatch (or error), 0 when every byte came back.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kvpool.cli.args import positive_int, size_arg

if TYPE_CHECKING:
    import numpy as np

__all__ = ["add_parser", "run_demo"]

# One KV chunk: [K/V, layers, tokens, hidden] in fp16 (2 bytes) = 512 KiB.  Plain
# numbers: this module is imported to build the parser, which must not load
# torch (`kvpool --version` and `--help` stay fast).
CHUNK_SHAPE = (2, 4, 256, 128)
CHUNK_BYTES = math.prod(CHUNK_SHAPE) * 2
#: The smallest pool the demo makes when --size is not given (twice the chunks' bytes otherwise).
DEFAULT_SIZE_FLOOR = 64 << 20


def _pattern(index: int) -> np.ndarray:
    """The bytes chunk ``index`` is filled with (random, reproducible)."""
    import numpy as np

    return np.random.default_rng(0x6B76 + index).integers(0, 256, CHUNK_BYTES, dtype=np.uint8)


@dataclass
class DemoResult:
    """What one demo run measured (also what ``--json`` prints)."""

    chunks: int
    bytes: int
    put_GBps: float
    get_GBps: float
    mismatched_chunks: int
    rss_before: int
    rss_after: int
    pool: dict[str, Any]
    stats: dict[str, Any]
    store: str


def _default_store_dir() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkdtemp(prefix="kvpool-demo-", dir=base)


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo described in the module docstring; return the exit status."""
    import numpy as np
    import torch

    from kvpool.allocators import MixedMemoryAllocator
    from kvpool.cli.progress import Progress
    from kvpool.errors import KVPoolError
    from kvpool.formats import MemoryFormat
    from kvpool.native.machine import format_bytes, rss_bytes
    from kvpool.remote import open_store
    from kvpool.remote.redis.config import redact_url, scrub, url_secrets

    shape, dtype = torch.Size(CHUNK_SHAPE), torch.float16

    out = sys.stdout
    size = args.size or max(2 * args.chunks * CHUNK_BYTES, DEFAULT_SIZE_FLOOR)
    if args.chunks * CHUNK_BYTES > size:
        print(
            f"kvpool demo: {args.chunks} chunks of {format_bytes(CHUNK_BYTES)} do not fit in a "
            f"{format_bytes(size)} pool; raise --size or lower --chunks",
            file=sys.stderr,
        )
        return 2
    tmpdir = None
    spec = args.store
    if spec is None:
        tmpdir = _default_store_dir()
        spec = tmpdir
    # What the demo prints names the store without its password (text, JSON, errors).
    shown = redact_url(str(spec))
    secrets = url_secrets(str(spec))
    rss_before = rss_bytes()
    kwargs: dict[str, Any] = {}
    if args.numa_node is not None:
        kwargs["numa_node"] = args.numa_node
    if args.shm_name:
        kwargs["shm_name"] = args.shm_name
        kwargs["shm_reuse"] = True
    fmt = MemoryFormat.KV_2LTD
    try:
        with (
            MixedMemoryAllocator(size, use_hugepages=args.hugepages, **kwargs) as pool,
            open_store(spec) as store,
        ):
            info = pool.describe()
            show = (lambda *a, **k: None) if args.json else print
            show(
                f"pool: {format_bytes(size)} {info['kind']} memory, pinned={info['pinned']}, "
                f"hugepages={info['hugepages']}, numa_node={info['numa_node']}"
                + (f", shm_name={info['shm_name']}" if info.get("shm_name") else ""),
                file=out,
            )
            show(f"store: {shown}", file=out)
            keys = [f"demo-chunk-{i}" for i in range(args.chunks)]
            with Progress(total=4 * args.chunks, label="filling chunks") as bar:
                chunks = []
                for i in range(args.chunks):
                    obj = pool.allocate(shape, dtype, fmt)
                    if obj is None:
                        raise KVPoolError(f"the pool is full after {i} chunks")
                    obj.byte_array[:] = _pattern(i).data
                    chunks.append(obj)
                    bar.advance()
                bar.set_label("put")
                t0 = time.perf_counter()
                for key, obj in zip(keys, chunks, strict=True):
                    store.put(key, obj)
                    bar.advance()
                t_put = time.perf_counter() - t0
                for obj in chunks:
                    obj.ref_count_down()
                del chunks, obj
                bar.set_label("get")
                t0 = time.perf_counter()
                back = []
                for key in keys:
                    obj = store.get(key, pool, shape, dtype, fmt)
                    if obj is None:
                        raise KVPoolError(f"the store lost {key!r}")
                    back.append(obj)
                    bar.advance()
                t_get = time.perf_counter() - t0
                bar.set_label("verifying")
                mismatched = 0
                for i, obj in enumerate(back):
                    # No local keeps the view: the objects are freed below.
                    if not np.array_equal(np.frombuffer(obj.byte_array, np.uint8), _pattern(i)):
                        mismatched += 1
                    bar.advance()
            stats = pool.stats()
            for obj in back:
                obj.ref_count_down()
            try:
                store.batched_delete(keys)
            except KVPoolError as exc:  # e.g. a Mooncake read lease outlasting the timeout
                print(
                    f"kvpool demo: not all its entries were deleted: {scrub(str(exc), secrets)}",
                    file=sys.stderr,
                )
            total = args.chunks * CHUNK_BYTES
            result = DemoResult(
                chunks=args.chunks,
                bytes=total,
                put_GBps=total / t_put / 1e9,
                get_GBps=total / t_get / 1e9,
                mismatched_chunks=mismatched,
                rss_before=rss_before,
                rss_after=rss_bytes(),
                pool=info,
                stats=asdict(stats),
                store=shown,
            )
    except (KVPoolError, OSError, ValueError) as exc:
        print(f"kvpool demo: {type(exc).__name__}: {scrub(str(exc), secrets)}", file=sys.stderr)
        return 1
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    if args.json:
        print(json.dumps(asdict(result), indent=2), file=out)
    else:
        _print_result(result, out)
    return 1 if result.mismatched_chunks else 0


def _print_result(r: DemoResult, out: Any) -> None:
    from kvpool.native.machine import format_bytes

    verdict = (
        f"verified: all {r.chunks} chunks ({format_bytes(r.bytes)}) came back byte for byte"
        if not r.mismatched_chunks
        else f"MISMATCH: {r.mismatched_chunks} of {r.chunks} chunks differ"
    )
    s = r.stats
    print(
        f"put: {r.chunks} chunks of {format_bytes(CHUNK_BYTES)} at {r.put_GBps:.2f} GB/s", file=out
    )
    print(
        f"get: {r.chunks} chunks of {format_bytes(CHUNK_BYTES)} at {r.get_GBps:.2f} GB/s", file=out
    )
    print(verdict, file=out)
    print(
        f"pool stats (before the final frees): {s['active_objects']} objects, "
        f"{format_bytes(s['used_bytes'])} used of {format_bytes(s['total_bytes'])}, "
        f"{s['pinned_objects']} held by pin(), "
        f"largest free block {format_bytes(s['largest_free_block'])}, "
        f"fragmentation {s['fragmentation']:.3f}",
        file=out,
    )
    note = " (hugetlb pages are not counted in RSS)" if "hugetlb" in str(r.pool) else ""
    print(
        f"resident memory: {format_bytes(r.rss_before)} before, "
        f"{format_bytes(r.rss_after)} after{note}",
        file=out,
    )


#: What ``kvpool demo --help`` says (plain words: argparse shows it as is).
DESCRIPTION = (
    "On a host pool as kvpool makes one by default (pinned as well as the machine allows; 4 KiB"
    " pages unless --hugepages, or KVPOOL_HUGEPAGES=auto to use 2 MiB pages when enough are "
    "free; optionally NUMA-bound or shared), fill N KV chunks with a known pattern, put them to"
    " a store (a FileStore in a temporary directory on /dev/shm by default, or any --store), "
    "free them, get them back into new chunks, verify every byte, and print the throughput, the"
    " pool's statistics and the resident memory before and after. Exit status: 0 when every "
    "byte came back, 1 on any mismatch or error."
)


def add_parser(subparsers: Any) -> None:
    """Register ``kvpool demo`` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "demo",
        help="a verified put/get round trip of KV chunks through a store",
        description=DESCRIPTION,
    )
    p.add_argument(
        "--store",
        help="where to put the chunks: a directory, file:///path, redis://host:port/db, "
        "redis-cluster://h1:p1,h2:p2 or mooncake://master:port?metadata=URL "
        "(default: a FileStore in a temporary directory on /dev/shm)",
    )
    p.add_argument(
        "--size",
        type=size_arg,
        help="pool size, e.g. 256M (binary units: 256M = 256MB = 256MiB); default: twice the "
        f"chunks' bytes, at least {DEFAULT_SIZE_FLOOR >> 20} MiB; a given size is used as it is",
    )
    p.add_argument(
        "--chunks", type=positive_int, default=64, help="KV chunks of 512 KiB (default 64)"
    )
    p.add_argument(
        "--hugepages",
        action="store_true",
        help="require 2 MiB hugepages (default: 4 KiB pages; KVPOOL_HUGEPAGES=auto in the "
        "environment uses 2 MiB pages when enough are free)",
    )
    p.add_argument("--numa-node", type=int, help="bind the pool to this NUMA node")
    p.add_argument("--shm-name", help="put the pool in POSIX shared memory of this name")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run_demo)
