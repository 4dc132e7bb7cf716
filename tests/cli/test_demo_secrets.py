"""``kvpool demo --store URL`` never prints the URL's password (text, JSON, errors).

Each store kind the demo takes is tried with a password-bearing URL: a real
round trip through a redis-server started with ``--requirepass`` (text and
JSON), a wrong password refused by that server, a real Redis Cluster that
has no password (its refusal), and TLS, Unix-socket, cluster and Mooncake URLs
whose servers are not there (the error paths).  Whatever the demo writes,
to stdout or stderr, must hold neither the password nor its percent-encoded
form, and the store line names the store with ``***`` in the password's place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from remote.cluster_servers import RedisCluster, start_cluster
from remote.conftest import RedisServer, need_redis, start_redis

PASSWORD = "s3cretPW-4-demo"


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool", "demo", "--chunks", "2", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def _no_secret(run: subprocess.CompletedProcess[str], *secrets: str) -> None:
    for secret in secrets:
        assert secret not in run.stdout, run.stdout
        assert secret not in run.stderr, run.stderr


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    """A redis-server that requires PASSWORD."""
    server = start_redis(need_redis(), "--requirepass", PASSWORD)
    yield server
    server.stop()


@pytest.mark.redis
def test_a_round_trip_prints_the_redis_url_without_its_password(locked_redis: RedisServer) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{locked_redis.port}/0"
    run = demo("--store", url)
    assert run.returncode == 0, run.stderr
    assert "verified: all 2 chunks" in run.stdout
    assert f"store: redis://***@127.0.0.1:{locked_redis.port}/0" in run.stdout
    _no_secret(run, PASSWORD)


@pytest.mark.redis
def test_the_json_names_the_store_without_its_password(locked_redis: RedisServer) -> None:
    url = f"redis://default:{PASSWORD}@127.0.0.1:{locked_redis.port}/0"
    run = demo("--store", url, "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["store"] == f"redis://***@127.0.0.1:{locked_redis.port}/0"
    _no_secret(run, PASSWORD)


@pytest.mark.redis
def test_a_refused_password_is_not_printed(locked_redis: RedisServer) -> None:
    wrong = "wr0ngPW-4-demo"
    run = demo("--store", f"redis://:{wrong}@127.0.0.1:{locked_redis.port}/0", "--json")
    assert run.returncode == 1
    assert "kvpool demo:" in run.stderr
    _no_secret(run, wrong)


@pytest.mark.redis
def test_a_cluster_url_s_password_is_not_printed() -> None:
    # A real cluster without a password: it refuses AUTH, and the demo says so.
    cluster: RedisCluster = start_cluster()
    try:
        url = cluster.url.replace("://", f"://:{PASSWORD}@", 1)
        run = demo("--store", url)
    finally:
        cluster.stop()
    assert "kvpool demo:" in run.stderr or "store: redis-cluster://***@" in run.stdout
    _no_secret(run, PASSWORD)


@pytest.mark.parametrize(
    "url",
    [
        f"rediss://:{PASSWORD}@127.0.0.1:1/0",
        f"unix:///nonexistent-kvpool/redis.sock?db=0&password={PASSWORD}",
        f"redis-cluster://:{PASSWORD}@127.0.0.1:1,127.0.0.1:2",
        f"mooncake://127.0.0.1:1?metadata=redis://:{PASSWORD}@127.0.0.1:1/0&protocol=tcp",
        f"redis://user%40x:{PASSWORD.replace('-', '%2D')}@127.0.0.1:1/0",
    ],
    ids=["rediss", "unix", "redis-cluster", "mooncake-metadata", "percent-encoded"],
)
def test_an_unreachable_store_s_password_is_not_printed(url: str) -> None:
    for args in ((), ("--json",)):
        run = demo("--store", url, *args)
        assert run.returncode == 1
        assert "kvpool demo:" in run.stderr
        _no_secret(run, PASSWORD, PASSWORD.replace("-", "%2D"))
