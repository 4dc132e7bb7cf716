"""NUMA binding: node 0, a missing node, mbind refused (faked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool import errors
from kvpool.native.buffer import allocate_host
from kvpool.native.machine import current_numa_node, numa_nodes

MIB = 1 << 20


def sysfs_nodes() -> list[int]:
    base = Path("/sys/devices/system/node")
    if not base.exists():
        return [0]
    return sorted(int(p.name[4:]) for p in base.glob("node[0-9]*"))


def test_numa_nodes_match_sysfs() -> None:
    assert numa_nodes() == sysfs_nodes()


def test_current_node_is_a_real_node() -> None:
    assert current_numa_node() in numa_nodes()


def test_node_zero_binds_or_reports_the_fallback(smaps) -> None:
    with allocate_host(8 * MIB, pin="none", numa_node=0) as buf:
        assert buf.numa_node == 0
        assert isinstance(buf.numa_bound, bool)
        assert smaps.fields(buf.address, buf.mapped_size)["Rss"] == buf.mapped_size
        if buf.numa_bound and Path("/proc/self/numa_maps").exists():
            with open("/proc/self/numa_maps") as f:
                line = next(ln for ln in f if int(ln.split()[0], 16) == buf.address)
            assert "bind:0" in line


def test_missing_node_names_the_real_ones() -> None:
    missing = max(numa_nodes()) + 7
    with pytest.raises(errors.NumaNodeError) as info:
        allocate_host(MIB, pin="none", numa_node=missing)
    message = str(info.value)
    assert f"NUMA node {missing} does not exist" in message
    for node in numa_nodes():
        assert str(node) in message.split("this machine has", 1)[1]
    assert isinstance(info.value, ValueError)


def test_negative_node_is_invalid() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="numa_node"):
        allocate_host(MIB, numa_node=-1)


def test_mbind_refused_falls_back_unbound(faults, smaps) -> None:
    faults.set("mbind_eperm")
    with allocate_host(8 * MIB, pin="none", numa_node=0) as buf:
        assert buf.numa_bound is False
        assert buf.numa_node == 0
        assert smaps.fields(buf.address, buf.mapped_size)["Rss"] == buf.mapped_size
        buf.memoryview()[0] = 1


def test_production_library_has_no_fault_switches(python, child_env) -> None:
    """The installed library ignores the old fault variables and has no test call."""
    import subprocess

    import kvpool

    production = Path(kvpool.__file__).resolve().parent / "native" / "libpinmem.so"
    with allocate_host(1 << 20, pin="none", numa_node=0) as buf:
        bound_for_real = buf.numa_bound  # no fault switched on here
    env = dict(
        child_env,
        KVPOOL_LIBPINMEM=str(production),
        KVPOOL_FAKE_MBIND_EPERM="1",
        KVPOOL_FAKE_MLOCK_EPERM="1",
    )
    code = (
        "from kvpool import native\n"
        "from kvpool.native.buffer import allocate_host\n"
        "b = allocate_host(1 << 20, pin='none', numa_node=0)\n"
        "try:\n"
        "    native.lib.pinmem_test_set_fault\n"
        "    test_call = True\n"
        "except native.ffi.error:\n"
        "    test_call = False\n"
        "print(native.library_path(), b.numa_bound, test_call)\n"
    )
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(production), str(bound_for_real), "False"]


@pytest.mark.skipif(len(sysfs_nodes()) < 2, reason="needs a machine with two NUMA nodes")
def test_second_node() -> None:  # pragma: no cover - single-node CI machine
    node = numa_nodes()[1]
    with allocate_host(8 * MIB, pin="none", numa_node=node) as buf:
        assert buf.numa_node == node
