"""SGLang HiCache L3 round trip: kvpool's backend against SGLang's own, same pages, same server.

::

    python -m kvpool.cli.bench.sglang_hicache [--rounds 7] [--pages 32] [--only file,mooncake,redis]

Runs in an environment with SGLang 0.5.23 (``make compat`` builds one;
``tests/compat/make_venv.py --requirements tests/compat/requirements-sgl0523.txt``
prints its Python).  One SGLang host pool (MHA, ``page_first``, bfloat16,
16 layers x 8 heads x 128, pages of 64 tokens: 4 MiB a page) is filled
with random bytes once.  A round of a contender writes ``pages`` new pages
and reads them back into other pages of the pool, each as SGLang's cache
controller calls its backend:

* **kvpool**: ``batch_set_v1`` / ``batch_get_v1`` of
  :class:`~kvpool.integrations.sglang.KVPoolHiCacheStorage` (pages moved in place);
* **HiCacheFile** (SGLang's file backend, no ``interface_v1``): the
  controller's generic path - ``get_data_page`` then ``batch_set``;
  ``get_dummy_flat_data_page``, ``batch_get``, ``set_from_flat_data_page``;
* **SGLang Mooncake** (``MooncakeStore``, zero copy, registered host pool):
  ``batch_set_v1`` / ``batch_get_v1``.

Pairs: ``file`` (kvpool ``file://`` vs HiCacheFile, two sibling
directories of one file system), ``mooncake`` (both on one local master).
``redis`` has no SGLang backend to compare: kvpool+redis is set against
``redis-benchmark`` SET/GET of the same value size on the same server.

Rounds interleave the contenders (order flipping each round); the first
round is a warm-up.  A ratio is SGLang's median seconds over kvpool's (>1:
kvpool faster); the spread is the min-max of the per-round ratios.  Every
page read back is compared byte for byte (untimed).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

LAYERS, HEADS, DIM, PAGE = 16, 8, 128, 64


def _pool(pages: int) -> Any:
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    tokens = 2 * pages * PAGE + PAGE
    k = tuple(torch.zeros(1, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    v = tuple(torch.zeros(1, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    ptrs = [torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64) for ts in (k, v)]
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs[0], v_data_ptrs=ptrs[1],
                          layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM, dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )  # fmt: skip
    return MHATokenToKVPoolHost(
        info, 1.0, 0, PAGE, "page_first", pin_memory=False, device="cpu",
        device_capacity_tokens=tokens, start_layer=0, end_layer=LAYERS,
    )  # fmt: skip


def _config(extra: dict[str, Any]) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench/model", extra_config=extra,
    )  # fmt: skip


def _kvpool(url: str, pool: Any) -> Any:
    from kvpool.integrations.sglang import KVPoolHiCacheStorage

    backend = KVPoolHiCacheStorage(_config({
        "backend_name": "kvpool", "module_path": "kvpool.integrations.sglang",
        "class_name": "KVPoolHiCacheStorage", "interface_v1": 1, "url": url,
    }))  # fmt: skip
    backend.register_mem_pool_host(pool)
    return backend


class Generic:
    """SGLang's controller path for a backend without ``interface_v1`` (HiCacheFile)."""

    def __init__(self, backend: Any, pool: Any) -> None:
        self.backend, self.pool = backend, pool

    def batch_set_v1(self, keys: list[str], idx: torch.Tensor) -> list[bool]:
        data = [self.pool.get_data_page(idx[i * PAGE]) for i in range(len(keys))]
        return [bool(self.backend.batch_set(keys, data))] * len(keys)

    def batch_get_v1(self, keys: list[str], idx: torch.Tensor) -> list[bool]:
        dummy = [self.pool.get_dummy_flat_data_page() for _ in keys]
        got = self.backend.batch_get(keys, dummy)
        out = []
        for i, page in enumerate(got):
            if page is None:
                out.append(False)
                continue
            self.pool.set_from_flat_data_page(idx[i * PAGE], page)
            out.append(True)
        return out

    def close(self) -> None:
        pass


def _round(
    backend: Any, pool: Any, src: torch.Tensor, dst: torch.Tensor, n: int
) -> tuple[float, float]:
    keys = [uuid.uuid4().hex * 2 for _ in range(n)]
    pool.kv_buffer[:, dst] = 0
    t0 = time.perf_counter()
    ok = backend.batch_set_v1(keys, src)
    t1 = time.perf_counter()
    back = backend.batch_get_v1(keys, dst)
    t2 = time.perf_counter()
    if (
        not all(ok)
        or not all(back)
        or not torch.equal(pool.kv_buffer[:, dst], pool.kv_buffer[:, src])
    ):
        raise RuntimeError(f"{backend!r}: a round lost or changed pages ({ok}, {back})")
    return t1 - t0, t2 - t1


def _pair(
    name: str, contenders: dict[str, Any], pool: Any, pages: int, rounds: int
) -> dict[str, Any]:
    src = pool.alloc(pages * PAGE)
    dst = pool.alloc(pages * PAGE)
    pool.kv_buffer[:, src] = torch.randn(pool.kv_buffer[:, src].shape).to(torch.bfloat16)
    times: dict[str, list[tuple[float, float]]] = {c: [] for c in contenders}
    order = list(contenders)
    for r in range(rounds + 1):
        for c in order if r % 2 == 0 else order[::-1]:
            t = _round(contenders[c], pool, src, dst, pages)
            if r:
                times[c].append(t)
    pool.free(src)
    pool.free(dst)
    kv, sg = order
    out: dict[str, Any] = {"pair": name, "mib": pages * pool.get_size_per_token() * PAGE / 2**20}
    for j, op in enumerate(("set", "get")):
        ratios = [s[j] / k[j] for k, s in zip(times[kv], times[sg], strict=True)]
        out[op] = {
            "kvpool_s": statistics.median(t[j] for t in times[kv]),
            "sglang_s": statistics.median(t[j] for t in times[sg]),
            "ratio": statistics.median(ratios),
            "spread": (min(ratios), max(ratios)),
        }
    return out


def _show(result: dict[str, Any]) -> None:
    mib = result["mib"]
    for op in ("set", "get"):
        r = result[op]
        print(
            f"{result['pair']:9s} {op}: kvpool {mib / r['kvpool_s']:8.0f} MiB/s, SGLang "
            f"{mib / r['sglang_s']:8.0f} MiB/s, ratio {r['ratio']:.2f}x "
            f"(rounds {r['spread'][0]:.2f}-{r['spread'][1]:.2f})"
        )


def _file_pair(pool: Any, pages: int, rounds: int, base: Path) -> dict[str, Any]:
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    kv = _kvpool(f"file://{base / 'kvpool'}", pool)
    hf = HiCacheFile(_config({"file_storage_path": str(base / "hicache")}))
    try:
        return _pair("file", {"kvpool": kv, "HiCacheFile": Generic(hf, pool)}, pool, pages, rounds)
    finally:
        kv.close()


def _mooncake_pair(pool: Any, pages: int, rounds: int) -> dict[str, Any]:
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    from kvpool.cli.bench.localservers import start_mooncake
    from kvpool.cli.bench.mooncake_put_get import mooncake_folder

    deployment = start_mooncake(mooncake_folder(), "1 GB")
    try:
        kv = _kvpool(deployment.url, pool)
        sg = MooncakeStore(_config({
            "master_server_address": deployment.master, "metadata_server": deployment.metadata,
            "protocol": "tcp", "global_segment_size": 0, "local_hostname": "127.0.0.1",
        }), pool)  # fmt: skip
        sg.register_mem_pool_host(pool)
        try:
            return _pair("mooncake", {"kvpool": kv, "SGLang": sg}, pool, pages, rounds)
        finally:
            kv.close()
    finally:
        deployment.stop()


def _redis(pool: Any, pages: int, rounds: int) -> None:
    from kvpool.cli.bench.localservers import start_redis

    server = shutil.which("redis-server")
    bench = shutil.which("redis-benchmark")
    if server is None or bench is None:
        print("redis: no redis-server / redis-benchmark here; skipped")
        return
    srv = start_redis(server)
    try:
        kv = _kvpool(f"redis://127.0.0.1:{srv.port}/0", pool)
        src = pool.alloc(pages * PAGE)
        dst = pool.alloc(pages * PAGE)
        sets, gets = [], []
        for r in range(rounds + 1):
            s, g = _round(kv, pool, src, dst, pages)
            if r:
                sets.append(s)
                gets.append(g)
        kv.close()
        entry = pool.get_size_per_token() * PAGE // 2  # one K or V entry
        mib = pages * 2 * entry / 2**20
        print(f"redis     set: kvpool {mib / statistics.median(sets):8.0f} MiB/s "
              f"({2 * pages} entries of {entry >> 10} KiB a round)")  # fmt: skip
        print(f"redis     get: kvpool {mib / statistics.median(gets):8.0f} MiB/s")
        for test in ("set", "get"):
            done = subprocess.run(
                [bench, "-p", str(srv.port), "-t", test, "-d", str(entry), "-n", str(8 * pages),
                 "-c", "1", "-P", "16", "-q"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
            rps = float(line.split(":")[1].split()[0]) if ":" in line else 0.0
            print(
                f"redis     {test}: redis-benchmark {rps * entry / 2**20:8.0f} MiB/s "
                f"({line.strip()})"
            )
    finally:
        srv.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the pairs and print their ratios (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pages", type=int, default=32)
    parser.add_argument("--only", default="file,mooncake,redis")
    parser.add_argument("--dir", default=None, help="where the file pair writes (default /tmp)")
    args = parser.parse_args(argv)
    try:
        import sglang  # noqa: F401
    except ImportError:
        print("sglang_hicache: SGLang is not installed here (make compat builds an environment)")
        return 2
    logging.disable(logging.WARNING)
    pool = _pool(args.pages)
    only = set(args.only.split(","))
    if "file" in only:
        with tempfile.TemporaryDirectory(dir=args.dir) as base:
            _show(_file_pair(pool, args.pages, args.rounds, Path(base)))
    if "mooncake" in only:
        _show(_mooncake_pair(pool, args.pages, args.rounds))
    if "redis" in only:
        _redis(pool, args.pages, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
