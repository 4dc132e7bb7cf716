"""The short soak: 20,000 FileStore put/get cycles must not grow resident memory.

A memory check, not a timing: ``bench/soak.py`` (the same code) runs the
1,000,000-cycle version.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
CYCLES = 20_000
MAX_GROWTH = 2 << 20


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvpool_bench_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_soak_rss_growth_below_2_mib() -> None:
    res = _load().run_soak(CYCLES, warmup=2000)
    assert res["cycles"] == CYCLES
    assert res["rss_growth_bytes"] < MAX_GROWTH, res
    assert res["rss_max_growth_bytes"] < MAX_GROWTH, res
