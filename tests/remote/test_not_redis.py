"""A server that is not Redis on a Redis URL: the error says so and quotes what it answered.

Two real HTTP servers on loopback stand where Redis was expected: Python's
own ``http.server`` (it answers the first command with an HTML error page
and closes the connection) and a keep-alive one that answers every request
with ``HTTP/1.1 400 Bad Request``, as nginx does.  Opening a store (its
first PING), a call of an asyncio store and a cluster store's slot map all
fail with :class:`~kvpool.errors.ProtocolError` naming the call and the
server, saying that it does not speak Redis, and quoting its first line.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import importlib.util
import socket
import threading
from collections.abc import Iterator

import pytest

from kvpool.errors import ProtocolError, RemoteStoreError
from kvpool.remote import AsyncRedisStore, open_store

NGINX_400 = (
    b"HTTP/1.1 400 Bad Request\r\nServer: nginx\r\nContent-Type: text/html\r\n"
    b"Content-Length: 11\r\n\r\nBad Request"
)


@pytest.fixture(autouse=True)
def _redis_client() -> None:
    if importlib.util.find_spec("redis") is None:
        pytest.skip("the redis client is not installed (pip install 'kvpool[redis]')")


@pytest.fixture
def python_http() -> Iterator[int]:
    """Python's http.server on a free loopback port; yields the port."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def keepalive_http() -> Iterator[int]:
    """A server that answers every request with an HTTP 400 and keeps the connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # the acceptor looks at `stop` this often
    clients: list[socket.socket] = []
    stop = threading.Event()

    def serve(client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set() and client.recv(65536):
                client.sendall(NGINX_400)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            clients.append(client)
            threading.Thread(target=serve, args=(client,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        acceptor.join(10)
        listener.close()
        for client in clients:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            client.close()


def _check(exc: BaseException, call: str, port: int, answer: str) -> None:
    text = str(exc)
    assert isinstance(exc, ProtocolError) and isinstance(exc, RemoteStoreError), repr(exc)
    assert text.startswith(f"{call} on 127.0.0.1:{port}/0: "), text
    assert "does not speak Redis (an HTTP server)" in text, text
    assert f"it answered {answer!r}" in text, text
    assert "check the URL's host and port" in text, text
    assert "out of step" not in text, text


@pytest.mark.parametrize("server", ["python_http", "keepalive_http"])
def test_opening_a_store_on_an_http_server_says_it_is_not_redis(
    server: str, request: pytest.FixtureRequest
) -> None:
    port = request.getfixturevalue(server)
    answer = "<!DOCTYPE HTML>" if server == "python_http" else "HTTP/1.1 400 Bad Request"
    with pytest.raises(ProtocolError) as info:
        open_store(f"redis://127.0.0.1:{port}/0", timeout=5.0)
    _check(info.value, "ping", port, answer)
    with pytest.raises(ProtocolError) as info:
        open_store(f"redis-cluster://127.0.0.1:{port}", timeout=5.0)
    _check(info.value, "CLUSTER SLOTS", port, answer)


@pytest.mark.parametrize("server", ["python_http", "keepalive_http"])
def test_an_async_call_on_an_http_server_says_it_is_not_redis(
    server: str, request: pytest.FixtureRequest
) -> None:
    port = request.getfixturevalue(server)
    answer = "<!DOCTYPE HTML>" if server == "python_http" else "HTTP/1.1 400 Bad Request"

    async def main() -> BaseException:
        store = AsyncRedisStore(f"redis://127.0.0.1:{port}/0", timeout=5.0)
        try:
            await store.exists("k")
        except BaseException as exc:  # checked below
            return exc
        finally:
            await store.aclose()
        raise AssertionError("exists() on an HTTP server succeeded")

    _check(asyncio.run(main()), "exists b'k'", port, answer)
