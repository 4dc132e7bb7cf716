"""The Redis stores over TLS (``rediss://``) against a real redis-server, throwaway certificate.

TLS sockets take the non-blocking, polled path of the connection layer
(no ``sendmsg``, no ``MSG_WAITALL``); these tests run it for real.  They
skip, with the reason, without ``openssl`` or a server built with TLS.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import kvpool
from kvpool.remote import AsyncRedisStore, RedisStore

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, _free_port, assert_clean, fill, need_redis

pytestmark = pytest.mark.redis


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A redis-server answering TLS only, on a free port; yields (port, CA file)."""
    binary = need_redis()
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (needed to make a test certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key),
         "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    context = ssl.create_default_context(cafile=str(cert))
    deadline = time.monotonic() + 10
    ready = False
    while time.monotonic() < deadline and proc.poll() is None and not ready:
        try:
            import socket

            with (
                socket.create_connection(("127.0.0.1", port), timeout=1) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1") as s,
            ):
                s.sendall(b"PING\r\n")
                ready = s.recv(16).startswith(b"+PONG")
        except OSError:
            time.sleep(0.05)  # the server is still starting
    if not ready:
        proc.kill()
        err = proc.communicate(timeout=5)[1].decode(errors="replace")[-300:]
        pytest.skip(f"redis-server did not serve TLS (built without it?): {err}")
    yield port, cert
    proc.terminate()
    proc.wait(10)


def test_round_trips_over_tls(
    tls_server: tuple[int, Path], pool: kvpool.TensorMemoryAllocator
) -> None:
    port, ca = tls_server
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    big = kvpool.TensorMemoryAllocator(torch.empty(8 << 20, dtype=torch.uint8))
    chunk = torch.Size([1 << 20])
    src = big.allocate(chunk, torch.uint8, kvpool.MemoryFormat.BINARY)
    data = fill(src, 3)
    with RedisStore(url, prefix="tls:") as store:
        store.put("big", src)
        got = store.get("big", big, chunk, torch.uint8, kvpool.MemoryFormat.BINARY)
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()
        objs = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 4, KV_FMT)
        datas = [fill(o, i) for i, o in enumerate(objs)]
        store.batched_put(["a", "b", "c", "d"], objs)
        back = store.batched_get(["a", "b", "c", "d"], pool)
        assert [bytes(b.byte_array) for b in back] == datas  # type: ignore[union-attr]
        pool.batched_free(back)  # type: ignore[arg-type]
        pool.batched_free(objs)
        assert store.head("a") is not None and store.batched_delete(["a", "b", "c", "d"]) == 4

    async def main() -> None:
        async with AsyncRedisStore(url, prefix="tls:") as astore:
            got = await astore.get("big", big)
            assert got is not None and bytes(got.byte_array) == data
            got.ref_count_down()

    asyncio.run(asyncio.wait_for(main(), 30))
    src.ref_count_down()
    assert_clean(pool)
    assert_clean(big)
    big.close()
