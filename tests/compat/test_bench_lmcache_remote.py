"""The lmcache_remote benchmark runs: tiny sizes, one round, real LMCache and real servers.

Speed is never asserted here: the tests check that the benchmark measures
every pair (LMCache's StorageManager round trip through each of LMCache's
connectors and through kvpool's plugin, the chunks read back verified by
the benchmark itself), prints its rows, writes its JSON, ends although
LMCache's Redis connectors never close, and says clearly when LMCache is
missing.  Each run is a child process with a liveness bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAIRS = ("redis", "resp", "cluster", "file", "mooncake", "mooncake_nometa")
LIVENESS_S = 600


def run(
    python: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python *args`` from the checkout, output captured, within the liveness bound."""
    return subprocess.run(
        [python, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LIVENESS_S,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_every_pair_is_measured_and_reported(tmp_path: Path) -> None:
    out = tmp_path / "lmcache_remote.json"
    done = run(
        sys.executable,
        "-m",
        "kvpool.cli.bench.lmcache_remote",
        "--rounds",
        "1",
        "--chunks",
        "2",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
    assert set(PAIRS) <= rows, done.stdout
    result = json.loads(out.read_text())
    assert list(result["pairs"]) == list(PAIRS)
    for key, row in result["pairs"].items():
        assert "errors" not in row, (key, row["errors"])
        for what in ("put", "get"):
            assert row[what]["rounds"] == [1, 1], (key, what)
            assert row[what]["kvpool_s"] > 0 and row[what]["lmcache_s"] > 0, (key, what)
            assert row[what]["ratio"] == row[what]["lmcache_s"] / row[what]["kvpool_s"]
    built = result["info"]["built"]
    assert {built[n]["backend"] for n in built if n.startswith("kvpool-")} == {
        "RemoteBackend-kvpool"
    }
    assert built["lmcache-redis"]["connector"] == "RedisConnector"
    assert built["lmcache-mooncake"]["connector"] == "MooncakestoreConnector"
    # kvpool's connector closes; the run ended even where LMCache's did not.
    closes = result["info"]["close"]
    assert all(closes[n] == "ok" for n in built if n.startswith("kvpool-")), closes


def test_kvpool_bench_runs_it(tmp_path: Path) -> None:
    listed = run(sys.executable, "-m", "kvpool", "bench", "--list")
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith("lmcache_remote"))
    assert "cannot run here" not in line
    out = tmp_path / "bench.json"
    done = run(
        sys.executable,
        "-m",
        "kvpool",
        "bench",
        "--only",
        "lmcache_remote",
        "--quick",
        "--repeat",
        "1",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    bench = json.loads(out.read_text())["benchmarks"]["lmcache_remote"]
    assert bench["status"] == "ok", bench["note"]
    assert bench["info"]["errors"] == {}
    keys = {f"{p}_{w}" for p in PAIRS for w in ("put", "get")}
    assert set(bench["metrics"]) == keys
    for key, metric in bench["metrics"].items():
        assert metric["ratio"] is not None, key
    assert "lmcache_remote" in done.stdout


def test_without_lmcache_it_says_so_and_fails() -> None:
    # The interpreter this venv was made from has kvpool but not LMCache.
    base = getattr(sys, "_base_executable", sys.executable)
    done = run(base, "-m", "kvpool.cli.bench.lmcache_remote", "--rounds", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "LMCache is not installed in this Python" in done.stderr
    done = run(base, "-m", "kvpool", "bench", "--only", "lmcache_remote")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "lmcache_remote cannot run here: LMCache is not installed" in done.stderr


def test_an_lmcache_that_does_not_import_is_reported(tmp_path: Path) -> None:
    fake = tmp_path / "lmcache"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('this LMCache is broken on purpose')\n")
    done = run(
        sys.executable,
        "-m",
        "kvpool.cli.bench.lmcache_remote",
        "--rounds",
        "1",
        "--chunks",
        "2",
        "--only-stores",
        "file",
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "LMCache cannot be imported here" in done.stderr
    assert "broken on purpose" in done.stderr


def test_passes_spreads_a_file_folder_and_this_checkouts_kvpool(tmp_path: Path) -> None:
    # A kvpool that fails to import first on PYTHONPATH: the side processes
    # (started in a folder of their own) must still import this checkout's.
    shadow = tmp_path / "shadow" / "kvpool"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the wrong kvpool')\n")
    folder = tmp_path / "files"
    folder.mkdir()
    out = tmp_path / "passes.json"
    done = run(
        sys.executable,
        "-m",
        "kvpool.cli.bench.lmcache_remote",
        "--rounds",
        "2",
        "--passes",
        "2",
        "--chunks",
        "2",
        "--only-stores",
        "file",
        "--file-dir",
        str(folder),
        "--json",
        str(out),
        env={"PYTHONPATH": str(tmp_path / "shadow")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["settings"]["passes"] == 2
    assert result["settings"]["file_dir"] == str(folder)
    assert result["info"]["servers"]["file"].startswith(f"folders under {folder}")
    row = result["pairs"]["file"]
    for what in ("put", "get"):
        assert row[what]["rounds"] == [4, 4], what  # 2 rounds x 2 passes
        assert all(s is not None and s >= 0 for s in row[what]["spread"]), row[what]
        low, high = row[what]["range_s"][0]
        assert 0 < low <= row[what]["kvpool_s"] <= high
    assert "spread" in done.stdout and "2 pass(es)" in done.stdout
    assert list(folder.iterdir()) == []  # the run's folder is removed at the end
    bench = "kvpool.cli.bench.lmcache_remote"
    done = run(sys.executable, "-m", bench, "--file-dir", "/nonexistent")
    assert done.returncode == 2 and "no such folder" in done.stderr
