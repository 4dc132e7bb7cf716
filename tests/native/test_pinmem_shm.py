"""POSIX shared memory: names, cross-process use, cleanup after a dead creator."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import textwrap
import uuid

import pytest

from kvpool import errors
from kvpool.native.buffer import allocate_host, attach_shm, unlink_shm

MIB = 1 << 20


@pytest.fixture
def name() -> str:
    value = f"/kvpool-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield value
    if os.path.exists(f"/dev/shm{value}"):
        os.unlink(f"/dev/shm{value}")


def run_child(python: str, env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60
    )


def test_another_process_attaches_reads_and_answers(name, python, child_env) -> None:
    with allocate_host(4 * MIB, shm_name=name) as buf:
        view = buf.memoryview()
        view[:18] = b"hello from parent\0"
        child = run_child(
            python,
            child_env,
            f"""
            from kvpool.native.buffer import attach_shm
            buf = attach_shm({name!r})
            assert buf.shm_owner is False and buf.kind == "shm", buf
            assert buf.size == {4 * MIB}, buf.size
            view = buf.memoryview()
            assert bytes(view[:17]) == b"hello from parent", bytes(view[:17])
            view[{MIB}:{MIB} + 12] = b"child answer"
            del view
            buf.close()
            print("child-ok", buf.pinned)
            """,
        )
        assert child.returncode == 0, child.stderr
        assert "child-ok" in child.stdout
        assert bytes(view[MIB : MIB + 12]) == b"child answer"
        # The attacher's close() detached only: the name is still there.
        assert os.path.exists(f"/dev/shm{name}")
        del view
    assert not os.path.exists(f"/dev/shm{name}")


def test_attach_in_process_sees_the_same_bytes(name) -> None:
    with allocate_host(MIB, shm_name=name, pin="none") as owner:
        with attach_shm(name, pin="none", populate=True) as other:
            assert other.address != owner.address
            owner.memoryview()[5] = 77
            assert other.memoryview()[5] == 77
        with attach_shm(name, 4096, pin="none") as part:
            assert part.size == 4096


def test_attach_larger_than_segment_is_refused(name) -> None:
    with allocate_host(MIB, shm_name=name, pin="none"):
        with pytest.raises(errors.InvalidArgumentError, match="has only"):
            attach_shm(name, 2 * MIB)
        with pytest.raises(errors.InvalidArgumentError):
            attach_shm(name, 0)


def test_existing_name_is_refused_unless_reused(name) -> None:
    with allocate_host(MIB, shm_name=name, pin="none") as first:
        first.memoryview()[0] = 9
        with pytest.raises(errors.SharedMemoryExistsError, match="shm_reuse=True") as info:
            allocate_host(MIB, shm_name=name, pin="none")
        assert isinstance(info.value, FileExistsError)
        assert info.value.errno == errno.EEXIST
        with allocate_host(MIB, shm_name=name, pin="none", shm_reuse=True) as second:
            assert second.memoryview()[0] == 0  # a fresh segment
        # The replacement's close() removed the name; the first buffer's
        # close() must not fail or remove anything else.
    assert not os.path.exists(f"/dev/shm{name}")


def test_first_creator_never_unlinks_its_replacement(name) -> None:
    first = allocate_host(MIB, shm_name=name, pin="none")
    second = allocate_host(MIB, shm_name=name, pin="none", shm_reuse=True)
    first.close()
    assert os.path.exists(f"/dev/shm{name}")
    second.close()
    assert not os.path.exists(f"/dev/shm{name}")


def test_keep_name_on_close_then_unlink(name) -> None:
    buf = allocate_host(MIB, shm_name=name, pin="none", shm_unlink_on_close=False)
    buf.close()
    assert os.path.exists(f"/dev/shm{name}")
    with attach_shm(name, pin="none") as again:
        assert again.size == MIB
    unlink_shm(name)
    assert not os.path.exists(f"/dev/shm{name}")
    with pytest.raises(errors.SharedMemoryNotFoundError):
        unlink_shm(name)


def test_attach_missing_segment(name) -> None:
    with pytest.raises(errors.SharedMemoryNotFoundError, match="no shared-memory segment") as info:
        attach_shm(name)
    assert isinstance(info.value, FileNotFoundError)


def test_dead_creator_leaves_something_a_later_create_cleans_up(name, python, child_env) -> None:
    child = run_child(
        python,
        child_env,
        f"""
        import os, signal
        from kvpool.native.buffer import allocate_host
        buf = allocate_host({MIB}, shm_name={name!r}, pin="none")
        buf.memoryview()[0] = 42
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    assert child.returncode == -signal.SIGKILL
    assert os.path.exists(f"/dev/shm{name}")
    with pytest.raises(errors.SharedMemoryExistsError):
        allocate_host(MIB, shm_name=name, pin="none")
    with attach_shm(name, pin="none") as leftover:
        assert leftover.memoryview()[0] == 42
    with allocate_host(MIB, shm_name=name, pin="none", shm_reuse=True) as fresh:
        assert fresh.memoryview()[0] == 0
    assert not os.path.exists(f"/dev/shm{name}")


def test_creator_exiting_without_close_unlinks_at_exit(name, python, child_env) -> None:
    child = run_child(
        python,
        child_env,
        f"""
        from kvpool.native.buffer import allocate_host
        buf = allocate_host({MIB}, shm_name={name!r}, pin="none")
        keep = buf  # never closed
        """,
    )
    assert child.returncode == 0, child.stderr
    assert not os.path.exists(f"/dev/shm{name}")


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("/a/b", "no '/' after the leading one"),
        ("a/b", "no '/' after the leading one"),
        ("/", "at least one character"),
        ("/" + "x" * 256, "NAME_MAX"),
        ("", "must start with '/'"),
    ],
)
def test_bad_names_are_refused_with_the_rule(bad: str, fragment: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=fragment):
        allocate_host(MIB, shm_name=bad, pin="none")
    with pytest.raises(errors.InvalidArgumentError, match=fragment):
        attach_shm(bad)


def test_a_name_without_the_leading_slash_gets_one() -> None:
    # LMCache names its segments "lmcache_l1_pool_<pid>", as Python's
    # multiprocessing.shared_memory allows.
    name = f"kvpool-noslash-{uuid.uuid4().hex[:12]}"
    try:
        with allocate_host(MIB, shm_name=name, pin="none") as buf:
            buf.memoryview()[:4] = b"kvpl"
            assert os.path.exists(f"/dev/shm/{name}")
            for alias in (name, "/" + name):
                with attach_shm(alias) as other:
                    assert bytes(other.memoryview()[:4]) == b"kvpl"
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


def test_name_type_and_nul_are_refused() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="str"):
        allocate_host(MIB, shm_name=b"/bytes", pin="none")  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgumentError, match="NUL"):
        allocate_host(MIB, shm_name="/a\0b", pin="none")


def test_longest_legal_name_works() -> None:
    name = "/" + "k" * 255
    try:
        with allocate_host(4096, shm_name=name, pin="none") as buf:
            assert buf.size == 4096
    finally:
        if os.path.exists(f"/dev/shm{name}"):
            os.unlink(f"/dev/shm{name}")


def test_hugepages_with_shm_refused(name) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="not supported with shared memory"):
        allocate_host(MIB, shm_name=name, hugepages="required")
    with allocate_host(MIB, shm_name=name, hugepages="auto", pin="none") as buf:
        assert buf.hugepages == "none"
