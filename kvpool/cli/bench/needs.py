"""What the optional benchmarks need that a machine may lack, each with the command that fixes it.

Every probe looks for a module or a program and starts nothing, so
``kvpool bench --list`` can ask every benchmark at once.  Each returns None
when the need is met, else the reason in plain words, ending with a
command that works from an installed kvpool (no script of a clone).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

__all__ = [
    "lmcache",
    "mooncake",
    "mooncake_folder",
    "redis_benchmark",
    "redis_client",
    "redis_cluster_tools",
    "redis_server",
    "sglang",
    "vllm",
]

#: Debian's and Ubuntu's package of redis-server, redis-cli and redis-benchmark.
SERVER_FIX = "apt-get install redis-server"


def redis_client() -> str | None:
    """Why kvpool's Redis stores cannot load here (the ``redis`` client missing), or None."""
    if importlib.util.find_spec("redis") is None:
        return "the redis client is not installed (pip install 'kvpool[redis]')"
    return None


def redis_server() -> str | None:
    """Why no Redis/Valkey server can start here, or None."""
    if shutil.which("redis-server") or shutil.which("valkey-server"):
        return None
    return f"no redis-server or valkey-server on PATH ({SERVER_FIX})"


def redis_cluster_tools() -> str | None:
    """Why no local Redis Cluster can be made here (a server and its cli), or None."""
    server = redis_server()
    if server is not None:
        return server
    if shutil.which("redis-cli") or shutil.which("valkey-cli"):
        return None
    return f"no redis-cli or valkey-cli on PATH ({SERVER_FIX})"


def redis_benchmark() -> str | None:
    """Why ``redis-benchmark`` (an anchor of the SGLang pairs) is missing here, or None."""
    if shutil.which("redis-benchmark"):
        return None
    return f"no redis-benchmark on PATH ({SERVER_FIX})"


def mooncake_folder() -> Path | None:
    """The installed ``mooncake`` package's folder when it holds ``mooncake_master``, else None."""
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder if (folder / "mooncake_master").exists() else None


def mooncake() -> str | None:
    """Why no local Mooncake master and storage node can start here, or None."""
    if importlib.util.find_spec("mooncake") is None:
        return "Mooncake is not installed (pip install 'kvpool[mooncake]')"
    if mooncake_folder() is None:
        return (
            "the installed Mooncake has no mooncake_master program "
            "(pip install --force-reinstall 'kvpool[mooncake]')"
        )
    return None


def lmcache() -> str | None:
    """Why LMCache's side cannot run in this Python, or None."""
    if importlib.util.find_spec("lmcache") is None:
        return (
            "LMCache is not installed in this Python; `python -m kvpool install-lmcache` "
            "installs it into this environment"
        )
    return None


def sglang() -> str | None:
    """Why SGLang's side cannot run in this Python, or None."""
    if importlib.util.find_spec("sglang") is None:
        return (
            "SGLang is not installed in this Python; `python -m kvpool install-sglang` "
            "installs it into this environment"
        )
    return None


def vllm() -> str | None:
    """Why vLLM's side cannot run in this Python, or None."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "vLLM is not installed in this Python; `python -m kvpool install-vllm` "
            "installs it into this environment"
        )
    return None
