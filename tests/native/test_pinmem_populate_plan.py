"""The populate plan: the decision with the platform faked, the probe for real, the overrides."""

from __future__ import annotations

import subprocess

import pytest

from kvpool import errors, native
from kvpool.native.buffer import allocate_host
from kvpool.native.calls import PopulateFacts
from kvpool.native.machine import capabilities

MIB = 1 << 20


def facts(**kw: object) -> PopulateFacts:
    base: dict[str, object] = {"probed": True, "populate_write": True, "cpus": 8}
    base.update(kw)
    return PopulateFacts(**base)  # type: ignore[arg-type]


# ------------------------------------------------------ decision, faked


def test_rule_without_a_probe() -> None:
    plan = native.populate_decide(PopulateFacts(probed=False, populate_write=True, cpus=64))
    assert (plan.method, plan.method_source) == ("madvise", "rule")
    assert (plan.threads, plan.threads_source) == (16, "rule")  # at most 16
    plan = native.populate_decide(PopulateFacts(probed=False, populate_write=False, cpus=3))
    assert (plan.method, plan.threads) == ("first-touch", 3)


@pytest.mark.parametrize(
    ("madvise", "touch", "method"),
    [(3.0, 2.0, "madvise"), (2.0, 2.4, "madvise"), (2.0, 2.6, "first-touch")],
)
def test_method_from_measurements(madvise: float, touch: float, method: str) -> None:
    plan = native.populate_decide(facts(madvise_gbps=madvise, touch_gbps=touch))
    assert (plan.method, plan.method_source) == (method, "probe")


def test_kernel_without_populate_write_means_first_touch_whatever_was_measured() -> None:
    plan = native.populate_decide(facts(populate_write=False, madvise_gbps=9.0, touch_gbps=1.0))
    assert plan.method == "first-touch"


@pytest.mark.parametrize("cpus", [1, 2, 8, 16, 64])
def test_threads_follow_the_rule_after_a_probe(cpus: int) -> None:
    plan = native.populate_decide(facts(cpus=cpus, madvise_gbps=2.0, touch_gbps=1.0))
    assert (plan.threads, plan.threads_source) == (min(cpus, 16), "rule")
    assert plan.method_source == "probe"


@pytest.mark.parametrize(
    "bad",
    [
        facts(madvise_gbps=-1.0),
        facts(touch_gbps=float("nan")),
        facts(cpus=-1),
        facts(cpus=1 << 40),
    ],
)
def test_bad_facts_are_refused(bad: PopulateFacts) -> None:
    with pytest.raises(errors.InvalidArgumentError):
        native.populate_decide(bad)


def test_decide_takes_facts_only() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="PopulateFacts"):
        native.populate_decide({"probed": True})  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgumentError, match="run must be one of"):
        native.populate_probe("sometimes")


# ------------------------------------------------------ probe, for real


def test_probe_measures_this_machine(options) -> None:
    got = native.populate_probe("once")
    assert got.probed and got.cpus >= 1
    assert got.touch_gbps > 0
    assert (got.madvise_gbps > 0) == got.populate_write
    assert got.bytes >= 24 * MIB and got.seconds > 0
    assert native.populate_probe("report") == got  # kept, not run again
    plan = native.populate_plan()
    assert plan == native.populate_decide(got)
    assert plan.method_source == "probe" and plan.threads_source == "rule"
    caps = capabilities()
    assert caps.populate_method == plan.method
    assert caps.default_populate_threads == plan.threads
    assert caps.populate_probe is not None and caps.populate_probe["probed"]
    assert "populate             " in caps.report() and "probe:" in caps.report()


def test_options_override_the_plan(options) -> None:
    native.option_set("populate_method", 2)
    native.option_set("populate_threads", 3)
    native.option_set("min_thread_bytes", 4 * MIB)
    plan = native.populate_plan()
    assert (plan.method, plan.method_source) == ("first-touch", "option")
    assert (plan.threads, plan.threads_source) == (3, "option")
    with allocate_host(48 * MIB, pin="none") as buf:
        assert (buf.populate_method, buf.threads_used) == ("first-touch", 3)
        assert native.resident_bytes(buf.address, buf.mapped_size) == buf.mapped_size
    with allocate_host(48 * MIB, pin="none", threads=2) as buf:
        assert buf.threads_used == 2  # the caller's count wins over the option
    if capabilities().populate_write:
        native.option_set("populate_method", 1)
        with allocate_host(8 * MIB, pin="none") as buf:
            assert buf.populate_method == "madvise"


CHILD = """
from kvpool import native
from kvpool.native.buffer import allocate_host
print("before", native.populate_probe("report").probed)
with allocate_host({size}, pin="none") as buf:
    pass
plan = native.populate_plan()
print("after", native.populate_probe("report").probed, plan.method, plan.method_source)
"""


@pytest.mark.parametrize(
    ("env", "size", "expected"),
    [
        ({}, 1024 * MIB, ["before False", "after True"]),  # a large populate probes first
        ({}, 64 * MIB, ["before False", "after False"]),  # a small one uses the rule
        ({"KVPOOL_POPULATE_PROBE": "0"}, 1024 * MIB, ["before False", "after False"]),
        ({"KVPOOL_POPULATE_METHOD": "2", "KVPOOL_POPULATE_THREADS": "1"}, 1024 * MIB, None),
    ],
)
def test_probe_runs_once_per_process_when_needed(
    python, child_env, env: dict[str, str], size: int, expected: list[str] | None
) -> None:
    out = subprocess.run(
        [python, "-c", CHILD.format(size=size)],
        env=dict(child_env, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    if expected is None:  # both overridden: nothing left to measure
        assert lines[0] == "before False"
        assert lines[1] == "after False first-touch option"
    else:
        assert [" ".join(line.split()[:2]) for line in lines] == expected


# -------------------------------------------------------- memory room


def test_memory_room_names_its_limit() -> None:
    room, limit = native.memory_room()
    assert room is None or room > 0
    assert limit
    unpinned, _ = native.memory_room(pinned=False)
    assert room is None or (unpinned is not None and unpinned >= room)


def test_commit_beyond_the_room_is_refused_before_touching_anything() -> None:
    room, limit = native.memory_room()
    total = capabilities().mem_total
    if room is None or room > total - 512 * MIB:
        pytest.skip(f"the room ({room}) is too close to RAM ({total}) to exceed it safely")
    size = 3 * total  # a reservation far beyond RAM: address space only
    with allocate_host(size, pin="none", populate=False) as buf:
        over = (room + 256 * MIB) // (2 * MIB) * (2 * MIB)
        with pytest.raises(errors.MemoryLimitError, match=limit):
            buf.commit(0, over, pin="mlock")
        assert buf.committed_bytes == 0
        assert native.resident_bytes(buf.address, 64 * MIB) == 0
