"""The pool-readiness benchmarks run and report well-formed figures (no speed is asserted)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hugepage_pool import reserve_hugepages

from kvpool.cli.bench import bare, lazy_first, populate_variants
from kvpool.cli.bench.core import Settings
from kvpool.cli.bench.pool_ready import DEFAULT_POOL, POOL_READY

MIB = 1 << 20


@pytest.mark.parametrize("method", bare.bare_methods(2, locking=False), ids=lambda m: m.name)
def test_every_bare_method_makes_the_mapping_resident(method: bare.BareMethod) -> None:
    seconds = method(8 * MIB)  # raises when a page was left out
    assert seconds > 0 and math.isfinite(seconds)


def test_pool_ready_case_has_the_default_pool_torch_and_the_bare_methods() -> None:
    case = POOL_READY.setup(Settings(size=8 * MIB, quick=True))
    assert case.subject == DEFAULT_POOL and case.baseline == "torch.zeros"
    for name in bare.METHODS:
        assert f"bare {name}" in case.variants
    for trial in case.variants.values():
        figures = trial()
        assert figures["ready"] > 0
    assert "populate_method" in case.info and "populate_probe" in case.info
    assert "pinned=" in case.info["got"][DEFAULT_POOL]


def test_populate_variants_side_by_side_with_json_and_plot(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the test extra has it)")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    code = populate_variants.main(
        ["--size", "8M", "--trials", "1", "--json", str(out), "--plot", str(png)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "default pool:" in printed and "x the fastest bare method" in printed
    result = json.loads(out.read_text())
    (phase,) = result["phases"].values()
    assert DEFAULT_POOL in phase["gbps"] and "torch.zeros" in phase["gbps"]
    assert phase["best_bare"].startswith("bare ")
    assert phase["pool_vs_torch"] > 0 and phase["pool_vs_best_bare"] > 0
    assert phase["huge_pool_vs_torch"] is None  # no hugepage phase without --hugepages
    assert png.stat().st_size > 1000


@pytest.mark.hugepages
def test_populate_variants_hugepage_phase_has_the_pool_that_asks() -> None:
    # The default pool keeps 4 KiB pages; the pool asking for hugepages and
    # allocate_host(hugepages="auto") get hugetlb pages.  12 pages: two 8 MiB
    # buffers are never alive at once, and the bare hugetlb methods need 4.
    with reserve_hugepages(12):
        phase = populate_variants.run_phase(8 * MIB, 1, 2, hugetlb=True)
    summary = populate_variants.summarize(8 * MIB, phase)
    assert "hugepages=none" in phase["got"][DEFAULT_POOL]
    assert "hugetlb-2MiB" in phase["got"][populate_variants.HUGE_POOL]
    assert "hugetlb-2MiB" in phase["got"][populate_variants.ALLOCATE_HOST]
    assert summary["huge_pool_vs_torch"] > 0 and summary["huge_pool_vs_best_bare"] > 0
    assert any(name.startswith("bare hugetlb") for name in summary["gbps"])


def test_populate_variants_refuses_bad_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        populate_variants.main(["--trials", "0"])
    assert info.value.code == 2


def test_lazy_first_allocation_of_a_pool_larger_than_ram(capsys) -> None:
    from kvpool.native.machine import capabilities

    size = 2 * capabilities().mem_total
    result = lazy_first.first_allocation(size, grow=0.0)
    assert 0 < result["construct_s"] <= result["first_s"]
    assert result["committed_after_grow"] >= 32 * MIB
    assert lazy_first.main(["--size", str(size), "--trials", "1", "--grow", "0"]) == 0
    assert "first allocation at" in capsys.readouterr().out
