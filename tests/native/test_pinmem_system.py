"""The capability probe, the NUMA/hugepage helpers and `kvpool info`."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
from pathlib import Path

import pytest

from kvpool import cli
from kvpool.native.machine import Capabilities, capabilities, read_hugepage_info


def test_capabilities_match_the_os() -> None:
    caps = capabilities()
    assert caps.cpu_count == os.cpu_count()
    assert caps.cpu_affinity == len(os.sched_getaffinity(0))
    assert caps.page_size == os.sysconf("SC_PAGESIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert caps.memlock_limit == (None if soft == resource.RLIM_INFINITY else soft)
    assert caps.memlock_hard_limit == (None if hard == resource.RLIM_INFINITY else hard)
    assert caps.mem_total == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert caps.library_path.endswith("libpinmem.so")


def test_hugepage_pools_match_sysfs() -> None:
    caps = capabilities()
    base = Path("/sys/kernel/mm/hugepages")
    sizes = sorted(int(p.name[len("hugepages-") : -2]) for p in base.glob("hugepages-*kB"))
    assert [p.page_size_kib for p in caps.hugepages] == sizes
    pool = caps.hugepage_pool(2048)
    info = read_hugepage_info()
    if info is None:
        assert pool is None
    else:
        assert pool is not None and pool.total == info[0]


def test_thp_mode_matches_sysfs() -> None:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists():
        assert capabilities().thp_mode == "unknown"
        return
    text = path.read_text()
    mode = text[text.index("[") + 1 : text.index("]")]
    assert capabilities().thp_mode == mode


def test_capabilities_are_frozen() -> None:
    caps = capabilities()
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.cpu_count = 99  # type: ignore[misc]


def test_memlock_exemption_matches_capabilities() -> None:
    status = Path("/proc/self/status").read_text()
    cap_eff = int(next(ln for ln in status.splitlines() if ln.startswith("CapEff:")).split()[1], 16)
    assert capabilities().memlock_exempt == bool(cap_eff >> 14 & 1)


def fake_caps(**changes) -> Capabilities:
    return dataclasses.replace(capabilities(), **changes)


def test_advice_names_the_fixes() -> None:
    caps = fake_caps(
        cuda_available=False,
        cuda_error="no CUDA runtime found",
        nvidia_gpus=1,  # CUDA advice is for a machine with a GPU (or a driver)
        hugepages=(),
        memlock_limit=8 << 20,
        memlock_exempt=False,
        thp_mode="never",
        populate_write=False,
    )
    text = "\n".join(caps.advice())
    assert "KVPOOL_CUDART" in text
    assert "no 2 MiB hugepage pool" in text
    assert "ulimit -l unlimited" in text
    assert "transparent_hugepage/enabled" in text
    assert "MADV_POPULATE_WRITE" in text


def test_advice_for_a_short_pool_gives_the_command() -> None:
    from kvpool.native.machine import HugePagePool

    caps = fake_caps(hugepages=(HugePagePool(2048, 10, 3),))
    text = "\n".join(caps.advice())
    assert "echo 2058 | sudo tee /proc/sys/vm/nr_hugepages" in text
    assert "3 free 2 MiB pages of 10 (6 MiB)" in text
    assert "only when asked: use_hugepages=True" in text and "KVPOOL_HUGEPAGES=auto" in text


def test_free_hugepages_that_pools_do_not_take_are_pointed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A default pool takes none of them: `kvpool info` said nothing, and the
    # demo's help said they were "used when free".
    from kvpool.native.machine import HugePagePool

    monkeypatch.delenv("KVPOOL_HUGEPAGES", raising=False)
    caps = fake_caps(hugepages=(HugePagePool(2048, 4096, 4096),))
    text = "\n".join(caps.advice())
    assert "4096 free 2 MiB pages (8 GiB), unused unless asked" in text
    monkeypatch.setenv("KVPOOL_HUGEPAGES", "auto")
    assert not [tip for tip in caps.advice() if tip.startswith("Hugepages")]


def test_good_machine_gets_little_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpool.native.machine import HugePagePool

    monkeypatch.setenv("KVPOOL_HUGEPAGES", "auto")  # its pools take the free hugepages

    caps = fake_caps(
        cuda_available=True,
        cuda_device_count=1,
        hugepages=(HugePagePool(2048, 4096, 4096),),
        memlock_limit=None,
        thp_mode="madvise",
        populate_write=True,
        numa_nodes=(0, 1),
    )
    assert caps.advice() == []


def test_info_prints_the_report(capsys) -> None:
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "kvpool host-memory capabilities" in out
    assert "NUMA " in out and "memlock limit" in out and "MADV_POPULATE_WRITE" in out


def test_info_json(capsys) -> None:
    assert cli.main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cpu_count"] == os.cpu_count()
    assert isinstance(data["hugepages"], list)


def test_cli_needs_a_subcommand(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2


def test_subcommands_can_be_added() -> None:
    def add_extra(subparsers) -> None:
        p = subparsers.add_parser("extra-for-test")
        p.set_defaults(func=lambda args: 7)

    cli.SUBCOMMANDS.append(add_extra)
    try:
        assert cli.main(["extra-for-test"]) == 7
    finally:
        cli.SUBCOMMANDS.remove(add_extra)


def test_python_m_kvpool_info(python, child_env) -> None:
    out = subprocess.run(
        [python, "-m", "kvpool", "info"], env=child_env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "Advice:" in out.stdout or "kvpool host-memory capabilities" in out.stdout


def test_info_without_the_library(python, child_env) -> None:
    env = dict(child_env, KVPOOL_LIBPINMEM="/nowhere/libpinmem.so")
    out = subprocess.run([python, "-m", "kvpool", "info"], env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert "/nowhere/libpinmem.so" in out.stderr
