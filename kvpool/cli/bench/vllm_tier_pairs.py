"""The contenders of the ``vllm_tier`` benchmark: vLLM's primary rows, its tiers, bounds, servers.

One primary region made by vLLM's own ``SharedOffloadRegion`` (a ``/dev/shm``
file, pre-faulted, seen as the 2-D view ``(chunks, row bytes)`` that vLLM hands
its secondary tiers) holds :class:`Rows`: random chunks in the first half, the
second half the rows they are loaded back into.  A *round* of a contender
stores ``chunks`` chunks under new keys and loads them back, as vLLM's tiering
manager moves them:

* :class:`Tier` - a secondary tier made by vLLM's ``SecondaryTierFactory``
  from its JSON entry (kvpool's ``KVPoolTier``, vLLM's ``fs``): the round's
  chunks go in jobs of ``job_chunks`` (a request's chunks of a step, as the
  manager submits them), every job submitted at once, then
  ``get_finished_jobs`` polled until each has ended; the same for the loads
  (promotions into the second half's rows).  Every load's bytes are checked;
* :class:`BareFiles` - the file system's own cost, a bound: each chunk
  written to a temporary file and renamed, read back with one ``os.readv``
  (buffered, or with ``O_DIRECT`` as vLLM's tier uses it), no subfolders, no
  checks; by one thread, and on a disk also by as many threads as kvpool's tier
  runs there (the device's rate with that many requests in flight);
* :class:`RedisAnchor` - ``redis-benchmark`` SET / GET of values of one
  chunk, at its best, on the server kvpool's tier uses (vLLM has no Redis tier;
  :class:`~kvpool.cli.bench.sglang_pairs.RedisBenchmark` measures).

A :class:`Pair` is kvpool's contender, the one it is compared with, bounds,
and how its store is emptied after every round (untimed: the server's keys
deleted; the files removed on tmpfs and moved into a folder aside on a disk,
removed at the end - see :class:`_Emptier` for why; vLLM's subfolders kept, as
a running tier's would be).  Keys are new every round, so no store ever finds
a chunk it has.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from kvpool.cli.bench.pairs import Contender, Pair

__all__ = [
    "BareFiles",
    "Contender",
    "Pair",
    "RedisAnchor",
    "Rows",
    "Tier",
    "fs_io_c",
    "file_pair",
    "redis_pair",
]

#: Seconds between two polls of ``get_finished_jobs`` (a scheduler step is longer).
POLL_S = 0.0005
#: Most seconds a round's jobs may take before the round fails.
ROUND_DEADLINE_S = 300.0
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def fs_io_c() -> str | None:
    """Why vLLM's C file I/O (``vllm.fs_io_C``) does not load here, or None when it does.

    vLLM's ``fs`` tier moves a job's files in that extension (the GIL
    released) where it loads, and in Python otherwise; on a CPU-only
    machine it does not load (it links CUDA's libraries).
    """
    try:
        import vllm.fs_io_C  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


class _Spec:
    """What vLLM's tiers read of an offloading spec: vLLM's own base class, no manager."""

    @staticmethod
    def make(row_bytes: int) -> Any:
        from vllm.v1.kv_offload.base import OffloadingSpec
        from vllm.v1.kv_offload.config import (
            OffloadingCacheConfig,
            OffloadingConfig,
            OffloadingGroupConfig,
            OffloadingModelConfig,
            OffloadingParallelConfig,
        )

        class BenchSpec(OffloadingSpec):
            def get_manager(self) -> Any:
                raise NotImplementedError("the benchmark drives the tiers itself")

            def get_worker(self, kv_caches: Any) -> Any:
                raise NotImplementedError("the benchmark has no GPU worker")

        config = OffloadingConfig(
            groups=(OffloadingGroupConfig(16, ("layers",), 0),),
            worker_kv_bytes_per_block=row_bytes,
            enable_kv_cache_events=False,
            extra_config={},
            engine_id=f"kvpool-bench-{uuid.uuid4().hex[:12]}",
            model=OffloadingModelConfig("bench/model", "bfloat16"),
            cache=OffloadingCacheConfig(16, 1),
            parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True),
        )
        return BenchSpec(config)


class Rows:
    """vLLM's primary region and the rows every round uses.

    Args:
        chunks: chunks a round moves.
        row_bytes: bytes of one chunk (a multiple of the page size).
        seed: of the chunks' contents.

    Attributes:
        spec: the offloading spec the tiers are made with.
        view: the primary tier's view, ``(2 * chunks, row_bytes)``.
        count: chunks a round moves.
        row_bytes: bytes of a chunk.
        nbytes: bytes a round moves (each way).
        src: row ids of the chunks stored.
        dst: row ids the chunks are loaded into.
    """

    def __init__(self, chunks: int, row_bytes: int, seed: int = 1) -> None:
        from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

        self.spec = _Spec.make(row_bytes)
        self.region = SharedOffloadRegion(
            engine_id=self.spec.config.engine_id,
            num_chunks=2 * chunks,
            rank=None,
            kv_bytes_per_chunk=row_bytes,
            cpu_page_size=row_bytes,
        )
        self.view: memoryview | None = self.region.create_kv_memoryview()
        self._array = np.asarray(self.view).view(np.uint8)
        self.count, self.row_bytes, self.nbytes = chunks, row_bytes, chunks * row_bytes
        self.src = np.arange(chunks, dtype=np.int64)
        self.dst = np.arange(chunks, 2 * chunks, dtype=np.int64)
        rng = np.random.default_rng(seed)
        self._array[:chunks] = rng.integers(0, 256, (chunks, row_bytes), dtype=np.uint8)

    def keys(self) -> list[bytes]:
        """New chunk keys for a round (vLLM's ``OffloadKey``: a 32-byte hash, group 0)."""
        from vllm.v1.kv_offload.base import make_offload_key

        return [make_offload_key(os.urandom(32), 0) for _ in range(self.count)]

    def row(self, chunk: int) -> memoryview:
        """Row ``chunk`` as a flat byte view."""
        return memoryview(self._array[chunk])

    def clear(self) -> None:
        """Zero the rows a round loads into (untimed)."""
        self._array[self.count :] = 0

    def check(self, who: str) -> None:
        """Raise unless every loaded row equals the row stored.

        Raises:
            RuntimeError: a chunk was lost or changed.
        """
        if not np.array_equal(self._array[self.count :], self._array[: self.count]):
            raise RuntimeError(f"{who}: the chunks loaded differ from the chunks stored")

    def close(self) -> None:
        """Unmap the region and remove its file (idempotent; the tiers first)."""
        if self.view is not None:
            self._array = np.empty(0, np.uint8)
            self.view.release()
            self.view = None
            self.region.cleanup()


class Tier(Contender):
    """A vLLM secondary tier driven as vLLM's tiering manager drives it.

    Args:
        label: how the report names it.
        entry: its ``secondary_tiers`` entry (``type``, ``module_path``, options).
        rows: the primary rows it is made over.
        job_chunks: chunks per job.

    Attributes:
        tier: the tier vLLM's factory made.
    """

    def __init__(self, label: str, entry: dict[str, Any], rows: Rows, job_chunks: int) -> None:
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

        self.label, self.job_chunks = label, job_chunks
        self.tier: Any = SecondaryTierFactory.create_secondary_tier(entry, rows.view, rows.spec)
        self._next_id = 0
        self.cpu = []

    def _run(self, rows: Rows, keys: list[bytes], chunks: np.ndarray, load: bool) -> float:
        """Submit every job, poll until each has ended; the seconds from first submit to last end.

        Raises:
            RuntimeError: a job failed, or the round passed its deadline.
        """
        from vllm.v1.kv_offload.base import ReqContext
        from vllm.v1.kv_offload.tiering.base import TransferJob

        n, tier = self.job_chunks, self.tier
        jobs = []
        for i in range(0, len(keys), n):
            self._next_id += 1
            ctx = ReqContext(f"req-{self._next_id}")
            jobs.append(TransferJob(self._next_id, keys[i : i + n], chunks[i : i + n], load, ctx))
        submit = tier.submit_load if load else tier.submit_store
        pending = {job.job_id for job in jobs}
        failed: list[int] = []
        t0 = time.perf_counter()
        for job in jobs:
            submit(job)
        while pending:
            for result in tier.get_finished_jobs():
                pending.discard(result.job_id)
                if not result.success:
                    failed.append(result.job_id)
            if pending:
                if time.perf_counter() - t0 > ROUND_DEADLINE_S:
                    raise RuntimeError(f"{self.label}: {len(pending)} jobs still running")
                time.sleep(POLL_S)
        seconds = time.perf_counter() - t0
        if failed:
            what = "load" if load else "store"
            raise RuntimeError(
                f"{self.label}: {len(failed)} {what} jobs of {len(jobs)} failed{self._errors()}"
            )
        return seconds

    def _errors(self) -> str:
        """The errors of the tier's store calls so far, where it counts them (kvpool's)."""
        counters = getattr(self.tier, "counters", None)
        if counters is None:
            return ""
        errors = {op: c.errors for op, c in counters.snapshot().items() if c.errors}
        return f" (store call errors: {errors})" if errors else ""

    def round(self, rows: Rows, keys: list[bytes]) -> tuple[float, float]:
        """As :meth:`Contender.round`; every loaded chunk checked (untimed).

        Raises:
            RuntimeError: a job failed, or a chunk came back different.
        """
        rows.clear()
        c0 = time.process_time()
        stored = self._run(rows, keys, rows.src, load=False)
        c1 = time.process_time()
        loaded = self._run(rows, keys, rows.dst, load=True)
        c2 = time.process_time()
        rows.check(self.label)
        self.cpu.append((c1 - c0, c2 - c1))
        return stored, loaded

    def close(self) -> None:
        """Shut the tier down (once)."""
        if self.tier is not None:
            self.tier.shutdown()
            self.tier = None


class BareFiles(Contender):
    """The file system's cost for a round: write + rename, then ``os.readv``, per chunk.

    Args:
        folder: where the files go (created).
        direct: open the files with ``O_DIRECT`` (aligned rows), as vLLM's tier does
            where the file system takes it.
        threads: how many threads share the chunks (1: one after another); with
            more, the round shows what the device gives with that many requests in
            flight, a tier's ceiling.
    """

    def __init__(self, folder: Path, direct: bool, threads: int = 1) -> None:
        self.folder, self.direct, self.threads = folder, direct, threads
        self.label = "bare write+rename/readv" + (" O_DIRECT" if direct else "")
        if threads > 1:
            self.label += f", {threads} threads"
        self.cpu = []
        folder.mkdir(parents=True, exist_ok=True)

    def round(self, rows: Rows, keys: list[bytes]) -> tuple[float, float]:
        """As :meth:`Contender.round` (what a file tier must do, minus its bookkeeping)."""
        flag = _O_DIRECT if self.direct else 0
        names = [str(self.folder / k.hex()) for k in keys]
        temps = [name + ".tmp" for name in names]
        writes = [rows.row(int(c)) for c in rows.src]
        reads = [rows.row(int(c)) for c in rows.dst]
        rows.clear()
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | flag

        def store(name: str, temp: str, view: memoryview) -> None:
            fd = os.open(temp, create, 0o644)
            try:
                os.write(fd, view)
            finally:
                os.close(fd)
            os.rename(temp, name)

        def load(name: str, view: memoryview) -> None:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | flag)
            try:
                os.readv(fd, [view])
            finally:
                os.close(fd)

        # The pool is made before the clock starts: only the I/O is timed.
        with ThreadPoolExecutor(self.threads) as pool:
            each = pool.map if self.threads > 1 else map
            c0 = time.process_time()
            t0 = time.perf_counter()
            list(each(store, names, temps, writes))
            t1 = time.perf_counter()
            c1 = time.process_time()
            list(each(load, names, reads))
            t2 = time.perf_counter()
        self.cpu.append((c1 - c0, time.process_time() - c1))
        rows.check(self.label)
        return t1 - t0, t2 - t1


class RedisAnchor(Contender):
    """``redis-benchmark`` at its best for values of one chunk, on kvpool's server.

    Args:
        bench: the SGLang benchmark's measurer (binary, ports, wipe).
    """

    def __init__(self, bench: Any) -> None:
        self.bench = bench
        self.label = bench.label
        self.cpu = []  # its work is redis-benchmark's and the server's

    def round(self, rows: Rows, keys: list[bytes]) -> tuple[float, float]:
        """The seconds SET and GET of the round's chunks take at redis-benchmark's best."""
        return self.bench.seconds(len(keys), rows.row_bytes)  # type: ignore[no-any-return]


def kvpool_entry(url: str, **options: Any) -> dict[str, Any]:
    """kvpool's ``secondary_tiers`` entry for ``url``, with store or tier options."""
    return {"type": "KVPoolTier", "module_path": "kvpool.integrations.vllm", "url": url,
            **options}  # fmt: skip


class _Emptier:
    """Takes a round's files out of the stores' folders: removed, or moved aside until the end.

    On tmpfs the files are removed (their memory comes back).  On a disk they
    are moved into ``aside`` and removed only by the pair's stop: ext4 without
    a journal does not reuse an inode freed less than 30 seconds ago, and every
    new file of the folder's block group then checks each such inode
    (``recently_deleted``, seen costing a millisecond a file here), so removing
    a round's files would slow the next rounds' creates in the folder they were
    removed from - a cost of the benchmark's emptying, not of the store.

    Args:
        aside: a folder on the same file system (made when first needed).
        remove: remove the files (tmpfs) instead of moving them.
    """

    def __init__(self, aside: Path, remove: bool) -> None:
        self.aside, self.remove = aside, remove
        self._moved = 0

    def empty(self, folder: Path, keep: Callable[[str], bool]) -> None:
        """Take every file under ``folder`` out but those ``keep`` names; folders stay."""
        for root, _, files in os.walk(folder):
            for name in files:
                if keep(name):
                    continue
                path = os.path.join(root, name)
                if self.remove:
                    os.unlink(path)
                    continue
                if not self._moved:
                    self.aside.mkdir(exist_ok=True)
                self._moved += 1
                os.rename(path, self.aside / str(self._moved))


def file_pair(
    name: str,
    rows: Rows,
    directory: str | None,
    job_chunks: int,
    direct: bool,
    options: dict[str, Any] | None = None,
) -> Pair:
    """kvpool's tier on a directory against vLLM's ``fs`` tier, in sibling folders.

    Args:
        name: the report's row.
        rows: the primary rows.
        directory: the file system's folder the pair's folders go in (None: the
            system's temporary folder).
        job_chunks: chunks per job.
        direct: kvpool's store with ``direct_io`` where vLLM's probe finds that the
            file system takes ``O_DIRECT`` (vLLM's tier then uses it too); else
            both buffered.
        options: more keys of kvpool's entry (the tier's or the store's options).
    """
    from vllm.v1.kv_offload.tiering.fs.io import probe_o_direct

    from kvpool.cli.bench.sglang_pairs import fs_type
    from kvpool.integrations.vllm.config import DISK_THREADS

    base = Path(tempfile.mkdtemp(prefix="kvpool-vllm-bench-", dir=directory))
    folders = {n: base / n for n in ("kvpool", "vllm", "bare", "bare-direct", "bare-deep")}
    fs_direct = probe_o_direct(str(base))  # the probe vLLM's tier runs at its start
    direct = direct and fs_direct  # the same I/O mode as vLLM's: buffered where it must be
    made: list[Contender] = []
    try:
        keys = {**({"direct_io": True} if direct else {}), **(options or {})}
        made.append(Tier("kvpool", kvpool_entry(str(folders["kvpool"]), **keys), rows, job_chunks))
        entry = {"type": "fs", "root_dir": str(folders["vllm"])}
        made.append(Tier("vLLM fs", entry, rows, job_chunks))
    except BaseException:
        for c in made:
            c.close()
        shutil.rmtree(base, ignore_errors=True)
        raise
    kv, fs = made
    kind = fs_type(base)
    bounds: list[Contender] = [BareFiles(folders["bare"], direct=False)]
    if fs_direct:
        bounds.insert(0 if direct else 1, BareFiles(folders["bare-direct"], direct=True))
    if kind != "tmpfs":
        # The device's rate with as many reads and writes in flight as kvpool's tier
        # keeps on a disk: what neither tier can pass.
        bounds.append(BareFiles(folders["bare-deep"], direct=direct, threads=DISK_THREADS))

    emptier = _Emptier(base / "aside", remove=kind == "tmpfs")

    def empty() -> None:
        # The stores' own temporary files stay (kvpool's spares, vLLM's config.json).
        emptier.empty(folders["kvpool"], lambda n: n.startswith("."))
        emptier.empty(folders["vllm"], lambda n: not n.endswith(".bin"))
        for bare in ("bare", "bare-direct", "bare-deep"):
            emptier.empty(folders[bare], lambda n: False)

    modes = f"kvpool {'O_DIRECT' if direct else 'buffered'}, vLLM fs " + (
        "O_DIRECT" if fs_direct else "buffered"
    )
    return Pair(
        name,
        kv,
        fs,
        f"{base} ({kind}; {modes})",
        bounds=bounds,
        empty=empty,
        stop=[lambda: shutil.rmtree(base, ignore_errors=True)],
    )


def redis_pair(
    name: str, rows: Rows, job_chunks: int, options: dict[str, Any] | None = None
) -> Pair:
    """kvpool's tier on ``redis://``, one local server, against ``redis-benchmark`` on it.

    ``options``: more keys of kvpool's entry (the tier's or the store's options).

    Raises:
        FileNotFoundError: no redis-server or redis-benchmark here.
    """
    from kvpool.cli.bench.localservers import start_redis
    from kvpool.cli.bench.sglang_pairs import RedisBenchmark, delete_keys

    found = {b: shutil.which(b) for b in ("redis-server", "redis-benchmark")}
    missing = [b for b, path in found.items() if path is None]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} not found")
    server = start_redis(str(found["redis-server"]))
    try:
        kv = Tier("kvpool", kvpool_entry(server.url, **(options or {})), rows, job_chunks)
    except BaseException:
        server.stop()
        raise

    def empty() -> None:
        delete_keys(server.port)

    bench = RedisBenchmark(str(found["redis-benchmark"]), [server.port], False, empty)
    return Pair(
        name,
        kv,
        RedisAnchor(bench),
        f"redis-server on 127.0.0.1:{server.port}",
        empty=empty,
        stop=[server.stop],
    )
