"""The sglang_hicache benchmark runs: tiny sizes, one round, real SGLang and real servers.

Speed is never asserted here: the tests check that the benchmark measures
every pair it can start (kvpool's backend and SGLang's own - HiCacheFile,
MooncakeStore - or redis-benchmark, on the same server, every page read
back checked by the benchmark itself), writes its JSON, runs from ``kvpool
bench``, and says clearly when SGLang is missing.  Each run is a child
process with a liveness bound.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool.cli.bench.sglang_hicache import PAIRS

REPO = Path(__file__).resolve().parents[2]
LIVENESS_S = 600


def run(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python *args`` from the checkout, output captured, within the liveness bound."""
    return subprocess.run(
        [python, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LIVENESS_S,
        env={**os.environ, "MC_LOG_LEVEL": "ERROR"},
        check=False,
    )


def _expected() -> set[str]:
    """The pairs this machine can start (redis-* and Mooncake's binaries may be absent)."""
    import importlib.util

    pairs = {"file_shm", "file_disk"}
    if all(shutil.which(b) for b in ("redis-server", "redis-cli", "redis-benchmark")):
        pairs |= {"redis", "cluster"}
    if importlib.util.find_spec("mooncake") is not None:
        pairs.add("mooncake")
    return pairs


def test_every_pair_is_measured_and_reported(tmp_path: Path) -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    out = tmp_path / "sglang_hicache.json"
    done = run(
        sys.executable,
        "-m",
        "kvpool.cli.bench.sglang_hicache",
        "--rounds",
        "1",
        "--pages",
        "2",
        "--disk-dir",
        str(tmp_path),
        "--json",
        str(out),
    )
    result = json.loads(out.read_text())
    expected = _expected()
    assert set(result["pairs"]) == expected, (result["errors"], done.stderr[-2000:])
    assert done.returncode == (0 if expected == {"file_shm", "file_disk", "mooncake", "redis",
                                                 "cluster"} else 1)  # fmt: skip
    for name, row in result["pairs"].items():
        for op in ("set", "get"):
            figures = row[op]
            assert len(figures["ratios"]) == 1, (name, op)
            assert figures["kvpool_mib_s"] > 0 and figures["other_mib_s"] > 0, (name, op)
            kv = result["samples"][name]["kvpool"][f"{op}_s"][0]
            other = result["samples"][name][figures["other"]][f"{op}_s"][0]
            assert figures["ratio"] == other / kv
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith(f"{name} "))
        assert "x (rounds" in line
    assert set(result["pairs"]["file_disk"]["set"]["bounds"]) == {"bare os.write/os.preadv"}
    assert result["pairs"]["file_shm"]["set"]["other"] == "HiCacheFile"
    if "mooncake" in result["pairs"]:
        assert result["pairs"]["mooncake"]["get"]["other"] == "SGLang MooncakeStore"
    assert "(tmpfs)" in result["info"]["where"]["file_shm"]
    assert not list(tmp_path.glob("kvpool-sglang-bench-*"))  # its folders are removed


def test_kvpool_bench_runs_it(tmp_path: Path) -> None:
    listed = run(sys.executable, "-m", "kvpool", "bench", "--list")
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith("sglang_hicache"))
    assert "cannot run here" not in line
    out = tmp_path / "bench.json"
    done = run(
        sys.executable,
        "-m",
        "kvpool",
        "bench",
        "--only",
        "sglang_hicache",
        "--quick",
        "--repeat",
        "1",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    bench = json.loads(out.read_text())["benchmarks"]["sglang_hicache"]
    assert bench["status"] == "ok", bench["note"]
    expected = _expected()
    assert set(bench["info"]["errors"]) == set(PAIRS) - expected
    keys = {f"{p}_{op}" for p in expected for op in ("set", "get")}
    # Every pair has its rows; those of a pair that cannot start here say why.
    assert set(bench["metrics"]) == {f"{p}_{op}" for p in PAIRS for op in ("set", "get")}
    assert set(bench["left_out"]) == set(bench["metrics"]) - keys
    for key in keys:
        assert bench["metrics"][key]["ratio"] is not None, key
    bound = bench["metrics"]["file_shm_set"]["variants"]["bare file I/O (bound)"]
    assert bound["best"] > 0
    assert "sglang_hicache" in done.stdout


def test_without_sglang_it_says_so_and_fails() -> None:
    # The interpreter this venv was made from has kvpool but not SGLang.
    base = getattr(sys, "_base_executable", sys.executable)
    done = run(base, "-m", "kvpool.cli.bench.sglang_hicache", "--rounds", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "SGLang is not installed in this Python" in done.stderr
    done = run(base, "-m", "kvpool", "bench", "--only", "sglang_hicache")
    assert done.returncode == 2, done.stdout + done.stderr
