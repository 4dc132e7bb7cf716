"""An asyncio store's ``aclose()`` cancelled part-way still completes the close.

A caller that bounds its wait (the LMCache plugin's connector waits for
the store at most 0.5 s, ``asyncio.wait_for``) cancels ``aclose()`` while
it waits for calls still running in the store's threads.  The close must
still complete: the blocking store closed and the threads ended once
those calls end, and the store refuses calls from then on.  The thread
stores (files with threads, Mooncake) are driven with one call held at a
gate in its thread, so ``aclose`` is provably waiting when it is
cancelled; the Redis stores close their connections before any await,
so their check is that a cancelled ``aclose`` leaves them closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvpool.errors import PoolClosedError
from kvpool.remote import AsyncFileStore, AsyncRedisStore

from .conftest import until
from .test_async_stores import run


def _threads(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


class Gate:
    """Wraps a blocking callable so that its calls wait until :attr:`opened` is set."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        self.opened.wait(30)
        return self.real(*args, **kwargs)


async def _cancel_aclose(store: Any) -> None:
    """Start ``store.aclose()``, let it reach its wait, cancel it; it must raise CancelledError."""
    closing = asyncio.create_task(store.aclose())
    await asyncio.sleep(0.05)  # aclose is now awaiting the held call
    assert not closing.done()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing


async def _held_call_then_cancelled_close(store: Any, threads: str) -> None:
    """Hold an ``exists`` in the store's thread, cancel ``aclose()``; the close completes.

    The store refuses calls at once; the held call still gets its answer
    from the blocking store, which is closed, and the threads (named
    ``threads``...) end, once that call is let go; a later ``aclose()`` is a
    no-op.
    """
    gate = Gate(store.store.exists)
    store.store.exists = gate  # the store's own thread runs the held call
    call = asyncio.create_task(store.exists("k"))
    await until(gate.entered.is_set, "the call to enter its thread")
    await _cancel_aclose(store)
    assert store.closed
    with pytest.raises(PoolClosedError):
        await store.head("k")
    assert not store.store.closed  # the held call still uses it
    gate.opened.set()
    assert await call is False  # the call finished, with its answer
    await until(lambda: store.store.closed, "the blocking store's close")
    await until(lambda: not _threads(threads), "the threads' end")
    await store.aclose()  # a later close is a no-op, not an error


def test_file_store_closes_when_aclose_is_cancelled(tmp_path: Path) -> None:
    run(
        _held_call_then_cancelled_close(
            AsyncFileStore(tmp_path, threads=2), "kvpool-AsyncFileStore"
        )
    )


@pytest.mark.mooncake
def test_mooncake_store_closes_when_aclose_is_cancelled(mooncake_client: Any) -> None:
    from kvpool.remote import AsyncMooncakeStore

    async def main() -> None:
        store = AsyncMooncakeStore(client=mooncake_client, prefix=f"ac-{uuid.uuid4().hex[:12]}:")
        await _held_call_then_cancelled_close(store, "kvpool-AsyncMooncakeStore")

    run(main())


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_redis_stores_are_closed_when_aclose_is_cancelled(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async def main() -> None:
        if kind == "redis":
            store: Any = AsyncRedisStore(request.getfixturevalue("redis_server").url)
        else:
            from kvpool.remote import AsyncRedisClusterStore

            store = AsyncRedisClusterStore(request.getfixturevalue("redis_cluster").url)
        assert await store.exists(f"ac-{uuid.uuid4().hex}") is False  # a connection is open
        closing = asyncio.create_task(store.aclose())
        await asyncio.sleep(0)  # aclose starts: it closes before its first await
        closing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closing  # done already, or cancelled in its wait for calls in flight
        assert store.closed
        with pytest.raises(PoolClosedError):
            await store.exists("k")

    run(main())
