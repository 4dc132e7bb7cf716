"""``kvpool demo``: the main job, run for real in a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hugepage_pool import reserve_hugepages


def demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool", "demo", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_demo_verifies_a_round_trip_on_the_default_store() -> None:
    run = demo("--chunks", "8")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "verified: all 8 chunks" in out
    assert "put: 8 chunks" in out and "get: 8 chunks" in out
    assert "pool stats" in out and "resident memory" in out
    assert "freed while views" not in out + run.stderr  # the demo uses its views correctly


def test_demo_removes_its_temporary_store() -> None:
    run = demo("--chunks", "2", "--json")
    assert run.returncode == 0, run.stderr
    assert not Path(json.loads(run.stdout)["store"]).exists()


def test_demo_json_reports_positive_figures(tmp_path: Path) -> None:
    run = demo("--chunks", "4", "--store", str(tmp_path), "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["chunks"] == 4 and result["mismatched_chunks"] == 0
    assert result["bytes"] == 4 * 512 * 1024
    assert result["put_GBps"] > 0 and result["get_GBps"] > 0
    assert result["stats"]["active_objects"] == 4
    assert result["store"] == str(tmp_path)
    assert list(tmp_path.iterdir()) == [] or all(p.name.startswith(".") for p in tmp_path.iterdir())


def test_demo_on_shared_numa_memory() -> None:
    name = f"/kvpool-demo-test-{os.getpid()}"
    run = demo("--chunks", "4", "--shm-name", name, "--numa-node", "0")
    assert run.returncode == 0, run.stderr
    assert f"shm_name={name}" in run.stdout and "numa_node=0" in run.stdout
    assert not Path("/dev/shm", name.lstrip("/")).exists()  # the creator unlinked it


def test_demo_refuses_chunks_that_do_not_fit() -> None:
    run = demo("--chunks", "1000", "--size", "64M")
    assert run.returncode == 2
    assert "do not fit" in run.stderr and "--size" in run.stderr


@pytest.mark.parametrize("args", [["--chunks", "0"], ["--size", "lots"], ["--chunks", "x"]])
def test_demo_bad_options_are_usage_errors(args: list[str]) -> None:
    run = demo(*args)
    assert run.returncode == 2
    assert "error" in run.stderr


def test_demo_unreachable_store_is_a_clear_error() -> None:
    run = demo("--chunks", "2", "--store", "redis://127.0.0.1:1/0")
    assert run.returncode == 1
    assert "StoreConnectionError" in run.stderr


def test_demo_help_says_which_pages_the_pool_gets() -> None:
    # It said "used when free" of hugepages, which a default pool never takes.
    done = subprocess.run(
        [sys.executable, "-m", "kvpool", "demo", "--help"], capture_output=True, text=True
    )
    text = " ".join(done.stdout.split())
    assert "when free" not in text.replace("when enough are free", "")
    assert "4 KiB pages unless --hugepages" in text
    assert "KVPOOL_HUGEPAGES=auto" in text


@pytest.mark.hugepages
def test_demo_takes_hugepages_only_when_asked() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KVPOOL_HUGEPAGES"}
    with reserve_hugepages(48):  # the default 64 MiB pool is 32 pages
        plain = subprocess.run(
            [sys.executable, "-m", "kvpool", "demo", "--chunks", "4", "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        auto = demo("--chunks", "4", "--json", env={"KVPOOL_HUGEPAGES": "auto"})
        required = demo("--chunks", "4", "--json", "--hugepages")
    assert plain.returncode == 0 and auto.returncode == 0, plain.stderr + auto.stderr
    assert required.returncode == 0, required.stderr
    assert json.loads(plain.stdout)["pool"]["hugepages"] == "none"
    assert json.loads(auto.stdout)["pool"]["hugepages"] != "none"
    assert json.loads(required.stdout)["pool"]["hugepages"] != "none"


def test_demo_says_pinned_only_of_the_pools_memory() -> None:
    # It printed "pinned=mlock" for the pool, then "0 pinned" for the objects held by pin().
    run = demo("--chunks", "2")
    assert run.returncode == 0, run.stderr
    pool_line = next(line for line in run.stdout.splitlines() if line.startswith("pool: "))
    said = [line for line in run.stdout.splitlines() if "pinned" in line]
    assert said == [pool_line] and re.search(r"pinned=(cuda|mlock|none)\b", pool_line), said
    assert "0 held by pin()" in run.stdout


def test_demo_default_size_floor_is_documented_and_kept() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvpool", "demo", "--help"], capture_output=True, text=True
    )
    assert "at least 64 MiB" in " ".join(done.stdout.split())
    small = demo("--chunks", "2", "--json")  # twice the chunks would be 2 MiB
    assert small.returncode == 0, small.stderr
    assert json.loads(small.stdout)["stats"]["total_bytes"] == 64 << 20
    given = demo("--chunks", "1", "--size", "1MB", "--json")  # a given size is used as it is
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["stats"]["total_bytes"] == 1 << 20
