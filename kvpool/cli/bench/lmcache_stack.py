"""The servers of the ``lmcache_remote`` benchmark: started per store kind, emptied between rounds.

:class:`Stack` starts, on loopback, what the chosen stores need
(:mod:`kvpool.cli.bench.localservers`): one ``redis-server`` (``redis``:
LMCache's ``redis://`` and ``resp://`` and kvpool's ``redis://`` all talk
to it), a three-master Redis Cluster (``cluster``), a folder on /dev/shm
(``file``), a Mooncake master with one storage node (``mooncake``, TCP).
A kind whose server cannot start here is left out with the reason
(:attr:`Stack.missing`); the rest still run.

:meth:`Stack.wipe` empties a kind's server after every round, untimed, so
that every round writes into the same empty store: a DEL of every key
(the plain server, every cluster master; not FLUSHALL, see
:func:`_delete_every_key`), every file under the folder (folders stay),
Mooncake's ``remove_all(force=True)`` through a client of its own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvpool.cli.bench import needs
from kvpool.cli.bench.lmcache_configs import STORES, Endpoints

__all__ = ["MOONCAKE_ENV", "STORE_NEEDS", "Stack"]

#: What each store kind needs here: a probe giving why not, with the fix (None: it can start).
STORE_NEEDS: dict[str, Callable[[], str | None]] = {
    "redis": lambda: needs.redis_client() or needs.redis_server(),
    "cluster": lambda: needs.redis_client() or needs.redis_cluster_tools(),
    "file": lambda: None,
    "mooncake": needs.mooncake,
}

#: Environment of every Mooncake client of the run (the parent's and the children's).
MOONCAKE_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_LOG_LEVEL": "ERROR"}


@contextlib.contextmanager
def _stderr_into(path: Path) -> Iterator[None]:
    """File descriptor 2 goes to ``path`` for the block (native code's logs included)."""
    saved = os.dup(2)
    try:
        with open(path, "ab") as f:
            os.dup2(f.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _delete_every_key(port: int) -> None:
    """DEL every key of the server on ``port`` (its own keys only, for a cluster node).

    Not FLUSHALL: Redis 7 follows a synchronous FLUSHALL with a jemalloc
    purge, which hands the freed pages back to the kernel, so the next
    round's values all fault in fresh pages (measured: 70 ms of server CPU
    for a 64 MiB put, against 30 ms after a DEL of the keys); a server that
    deletes or evicts keys reuses their memory.
    """
    import redis

    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=30) as r:
        keys = list(r.scan_iter(count=1000))
        with r.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.delete(key)  # one key each: a cluster node refuses cross-slot DELs
            pipe.execute()


class Stack:
    """The servers of one run; close it (or use ``with``) to stop them all."""

    def __init__(self, stores: list[str], round_bytes: int, file_dir: str | None = None) -> None:
        """Start the servers of ``stores`` (names of :data:`STORES`).

        Args:
            stores: the kinds to start.
            round_bytes: bytes one contender's round stores (sizes the
                Mooncake segment: rounds are wiped, so four rounds' worth
                is plenty).
            file_dir: the folder under which the ``file`` kind's folders
                are made (None: /dev/shm, else the temporary folder).
        """
        unknown = [s for s in stores if s not in STORES]
        if unknown:
            raise ValueError(f"unknown store kind(s) {unknown}; choose from {', '.join(STORES)}")
        self.missing: dict[str, str] = {}
        self.where: dict[str, str] = {}
        self._redis: Any = None
        self._cluster: Any = None
        self._folder: str | None = None
        self._file_dir = file_dir
        self._mooncake: Any = None
        self._wiper: Any = None
        at: dict[str, str | None] = {}
        try:
            for kind in stores:
                why = STORE_NEEDS[kind]()
                if why is not None:  # found by looking: nothing to start
                    self.missing[kind] = why
                    continue
                try:
                    getattr(self, f"_start_{kind}")(at, round_bytes)
                except (RuntimeError, OSError, ImportError) as exc:
                    self.missing[kind] = f"{type(exc).__name__}: {exc}"
        except BaseException:
            self.close()
            raise
        self.endpoints = Endpoints(**at)

    @property
    def stores(self) -> list[str]:
        """The kinds that started."""
        return [k for k in STORES if k in self.where]

    def _start_redis(self, at: dict[str, str | None], round_bytes: int) -> None:
        from kvpool.cli.bench.localservers import start_redis

        server = shutil.which("redis-server") or shutil.which("valkey-server")
        if server is None:
            raise RuntimeError("no redis-server or valkey-server on PATH")
        self._redis = start_redis(server)
        at["redis"] = f"127.0.0.1:{self._redis.port}"
        self.where["redis"] = f"redis-server on {at['redis']}"

    def _start_cluster(self, at: dict[str, str | None], round_bytes: int) -> None:
        from kvpool.cli.bench.localservers import start_cluster

        server = shutil.which("redis-server") or shutil.which("valkey-server")
        cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
        if server is None or cli is None:
            raise RuntimeError("no redis-server/redis-cli on PATH")
        self._cluster = start_cluster(server, cli)
        at["cluster"] = ",".join(f"127.0.0.1:{p}" for p in self._cluster.ports)
        self.where["cluster"] = f"3 cluster masters on {at['cluster']}"

    def _start_file(self, at: dict[str, str | None], round_bytes: int) -> None:
        base = self._file_dir or (
            "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        )
        self._folder = tempfile.mkdtemp(prefix="kvpool-bench-lmcache-", dir=base)
        for sub in ("kvpool-file", "lmcache-fs"):
            os.mkdir(os.path.join(self._folder, sub))
        at["directory"] = self._folder
        self.where["file"] = f"folders under {self._folder}"

    def _start_mooncake(self, at: dict[str, str | None], round_bytes: int) -> None:
        from kvpool.cli.bench.localservers import start_mooncake
        from kvpool.remote import MooncakeStore

        spec = importlib.util.find_spec("mooncake")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("Mooncake is not installed (pip install 'kvpool[mooncake]')")
        folder = Path(next(iter(spec.submodule_search_locations)))
        if not (folder / "mooncake_master").exists():
            raise RuntimeError(f"no mooncake_master in {folder}")
        for name, value in MOONCAKE_ENV.items():
            os.environ.setdefault(name, value)
        segment_mb = max(256, 4 * round_bytes >> 20)
        # The master's default lease (10 s): the wipe removes with force, and a
        # shorter one can run out inside a slow get (Mooncake's LEASE_EXPIRED, -707).
        self._mooncake = start_mooncake(folder, f"{segment_mb} MB")
        at["mooncake_master"] = self._mooncake.master
        at["mooncake_metadata"] = self._mooncake.metadata
        # Mooncake's client logs its set-up on stderr (glog): into the servers' logs.
        with _stderr_into(self._mooncake.logs / "wiper.log"):
            self._wiper = MooncakeStore(self._mooncake.master, metadata=self._mooncake.metadata)
        self.where["mooncake"] = (
            f"mooncake_master on {self._mooncake.master}, one {segment_mb} MB storage node, TCP"
        )

    def wipe(self, kind: str) -> None:
        """Empty the server of ``kind`` (see the module notes).

        Raises:
            RuntimeError: the server refused (the round's figures would then
                be measured on a store that is not empty).
        """
        if kind == "redis":
            _delete_every_key(self._redis.port)
        elif kind == "cluster":
            for port in self._cluster.ports:
                _delete_every_key(port)
        elif kind == "file":
            for root, _dirs, files in os.walk(self._folder or ""):
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(root, name))
        elif kind == "mooncake":
            left = self._wiper.client.remove_all(True)
            if left < 0:
                raise RuntimeError(f"Mooncake's remove_all failed with {left}")

    def close(self) -> None:
        """Stop every server and remove the folder (idempotent)."""
        if self._wiper is not None:
            with contextlib.suppress(Exception):
                self._wiper.close()
            self._wiper = None
        for server in (self._mooncake, self._cluster, self._redis):
            if server is not None:
                server.stop()
        self._mooncake = self._cluster = self._redis = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
