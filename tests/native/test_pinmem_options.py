"""libpinmem options: the table read from C, rejected variables warned about, bad sets refused."""

from __future__ import annotations

import subprocess

import pytest

from kvpool import errors, native

CHILD = """
import warnings
warnings.simplefilter("always")
from kvpool import native
for p in native.option_problems():
    print("problem", p.env, p.text, p.low, p.high, p.default)
print("mlock_mode", native.option_get("mlock_mode"))
print("populate_threads", native.option_get("populate_threads"))
"""


def test_options_come_from_libpinmem() -> None:
    assert set(native.OPTIONS) == {
        "populate_threads",
        "register_chunk",
        "register_threshold",
        "use_populate_write",
        "mlock_mode",
        "min_thread_bytes",
        "auto_fallback_thp",
        "populate_method",
        "populate_probe",
        "register_overlap",
        "register_min_chunk",
    }
    for name, (option, env) in native.OPTIONS.items():
        assert env.startswith("KVPOOL_")
        assert 0 <= option < native.lib.PINMEM_OPT_COUNT
        assert "FAKE" not in env, name


def test_rejected_variables_are_warned_about_by_name(python, child_env) -> None:
    env = dict(child_env, KVPOOL_MLOCK_MODE="7", KVPOOL_MIN_THREAD_BYTES="lots")
    env["KVPOOL_POPULATE_THREADS"] = "1"
    out = subprocess.run([python, "-c", CHILD], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "problem KVPOOL_MLOCK_MODE 7 0 3 3" in lines
    assert any(line.startswith("problem KVPOOL_MIN_THREAD_BYTES lots 4096 ") for line in lines)
    assert not any("KVPOOL_POPULATE_THREADS" in line for line in lines if "problem" in line)
    assert "mlock_mode 3" in lines  # the default stayed in effect
    assert "populate_threads 1" in lines  # a valid variable is used
    assert "RuntimeWarning" in out.stderr
    assert "KVPOOL_MLOCK_MODE='7'" in out.stderr and "0..3" in out.stderr
    assert "KVPOOL_MIN_THREAD_BYTES='lots'" in out.stderr


def test_no_problems_without_bad_variables(python, child_env) -> None:
    env = {
        k: v
        for k, v in child_env.items()
        if not k.startswith("KVPOOL_")
        or k
        in (
            "KVPOOL_LIBPINMEM",
            "KVPOOL_CUDART",
        )
    }
    out = subprocess.run(
        [python, "-W", "error::RuntimeWarning", "-c", CHILD],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert not any(line.startswith("problem") for line in out.stdout.splitlines())


@pytest.mark.parametrize(("name", "value"), [("mlock_mode", 4), ("use_populate_write", -1)])
def test_set_out_of_range_is_an_error_and_changes_nothing(name: str, value: int, options) -> None:
    before = native.option_get(name)
    with pytest.raises(errors.InvalidArgumentError) as info:
        native.option_set(name, value)
    assert native.OPTIONS[name][1] in str(info.value)
    assert str(value) in str(info.value)
    assert native.option_get(name) == before
