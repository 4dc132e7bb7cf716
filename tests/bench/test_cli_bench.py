"""``kvpool bench`` end to end, in a subprocess, with tiny sizes.

These tests check that every benchmark runs and reports well-formed
figures; they assert nothing about speed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli.bench import BUILTIN, OPTIONAL

# Small enough that each benchmark takes a second or two here.
TINY = ["--quick", "--repeat", "2", "--scale", "0.01", "--size", "8M"]


def kvpool_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m kvpool ARGS`` and capture its output (not a terminal)."""
    full_env = dict(os.environ)
    full_env.pop("KVPOOL_PROGRESS", None)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "kvpool", *args], capture_output=True, env=full_env, timeout=300
    )
    # Decoded by hand: text=True would turn the bar's carriage returns into newlines.
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
    )


def check_report(report: dict[str, Any], name: str, repeat: int) -> None:
    """The JSON of one ``ok`` benchmark has every variant's trials and positive figures."""
    assert report["settings"]["repeat"] == repeat
    assert report["machine"]["cpus"] >= 1
    bench = report["benchmarks"][name]
    assert bench["status"] == "ok", bench
    assert bench["subject"] in bench["variants"]
    assert bench["baseline"] in bench["variants"]
    assert bench["subject"] != bench["baseline"]
    assert bench["wall_s"] > 0
    assert bench["metrics"], "no metrics"
    for key, metric in bench["metrics"].items():
        assert metric["unit"] and metric["label"], key
        variants = metric["variants"]
        assert bench["subject"] in variants and bench["baseline"] in variants, key
        for variant, figures in variants.items():
            trials = figures["trials"]
            assert len(trials) == repeat, (key, variant)
            assert all(math.isfinite(t) for t in trials)
            pick = max if metric["higher_is_better"] else min
            assert figures["best"] == pick(trials)
            assert min(trials) <= figures["median"] <= max(trials)
            if metric["ratio"] is not None:  # memory growth may be 0 or negative
                assert all(t > 0 for t in trials), (key, variant, trials)
        if metric["ratio"] is not None:
            assert metric["ratio"] > 0 and metric["ratio_median"] > 0


@pytest.mark.parametrize("name", list(BUILTIN))
def test_each_benchmark_runs_quick(name: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = kvpool_cli("bench", *TINY, "--only", name, "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert name in proc.stdout
    assert "ratio" in proc.stdout
    report = json.loads(out.read_text())
    assert list(report["benchmarks"]) == [name]
    check_report(report, name, repeat=2)
    # Not a terminal: no progress bar on stderr.
    assert "\r[" not in proc.stderr


def test_several_benchmarks_in_one_run_keep_their_order(tmp_path: Path) -> None:
    out = tmp_path / "two.json"
    proc = kvpool_cli("bench", *TINY, "--repeat", "1", "--only", "paged,churn", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert list(report["benchmarks"]) == ["churn", "paged"]  # registry order
    for name in report["benchmarks"]:
        check_report(report, name, repeat=1)


_MISSING_PLUGIN = (
    "import sys, kvpool.cli.bench as b\n"
    "b.OPTIONAL['plugin_xyz'] = b.OptionalSource('a plug-in', modules=('no_such_module_xyz',))\n"
    "from kvpool.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _cli_with_a_missing_plugin(*args: str) -> subprocess.CompletedProcess:
    """``kvpool ARGS`` in a child whose registry lists an optional benchmark with no code."""
    proc = subprocess.run(
        [sys.executable, "-c", _MISSING_PLUGIN, *args], capture_output=True, timeout=300
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
    )


def test_optional_benchmark_that_cannot_run_is_skipped_or_refused(tmp_path: Path) -> None:
    name = "plugin_xyz"
    # Asked for by --only: refused before anything runs, in plain words, non-zero.
    proc = _cli_with_a_missing_plugin("bench", *TINY, "--only", name)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{name} cannot run here: its code is not installed" in proc.stderr
    assert "kvpool.cli" not in proc.stderr
    # In a run that did not ask for it: listed as not run, with the reason, exit 0.
    out = tmp_path / "opt.json"
    others = ",".join(n for n in [*BUILTIN, *OPTIONAL])
    proc = _cli_with_a_missing_plugin("bench", *TINY, "--skip", others, "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bench = json.loads(out.read_text())["benchmarks"][name]
    assert bench["status"] == "skipped" and bench["note"]
    assert f"{name}: not run here: {bench['note']}" in proc.stdout


def test_progress_bar_can_be_forced_into_a_pipe() -> None:
    pytest.importorskip("tqdm", reason="the bar is drawn by tqdm (pip install 'kvpool[progress]')")
    proc = kvpool_cli(
        "bench", *TINY, "--repeat", "1", "--only", "churn", env={"KVPOOL_PROGRESS": "1"}
    )
    assert proc.returncode == 0, proc.stderr
    assert "\rkvpool bench" in proc.stderr and "%|" in proc.stderr  # tqdm's bar
    assert "\r" not in proc.stdout  # the table stays clean


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (pip install kvpool[plot])")
    png = tmp_path / "ratios.png"
    proc = kvpool_cli(
        "bench", *TINY, "--repeat", "1", "--only", "fragmentation", "--plot", str(png)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {png}" in proc.stdout


def test_list_names_every_benchmark() -> None:
    proc = kvpool_cli("bench", "--list")
    assert proc.returncode == 0, proc.stderr
    for name in [*BUILTIN, *OPTIONAL]:
        assert name in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "nosuch"], "unknown benchmark 'nosuch'; choose from churn,"),
        (["--only", ","], "expected NAME[,NAME...]"),
        (["--skip", "churn,nosuch"], "unknown benchmark 'nosuch'"),
        (["--repeat", "0"], "expected a whole number >= 1, got 0"),
        (["--repeat", "two"], "expected a whole number >= 1, got 'two'"),
        (["--scale", "-1"], "expected a finite number > 0, got '-1'"),
        (["--scale", "inf"], "expected a finite number > 0"),
        (["--size", "lots"], "not a size: 'lots'"),
        (["--size", "0"], "size must be > 0 bytes"),
    ],
)
def test_bad_options_give_an_argparse_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvpool.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: kvpool bench" in err
    assert f"argument {args[0]}" in err and message in err


def test_bad_option_exit_status_from_the_real_command() -> None:
    proc = kvpool_cli("bench", "--repeat", "0")
    assert proc.returncode == 2
    assert "kvpool bench: error: argument --repeat" in proc.stderr
    assert proc.stdout == ""
    proc = kvpool_cli("bench", "--frobnicate")
    assert proc.returncode == 2
    assert "unrecognized arguments: --frobnicate" in proc.stderr


def test_installed_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("kvpool")
    if not script.exists():
        pytest.skip(f"no console script next to {sys.executable} (kvpool not pip-installed)")
    # The installed kvpool loads its own library, not the test build tests/conftest.py chose.
    env = {k: v for k, v in os.environ.items() if k != "KVPOOL_LIBPINMEM"}
    proc = subprocess.run([str(script), "bench", "--list"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "pool_ready" in proc.stdout
