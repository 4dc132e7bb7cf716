"""The vllm_tier benchmark runs: tiny sizes, one round, real vLLM tiers and real servers.

Speed is never asserted here: the tests check that the benchmark measures
every pair it can start (kvpool's tier and vLLM's own ``fs`` tier, or
redis-benchmark, on the same storage, every loaded chunk checked by the
benchmark itself), writes its JSON, runs from ``kvpool bench``, says clearly
when vLLM is missing, and drives kvpool's directory tier on its fast path.
Each run of the command is a child process with a liveness bound.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIVENESS_S = 600
PAIRS = {"file_shm", "file_disk", "redis"}


def run(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python *args`` from the checkout, output captured, within the liveness bound."""
    return subprocess.run(
        [python, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LIVENESS_S,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
        check=False,
    )


def _expected() -> set[str]:
    """The pairs this machine can start (redis-* may be absent)."""
    pairs = {"file_shm", "file_disk"}
    if all(shutil.which(b) for b in ("redis-server", "redis-benchmark")):
        pairs.add("redis")
    return pairs


def test_every_pair_is_measured_and_reported(tmp_path: Path) -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    out = tmp_path / "vllm_tier.json"
    regions = set(Path("/dev/shm").glob("vllm_offload_kvpool-bench-*"))
    done = run(
        sys.executable,
        "-m",
        "kvpool.cli.bench.vllm_tier",
        "--rounds",
        "1",
        "--sizes",
        "256K,64K",
        "--round-bytes",
        "1M",
        "--job-chunks",
        "3",
        "--disk-dir",
        str(tmp_path),
        "--json",
        str(out),
    )
    result = json.loads(out.read_text())
    names = {f"{p}/{s}" for p in _expected() for s in ("256K", "64K")}
    assert set(result["pairs"]) == names, (result["errors"], done.stderr[-2000:])
    assert done.returncode == (0 if _expected() == PAIRS else 1), done.stderr[-2000:]
    assert result["info"]["chunks"] == {"256K": 4, "64K": 16}
    for name, row in result["pairs"].items():
        for op in ("store", "load"):
            figures = row[op]
            assert len(figures["ratios"]) == 1, (name, op)
            assert figures["kvpool_gb_s"] > 0 and figures["other_gb_s"] > 0, (name, op)
            kv = result["samples"][name]["kvpool"][f"{op}_s"][0]
            other = result["samples"][name][figures["other"]][f"{op}_s"][0]
            assert figures["ratio"] == other / kv
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith(f"{name} "))
        assert "x (rounds" in line
    shm = result["pairs"]["file_shm/256K"]["store"]
    assert shm["other"] == "vLLM fs"
    assert "bare write+rename/readv" in shm["bounds"]
    assert set(shm["cpu_us_per_chunk"]) >= {"kvpool", "vLLM fs"}
    assert "(tmpfs;" in result["info"]["where"]["file_shm/64K"]
    # On a disk, the device's rate with the tier's requests in flight is a bound too.
    deep = [b for b in result["pairs"]["file_disk/256K"]["load"]["bounds"] if "threads" in b]
    on_disk = "(tmpfs;" not in result["info"]["where"]["file_disk/256K"]
    assert len(deep) == (1 if on_disk else 0), result["pairs"]["file_disk/256K"]["load"]
    assert not [b for b in shm["bounds"] if "threads" in b]
    assert not list(tmp_path.glob("kvpool-vllm-bench-*"))  # its folders are removed
    # vLLM's primary regions are removed too.
    assert set(Path("/dev/shm").glob("vllm_offload_kvpool-bench-*")) <= regions


def test_kvpool_bench_runs_it(tmp_path: Path) -> None:
    listed = run(sys.executable, "-m", "kvpool", "bench", "--list")
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith("vllm_tier"))
    assert "cannot run here" not in line
    out = tmp_path / "bench.json"
    done = run(
        sys.executable,
        "-m",
        "kvpool",
        "bench",
        "--only",
        "vllm_tier",
        "--quick",
        "--repeat",
        "1",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    bench = json.loads(out.read_text())["benchmarks"]["vllm_tier"]
    assert bench["status"] == "ok", bench["note"]
    assert bench["info"]["errors"] == {}
    sizes, ops = ("2M", "256K"), ("store", "load")
    keys = {f"{p}_{s}_{op}" for p in _expected() for s in sizes for op in ops}
    measured = {k for k, m in bench["metrics"].items() if m["ratio"] is not None}
    assert measured == keys
    bound = bench["metrics"]["file_shm_2M_store"]["variants"]["bare write+rename/readv (bound)"]
    assert bound["best"] > 0
    assert "vllm_tier" in done.stdout


def test_without_vllm_it_says_so_and_fails() -> None:
    # The interpreter this venv was made from has kvpool but not vLLM.
    base = getattr(sys, "_base_executable", sys.executable)
    done = run(base, "-m", "kvpool.cli.bench.vllm_tier", "--rounds", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "vLLM is not installed in this Python" in done.stderr
    listed = run(base, "-m", "kvpool", "bench", "--list")
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith("vllm_tier"))
    assert "cannot run here: vLLM is not installed" in line
    done = run(base, "-m", "kvpool", "bench", "--only", "vllm_tier")
    assert done.returncode == 2, done.stdout + done.stderr


def test_the_directory_tier_moves_rows_as_ranges(tmp_path: Path) -> None:
    # No memory object per row: the rows go to the directory store as address ranges.
    from kvpool.cli.bench import vllm_tier_pairs as vp

    rows = vp.Rows(4, 64 << 10)
    tier = None
    try:
        tier = vp.Tier("kvpool", vp.kvpool_entry(str(tmp_path / "kv")), rows, job_chunks=3)
        tier.round(rows, rows.keys())
        calls = tier.tier.store.counters.snapshot()
        assert calls["put_ranges"].entries == 4 and calls["get_ranges"].entries == 4, calls
        assert "batched_put" not in calls and "batched_get" not in calls
    finally:
        if tier is not None:
            tier.close()
        rows.close()
