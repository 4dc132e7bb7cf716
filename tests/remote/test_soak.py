"""The short soak: 20,000 FileStore put/get cycles must not grow resident memory.

A memory check, not a timing: ``python -m kvpool.cli.bench.soak`` (the same
code) runs the 1,000,000-cycle version.
"""

from __future__ import annotations

from kvpool.cli.bench.soak import run_soak

CYCLES = 20_000
MAX_GROWTH = 2 << 20


def test_soak_rss_growth_below_2_mib() -> None:
    res = run_soak(CYCLES, warmup=2000)
    assert res["cycles"] == CYCLES
    assert res["rss_growth_bytes"] < MAX_GROWTH, res
    assert res["rss_max_growth_bytes"] < MAX_GROWTH, res
