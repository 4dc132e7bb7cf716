"""The contenders of the ``sglang_hicache`` benchmark: SGLang's host pages, backends, servers.

One SGLang host pool (:class:`Pages`: MHA, ``page_first``, bfloat16, 16
layers x 8 heads x 128, pages of 64 tokens: 4 MiB a page, two 2 MiB
ranges, K and V) holds random pages.  A *round* of a contender writes
``pages`` pages under new keys and reads them back into other pages of the
pool, as SGLang's cache controller moves them:

* :class:`Backend` - a backend with SGLang's ``interface_v1``
  (``batch_set_v1`` / ``batch_get_v1``): kvpool's
  :class:`~kvpool.integrations.sglang.KVPoolHiCacheStorage`, SGLang's own
  ``MooncakeStore``;
* :class:`Generic` - the controller's path for a backend without it
  (SGLang's ``HiCacheFile``): ``get_data_page`` (a staging copy) then
  ``batch_set``; ``get_dummy_flat_data_page``, ``batch_get`` and
  ``set_from_flat_data_page`` (another copy);
* :class:`BareFiles` - the file system's own cost, a bound: each range
  written with one ``os.write`` into a new file, read back with one
  ``os.preadv`` into its place (no rename, no header, no checks);
* :class:`RedisBenchmark` - ``redis-benchmark`` SET / GET of values the
  size of kvpool's entries, on the server kvpool uses (there is no SGLang
  Redis backend to compare with).

A :class:`Pair` is kvpool's contender, the one it is compared with, any
bounds, and how its server is emptied between rounds (untimed), so that
every round writes new keys into an empty store: a Mooncake segment never
fills (eviction would land in whichever timed call crossed its high
watermark), the directories and servers stay small.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvpool.cli.bench.pairs import Contender, Pair

__all__ = [
    "PAGE",
    "Backend",
    "BareFiles",
    "Contender",
    "Generic",
    "Pages",
    "Pair",
    "RedisBenchmark",
    "delete_keys",
    "file_pair",
    "fs_type",
    "mooncake_pair",
    "redis_pair",
]

LAYERS, HEADS, DIM, PAGE = 16, 8, 128, 64


def _config(extra: dict[str, Any]) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench/model", extra_config=extra,
    )  # fmt: skip


class Pages:
    """SGLang's host pool and the two page ranges every round uses.

    Args:
        pages: pages a round moves.
        seed: of the random page contents.

    Attributes:
        pool: SGLang's ``MHATokenToKVPoolHost`` (``page_first``, not pinned).
        src: host indices of the pages written (random contents).
        dst: host indices the pages are read back into.
        count: pages a round moves.
        nbytes: bytes a round moves (each way).
        ranges: byte ranges of one page (K, V), each a kvpool entry.
    """

    def __init__(self, pages: int, seed: int = 1) -> None:
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
        self.pool = MHATokenToKVPoolHost(
            info, 1.0, 0, PAGE, "page_first", pin_memory=False, device="cpu",
            device_capacity_tokens=tokens, start_layer=0, end_layer=LAYERS,
        )  # fmt: skip
        self.count = pages
        self.src = self.pool.alloc(pages * PAGE)
        self.dst = self.pool.alloc(pages * PAGE)
        gen = torch.Generator().manual_seed(seed)
        shape = self.pool.kv_buffer[:, self.src].shape
        self.pool.kv_buffer[:, self.src] = torch.randn(shape, generator=gen).to(torch.bfloat16)
        self.nbytes = pages * self.pool.get_size_per_token() * PAGE
        _, sizes = self.pool.get_page_buffer_meta(self.src[:PAGE])
        self.ranges = [int(s) for s in sizes]

    def keys(self) -> list[str]:
        """New page keys for a round (64 hex digits, as SGLang's page hashes)."""
        return [uuid.uuid4().hex * 2 for _ in range(self.count)]

    def clear(self) -> None:
        """Zero the pages a round reads into (untimed)."""
        self.pool.kv_buffer[:, self.dst] = 0

    def check(self, who: str) -> None:
        """Raise unless every page read back equals the page written.

        Raises:
            RuntimeError: a page was lost or changed.
        """
        pool = self.pool
        if not torch.equal(pool.kv_buffer[:, self.dst], pool.kv_buffer[:, self.src]):
            raise RuntimeError(f"{who}: the pages read back differ from the pages written")


class Backend(Contender):
    """A backend SGLang calls with ``interface_v1``: one ``batch_set_v1``, one ``batch_get_v1``."""

    def __init__(self, label: str, backend: Any, closes: bool = True) -> None:
        self.label, self.backend, self._closes = label, backend, closes

    def round(self, pages: Pages, keys: list[str]) -> tuple[float, float]:
        """As :meth:`Contender.round`; every page checked (untimed).

        Raises:
            RuntimeError: a page was not stored, not found or changed.
        """
        pages.clear()
        t0 = time.perf_counter()
        stored = self.backend.batch_set_v1(keys, pages.src)
        t1 = time.perf_counter()
        found = self.backend.batch_get_v1(keys, pages.dst)
        t2 = time.perf_counter()
        if not all(stored) or not all(found):
            raise RuntimeError(f"{self.label}: stored {stored}, read back {found}")
        pages.check(self.label)
        return t1 - t0, t2 - t1

    def close(self) -> None:
        """Close the backend (SGLang's Mooncake backend has nothing to close)."""
        if self._closes:
            self._closes = False
            self.backend.close()


class Generic(Backend):
    """SGLang's controller path for a backend without ``interface_v1`` (``HiCacheFile``).

    Attributes:
        staging: per round, the seconds of the set's staging copies
            (``get_data_page``) and of the get's staging pages and copies
            back (``get_dummy_flat_data_page``, ``set_from_flat_data_page``).
    """

    def __init__(self, label: str, backend: Any, closes: bool = True) -> None:
        super().__init__(label, backend, closes)
        self.staging: list[tuple[float, float]] = []

    def round(self, pages: Pages, keys: list[str]) -> tuple[float, float]:
        """As :meth:`Backend.round`, through staging pages as SGLang's controller does."""
        pool, backend, now = pages.pool, self.backend, time.perf_counter
        pages.clear()
        t0 = now()
        data = [pool.get_data_page(pages.src[i * PAGE]) for i in range(len(keys))]
        staged = now()
        stored = backend.batch_set(keys, data)
        t1 = now()
        del data
        t2 = now()
        dummy = [pool.get_dummy_flat_data_page() for _ in keys]
        dummies = now()
        got = backend.batch_get(keys, dummy)
        read = now()
        found = 0
        for i, page in enumerate(got):
            if page is None:
                break
            pool.set_from_flat_data_page(pages.dst[i * PAGE], page)
            found += 1
        t3 = now()
        if not stored or found != len(keys):
            raise RuntimeError(f"{self.label}: stored {stored}, read back {found} of {len(keys)}")
        pages.check(self.label)
        self.staging.append((staged - t0, (dummies - t2) + (t3 - read)))
        return t1 - t0, t3 - t2


class BareFiles(Contender):
    """The file system's cost for a round's bytes: one ``os.write`` / ``os.preadv`` per range."""

    label = "bare os.write/os.preadv"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def _ranges(self, pages: Pages, where: torch.Tensor, keys: list[str]) -> list[Any]:
        ptrs, sizes = pages.pool.get_page_buffer_meta(where)
        flat = pages.pool.kv_buffer.view(-1).view(torch.uint8)
        base = flat.data_ptr()
        views = [flat[p - base : p - base + s].numpy() for p, s in zip(ptrs, sizes, strict=True)]
        per = len(views) // len(keys)
        return [(self.folder / f"{k}.{j}", views[i * per + j]) for i, k in enumerate(keys)
                for j in range(per)]  # fmt: skip

    def round(self, pages: Pages, keys: list[str]) -> tuple[float, float]:
        """As :meth:`Contender.round` (what kvpool's file store writes, minus its safety)."""
        writes = self._ranges(pages, pages.src, keys)
        reads = self._ranges(pages, pages.dst, keys)
        pages.clear()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        t0 = time.perf_counter()
        for path, view in writes:
            fd = os.open(path, flags, 0o644)
            try:
                os.write(fd, view)
            finally:
                os.close(fd)
        t1 = time.perf_counter()
        for path, view in reads:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.preadv(fd, [view], 0)
            finally:
                os.close(fd)
        t2 = time.perf_counter()
        pages.check(self.label)
        return t1 - t0, t2 - t1


class RedisBenchmark(Contender):
    """``redis-benchmark`` SET and GET of values the size of one entry, on kvpool's server.

    Each round measures what the server does for this C client at its
    best, with the same kind of keys as kvpool's: SET of new keys
    (``-r`` over a huge key space, so each value takes new server memory,
    as a put of new pages does); GET of as many existing keys as kvpool
    reads (``-r entries``, after an untimed SET of them), so the values
    come from memory, not from one cached key.  Each is run with
    ``-P 1`` and with ``-P 16`` (one connection, ``-c 1``), the store
    emptied before each, and the faster counts: with values of megabytes,
    pipelining makes the server copy them (measured here: SET 0.48 GB/s
    with ``-P 16``, 1.47 GB/s with ``-P 1``).  On a cluster it runs one
    client per master (``--cluster -c <masters>``: redis-benchmark gives
    each client one master's slots), as kvpool's store talks to every
    master at once; there its rates are read off two runs, of n and 4n
    requests ((4n - n) / (t4n - tn)), because ``--cluster`` counts a fixed
    start (about 0.2 s here) in its time (a noisy pair whose longer run
    was not the slower counts the 4n run's own rate).  The rates
    (requests a second) are turned into the seconds the round's entries
    would take.

    Args:
        binary: the ``redis-benchmark`` binary.
        ports: the server's port, or every master's.
        cluster: run with ``--cluster``.
        wipe: empties the server (or cluster).
    """

    #: The pipeline depths tried (``-P``).
    PIPELINES = (1, 16)

    def __init__(
        self, binary: str, ports: list[int], cluster: bool, wipe: Callable[[], None]
    ) -> None:
        self.binary, self.port, self.cluster, self.wipe = binary, ports[0], cluster, wipe
        self.clients = len(ports) if cluster else 1
        depths = "/".join(f"-P {p}" for p in self.PIPELINES)
        self.label = f"redis-benchmark -c {self.clients} (best of {depths})" + (
            " --cluster" if cluster else ""
        )

    def _rate(self, test: str, size: int, requests: int, keys: int, pipeline: int) -> float:
        cmd = [self.binary, "-p", str(self.port), "-t", test, "-d", str(size), "-n", str(requests),
               "-r", str(keys), "-c", str(self.clients), "-P", str(pipeline), "-q"]  # fmt: skip
        if self.cluster:
            cmd.insert(1, "--cluster")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        for line in reversed(done.stdout.replace("\r", "\n").splitlines()):
            name, _, rest = line.partition(":")
            if name.strip().lower() == test and "requests per second" in rest:
                return float(rest.split()[0])
        raise RuntimeError(f"{self.label} {test}: no rate in its output: {done.stdout[-300:]}")

    def _net_rate(self, test: str, size: int, requests: int, keys: int, pipeline: int) -> float:
        """Requests a second, less a fixed start for ``--cluster`` (see the class notes)."""
        if not self.cluster:
            return self._rate(test, size, requests, keys, pipeline)
        short = requests / self._rate(test, size, requests, keys, pipeline)
        rate = self._rate(test, size, 4 * requests, keys, pipeline)
        long = 4 * requests / rate
        return 3 * requests / (long - short) if long > short else rate

    def round(self, pages: Pages, keys: list[str]) -> tuple[float, float]:
        """The seconds SET and GET of the round's entries take at redis-benchmark's best rates."""
        return self.seconds(len(keys) * len(pages.ranges), max(pages.ranges))

    def seconds(self, entries: int, size: int) -> tuple[float, float]:
        """The seconds SET and GET of ``entries`` values of ``size`` bytes take at its best.

        The server is emptied before each measurement (``wipe``).

        Raises:
            RuntimeError: redis-benchmark printed no rate.
        """
        requests = max(64, 2 * entries)  # more requests than entries: its clock counts ms
        best = {"set": 0.0, "get": 0.0}
        for pipeline in self.PIPELINES:
            self.wipe()
            best["set"] = max(best["set"], self._net_rate("set", size, requests, 10**9, pipeline))
            self.wipe()
            self._rate("set", size, 8 * entries, entries, 1)  # the keys the GETs read (untimed)
            best["get"] = max(best["get"], self._net_rate("get", size, requests, entries, pipeline))
        return entries / best["set"], entries / best["get"]


def kvpool_backend(url: str) -> Any:
    """kvpool's backend, made as SGLang's factory makes it (``interface_v1``, ``url``)."""
    from kvpool.integrations.sglang import KVPoolHiCacheStorage

    return KVPoolHiCacheStorage(_config({
        "backend_name": "kvpool", "module_path": "kvpool.integrations.sglang",
        "class_name": "KVPoolHiCacheStorage", "interface_v1": 1, "url": url,
    }))  # fmt: skip


def file_pair(name: str, pages: Pages, directory: str | None) -> Pair:
    """kvpool ``file://`` against ``HiCacheFile``, in sibling folders of one file system."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    base = Path(tempfile.mkdtemp(prefix="kvpool-sglang-bench-", dir=directory))
    folders = {n: base / n for n in ("kvpool", "hicache", "bare")}
    kv = kvpool_backend(f"file://{folders['kvpool']}")
    kv.register_mem_pool_host(pages.pool)
    hf = HiCacheFile(_config({"file_storage_path": str(folders["hicache"])}))

    def empty() -> None:
        for folder in folders.values():
            for entry in os.scandir(folder):
                if not entry.name.startswith("."):  # the stores' own temporary files stay
                    os.unlink(entry.path)

    return Pair(
        name,
        Backend("kvpool", kv),
        Generic("HiCacheFile", hf, closes=False),
        f"{base} ({fs_type(base)})",
        bounds=[BareFiles(folders["bare"])],
        empty=empty,
        stop=[lambda: shutil.rmtree(base, ignore_errors=True)],
    )


def fs_type(path: Path) -> str:
    """The file system type ``path`` is on (from /proc/mounts), or "?"."""
    best, kind = "", "?"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        inside = len(parts) > 2 and (target + "/").startswith(parts[1].rstrip("/") + "/")
        if inside and len(parts[1]) >= len(best):
            best, kind = parts[1], parts[2]
    return kind


def mooncake_pair(pages: Pages) -> Pair:
    """kvpool ``mooncake://`` against SGLang's ``MooncakeStore``, one local master and node.

    Both register SGLang's host pool with their transfer engine and send
    the pages over TCP to the storage node; the store is emptied
    (``remove_all``, forced) after every round.
    """
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    from kvpool.cli.bench.localservers import start_mooncake
    from kvpool.cli.bench.mooncake_put_get import mooncake_folder

    segment_mb = max(256, 4 * pages.nbytes >> 20)  # two contenders' rounds, with room
    deployment = start_mooncake(mooncake_folder(), f"{segment_mb} MB")
    try:
        kv = kvpool_backend(deployment.url)
        kv.register_mem_pool_host(pages.pool)
        sg = MooncakeStore(_config({
            "master_server_address": deployment.master, "metadata_server": deployment.metadata,
            "protocol": "tcp", "global_segment_size": 0, "local_hostname": "127.0.0.1",
        }), pages.pool)  # fmt: skip
        sg.register_mem_pool_host(pages.pool)
    except BaseException:
        deployment.stop()
        raise

    def empty() -> None:
        left = sg.store.remove_all(True)
        if left < 0:
            raise RuntimeError(f"Mooncake's remove_all failed with {left}")

    return Pair(
        "mooncake",
        Backend("kvpool", kv),
        Backend("SGLang MooncakeStore", sg, closes=False),
        f"mooncake_master {deployment.master}, one {segment_mb} MB storage node, TCP",
        empty=empty,
        stop=[deployment.stop],
    )


def delete_keys(port: int) -> None:
    """Delete every key of the server (or cluster master) on ``port``, one DEL each.

    Not FLUSHALL: Redis hands a flushed keyspace's pages back to the
    kernel, so the next round would fault in fresh pages (see
    :mod:`kvpool.cli.bench.lmcache_stack`); deleted keys' memory is reused.
    """
    import redis

    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=30) as client:
        names = list(client.scan_iter(count=1000))
        with client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.delete(name)  # a cluster master refuses a DEL across slots
            pipe.execute()


def redis_pair(pages: Pages, cluster: bool) -> Pair:
    """kvpool ``redis://`` (or ``redis-cluster://``, 3 masters) against ``redis-benchmark``.

    Raises:
        FileNotFoundError: no redis-server, redis-cli or redis-benchmark here.
    """
    from kvpool.cli.bench.localservers import start_cluster, start_redis

    found = {b: shutil.which(b) for b in ("redis-server", "redis-cli", "redis-benchmark")}
    missing = [b for b, path in found.items() if path is None]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} not found")
    if cluster:
        servers = start_cluster(found["redis-server"], found["redis-cli"])  # type: ignore[arg-type]
        ports, url = servers.ports, servers.url
    else:
        server = start_redis(found["redis-server"])  # type: ignore[arg-type]
        servers, ports, url = server, [server.port], server.url  # type: ignore[assignment]
    try:
        kv = kvpool_backend(url)
        kv.register_mem_pool_host(pages.pool)
    except BaseException:
        servers.stop()
        raise

    def empty() -> None:
        for port in ports:
            delete_keys(port)

    name = "cluster" if cluster else "redis"
    where = "3 masters" if cluster else "one server"
    return Pair(
        name,
        Backend("kvpool", kv),
        RedisBenchmark(found["redis-benchmark"], ports, cluster, empty),  # type: ignore[arg-type]
        f"redis-server {where} on 127.0.0.1:{','.join(map(str, ports))}",
        empty=empty,
        stop=[servers.stop],
    )
