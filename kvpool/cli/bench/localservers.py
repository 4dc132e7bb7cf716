"""Throwaway local servers on loopback: a Mooncake master and node, a Redis Cluster, a Redis.

For the store benchmarks (``kvpool bench --only cluster_put_get``,
``mooncake_put_get``), which start what they measure against, and for the
tests' fixtures.  Every process listens on 127.0.0.1 only, on free ports,
keeps nothing on disk beyond a temporary directory, and is stopped by the
object that started it.  Readiness is polled with deadlines; nothing here
waits without one.

* :func:`start_mooncake` - ``mooncake_master`` with its HTTP metadata
  server plus one ``mooncake_client`` storage node
  (:class:`MooncakeDeployment`).
* :func:`start_cluster` - three ``redis-server --cluster-enabled yes``
  masters joined by ``redis-cli --cluster create`` (:class:`RedisCluster`:
  kill a node, start it again, stop all).
* :func:`start_redis` - one plain ``redis-server`` (:class:`RedisServer`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "MooncakeDeployment",
    "RedisCluster",
    "RedisServer",
    "cluster_info",
    "start_cluster",
    "start_mooncake",
    "start_redis",
]


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class MooncakeDeployment:
    """A master and a storage node started for the tests."""

    master_port: int
    metadata_port: int
    procs: dict[str, subprocess.Popen[bytes]]
    logs: Path
    _tmp: tempfile.TemporaryDirectory[str] = field(repr=False)

    @property
    def master(self) -> str:
        """``host:port`` of the master's RPC service."""
        return f"127.0.0.1:{self.master_port}"

    @property
    def metadata(self) -> str:
        """The HTTP metadata URL."""
        return f"http://127.0.0.1:{self.metadata_port}/metadata"

    @property
    def url(self) -> str:
        """The ``mooncake://`` URL for ``open_store``."""
        return f"mooncake://{self.master}?metadata={self.metadata}&protocol=tcp"

    def log_tail(self, name: str, nbytes: int = 2000) -> str:
        """The end of a process's log."""
        path = self.logs / f"{name}.log"
        return path.read_bytes()[-nbytes:].decode(errors="replace") if path.exists() else ""

    def kill(self, name: str) -> None:
        """SIGKILL one process (``"master"`` or ``"node"``) and wait for it."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop(self) -> None:
        """Stop both processes (idempotent) and remove their files."""
        for name in ("node", "master"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self._tmp.cleanup()


def _wait(proc: subprocess.Popen[bytes], port: int, deadline: float) -> bool:
    while time.monotonic() < deadline and proc.poll() is None:
        if _accepts(port):
            return True
        time.sleep(0.05)
    return False


def start_mooncake(
    folder: Path, segment: str = "256 MB", lease_ms: int | None = None
) -> MooncakeDeployment:
    """Start a Mooncake master and one storage node on free loopback ports.

    The master runs its built-in HTTP metadata server (no etcd); the node
    contributes ``segment`` of memory.  Both listen on 127.0.0.1 and get
    ``MC_TCP_BIND_ADDRESS=127.0.0.1``.

    Args:
        folder: the installed ``mooncake`` package folder (its binaries).
        segment: the node's ``--global_segment_size``.
        lease_ms: the master's ``--default_kv_lease_ttl`` (None: its default, 10 s).

    Raises:
        RuntimeError: they did not come up within 30 s (with their logs).
    """
    lease = [] if lease_ms is None else [f"--default_kv_lease_ttl={lease_ms}"]
    last = ""
    for _ in range(3):
        tmp = tempfile.TemporaryDirectory(prefix="kvpool-mooncake-")
        logs = Path(tmp.name)
        rpc, http, metrics, node = _free_ports(4)
        env = {**os.environ, "MC_TCP_BIND_ADDRESS": "127.0.0.1"}
        with open(logs / "master.log", "wb") as out:
            master = subprocess.Popen(
                [str(folder / "mooncake_master"), "--rpc_address=127.0.0.1", f"--rpc_port={rpc}",
                 "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                 f"--http_metadata_server_port={http}", "--metrics_host=127.0.0.1",
                 f"--metrics_port={metrics}", "--rpc_thread_num=2", *lease],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=logs,
            )  # fmt: skip
        procs = {"master": master}
        deadline = time.monotonic() + 30
        if _wait(master, rpc, deadline) and _wait(master, http, deadline):
            with open(logs / "node.log", "wb") as out:
                procs["node"] = subprocess.Popen(
                    [str(folder / "mooncake_client"), "--host=127.0.0.1", f"--port={node}",
                     f"--global_segment_size={segment}", f"--master_server_address=127.0.0.1:{rpc}",
                     f"--metadata_server=http://127.0.0.1:{http}/metadata", "--protocol=tcp",
                     "--threads=1"],
                    stdout=out, stderr=subprocess.STDOUT, env=env, cwd=logs,
                )  # fmt: skip
            # The node serves its port once its segment is mounted.
            if _wait(procs["node"], node, deadline):
                return MooncakeDeployment(rpc, http, procs, logs, tmp)
        deployment = MooncakeDeployment(rpc, http, procs, logs, tmp)
        last = deployment.log_tail("master") + "\n" + deployment.log_tail("node")
        deployment.stop()
    raise RuntimeError(f"could not start Mooncake's master and storage node:\n{last}")


def _free_cluster_ports(n: int) -> list[int]:
    """``n`` free ports whose cluster bus ports (+10000) are free too."""
    found: list[int] = []
    while len(found) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in found:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        found.append(port)
    return found


def _command(port: int, *args: str, timeout: float = 1.0) -> bytes:
    """Send one inline command to a node and return its raw reply (b"" if unreachable)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall((" ".join(args) + "\r\n").encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return data
                data += chunk
                if data.startswith((b"+", b"-", b":")) and data.endswith(b"\r\n"):
                    return data
                if data.startswith(b"$"):
                    head, _, rest = data.partition(b"\r\n")
                    if int(head[1:]) < 0 or len(rest) >= int(head[1:]) + 2:
                        return data
    except (OSError, ValueError):
        return b""


def cluster_info(port: int) -> dict[str, str]:
    """``CLUSTER INFO`` of one node as a dict (empty if it does not answer)."""
    out = {}
    for line in _command(port, "CLUSTER", "INFO").decode(errors="replace").splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


@dataclass
class RedisCluster:
    """Three cluster masters started for the tests."""

    server: str
    ports: list[int]
    procs: dict[int, subprocess.Popen[bytes]]
    _tmp: tempfile.TemporaryDirectory[str] = field(repr=False)

    @property
    def dir(self) -> Path:
        return Path(self._tmp.name)

    @property
    def url(self) -> str:
        """``redis-cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``."""
        return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start_node(self, port: int) -> None:
        """Start (or start again) the node of ``port`` with its own nodes-P.conf."""
        log = open(self.dir / f"redis-{port}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[port] = subprocess.Popen(
            [self.server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", f"nodes-{port}.conf", "--cluster-node-timeout", "5000",
             "--cluster-require-full-coverage", "no", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--loglevel", "warning"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
        )  # fmt: skip
        log.close()

    def wait_ok(self, ports: list[int] | None = None, seconds: float = 30.0) -> None:
        """Poll until every node of ``ports`` says ``cluster_state:ok`` with all slots assigned.

        Raises:
            RuntimeError: not within ``seconds`` (with each node's CLUSTER INFO).
        """
        ports = self.ports if ports is None else ports
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            infos = [cluster_info(p) for p in ports]
            if all(
                i.get("cluster_state") == "ok"
                and i.get("cluster_slots_assigned") == "16384"
                and i.get("cluster_slots_fail", "0") == "0"
                and i.get("cluster_slots_pfail", "0") == "0"
                for i in infos
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not become ok within {seconds} s: {infos}")

    def kill(self, port: int) -> None:
        """SIGKILL one node and wait for it."""
        proc = self.procs[port]
        proc.kill()
        proc.wait(10)

    def restart(self, port: int) -> None:
        """Start a killed node again and wait until the cluster is ok everywhere."""
        self.start_node(port)
        deadline = time.monotonic() + 10
        while not _command(port, "PING").startswith(b"+PONG"):
            if time.monotonic() > deadline or self.procs[port].poll() is not None:
                raise RuntimeError(f"node {port} did not come back")
            time.sleep(0.05)
        self.wait_ok()

    def stop(self) -> None:
        """Stop every node (idempotent) and remove their files."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self._tmp.cleanup()


def start_cluster(server: str, cli: str) -> RedisCluster:
    """Start three cluster masters on free loopback ports and join them.

    ``redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes``,
    then ``CLUSTER INFO`` is polled on every node until all report
    ``cluster_state:ok`` with the 16384 slots assigned.  The nodes run
    without persistence and with ``cluster-require-full-coverage no``, so
    the other masters keep serving when one dies.

    Args:
        server: the ``redis-server`` (or ``valkey-server``) binary.
        cli: the ``redis-cli`` (or ``valkey-cli``) binary.

    Raises:
        RuntimeError: they did not form a cluster (with the logs).
    """
    last = ""
    for _ in range(3):
        tmp = tempfile.TemporaryDirectory(prefix="kvpool-cluster-")
        cluster = RedisCluster(server, _free_cluster_ports(3), {}, tmp)
        try:
            for port in cluster.ports:
                cluster.start_node(port)
            deadline = time.monotonic() + 10
            while not all(_command(p, "PING").startswith(b"+PONG") for p in cluster.ports):
                if time.monotonic() > deadline:
                    raise RuntimeError("the nodes did not answer PING")
                time.sleep(0.05)
            created = subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in cluster.ports),
                 "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, timeout=60, check=False,
            )  # fmt: skip
            if created.returncode != 0:
                raise RuntimeError(created.stdout.decode(errors="replace")[-2000:])
            cluster.wait_ok()
            return cluster
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            logs = "".join(
                p.read_text(errors="replace")[-500:] for p in cluster.dir.glob("redis-*.log")
            )
            last = f"{exc}\n{logs}"
            cluster.stop()
    raise RuntimeError(f"could not start a Redis Cluster: {last}")


@dataclass
class RedisServer:
    """One plain (not clustered) server started for a benchmark."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Stop it (idempotent)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_redis(server: str) -> RedisServer:
    """Start a plain server (no persistence) on a free loopback port and wait for PING.

    Raises:
        RuntimeError: it did not answer within 10 s.
    """
    for _ in range(3):
        (port,) = _free_cluster_ports(1)
        proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if _command(port, "PING").startswith(b"+PONG"):
                return RedisServer(proc, port)
            time.sleep(0.05)
        proc.kill()
        proc.wait(10)
    raise RuntimeError(f"could not start {server}")
