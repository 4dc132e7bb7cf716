"""The LMCache remote plugin's configuration: instances, options, refusals, the start-up line.

What LMCache reads is real: configs are YAML text loaded by
``LMCacheEngineConfig.from_file`` and handed to LMCache's StorageManager
(or, for the messages, straight to the adapter with LMCache's own
``ConnectorContext``).  A refused config must leave LMCache without the
backend and with our message in its log - never a backend that silently
stores nothing.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import plugin_cases as cases
import pytest
from conftest import REPO
from store_url_cases import BAD_IDS, BAD_SPECS, missing_parent, unmakeable

from kvpool.integrations.lmcache.remote import (
    KVPoolConnectorAdapter,
    PluginConfigError,
    PluginSettings,
)

CHILD_TIMEOUT = 180


@pytest.fixture
def lmcache_backend_log() -> Iterator[cases.Collect]:
    """Records of LMCache's storage-backend loggers."""
    names = (
        "lmcache.v1.storage_backend",
        "lmcache.v1.storage_backend.remote_backend",
        "lmcache.v1.storage_backend.connector",
    )
    with cases.collecting(*names) as handler:
        yield handler


def refusal(text: str, folder: Path) -> str:
    """The message the adapter raises for the config ``text`` (instance ``kvpool``)."""
    from lmcache.v1.storage_backend.connector import ConnectorContext

    config = cases.load_config(text, folder)
    context = ConnectorContext(
        "plugin://kvpool", None, None, config, cases.metadata(), plugin_name="kvpool"
    )
    with pytest.raises(PluginConfigError) as info:
        KVPoolConnectorAdapter().create_connector(context)
    return str(info.value)


def test_the_adapter_answers_for_its_instances_only() -> None:
    adapter = KVPoolConnectorAdapter()
    for url in ("plugin://kvpool", "plugin://kvpool.hot", "plugin://kvpool.a.b"):
        assert adapter.can_parse(url), url
    for url in ("plugin://kvpoolx", "plugin://kvpool.", "plugin://fs", "redis://h:1", "kvpool"):
        assert not adapter.can_parse(url), url


def test_a_missing_url_is_refused_at_start_up(tmp_path: Path, lmcache_backend_log) -> None:
    text = cases.config_text("unused").replace(
        '  remote_storage_plugin.kvpool.url: "unused"', "  # no url"
    )
    assert "kvpool.url" not in text.split("# any URL")[0]
    message = refusal(text, tmp_path)
    assert "remote_storage_plugin.kvpool.url" in message and "redis://" in message
    manager = cases.make_manager(cases.load_config(text, tmp_path))
    try:
        # No backend that would store nothing: LMCache dropped it, and said why.
        assert list(manager.storage_backends) == ["LocalCPUBackend"]
    finally:
        manager.close()
    logged = [r.getMessage() for r in lmcache_backend_log.records if r.levelno >= logging.ERROR]
    assert any("remote_storage_plugin.kvpool.url" in m for m in logged), logged


@pytest.mark.parametrize(
    ("wrong", "right", "line", "level"),
    [
        (
            "class_name: KVPoolAdapter",
            "class_name: KVPoolConnectorAdapter",
            "Failed to load remote connector kvpool",
            logging.ERROR,
        ),
        (
            "module_path: kvpool.integrations.lmcache.remotes",
            "module_path: kvpool.integrations.lmcache.remote",
            "Failed to load remote connector kvpool",
            logging.ERROR,
        ),
        (
            "# no class_name",
            "remote_storage_plugin.kvpool.class_name: KVPoolConnectorAdapter",
            "Remote connector kvpool missing adapter module_path or class_name",
            logging.WARNING,
        ),
    ],
    ids=["class_name", "module_path", "missing"],
)
def test_a_plugin_lmcache_cannot_load_is_its_log_line(
    tmp_path: Path, lmcache_backend_log, wrong: str, right: str, line: str, level: int
) -> None:
    # What the docs tell a user to look for when the plugin did not load: LMCache
    # logs this line and keeps a backend with no connection.
    text = cases.config_text("redis://127.0.0.1:1/0")
    assert right in text
    manager = cases.make_manager(cases.load_config(text.replace(right, wrong), tmp_path))
    try:
        assert manager.storage_backends[cases.BACKEND].connection is None
    finally:
        manager.close()
    logged = [r.getMessage() for r in lmcache_backend_log.records if r.levelno == level]
    assert any(line in m for m in logged), logged


def test_naming_the_connector_class_is_refused_with_the_fix(
    tmp_path: Path, lmcache_backend_log
) -> None:
    # The module exports KVPoolConnector too; LMCache would make it itself, without a
    # store. The backend must not stay with no connection, and the error names the fix.
    text = cases.config_text("redis://127.0.0.1:1/0").replace(
        "class_name: KVPoolConnectorAdapter", "class_name: KVPoolConnector"
    )
    manager = cases.make_manager(cases.load_config(text, tmp_path))
    try:
        assert list(manager.storage_backends) == ["LocalCPUBackend"]
    finally:
        manager.close()
    logged = [r.getMessage() for r in lmcache_backend_log.records if r.levelno >= logging.ERROR]
    assert any("class_name: KVPoolConnectorAdapter" in m for m in logged), logged


def test_an_unknown_option_is_refused_with_the_closest_name(tmp_path: Path) -> None:
    text = cases.config_text("redis://127.0.0.1:1/0", "remote_storage_plugin.kvpool.timout: 2")
    message = refusal(text, tmp_path)
    assert "remote_storage_plugin.kvpool.timout" in message
    assert "did you mean 'timeout'" in message
    assert "accepted:" in message and "window" in message and "ttl" in message
    file_text = cases.config_text(str(tmp_path / "s"), "remote_storage_plugin.kvpool.durabel: true")
    file_message = refusal(file_text, tmp_path)
    assert "remote_storage_plugin.kvpool.durabel" in file_message
    assert "did you mean 'durable'" in file_message


@pytest.mark.parametrize(
    ("url", "line", "expected"),
    [
        ("redis://127.0.0.1:1/0", "remote_storage_plugin.kvpool.timeout: -1", "timeout"),
        ("ftp://127.0.0.1/x", None, "unknown store scheme"),
        ("redis://:hunter22@127.0.0.1:1/0", "remote_storage_plugin.kvpool.window: 0", "window"),
    ],
)
def test_a_bad_value_or_url_is_refused(
    tmp_path: Path, url: str, line: str | None, expected: str
) -> None:
    message = refusal(cases.config_text(url, *([line] if line else [])), tmp_path)
    assert "kvpool plugin 'kvpool'" in message and expected in message
    assert "hunter22" not in message


@pytest.mark.parametrize(("url", "fix"), BAD_SPECS, ids=BAD_IDS)
def test_a_mistyped_url_is_refused_naming_the_fix_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, fix: str
) -> None:
    monkeypatch.chdir(tmp_path)
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    message = refusal(cases.config_text(url), config_dir)
    assert "kvpool plugin 'kvpool'" in message and fix in message
    assert [p.name for p in tmp_path.iterdir()] == ["config"]  # nothing besides the config


def test_a_directory_with_a_missing_parent_is_refused(tmp_path: Path) -> None:
    url, fix = missing_parent(tmp_path)
    message = refusal(cases.config_text(url), tmp_path)
    assert fix in message and "make_parents" in message
    assert not (tmp_path / "no-such-parent").exists()


def test_a_directory_that_cannot_be_made_is_refused_not_retried(tmp_path: Path) -> None:
    url, fix = unmakeable(tmp_path)
    assert fix in refusal(cases.config_text(url), tmp_path)


def test_a_password_in_an_option_value_is_never_shown(tmp_path: Path) -> None:
    # A refused value is quoted by the store's check: the password in it is not.
    secret = "Sup3rSecretPW"
    line = f'remote_storage_plugin.kvpool.timeout: "redis://admin:{secret}@127.0.0.1:1"'
    message = refusal(cases.config_text("redis://127.0.0.1:1/0", line), tmp_path)
    assert "timeout" in message and "***" in message
    assert secret not in message
    # The start-up line shows the options; a URL-valued one (Mooncake's metadata) is redacted.
    settings = PluginSettings(
        "kvpool",
        "mooncake://127.0.0.1:1",
        {"metadata": f"http://admin:{secret}@127.0.0.1:2/metadata", "threads": 2},
        "remote_storage_plugin.kvpool.",
    )
    shown = settings.describe()
    assert "metadata='http://***@127.0.0.1:2/metadata'" in shown and "threads=2" in shown
    assert secret not in shown


def test_a_serde_that_rewrites_chunks_is_refused(tmp_path: Path) -> None:
    # cachegen hands the connector byte buffers, which the stores cannot put:
    # refused at start-up, not a backend whose every put fails.
    text = cases.config_text("redis://127.0.0.1:1/0").replace(
        'remote_serde: "naive"', 'remote_serde: "cachegen"'
    )
    message = refusal(text, tmp_path)
    assert "'cachegen'" in message and 'remote_serde: "naive"' in message


def test_a_non_string_url_is_refused(tmp_path: Path) -> None:
    text = cases.config_text("x").replace('"x"', "6379")
    assert "must be a non-empty string" in refusal(text, tmp_path)


@pytest.mark.parametrize("setting", ["save_unfull_chunk", "use_layerwise"])
def test_headerless_mooncake_refuses_other_layouts(tmp_path: Path, mooncake, setting) -> None:
    # Partial chunks and per-layer objects would be read back in the full chunk's layout.
    text = cases.config_text(mooncake.url + "&headerless=1", head=f"{setting}: true\n")
    message = refusal(text, tmp_path)
    assert "headerless" in message and f"{setting}: False" in message


def test_store_options_reach_the_store(tmp_path: Path, redis_server, lmc) -> None:
    import redis

    from kvpool.remote.header import decode_header

    prefix = "plugtest-options:"
    text = cases.config_text(
        redis_server.url + "/0",
        "remote_storage_plugin.kvpool.timeout: 2.5",
        "remote_storage_plugin.kvpool.ttl: 600",
        "remote_storage_plugin.kvpool.checksum: true",
        "remote_storage_plugin.kvpool.window: 3",
        f'remote_storage_plugin.kvpool.prefix: "{prefix}"',
    )
    manager = cases.make_manager(cases.load_config(text, tmp_path))
    try:
        connector = manager.storage_backends[cases.BACKEND].connection.getWrappedConnector()
        assert connector.store.timeout == 2.5
        ev = cases.round_trip(manager, n=3, partial=4)
    finally:
        manager.close()
    assert [d["digest"] for d in ev["batched"]] == ev["written"]["digests"]
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    try:
        names = client.keys(prefix + "*")
        assert len(names) == 3  # 4 put under the prefix, 1 removed
        for name in names:
            assert 0 < client.ttl(name) <= 600
            assert decode_header(client.get(name), "test").payload_crc is not None
    finally:
        client.close()


def test_two_instances_are_two_backends(tmp_path: Path, redis_server, lmc) -> None:
    text = cases.SIZES + textwrap.dedent(
        f"""\
        remote_serde: "naive"
        remote_storage_plugins: ["kvpool.hot", "kvpool.cold"]
        extra_config:
          remote_storage_plugin.kvpool.hot.module_path: kvpool.integrations.lmcache.remote
          remote_storage_plugin.kvpool.hot.class_name: KVPoolConnectorAdapter
          remote_storage_plugin.kvpool.hot.url: "{redis_server.url}/0"
          remote_storage_plugin.kvpool.hot.timeout: 3
          remote_storage_plugin.kvpool.cold.module_path: kvpool.integrations.lmcache.remote
          remote_storage_plugin.kvpool.cold.class_name: KVPoolConnectorAdapter
          remote_storage_plugin.kvpool.cold.url: "file://{tmp_path}/cold"
        """
    )
    manager = cases.make_manager(cases.load_config(text, tmp_path))
    try:
        names = list(manager.storage_backends)
        assert names == ["LocalCPUBackend", "RemoteBackend-kvpool.hot", "RemoteBackend-kvpool.cold"]
        stores = {}
        for name in names[1:]:
            connector = manager.storage_backends[name].connection.getWrappedConnector()
            stores[name] = type(connector.store).__name__
            ev = cases.round_trip(manager, n=2, partial=3, name=name)
            assert [d["digest"] for d in ev["batched"]] == ev["written"]["digests"], name
        hot = manager.storage_backends["RemoteBackend-kvpool.hot"].connection
        assert hot.getWrappedConnector().store.timeout == 3
    finally:
        manager.close()
    assert stores == {
        "RemoteBackend-kvpool.hot": "AsyncRedisStore",
        "RemoteBackend-kvpool.cold": "AsyncFileStore",
    }
    assert any((tmp_path / "cold").iterdir())


def test_an_instance_and_one_named_under_it(tmp_path: Path, redis_server, lmc) -> None:
    # remote_storage_plugin.kvpool.cold.* starts with kvpool's prefix, and is not kvpool's.
    text = cases.SIZES + textwrap.dedent(
        f"""\
        remote_serde: "naive"
        remote_storage_plugins: ["kvpool", "kvpool.cold"]
        extra_config:
          remote_storage_plugin.kvpool.module_path: kvpool.integrations.lmcache.remote
          remote_storage_plugin.kvpool.class_name: KVPoolConnectorAdapter
          remote_storage_plugin.kvpool.url: "{redis_server.url}/0"
          remote_storage_plugin.kvpool.timeout: 3
          remote_storage_plugin.kvpool.cold.module_path: kvpool.integrations.lmcache.remote
          remote_storage_plugin.kvpool.cold.class_name: KVPoolConnectorAdapter
          remote_storage_plugin.kvpool.cold.url: "file://{tmp_path}/cold"
          remote_storage_plugin.kvpool.cold.durable: false
        """
    )
    manager = cases.make_manager(cases.load_config(text, tmp_path))
    try:
        names = list(manager.storage_backends)
        assert names == ["LocalCPUBackend", cases.BACKEND, "RemoteBackend-kvpool.cold"]
        stores = {}
        for name in names[1:]:
            connector = manager.storage_backends[name].connection.getWrappedConnector()
            stores[name] = (type(connector.store).__name__, connector.settings.options)
            ev = cases.round_trip(manager, n=2, partial=3, name=name)
            assert [d["digest"] for d in ev["batched"]] == ev["written"]["digests"], name
    finally:
        manager.close()
    assert stores == {
        cases.BACKEND: ("AsyncRedisStore", {"timeout": 3}),
        "RemoteBackend-kvpool.cold": ("AsyncFileStore", {"durable": False}),
    }


def run_child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter of this environment (no install(), no conftest)."""
    child_env = {**os.environ, **env}
    child_env.pop("KVPOOL_LMCACHE", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=child_env,
        cwd=str(REPO),
    )


def test_import_kvpool_never_imports_lmcache_and_the_plugin_imports_cleanly() -> None:
    proc = run_child(
        """
        import sys
        import kvpool, kvpool.remote, kvpool.integrations.lmcache
        assert not [m for m in sys.modules if m.split(".")[0] == "lmcache"], "lmcache imported"
        import kvpool.integrations.lmcache.remote as plugin
        assert plugin.KVPoolConnectorAdapter.__module__ == "kvpool.integrations.lmcache.remote"
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_start_up_logs_one_info_line_with_the_url_redacted(tmp_path: Path) -> None:
    # What a user checks: LMCache's log at its default level shows the plugin and its store.
    text = cases.config_text("redis://:s3cretPW@127.0.0.1:1/0")
    proc = run_child(
        f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO / "tests" / "compat")!r})
        import plugin_cases as cases
        manager = cases.make_manager(cases.load_config({text!r}, Path({str(tmp_path)!r})))
        print(list(manager.storage_backends))
        manager.close()
        """,
        LMCACHE_LOG_LEVEL="INFO",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'RemoteBackend-kvpool'" in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if "kvpool plugin 'kvpool': " in ln]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "AsyncRedisStore at redis://***@127.0.0.1:1/0" in lines[0]
    assert "RemoteBackend-kvpool" in lines[0]
    assert "s3cretPW" not in proc.stderr + proc.stdout
