"""Store specs are read exactly: a typo is refused naming the fix, never made a directory."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from store_url_cases import BAD_IDS, BAD_SPECS, created_anything, missing_parent

from kvpool.errors import InvalidArgumentError
from kvpool.remote import FileStore, open_async_store, open_store, store_kind
from kvpool.remote.urls import parse_spec


@pytest.mark.parametrize(("spec", "fix"), BAD_SPECS, ids=BAD_IDS)
def test_open_store_refuses_a_mistyped_spec_and_creates_nothing(
    spec: str, fix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError) as info:
        open_store(spec)
    assert fix in str(info.value)
    assert created_anything(tmp_path) == []


@pytest.mark.parametrize(("spec", "fix"), BAD_SPECS, ids=BAD_IDS)
def test_open_async_store_and_store_kind_refuse_the_same_specs(
    spec: str, fix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError) as info:
        open_async_store(spec)
    assert fix in str(info.value)
    with pytest.raises(InvalidArgumentError):
        store_kind(spec)
    assert created_anything(tmp_path) == []


def test_a_missing_parent_is_an_error_naming_it(tmp_path: Path) -> None:
    spec, fix = missing_parent(tmp_path)
    for opener in (open_store, open_async_store):
        with pytest.raises(InvalidArgumentError) as info:
            opener(spec)
        assert fix in str(info.value) and "make_parents=True" in str(info.value)
    assert created_anything(tmp_path) == []


def test_make_parents_creates_the_missing_parents(tmp_path: Path) -> None:
    spec, _ = missing_parent(tmp_path)
    with open_store(spec, make_parents=True) as store:
        assert isinstance(store, FileStore)
        assert Path(store.directory).is_dir()
        assert store.directory == str(tmp_path / "no-such-parent" / "dir" / "x")


def test_a_directory_is_created_when_its_parent_exists(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "new")) as store:
        assert Path(store.directory).is_dir()
    with open_store(f"file://{tmp_path / 'newer'}") as store:
        assert Path(store.directory).is_dir()


def test_a_path_that_exists_and_is_no_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="is not a directory"):
        FileStore(tmp_path / "f")


@pytest.mark.parametrize("name", ["./redis:127.0.0.1", "./127.0.0.1:6391"])
def test_a_directory_with_a_url_like_name_is_written_as_a_path(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store(name) as store:
        assert Path(store.directory) == tmp_path / name[2:]


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("/dev/shm/kv", "file"),
        ("cache/kv", "file"),
        ("redis/cache", "file"),  # a folder named redis: no ':' and no '//'
        ("redis://h:1/0", "redis"),
        ("redis://h:1", "redis"),
        ("valkey://h:1/3", "redis"),
        ("unix:///run/redis.sock?db=2", "redis"),
        ("redis-cluster://a:1,b:2", "redis-cluster"),
        ("mooncake://m:50051?metadata=http://m:8080/metadata", "mooncake"),
    ],
)
def test_good_specs_keep_their_kind(spec: str, kind: str) -> None:
    assert parse_spec(spec).kind == kind


@pytest.mark.parametrize(
    "spec",
    [
        "reddis://user:hunter22@h:1/0",
        "admin:hunter22@h:6379",
        "redis://:hunter22@h/x",
        # Written without "://": the user information is still found and hidden.
        "redis//:hunter22@127.0.0.1:6391/0",
        "rediss:/user:hunter22@h/0",
        "redis:hunter22@h",
        "file://user:hunter22@host/x",
        "redis://user:hunter22@/0",
    ],
)
def test_a_password_never_shows_in_a_refusal(spec: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_spec(spec)
    assert "hunter22" not in str(info.value)


def test_spaces_around_a_spec_are_dropped_by_every_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_spec(" redis://h:1/0\n") == parse_spec("redis://h:1/0")
    with open_store(" ./kv\n") as store:
        assert Path(store.directory) == tmp_path / "kv"
    assert created_anything(tmp_path) == ["kv"]


def test_a_tilde_is_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    with open_store("~/kv") as store:
        assert Path(store.directory) == tmp_path / "home" / "kv"
    assert created_anything(tmp_path) == ["home", "home/kv"]


def test_a_directory_that_can_never_be_made_is_a_config_error(tmp_path: Path) -> None:
    # A config error stops an engine's start-up; a RemoteStoreError would be retried as
    # an outage for ever.  A name longer than any file system takes fails for every user.
    with pytest.raises(InvalidArgumentError, match="give a directory this process may"):
        open_store(str(tmp_path / ("k" * 300)))
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="is not a directory"):
        open_store(str(tmp_path / "f" / "kv"), make_parents=True)


def test_redis_store_refuses_a_database_name_given_directly() -> None:
    pytest.importorskip("redis", reason="the Redis client is an extra (kvpool[redis])")
    from kvpool.remote import AsyncRedisStore, RedisStore

    with pytest.raises(InvalidArgumentError, match="'db0' is not a number"):
        RedisStore("redis://127.0.0.1:6391/db0")
    with pytest.raises(InvalidArgumentError, match="'x' is not a number"):
        asyncio.run(_open_async("rediss://127.0.0.1:6391/x", AsyncRedisStore))


async def _open_async(url: str, cls: type) -> None:
    store = cls(url)
    await store.aclose()


@pytest.mark.parametrize(("spec", "fix"), BAD_SPECS[:3], ids=BAD_IDS[:3])
def test_demo_store_option_refuses_a_mistyped_spec(spec: str, fix: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kvpool", "demo", "--chunks", "1", "--store", spec],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert run.returncode != 0
    assert fix in run.stderr + run.stdout
    assert created_anything(tmp_path) == []
