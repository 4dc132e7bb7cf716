"""``kvpool bench --only async_put_get`` end to end, on the real servers it starts.

It asserts that both halves (cluster, Mooncake) ran, every variant reported
every store's figures and the chunks read back were verified; nothing
about speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_bench import check_report, kvpool_cli

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
    proc = kvpool_cli(
        "bench", "--repeat", "1", "--scale", "0.01", "--only", "async_put_get", "--json", str(out)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    check_report(report, "async_put_get", repeat=1)
    bench = report["benchmarks"]["async_put_get"]
    assert bench["info"]["verified"] is True
    assert "cleanup_errors" not in bench["info"]
    assert sorted(bench["info"]["paired_ratio_median"]) == sorted(bench["metrics"])
    assert all(r > 0 for r in bench["info"]["paired_ratio_median"].values())
    cpu = bench["info"]["client_cpu_ms_median"]
    assert sorted(cpu) == ["async", "blocking"]
    assert all(sorted(cpu[k]) == sorted(bench["metrics"]) for k in cpu)
    assert sorted(bench["metrics"]) == sorted(
        f"{store}_{op}" for store in ("cluster", "mooncake", "headerless") for op in ("put", "get")
    )
