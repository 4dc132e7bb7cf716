"""SGLang 0.5.23's own HiCache code on kvpool's stores: the SGLang compatibility suite's setup.

This folder runs in an environment that has ``sglang==0.5.23`` (``make
compat`` builds and caches one from the list ``kvpool install-sglang``
installs, ``kvpool/integrations/sglang/requirements-sgl0523.txt``; see
``tests/compat/make_venv.py``).  Where SGLang is not installed the folder
is not collected; ``KVPOOL_REQUIRE_SGLANG=1`` (set by ``make compat``) makes
that an error.  The kvpool imported must be this checkout's.

Fixtures: ``pools`` builds SGLang's real host pools on CPU
(``pin_memory=False``); ``backend`` loads :class:`KVPoolHiCacheStorage`
through SGLang's ``StorageBackendFactory`` as SGLang does; ``redis_url``,
``redis_cluster``, ``mooncake`` are real servers on loopback (tests/remote's
cluster and Mooncake starters), stopped after the session.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_gate import engine_here, env_flag
from compat_servers import mooncake, redis_cluster  # noqa: F401 (fixtures)

REQUIRE_REDIS = env_flag("KVPOOL_REQUIRE_REDIS")

if not engine_here("sglang", "KVPOOL_REQUIRE_SGLANG"):
    collect_ignore_glob = ["*"]


# -- SGLang's host pools and its factory ----------------------------------


def mha_pool(layout: str, layers: int = 3, heads: int = 2, dim: int = 16, page: int = 4,
             tokens: int = 64, dtype: Any = None) -> Any:  # fmt: skip
    """A real ``MHATokenToKVPoolHost`` on CPU (``pin_memory=False``)."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    dtype = dtype or torch.bfloat16
    k = tuple(torch.zeros(tokens, heads, dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(tokens, heads, dim, dtype=dtype) for _ in range(layers))

    def table(ts: tuple[Any, ...]) -> Any:
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    buffers = KVBuffers(k=k, v=v, k_data_ptrs=table(k), v_data_ptrs=table(v),
                        layout=KVBufferLayout.NHD)  # fmt: skip
    info = MHABufferInfo(buffers=buffers, page_size=page, head_num=heads, head_dim=dim,
                         v_head_dim=dim, dtype=dtype, device=torch.device("cpu"))  # fmt: skip
    return MHATokenToKVPoolHost(info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0,
                                end_layer=layers)  # fmt: skip


def mla_pool(layout: str, layers: int = 3, rank: int = 32, rope: int = 8, page: int = 4,
             tokens: int = 64, dtype: Any = None) -> Any:  # fmt: skip
    """A real ``MLATokenToKVPoolHost`` on CPU (``pin_memory=False``)."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import MLABufferInfo
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    dtype = dtype or torch.bfloat16
    bufs = tuple(torch.zeros(tokens, 1, rank + rope, dtype=dtype) for _ in range(layers))
    info = MLABufferInfo(
        buffers=bufs, data_ptrs=torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64),
        layer_indices=tuple(range(layers)), device_layer_num=layers, page_size=page,
        kv_lora_rank=rank, qk_rope_head_dim=rope, kv_cache_dim=rank + rope, dtype=dtype,
        device=torch.device("cpu"),
    )  # fmt: skip
    return MLATokenToKVPoolHost(info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=layers,
                                target_layer_num=layers)  # fmt: skip


def storage_config(url: str, *, mla: bool = False, tp: tuple[int, int] = (0, 1),
                   model: str = "kvpool/compat", metrics: bool = False,
                   **extra: Any) -> Any:  # fmt: skip
    """SGLang's ``HiCacheStorageConfig`` with the kvpool backend's extra config."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    config = {
        "backend_name": "kvpool",
        "module_path": "kvpool.integrations.sglang",
        "class_name": "KVPoolHiCacheStorage",
        "interface_v1": 1,
        "url": url,
        **extra,
    }
    return HiCacheStorageConfig(
        tp_rank=tp[0], tp_size=tp[1], pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=metrics, is_page_first_layout=False,
        model_name=model, extra_config=config,
    )  # fmt: skip


def load_backend(config: Any, pool: Any) -> Any:
    """The backend as SGLang's cache controller makes it: the factory, then the host pool."""
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    backend.on_host_pools_registered()
    return backend


@pytest.fixture
def backends() -> Iterator[Callable[..., Any]]:
    """``make(config, pool)``: backends loaded as SGLang does, closed after the test."""
    made: list[Any] = []

    def make(config: Any, pool: Any) -> Any:
        backend = load_backend(config, pool)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


# -- servers -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server on a free loopback port (no persistence)."""

    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            reason = "no redis-server on PATH (apt-get install redis-server)"
            if REQUIRE_REDIS:
                pytest.fail(f"KVPOOL_REQUIRE_REDIS is set but there is {reason}")
            pytest.skip(reason)
        self.port = port or _free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self.ping():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                pytest.fail("redis-server did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


# redis_cluster and mooncake: tests/compat_servers.py (imported at the top).


@pytest.fixture(params=["file", "redis", "cluster", "mooncake"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of each kind of store, on a fresh key space."""
    if request.param == "file":
        return f"file://{tmp_path / 'l3'}"
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    if request.param == "cluster":
        return request.getfixturevalue("redis_cluster").url
    return request.getfixturevalue("mooncake").url
