"""The pinned-buffer readiness benchmark runs its trials in child processes and reports them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvpool.cli.bench import pinned_ready

MIB = 1 << 20


def test_trials_run_in_child_processes_and_report_each_variant() -> None:
    result = pinned_ready.run_trials(["kvpool mlock"], 16 * MIB, 2)
    got = result["variants"]["kvpool mlock"]
    assert len(got["seconds"]) == 2 and all(s > 0 for s in got["seconds"])
    assert got["GBps_median"] > 0
    assert got["pinned"].startswith("mlock")


def test_a_failing_variant_is_reported_and_not_run_again(monkeypatch) -> None:
    # A child that cannot start (a module that does not exist) fails every time.
    monkeypatch.setattr(pinned_ready, "_MODULE", "kvpool.cli.bench.no_such_module")
    result = pinned_ready.run_trials(["kvpool mlock"], 16 * MIB, 3)
    assert result["variants"] == {}
    assert "No module named" in result["failed"]["kvpool mlock"]


def test_run_as_a_module_its_children_find_it_by_name() -> None:
    # Under ``python -m`` the module's __name__ is "__main__", which a child cannot run.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvpool.cli.bench.pinned_ready",
            "--only",
            "kvpool mlock",
            "--size",
            "16M",
            "--trials",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert list(result["variants"]) == ["kvpool mlock"] and result["failed"] == {}
    assert len(result["variants"]["kvpool mlock"]["seconds"]) == 2
    assert result["register_over_cudaHostAlloc"] is None  # neither side was run


def test_unknown_variants_are_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        pinned_ready.main(["--only", "kvpool mlock,nonsense"])
    assert info.value.code == 2


def test_without_cuda_it_says_so_and_exits_2(monkeypatch, capsys) -> None:
    monkeypatch.setattr(pinned_ready, "_cuda_missing", lambda: "no CUDA device (faked)")
    assert pinned_ready.main(["--size", "16M"]) == 2
    assert "no CUDA device (faked)" in capsys.readouterr().err


def test_a_size_beyond_available_memory_is_refused_first(monkeypatch, capsys) -> None:
    monkeypatch.setattr(pinned_ready, "_cuda_missing", lambda: None)
    monkeypatch.setattr(pinned_ready, "run_trials", lambda *a: pytest.fail("ran trials"))
    assert pinned_ready.main(["--size", str(1 << 50)]) == 2
    assert "does not fit: MemAvailable" in capsys.readouterr().err


def test_bad_trials_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        pinned_ready.main(["--trials", "0"])
    assert info.value.code == 2


def test_the_fake_runtime_measures_the_overlap_on_a_cpu(fake_cudart, capsys, monkeypatch) -> None:
    monkeypatch.delenv("KVPOOL_CUDART", raising=False)
    only = "kvpool cuda-register,kvpool register sequential"
    argv = ["--cudart", str(fake_cudart), "--only", only, "--size", "32M", "--trials", "1"]
    assert pinned_ready.main([*argv, "--json"]) == 0
    # Only the children load it: the caller's process (here, the tests') keeps its CUDA.
    assert "KVPOOL_CUDART" not in os.environ
    result = json.loads(capsys.readouterr().out)
    pins = {name: v["pinned"] for name, v in result["variants"].items()}
    assert sorted(pins) == ["kvpool cuda-register", "kvpool register sequential"]
    assert all(p.startswith("cuda-register") for p in pins.values())
    assert result["overlapped_over_sequential"] > 0
    assert result["register_threshold"] == 1 << 30 and "2.60x" in result["register_threshold_why"]


def test_the_report_says_from_which_size_auto_registers_and_why(fake_cudart, capsys) -> None:
    argv = ["--cudart", str(fake_cudart), "--only", "kvpool cuda-register", "--size", "16M"]
    assert pinned_ready.main([*argv, "--trials", "1"]) == 0
    out = capsys.readouterr().out
    assert "pin='auto' registers from 1 GiB" in out and "2.60x faster than cudaHostAlloc" in out


def test_torch_variants_need_torchs_cuda(fake_cudart) -> None:
    with pytest.raises(SystemExit) as info:
        pinned_ready.main(["--cudart", str(fake_cudart), "--only", "torch pin_memory"])
    assert info.value.code == 2


@pytest.mark.gpu
def test_every_variant_pins_on_a_gpu(cuda_device, capsys) -> None:
    assert pinned_ready.main(["--size", "1G", "--trials", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    pins = {name: v["pinned"] for name, v in result["variants"].items()}
    assert pins["kvpool cuda-register"].startswith("cuda-register")
    assert pins["kvpool register sequential"].startswith("cuda-register")
    assert pins["cudaHostAlloc"].startswith("cuda-alloc")
    assert result["register_over_cudaHostAlloc"] > 0
    assert result["overlapped_over_sequential"] > 0
