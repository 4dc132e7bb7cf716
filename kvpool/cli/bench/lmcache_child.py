"""One side of the ``lmcache_remote`` benchmark: LMCache StorageManagers in a process of their own.

The parent (:mod:`kvpool.cli.bench.lmcache_remote`) starts this module as
``python -m kvpool.cli.bench.lmcache_child`` and talks to it in JSON lines:
the first line on stdin is the spec, then one command per line; every
reply is one line on the process's original stdout (which the child keeps
for itself: anything else printed to stdout, by LMCache or Mooncake's
native code, is sent to stderr, which the parent keeps in a log file).

Spec::

    {"memory": "lmcache" | "kvpool", "chunks": 32, "seed": 1, "deadline_s": 60,
     "kv_shape": [layers, 2, tokens, heads, head_size], "run": "nonce",
     "contenders": [{"name": "...", "yaml": "LMCache engine config as YAML"}]}

Each contender is LMCache's own ``StorageManager`` built from its YAML by
``LMCacheEngineConfig.from_file``, as LMCache's engine builds it, with the
local CPU backend on (the remote backend's buffer) and one remote backend
(``RemoteBackend`` or ``RemoteBackend-<plugin>``).  ``"memory": "kvpool"``
calls :func:`kvpool.integrations.lmcache.install` first, so every chunk
lives in kvpool memory; ``"lmcache"`` leaves LMCache's allocators alone.

Commands and replies:

* ``{"op": "round", "name": C, "tag": T}`` - one round of contender C:
  ``chunks`` KV chunks (bfloat16, KV_2LTD) allocated through the manager
  and filled (untimed), then timed: the put - what
  ``StorageManager.batched_put`` does, backend by backend (the local CPU
  backend, then the remote backend's ``batched_submit_put_task`` with
  LMCache's ``on_complete_callback``) until every key's write has
  completed - and the get, ``batched_get_blocking`` from the remote
  backend.  The put counts only when the remote backend's ``contains``
  then finds every key (asked key by key; a key not there yet is asked
  again every 1 ms and the put's time runs on until it is).  The asks
  themselves are timed in neither column: the put ends at its completion
  (or when a late key was last waited for), the get starts at its own
  call (32 asks cost 5 to 12 ms, which the get column used to hold).  Waiting for
  the completion hook instead of polling keeps the measurement off the
  loop the put runs on (a poll costs the loop a turn, and the GIL, every
  time).  ``contains``, not ``batched_contains``: LMCache 0.5.6's
  ``RESPConnector`` answers the latter through its client's sync path,
  which submits the request before it registers the reply's future, from
  a thread that is not the loop's; a reply the loop drains in between is
  dropped and the call never returns (seen here within a few rounds).
  The chunks read back are compared byte for byte (untimed) and released,
  and the keys are dropped from the local CPU backend.  Reply ``{"put_s", "get_s",
  "missing", "wrong", "late"}`` (``late``: keys not there yet when their
  write had completed; with ``"log"``, what LMCache logged, when a
  chunk is missing or wrong) or ``{"error": why}``.
* ``{"op": "stop"}`` - close every manager, each in a thread, all within
  ``close_s`` seconds; reply ``{"closed": {name: "ok" | why}}`` and exit
  at once, without waiting for a close that hangs (LMCache 0.5.6's
  ``RedisConnector``, ``RESPConnector`` and ``RedisClusterConnector``
  ``close()`` never return here: they wait, on the storage manager's loop,
  for an executor that needs that loop to shut down).

The first reply is ``{"ready": true, "errors": {name: why}, "built":
{name: {"backend", "connector"}}, "kvpool_root": folder}`` (the folder
holding the kvpool package this process imported, which the parent
checks is its own); without LMCache it is ``{"fatal": why}`` and the exit
status 3.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

__all__ = ["main"]

T = TypeVar("T")

#: Seconds between two asks for a key the remote does not hold yet.
POLL_S = 0.001
#: Exit status when LMCache cannot be imported.
NO_LMCACHE = 3


def _reply(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def _log_since(offset: int) -> str:
    """The WARNING/ERROR lines this process wrote to stderr (a file) since ``offset``."""
    try:
        where = os.readlink("/proc/self/fd/2")
        with open(where, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if "ERROR" in ln or "WARNING" in ln]
    return " | ".join(lines[-6:])


def _log_offset() -> int:
    try:
        return os.lseek(2, 0, os.SEEK_END)
    except OSError:
        return 0


class Contender:
    """One LMCache StorageManager and its remote backend, with the round's sources."""

    def __init__(self, name: str, yaml_text: str, spec: dict[str, Any], sources: list[Any]) -> None:
        import torch
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.event_manager import EventManager
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.storage_manager import StorageManager

        self.name = name
        self.chunks = int(spec["chunks"])
        self.deadline_s = float(spec["deadline_s"])
        self.sources = sources
        layers, _, tokens, heads, head_size = spec["kv_shape"]
        self.shape = torch.Size([2, layers, tokens, heads * head_size])
        self.model = f"kvpool-bench/{spec['run']}/{name}"
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(yaml_text)
            path = f.name
        try:
            config = LMCacheEngineConfig.from_file(path)
        finally:
            os.unlink(path)
        metadata = LMCacheMetadata(
            model_name=self.model,
            world_size=1,
            local_world_size=1,
            worker_id=0,
            local_worker_id=0,
            kv_dtype=torch.bfloat16,
            kv_shape=tuple(spec["kv_shape"]),
            chunk_size=tokens,
        )
        offset = _log_offset()
        self.manager = StorageManager(config, metadata, EventManager())
        remotes = [b for n, b in self.manager.storage_backends.items() if n.startswith("Remote")]
        if len(remotes) != 1 or getattr(remotes[0], "connection", None) is None:
            names = list(self.manager.storage_backends)
            why = _log_since(offset) or "LMCache logged nothing"
            raise RuntimeError(
                f"LMCache built the backends {names}, without a connected remote: {why}"
            )
        self.remote = remotes[0]
        self.backend_name = next(
            n for n, b in self.manager.storage_backends.items() if b is remotes[0]
        )
        self.connector = type(_unwrap(self.remote.connection)).__name__
        # A first lookup, as LMCache's engine makes before it stores: the
        # client connects here rather than inside the first timed put.
        _bounded(lambda: self.remote.contains(self._keys(-1)[0]), self.deadline_s)

    def _keys(self, tag: int) -> list[Any]:
        import torch
        from lmcache.utils import CacheEngineKey

        n = self.chunks
        return [CacheEngineKey(self.model, 1, 0, tag * n + i + n, torch.bfloat16) for i in range(n)]

    def round(self, tag: int) -> dict[str, Any]:
        """One timed put + get of every chunk; see the module notes."""
        import torch
        from lmcache.v1.memory_management import MemoryFormat

        n = self.chunks
        objs = self.manager.batched_allocate(
            self.shape, torch.bfloat16, n, MemoryFormat.KV_2LTD, eviction=False, busy_loop=False
        )
        if objs is None:
            return {"error": f"LMCache's local CPU backend has no room for {n} chunks"}
        stamp = torch.tensor([tag], dtype=torch.int64).view(torch.uint8)
        for i, obj in enumerate(objs):
            flat = obj.tensor.reshape(-1).view(torch.uint8)
            flat.copy_(self.sources[i])
            flat[:8].copy_(stamp)  # a stale entry from another round would not match
        keys = self._keys(tag)
        offset = _log_offset()
        left = [n]
        lock = threading.Lock()
        written = threading.Event()

        def one_written(key: Any) -> None:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    written.set()

        start = time.perf_counter()
        # StorageManager.batched_put, backend by backend: the local CPU backend
        # (takes over our references), then the remote one with LMCache's
        # completion hook, so that nothing polls the loop while the put runs.
        self.manager.batched_put(keys, objs, location="LocalCPUBackend")
        self.remote.batched_submit_put_task(keys, objs, on_complete_callback=one_written)
        end = start + self.deadline_s
        written.wait(self.deadline_s)
        put_done = time.perf_counter()
        held = late = 0
        asked = -1
        while held < n:  # the remote must hold every key: a key not there yet is waited for
            if self.remote.contains(keys[held]):
                held += 1
                continue
            late += asked != held
            asked = held
            if time.perf_counter() > end:
                break
            time.sleep(POLL_S)
            put_done = time.perf_counter()
        if held != n:
            self.manager.batched_remove(keys, locations=["LocalCPUBackend"])
            why = _log_since(offset) or "LMCache logged nothing"
            after = f"{self.deadline_s:g} s after the put"
            return {"error": f"the remote held {held} of {n} keys {after}: {why}"}
        get_start = time.perf_counter()
        got = self.remote.batched_get_blocking(keys)
        get_done = time.perf_counter()
        missing = sum(g is None for g in got)
        wrong = 0
        for i, g in enumerate(got):
            if g is None:
                continue
            flat = g.tensor.reshape(-1).view(torch.uint8)
            if not (torch.equal(flat[:8], stamp) and torch.equal(flat[8:], self.sources[i][8:])):
                wrong += 1
            g.ref_count_down()
        self.manager.batched_remove(keys, locations=["LocalCPUBackend"])
        reply = {"put_s": put_done - start, "get_s": get_done - get_start}
        reply.update(missing=missing, wrong=wrong, late=late)
        if missing or wrong:
            reply["log"] = _log_since(offset) or "LMCache logged nothing"
        return reply

    def close_now(self) -> None:
        """Close the manager (may hang on LMCache's Redis connectors: call it in a thread)."""
        self.manager.close()


def _bounded(work: Callable[[], T], seconds: float) -> T:
    """``work()`` in a daemon thread, waited for at most ``seconds`` (then TimeoutError).

    LMCache's backends wait for their connectors without a deadline
    (``future.result()``); a call that never returns must not stop this
    process from serving the other contenders and the parent.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="lmcache-bench-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"the call did not return within {seconds:g} s (left behind)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _unwrap(connection: Any) -> Any:
    """LMCache's connector inside its InstrumentedRemoteConnector (for the report only)."""
    inner = getattr(connection, "getWrappedConnector", None)
    return inner() if callable(inner) else connection


def _close_all(contenders: dict[str, Contender], close_s: float) -> dict[str, str]:
    """Close every manager in its own daemon thread; report those that did not return in time."""
    done: dict[str, str] = {}

    def close(c: Contender) -> None:
        try:
            c.close_now()
            done[c.name] = "ok"
        except Exception as exc:
            done[c.name] = f"close raised {type(exc).__name__}: {exc}"

    threads = [
        threading.Thread(target=close, args=(c,), name=f"close-{c.name}", daemon=True)
        for c in contenders.values()
    ]
    for t in threads:
        t.start()
    end = time.monotonic() + close_s
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    return {
        name: done.get(name, f"close() did not return within {close_s:g} s (left behind)")
        for name in contenders
    }


def _sources(chunks: int, nbytes: int, seed: int) -> list[Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen) for _ in range(chunks)
    ]


def main() -> int:
    """Serve the parent's commands (see the module notes); the exit status says how it ended."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (LMCache, native code) go to the log, not the protocol
    spec = json.loads(sys.stdin.readline())
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if spec.get("memory") == "kvpool":
        import kvpool.integrations.lmcache as kv_lmcache

        kv_lmcache.install()
    try:
        import lmcache.v1.storage_backend.storage_manager  # noqa: F401
    except ImportError as exc:
        _reply(out, {"fatal": f"LMCache cannot be imported here ({exc})"})
        return NO_LMCACHE
    layers, _, tokens, heads, head_size = spec["kv_shape"]
    nbytes = 2 * layers * tokens * heads * head_size * 2
    sources = _sources(int(spec["chunks"]), nbytes, int(spec["seed"]))
    contenders: dict[str, Contender] = {}
    errors: dict[str, str] = {}
    built: dict[str, dict[str, str]] = {}
    for item in spec["contenders"]:
        try:
            c = Contender(item["name"], item["yaml"], spec, sources)
        except Exception as exc:
            errors[item["name"]] = f"{type(exc).__name__}: {exc}"
            continue
        contenders[c.name] = c
        built[c.name] = {"backend": c.backend_name, "connector": c.connector}
    stuck: dict[str, str] = {}
    # This module lives in the kvpool package this process imported.
    here = str(Path(__file__).resolve().parents[3])
    _reply(out, {"ready": True, "errors": errors, "built": built, "kvpool_root": here})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "stop":
            _reply(out, {"closed": _close_all(contenders, float(cmd.get("close_s", 10)))})
            out.flush()
            os._exit(0)  # a close left hanging must not keep the process alive
        name = cmd.get("name", "")
        if name in stuck:
            _reply(out, {"error": stuck[name]})
            continue
        c = contenders.get(name)
        if c is None:
            _reply(out, {"error": f"no contender {name!r} here"})
            continue
        try:
            tag = int(cmd["tag"])
            _reply(out, _bounded(lambda c=c, tag=tag: c.round(tag), 2 * c.deadline_s + 30))
        except TimeoutError as exc:
            stuck[name] = f"a round hung inside LMCache: {exc}"
            _reply(out, {"error": stuck[name]})
        except Exception as exc:
            _reply(out, {"error": f"{type(exc).__name__}: {exc}"})
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
