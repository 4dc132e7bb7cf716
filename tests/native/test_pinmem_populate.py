"""Population: the whole size resident, with and without MADV_POPULATE_WRITE."""

from __future__ import annotations

import subprocess

import pytest

from kvpool import errors, native
from kvpool.native.buffer import allocate_host, attach_shm
from kvpool.native.machine import capabilities

MIB = 1 << 20


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_populate_makes_everything_resident(threads: int, smaps, options) -> None:
    native.option_set("min_thread_bytes", 4 * MIB)
    with allocate_host(40 * MIB + 4096, pin="none", threads=threads) as buf:
        assert buf.threads_used == threads
        assert native.resident_bytes(buf.address, buf.mapped_size) == buf.mapped_size
        assert smaps.fields(buf.address, buf.mapped_size)["Rss"] == buf.mapped_size
        # The method is the plan's: a probe of both methods picks it (madvise
        # unless first touch measured clearly faster), so on a busy machine it
        # may be first touch even where MADV_POPULATE_WRITE exists.
        plan = native.populate_plan().method
        expected = plan if capabilities().populate_write else "first-touch"
        assert buf.populate_method == expected


def test_small_mappings_use_one_thread(options) -> None:
    native.option_set("min_thread_bytes", 64 * MIB)
    with allocate_host(8 * MIB, pin="none", threads=8) as buf:
        assert buf.threads_used == 1


def test_without_populate_write_first_touch_still_fills_everything(smaps, options) -> None:
    native.option_set("use_populate_write", 0)
    native.option_set("min_thread_bytes", 4 * MIB)
    with allocate_host(24 * MIB + 1, pin="none", threads=2) as buf:
        assert buf.populate_method == "first-touch"
        assert buf.threads_used == 2
        assert smaps.fields(buf.address, buf.mapped_size)["Rss"] == buf.mapped_size
        assert buf.memoryview()[buf.size - 1] == 0


def test_first_touch_attach_keeps_the_contents(options) -> None:
    name = "/kvpool-test-populate-keep"
    native.option_set("use_populate_write", 0)
    with allocate_host(4 * MIB, pin="none", shm_name=name, shm_reuse=True) as owner:
        owner.memoryview()[4096 * 3] = 99
        with attach_shm(name, pin="none", populate=True) as other:
            assert other.populate_method == "first-touch"
            assert other.memoryview()[4096 * 3] == 99
            assert native.resident_bytes(other.address, other.mapped_size) == other.mapped_size


def test_populate_write_absent_via_environment(python, child_env) -> None:
    env = dict(child_env, KVPOOL_USE_POPULATE_WRITE="0")
    code = (
        "from kvpool.native.buffer import allocate_host\n"
        "from kvpool import native\n"
        "b = allocate_host(8 << 20, pin='none')\n"
        "full = native.resident_bytes(b.address, b.mapped_size) == b.mapped_size\n"
        "print(b.populate_method, full)\n"
    )
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["first-touch", "True"]


def test_native_populate_helper() -> None:
    region = native.alloc(8 * MIB, pin="none", populate=False)
    try:
        assert native.resident_bytes(region.address, region.mapped_size) == 0
        method, used = native.populate(region.address, region.mapped_size, threads=2)
        assert method in ("madvise", "first-touch")
        assert used >= 1
        assert native.resident_bytes(region.address, region.mapped_size) == region.mapped_size
        with pytest.raises(errors.InvalidArgumentError, match="aligned"):
            native.populate(region.address + 1, 4096)
    finally:
        native.free(region.address)


def test_threads_option_default(options) -> None:
    caps = capabilities()
    # The populate plan's count: the rule's (CPUs, at most 16) until the probe ran.
    assert caps.default_populate_threads == native.populate_plan().threads
    if not native.populate_probe("report").probed:
        assert caps.default_populate_threads == min(caps.cpu_affinity, 16)
    native.option_set("populate_threads", 1)
    assert capabilities().default_populate_threads == 1
