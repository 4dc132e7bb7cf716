"""``kvpool bench --only async_put_get`` end to end, on the real servers it starts.

It asserts that both halves (cluster, Mooncake) ran, each store was
measured by both variants, the paired and CPU figures are there and the
chunks read back were verified; nothing about speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_bench import kvpool_cli

from kvpool.cli.bench import SkipBenchmark
from kvpool.cli.bench.cluster_put_get import cluster_binaries
from kvpool.cli.bench.mooncake_put_get import mooncake_folder

pytestmark = [pytest.mark.redis, pytest.mark.mooncake]


def test_async_put_get_runs_both_halves(tmp_path: Path) -> None:
    try:
        cluster_binaries()
        mooncake_folder()
    except SkipBenchmark as exc:
        pytest.skip(f"the benchmark's servers cannot start here: {exc}")
    out = tmp_path / "bench.json"
    # Three trials: one per store (cluster, Mooncake, Mooncake headerless), both variants each.
    proc = kvpool_cli(
        "bench", "--repeat", "3", "--scale", "0.01", "--only", "async_put_get", "--json", str(out)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bench = json.loads(out.read_text())["benchmarks"]["async_put_get"]
    assert bench["status"] == "ok", bench
    assert bench["info"]["verified"] is True
    assert "cleanup_errors" not in bench["info"]
    keys = sorted(
        f"{s}_{op}" for s in ("cluster", "mooncake", "headerless") for op in ("put", "get")
    )
    assert sorted(bench["metrics"]) == keys
    for key, metric in bench["metrics"].items():
        for variant in (bench["subject"], bench["baseline"]):
            trials = metric["variants"][variant]["trials"]
            assert len(trials) == 1 and trials[0] > 0, (key, variant, trials)
        assert metric["ratio"] > 0
    assert sorted(bench["info"]["paired_ratio_median"]) == keys
    assert all(r > 0 for r in bench["info"]["paired_ratio_median"].values())
    cpu = bench["info"]["client_cpu_ms_median"]
    assert sorted(cpu) == ["async", "blocking"]
    assert all(sorted(cpu[k]) == keys for k in cpu)
