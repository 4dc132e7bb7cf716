"""The command line explains itself: readable help, a version, plain reasons and exit codes."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvpool
from kvpool.cli import build_parser, main
from kvpool.cli.bench import OPTIONAL, Benchmark, Case, Metric, OptionalSource, SkipBenchmark
from kvpool.cli.bench import register as register_benchmark
from kvpool.native import machine

# reStructuredText (or Sphinx) markup that must not reach a terminal.
MARKUP = re.compile(r"``|:(class|mod|func|meth|data|attr|exc):|~kvpool\.")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


def test_there_are_subcommands() -> None:
    assert {"bench", "demo", "info"} <= set(subcommands())


def test_the_command_line_guide_has_a_section_per_subcommand() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "cli.md").read_text()
    sections = re.findall(r"^## kvpool ([\w-]+)$", guide, re.M)
    assert sorted(sections) == subcommands()
    words = {3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"has {words[len(sections)]} subcommands" in guide


@pytest.mark.parametrize("command", [[], *([c] for c in subcommands())])
def test_every_help_is_plain_text(command: list[str]) -> None:
    done = run(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kvpool")
    found = MARKUP.search(done.stdout)
    assert found is None, f"markup {found.group(0)!r} in `kvpool {' '.join(command)} --help`"


@pytest.mark.parametrize(
    "entry", [["-m", "kvpool"], ["-c", "import sys; from kvpool.cli import main; sys.exit(main())"]]
)
def test_version(entry: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, *entry, "--version"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"kvpool {kvpool.__version__}"


# Run in a fresh interpreter: which heavy modules the command line loaded.
HEAVY_CHILD = """
import sys
heavy = ("torch", "numpy")
before = [m for m in heavy if m in sys.modules]
from kvpool.cli import main
try:
    main({args!r})
except SystemExit:
    pass
print("before:", before, "after:", [m for m in heavy if m in sys.modules])
"""


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["demo", "--help"]])
def test_version_and_help_load_neither_torch_nor_numpy(args: list[str]) -> None:
    # `kvpool --version` answered in 2-4 s when it imported torch.
    done = subprocess.run(
        [sys.executable, "-c", HEAVY_CHILD.format(args=args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "before: [] after: []", done.stdout


def test_importing_kvpool_loads_names_on_first_use() -> None:
    code = (
        "import sys, kvpool\n"
        "print('torch' in sys.modules)\n"
        "from kvpool import MemoryFormat, align_to\n"
        "print('torch' in sys.modules, MemoryFormat.__module__, kvpool.remote.__name__)\n"
        "try:\n"
        "    kvpool.no_such_name\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
        "align_to(3, 4, bogus=1)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    lines = done.stdout.splitlines()
    assert lines[:3] == [
        "False",
        "True kvpool.formats kvpool.remote",
        "module 'kvpool' has no attribute 'no_such_name'",
    ], done.stdout + done.stderr
    # A name loaded on first use still refuses a misspelt keyword.
    assert "bogus" in done.stderr and "TypeError" in done.stderr, done.stderr


def test_the_lazy_table_and_the_type_checking_imports_agree() -> None:
    # kvpool/__init__.py names each public name twice: in _LAZY_NAMES (what
    # loads it) and under TYPE_CHECKING (what type checkers see).
    import ast

    tree = ast.parse(Path(kvpool.__file__).read_text())
    guarded = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    imported = {
        alias.name: node.module
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == kvpool._LAZY_NAMES
    assert set(kvpool.__all__) <= set(kvpool._LAZY_NAMES)


def test_no_command_is_a_usage_error() -> None:
    done = run()
    assert done.returncode == 2
    assert "COMMAND" in done.stderr


# -- bench: reasons in plain words, exit codes ------------------------------


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpool.cli import bench

    monkeypatch.setattr(bench, "_registered", {})


def _never(ran: list[int]) -> Benchmark:
    def setup(settings: object) -> Case:
        ran.append(1)
        raise AssertionError("must not run")

    return Benchmark("never", "never", setup)  # type: ignore[arg-type]


def test_only_a_benchmark_that_cannot_run_here_exits_non_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = next(iter(OPTIONAL))
    source = OptionalSource("x", modules=("no_such_module_xyz",), missing="there is no such store")
    monkeypatch.setitem(OPTIONAL, name, source)
    assert main(["bench", "--only", name]) == 2
    assert f"{name} cannot run here: there is no such store" in capsys.readouterr().err


def test_only_a_benchmark_skipped_while_setting_up_exits_1(
    clean_registry: None, capsys: pytest.CaptureFixture[str]
) -> None:
    def setup(settings: object) -> Case:
        raise SkipBenchmark("the machine has no such device")

    register_benchmark(Benchmark("needs_device", "needs a device", setup))  # type: ignore[arg-type]
    assert main(["bench", "--only", "needs_device", "--repeat", "1"]) == 1
    captured = capsys.readouterr()
    assert "needs_device: not run here: the machine has no such device" in captured.out
    assert "needs_device could not run here" in captured.err


@pytest.mark.parametrize(
    ("name", "words"),
    [("ratios.txt", "cannot write .txt files"), ("ratios", "has no type")],
)
def test_plot_file_type_is_checked_before_running(
    clean_registry: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    words: str,
) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (pip install kvpool[plot])")
    ran: list[int] = []
    register_benchmark(_never(ran))
    assert main(["bench", "--only", "never", "--plot", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert words in err and ".png" in err
    assert not ran  # refused before running anything


def test_a_bound_is_shown_as_a_fraction_of_it(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (pip install kvpool[plot])")
    from kvpool.cli.bench import Settings, run_benchmark
    from kvpool.cli.bench.report import format_table, machine_info, plot_ratios

    def setup(settings: Settings) -> Case:
        return Case(
            metrics=[
                Metric("copy", "copy", "GB/s", True, bound=True),
                Metric("op", "op", "us/op"),
            ],
            variants={
                "kv": lambda: {"copy": 4.0, "op": 1.0},
                "memcpy": lambda: {"copy": 8.0, "op": 3.0},
            },
            subject="kv",
            baseline="memcpy",
        )

    result = run_benchmark(Benchmark("b", "bound", setup), Settings(repeat=1))
    table = format_table([result], Settings(repeat=1), machine_info())
    assert "50% of bound" in table and "3.00x" in table
    assert "0.50x" not in table
    png = tmp_path / "b.png"
    assert plot_ratios([result], str(png)) == 2
    assert png.read_bytes()[:4] == b"\x89PNG"


# -- info: wording and the real cause of a missing CUDA ---------------------------


def fake(**changes: object) -> machine.Capabilities:
    return dataclasses.replace(machine.capabilities(), **changes)


def test_info_counts_numa_nodes_in_words() -> None:
    assert "NUMA                 1 node: 0\n" in fake(numa_nodes=(0,)).report()
    assert "NUMA                 2 nodes: 0, 1\n" in fake(numa_nodes=(0, 1)).report()


def test_cuda_advice_without_a_runtime() -> None:
    caps = fake(cuda_available=False, cuda_runtime_path=None, cuda_error="not found", nvidia_gpus=1)
    cause, fix = caps.cuda_problem()
    assert cause.startswith("no CUDA runtime (libcudart) was found")
    assert "KVPOOL_CUDART" in fix
    assert cause in caps.report()


def test_cuda_advice_without_a_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    caps = fake(
        cuda_available=False,
        cuda_runtime_path="/opt/cuda/libcudart.so.12",
        cuda_device_count=0,
        cuda_error="cudaGetDeviceCount failed: CUDA driver version is insufficient (35)",
        nvidia_gpus=1,
    )
    monkeypatch.setattr(machine, "_NVIDIA_DRIVER", tmp_path / "absent")
    cause, fix = caps.cuda_problem()
    assert cause.startswith("no NVIDIA driver is loaded") and "install the NVIDIA driver" in fix
    assert "libcudart" not in fix  # the runtime is there: do not tell the user to get one
    driver = tmp_path / "version"
    driver.write_text("NVRM version: 470.00\n")
    monkeypatch.setattr(machine, "_NVIDIA_DRIVER", driver)
    cause, fix = caps.cuda_problem()
    assert "older than the CUDA runtime" in cause and "upgrade the driver" in fix


def test_cuda_advice_without_a_device() -> None:
    caps = fake(
        cuda_available=False,
        cuda_runtime_path="/opt/cuda/libcudart.so.12",
        cuda_device_count=0,
        cuda_error="cudaGetDeviceCount failed: no CUDA-capable device is detected (100)",
        nvidia_gpus=1,
    )
    cause, fix = caps.cuda_problem()
    assert "sees no CUDA device" in cause and "CUDA_VISIBLE_DEVICES" in fix


def test_cuda_usable_has_no_problem() -> None:
    assert fake(cuda_available=True, cuda_device_count=1).cuda_problem() == ("", "")


def test_no_gpu_and_no_driver_get_no_gpu_advice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # It told a CPU machine with a CUDA runtime installed to install an NVIDIA driver.
    caps = fake(
        cuda_available=False,
        cuda_runtime_path="/opt/cuda/libcudart.so.12",
        cuda_device_count=0,
        cuda_error="cudaGetDeviceCount failed: CUDA driver version is insufficient (35)",
        nvidia_gpus=0,
    )
    monkeypatch.setattr(machine, "_NVIDIA_DRIVER", tmp_path / "absent")
    assert caps.cuda_problem() == (
        "this machine has no NVIDIA GPU (none on its PCI bus, no driver loaded)",
        "",
    )
    assert not [tip for tip in caps.advice() if tip.startswith("CUDA")]
    assert "no NVIDIA GPU" in caps.report() and "NVIDIA driver" not in caps.report()
    runtime_missing = dataclasses.replace(caps, cuda_runtime_path=None)
    assert not [tip for tip in runtime_missing.advice() if tip.startswith("CUDA")]
    # A GPU on the bus, or a driver loaded, brings the advice back.
    assert [tip for tip in dataclasses.replace(caps, nvidia_gpus=1).advice() if "CUDA" in tip]
    driver = tmp_path / "version"
    driver.write_text("NVRM version: 470.00\n")
    monkeypatch.setattr(machine, "_NVIDIA_DRIVER", driver)
    assert [tip for tip in caps.advice() if tip.startswith("CUDA")]


def _pci(base: Path, name: str, vendor: str, kind: str) -> None:
    device = base / name
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(kind + "\n")


def test_nvidia_gpus_are_counted_from_sysfs(tmp_path: Path) -> None:
    _pci(tmp_path, "0000:17:00.0", "0x10de", "0x030200")  # an NVIDIA 3D controller
    _pci(tmp_path, "0000:65:00.0", "0x10de", "0x030000")  # an NVIDIA VGA controller
    _pci(tmp_path, "0000:65:00.1", "0x10de", "0x040300")  # the same card's audio function
    _pci(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # another vendor's display
    (tmp_path / "0000:00:1f.0").mkdir()  # unreadable entries are skipped
    assert machine.nvidia_gpus(tmp_path) == 2
    assert machine.nvidia_gpus(tmp_path / "absent") == 0


def test_the_probe_reports_the_gpus_of_this_machine() -> None:
    assert machine.capabilities().nvidia_gpus == machine.nvidia_gpus()
