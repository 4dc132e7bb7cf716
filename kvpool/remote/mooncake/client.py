"""Making a Mooncake Store client: its URL, loading it, reaching the master, ``setup``.

:func:`connect` returns a set-up ``MooncakeDistributedStore``.  It checks
first that the master accepts TCP connections (bounded by a timeout),
because the client's own ``setup`` retries an unreachable master for a
long time before it gives up.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kvpool.errors import FeatureUnavailableError, InvalidArgumentError, StoreConnectionError

__all__ = ["connect", "import_mooncake", "parse_url", "split_host_port"]


def import_mooncake() -> tuple[Any, Any]:
    try:
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    except ImportError as exc:
        raise FeatureUnavailableError(
            "MooncakeStore needs Mooncake's client, which is not installed or cannot load "
            f"({exc}): pip install 'kvpool[mooncake]', and on Debian/Ubuntu "
            "apt-get install libibverbs1 (needed even for TCP)"
        ) from exc
    return MooncakeDistributedStore, ReplicateConfig


def split_host_port(text: str, what: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) -> ``(host, port)``.

    Raises:
        InvalidArgumentError: malformed, or no port and no default.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError(f"{what} must be 'host:port', got {text!r}")
    try:
        parts = urlsplit("//" + text.strip())
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise InvalidArgumentError(f"{what} {text!r} is not 'host:port': {exc}") from None
    if not host or parts.path or parts.query:
        raise InvalidArgumentError(f"{what} {text!r} is not 'host:port'")
    if port is None:
        if default_port is None:
            raise InvalidArgumentError(f"{what} {text!r} has no port; write it as host:port")
        port = default_port
    return host, port


def _local_address_towards(host: str, port: int) -> str:
    """The local IP address this machine uses to reach ``host`` (no packet is sent)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def _check_reachable(host: str, port: int, what: str, timeout: float) -> None:
    """Connect once to ``host:port``, so a dead master fails fast instead of in setup's retries.

    Raises:
        StoreConnectionError: nothing accepts connections there.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise StoreConnectionError(
            f"the Mooncake {what} at {host}:{port} cannot be reached ({exc}); is it running?"
        ) from None


def connect(
    host: str,
    port: int,
    *,
    metadata: str | None,
    protocol: str,
    device: str,
    local_hostname: str | None,
    segment_size: int,
    local_buffer_size: int,
    timeout: float,
) -> Any:
    """A ``MooncakeDistributedStore`` set up against the master at ``host:port``.

    Args:
        host: the master's host.
        port: the master's RPC port.
        metadata: the metadata service (default ``http://<host>:8080/metadata``,
            the master's built-in one on its default port).
        protocol: ``"tcp"`` or ``"rdma"``.
        device: RDMA device name(s) (``""`` for TCP).
        local_hostname: this process's address (default: the local address
            that routes to the master).
        segment_size: bytes this process contributes to the store.
        local_buffer_size: bytes of the client's local buffer.
        timeout: seconds to wait for the master to accept a connection.

    Raises:
        FeatureUnavailableError: Mooncake's client is not installed.
        InvalidArgumentError: a bad metadata string.
        StoreConnectionError: the master cannot be reached or setup failed.
    """
    store_cls, _ = import_mooncake()
    if metadata is None:
        metadata = f"http://{host}:8080/metadata"
    if not isinstance(metadata, str) or not metadata:
        raise InvalidArgumentError(f"metadata must be a non-empty str, got {metadata!r}")
    if local_hostname is None:
        local_hostname = _local_address_towards(host, port)
    _check_reachable(host, port, "master", timeout)
    client = store_cls()
    rc = client.setup(
        {
            "local_hostname": local_hostname,
            "metadata_server": metadata,
            "global_segment_size": segment_size,
            "local_buffer_size": local_buffer_size,
            "protocol": protocol,
            "rdma_devices": device,
            "master_server_addr": f"{host}:{port}",
        }
    )
    if rc != 0:
        raise StoreConnectionError(
            f"setting up the Mooncake client for {host}:{port} (metadata {metadata}, {protocol}) "
            f"failed with {rc}; the client's log on stderr says why"
        )
    return client


#: URL query parameters of ``mooncake://`` and how each is read.
_URL_OPTIONS: dict[str, type] = {
    "metadata": str,
    "protocol": str,
    "device": str,
    "local_hostname": str,
    "replicas": int,
    "segment_size": int,
    "local_buffer_size": int,
    "prefix": str,
    "timeout": float,
    "checksum": bool,
    "headerless": bool,
    "replace": bool,
}


def parse_url(url: str) -> tuple[str, dict[str, Any]]:
    """``mooncake://MASTER:PORT?metadata=...&protocol=tcp`` -> ``(master, options)``.

    The query may set ``metadata``, ``protocol``, ``device``,
    ``local_hostname``, ``replicas``, ``segment_size`` and
    ``local_buffer_size`` (bytes), ``prefix``, ``timeout`` (seconds),
    ``checksum``, ``headerless`` and ``replace`` (``0``/``1``), each at
    most once.

    Raises:
        InvalidArgumentError: another scheme, no master, an unknown or
            repeated parameter, or a value of the wrong kind.
    """
    if not isinstance(url, str):
        raise InvalidArgumentError(f"a Mooncake URL must be a str, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed "[" of an IPv6 address
        raise InvalidArgumentError(f"{url!r} is not a valid Mooncake URL: {exc}") from None
    if parts.scheme.lower() != "mooncake" or not parts.netloc:
        raise InvalidArgumentError(
            f"{url!r} is not a Mooncake URL: write mooncake://MASTER:PORT?metadata=URL&protocol=tcp"
        )
    if parts.path not in ("", "/"):
        raise InvalidArgumentError(f"Mooncake URL {url!r} has a path; options go in the query")
    split_host_port(parts.netloc, "master")
    options: dict[str, Any] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        kind = _URL_OPTIONS.get(name)
        if kind is None:
            raise InvalidArgumentError(
                f"Mooncake URL {url!r}: unknown parameter {name!r}; known: "
                + ", ".join(_URL_OPTIONS)
            )
        if name in options:
            raise InvalidArgumentError(f"Mooncake URL {url!r}: {name} is given twice")
        try:
            if kind is bool:
                if value not in ("0", "1", "true", "false"):
                    raise ValueError(value)
                options[name] = value in ("1", "true")
            else:
                options[name] = kind(value)
        except ValueError:
            raise InvalidArgumentError(
                f"Mooncake URL {url!r}: {name}={value!r} is not a {kind.__name__}"
            ) from None
    return parts.netloc, options
