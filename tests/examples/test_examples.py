"""Every script in examples/ runs as a user runs it: its own process, from another directory.

Each example exits 0, prints its closing "ok" line, and writes nothing to
stderr that signals a fault (a traceback, a kvpool warning); the store
examples run against the real servers of the store tests, given by URL on
the command line as a user would.  A new example must be added to
``EXPECTED`` (the first test fails otherwise), so none goes untested.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Each example's closing line (the last line it prints on success).
EXPECTED = {
    "quickstart.py": "round trip of 524288 bytes verified",
    "file_store.py": "file store round trip ok",
    "redis_store.py": "redis store round trip ok",
    "redis_cluster_store.py": "redis cluster store round trip ok",
    "mooncake_store.py": "mooncake store round trip ok",
    "async_store.py": "async store round trip ok",
    "shared_pool.py": "creator: the reader saw the chunk; pool closed, segment removed",
}
# Run by their own tests elsewhere (named here so the inventory test knows them).
ELSEWHERE = {
    "_chunks.py": "a helper module the store examples import, not an example",
    "lmcache_remote_plugin.py": "needs LMCache: tests/compat/test_remote_plugin_example.py runs it",
    "sglang_hicache_backend.py": "needs SGLang: tests/compat_sglang/test_example.py runs it",
    "vllm_tier.py": "needs vLLM: tests/compat_vllm/test_example.py runs it",
}
# What no successful run may print on stderr.
FAULTS = ("Traceback", "freed while views", "reclaiming <", "LeakedHandleWarning", "Error")


def run_example(
    name: str, args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120
) -> str:
    """Run one example; fail with its output unless it ran cleanly. Returns its stdout."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    report = f"{name} {args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, report
    lines = done.stdout.strip().splitlines()
    expected = EXPECTED[name]
    assert expected in lines, report
    for fault in FAULTS:
        assert fault not in done.stderr, report
    return done.stdout


def test_every_example_is_run_by_a_test() -> None:
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    compat = Path(__file__).resolve().parents[1] / "compat"
    for name, why in ELSEWHERE.items():
        runner = why.partition("tests/compat/")[2].partition(" ")[0]
        if runner:  # the test named must exist and name the example
            assert name in (compat / runner).read_text(), f"{runner} does not run {name}"
    untested = scripts - set(EXPECTED) - set(ELSEWHERE)
    assert not untested, f"examples no test runs: {sorted(untested)}; add them to EXPECTED"
    missing = set(EXPECTED) - scripts
    assert not missing, f"EXPECTED names examples that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("name", ["quickstart.py", "file_store.py", "shared_pool.py"])
def test_example_without_a_server(name: str, child_env: dict[str, str], tmp_path: Path) -> None:
    run_example(name, [], child_env, tmp_path)


def test_file_store_example_in_a_given_directory(child_env: dict[str, str], tmp_path: Path) -> None:
    where = tmp_path / "store"
    out = run_example("file_store.py", [str(where)], child_env, tmp_path)
    assert "stored: 8 of 8" in out
    assert "deleted: 8" in out
    assert where.is_dir() and not any(where.glob("*.kvp*")), list(where.iterdir())


def test_async_example_on_files(child_env: dict[str, str], tmp_path: Path) -> None:
    out = run_example("async_store.py", [], child_env, tmp_path)
    assert "deleted: 8" in out


@pytest.mark.redis
def test_redis_example(redis_server, child_env: dict[str, str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = run_example("redis_store.py", [redis_server.url], child_env, tmp_path)
    assert "deleted: 8" in out


@pytest.mark.redis
def test_async_example_on_redis(redis_server, child_env: dict[str, str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = run_example("async_store.py", [redis_server.url], child_env, tmp_path)
    assert "deleted: 8" in out


@pytest.mark.redis
def test_redis_cluster_example(redis_cluster, child_env: dict[str, str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = run_example("redis_cluster_store.py", [redis_cluster.url], child_env, tmp_path)
    assert "masters: 3" in out
    assert "deleted: 16" in out


@pytest.mark.mooncake
def test_mooncake_example(mooncake, child_env: dict[str, str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = {**child_env, "MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_LOG_LEVEL": "ERROR"}
    out = run_example("mooncake_store.py", [mooncake.url], env, tmp_path)
    assert "stored: 8 of 8" in out
