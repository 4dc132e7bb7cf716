"""The benchmark suite in-process: runner, registry and plug-ins, reports, baselines."""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

import pytest

import kvpool.cli.bench as benchmarks
from kvpool.cli import main
from kvpool.cli.bench import (
    Benchmark,
    Case,
    Metric,
    OptionalSource,
    Settings,
    SkipBenchmark,
    register,
    resolve,
    run_benchmark,
)
from kvpool.cli.bench.core import format_bytes
from kvpool.cli.bench.naive import FirstFitAllocator
from kvpool.cli.bench.pool_ready import parse_size
from kvpool.cli.bench.report import format_table, format_value, machine_info, to_json


def fake_benchmark(name: str, fail: bool = False) -> Benchmark:
    """A benchmark with fixed figures: 2 us/op for kvpool, 6 us/op for the baseline."""

    def setup(settings: Settings) -> Case:
        calls = {"n": 0}

        def kv() -> dict[str, float]:
            calls["n"] += 1
            if fail:
                raise RuntimeError("boom")
            return {"t": 2.0 + calls["n"], "mem": 0.0}

        return Case(
            metrics=[Metric("t", "op", "us/op"), Metric("mem", "growth", "MiB", ratio=False)],
            variants={"kv": kv, "naive": lambda: {"t": 6.0, "mem": 1.0}},
            subject="kv",
            baseline="naive",
            info={"calls": calls},
        )

    return Benchmark(name, f"fake {name}", setup)


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmarks, "_registered", {})


# -- runner -----------------------------------------------------------


def test_runner_interleaves_and_summarises() -> None:
    order: list[str] = []

    def setup(settings: Settings) -> Case:
        def variant(name: str, value: float) -> object:
            def trial() -> dict[str, float]:
                order.append(name)
                return {"rate": value}

            return trial

        return Case(
            metrics=[Metric("rate", "rate", "GB/s", higher_is_better=True)],
            variants={"a": variant("a", 4.0), "b": variant("b", 2.0), "c": variant("c", 1.0)},  # type: ignore[dict-item]
            subject="a",
            baseline="b",
        )

    result = run_benchmark(Benchmark("x", "x", setup), Settings(repeat=3))
    assert result.status == "ok"
    # The order rotates every trial.
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    (m,) = result.metrics
    assert m.best("a") == 4.0 and m.ratio() == pytest.approx(2.0)
    assert m.ratio("c") == pytest.approx(0.5)
    assert m.trials["a"] == [4.0, 4.0, 4.0]


def test_ratio_orientation_for_times() -> None:
    result = run_benchmark(fake_benchmark("f"), Settings(repeat=2))
    t, mem = result.metrics
    assert t.best("kv") == 3.0  # min of 3.0, 4.0
    assert t.median("kv") == 3.5
    assert t.ratio() == pytest.approx(2.0)  # 6 / 3: lower is better
    assert mem.ratio() is None and mem.ratio_median() is None


def test_a_failing_benchmark_is_recorded_not_raised() -> None:
    result = run_benchmark(fake_benchmark("bad", fail=True), Settings(repeat=1))
    assert result.status == "error"
    assert "RuntimeError: boom" in result.note
    assert "Traceback" in result.traceback


def test_skip_from_setup() -> None:
    def setup(settings: Settings) -> Case:
        raise SkipBenchmark("no hugepages")

    result = run_benchmark(Benchmark("s", "s", setup), Settings())
    assert (result.status, result.note) == ("skipped", "no hugepages")


def test_bad_values_and_missing_variants_are_errors() -> None:
    def bad_value(settings: Settings) -> Case:
        return Case([Metric("t", "t", "s")], {"a": lambda: {"t": float("nan")}}, "a", "a")

    def unknown_metric(settings: Settings) -> Case:
        return Case([Metric("t", "t", "s")], {"a": lambda: {"u": 1.0}}, "a", "a")

    def no_baseline(settings: Settings) -> Case:
        return Case([Metric("t", "t", "s")], {"a": lambda: {"t": 1.0}}, "a", "b")

    for setup, text in [
        (bad_value, "not a finite number"),
        (unknown_metric, "unknown metric"),
        (no_baseline, "no variant named 'b'"),
    ]:
        result = run_benchmark(Benchmark("e", "e", setup), Settings(repeat=1))
        assert result.status == "error" and text in result.note


def test_settings_count_scales_with_a_floor() -> None:
    assert Settings(scale=0.01).count(100_000, minimum=10) == 1000
    assert Settings(scale=0.0001).count(100_000, minimum=10) == 10


# -- registry and plug-ins --------------------------------------------


def test_builtin_names_resolve() -> None:
    for name in benchmarks.BUILTIN:
        bench = resolve(name)
        assert bench.name == name and bench.title
    with pytest.raises(KeyError, match="no benchmark named"):
        resolve("nosuch")


def test_optional_benchmark_found_as_a_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "fake_remote_bench.py").write_text(
        "from kvpool.cli.bench import Benchmark, Case, Metric\n"
        "def kvpool_benchmark():\n"
        "    return Benchmark('remote_put_get', 'fake remote', lambda s: Case(\n"
        "        [Metric('t', 't', 's')], {'a': lambda: {'t': 1.0}, 'b': lambda: {'t': 2.0}},\n"
        "        'a', 'b'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        benchmarks.OPTIONAL,
        "remote_put_get",
        OptionalSource("remote", modules=("fake_remote_bench",)),
    )
    bench = resolve("remote_put_get")
    assert bench.title == "fake remote"
    assert run_benchmark(bench, Settings(repeat=1)).metrics[0].ratio() == pytest.approx(2.0)


def test_optional_benchmark_module_without_hook_or_imports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = tmp_path / "hookless_bench_xyz.py"
    module.write_text("print('no hook here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = OptionalSource("remote", modules=("hookless_bench_xyz",))
    monkeypatch.setitem(benchmarks.OPTIONAL, "remote_put_get", source)
    with pytest.raises(SkipBenchmark, match="defines no kvpool_benchmark"):
        resolve("remote_put_get")
    broken = tmp_path / "broken_bench_xyz.py"
    broken.write_text("import no_such_dependency_xyz\n")
    source = OptionalSource("remote", modules=("broken_bench_xyz",))
    monkeypatch.setitem(benchmarks.OPTIONAL, "remote_put_get", source)
    with pytest.raises(SkipBenchmark, match="needs no_such_dependency_xyz, which is not installed"):
        resolve("remote_put_get")


def test_optional_benchmark_absent_says_why_in_plain_words(monkeypatch: pytest.MonkeyPatch) -> None:
    source = OptionalSource(
        "remote", modules=("no_such_bench_module_xyz",), missing="this kvpool has no such thing"
    )
    monkeypatch.setitem(benchmarks.OPTIONAL, "remote_put_get", source)
    with pytest.raises(SkipBenchmark) as info:
        resolve("remote_put_get")
    assert str(info.value) == "this kvpool has no such thing"  # no module or hook names


def test_remote_stores_benchmark_is_found() -> None:
    bench = resolve("remote_put_get")
    assert bench.name == "remote_put_get" and bench.title


# -- the CLI in-process ------------------------------------------------


def test_cli_runs_registered_benchmarks_and_reports_failures(
    clean_registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register(fake_benchmark("fake_ok"))
    register(fake_benchmark("fake_bad", fail=True))
    out = tmp_path / "r.json"
    status = main(["bench", "--only", "fake_ok,fake_bad", "--repeat", "2", "--json", str(out)])
    assert status == 1  # one benchmark failed; the other still ran
    captured = capsys.readouterr()
    assert "fake_ok" in captured.out and "2.00x" in captured.out
    assert "fake_bad: ERROR: RuntimeError: boom" in captured.out
    assert "RuntimeError: boom" in captured.err  # the traceback
    report = json.loads(out.read_text())
    assert report["benchmarks"]["fake_ok"]["metrics"]["t"]["variants"]["kv"]["trials"] == [
        3.0,
        4.0,
    ]
    assert report["benchmarks"]["fake_bad"]["status"] == "error"


def test_cli_plot_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, clean_registry: None, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = []
    register(Benchmark("never", "never", lambda s: ran.append(1)))  # type: ignore[arg-type, func-returns-value]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    status = main(["bench", "--only", "never", "--plot", "x.png"])
    assert status == 2
    assert "pip install 'kvpool[plot]'" in capsys.readouterr().err
    assert not ran  # it failed before running anything


def test_cli_output_into_a_missing_directory(
    clean_registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = []
    register(Benchmark("never", "never", lambda s: ran.append(1)))  # type: ignore[arg-type, func-returns-value]
    status = main(["bench", "--only", "never", "--json", str(tmp_path / "no" / "r.json")])
    assert status == 2
    assert "no such directory" in capsys.readouterr().err
    assert not ran


def test_cli_skip_leaving_nothing(clean_registry: None, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["bench", "--only", "churn", "--skip", "churn"])
    assert status == 2
    assert "nothing to run" in capsys.readouterr().err


# -- reports ----------------------------------------------------------


def test_table_and_json_from_results() -> None:
    results = [
        run_benchmark(fake_benchmark("f"), Settings(repeat=2)),
        run_benchmark(fake_benchmark("g", fail=True), Settings(repeat=2)),
    ]
    machine = machine_info()
    table = format_table(results, Settings(repeat=2), machine)
    assert "best of 2 interleaved trial(s)" in table
    assert "2.00x" in table and "n/a" in table
    assert "g: ERROR" in table
    data = to_json(results, Settings(repeat=2), machine)
    json.dumps(data)  # serialisable
    assert data["benchmarks"]["f"]["metrics"]["t"]["ratio"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), (0, "0"), (1234.5, "1,234"), (123.4, "123"), (12.34, "12.3"), (1.234, "1.23"),
     (0.1234, "0.123"), (0.00001234, "1.23e-05")],
)  # fmt: skip
def test_format_value(value: float | None, text: str) -> None:
    assert format_value(value) == text


def test_plot_draws_the_ratios(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (pip install kvpool[plot])")
    from kvpool.cli.bench.report import plot_ratios

    png = tmp_path / "p.png"
    results = [run_benchmark(fake_benchmark("f"), Settings(repeat=1))]
    assert plot_ratios(results, str(png)) == 1  # the MiB metric has no ratio
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_format_bytes() -> None:
    assert format_bytes(4 << 30) == "4 GiB"
    assert format_bytes(256 << 20) == "256 MiB"
    assert format_bytes(3 << 29) == "1.5 GiB"
    assert format_bytes(100) == "100 B"


@pytest.mark.parametrize(
    ("text", "size"),
    [("4G", 4 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("64k", 64 << 10), ("4096", 4096)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


# -- the naive baseline must be correct for the comparison to mean anything


def test_first_fit_allocator_is_a_correct_allocator() -> None:
    rng = random.Random(7)
    size = 1 << 24
    ff = FirstFitAllocator(size, 4096)
    live: dict[int, int] = {}
    for _ in range(3000):
        if live and rng.random() < 0.45:
            addr = rng.choice(list(live))
            ff.free(addr, live.pop(addr))
        else:
            try:
                addr, n = ff.allocate(rng.randrange(1, 200_000))
            except RuntimeError:
                continue
            assert addr % 4096 == 0 and n % 4096 == 0
            live[addr] = n
        # Free blocks: sorted, coalesced, disjoint from live blocks, tiling the space.
        blocks = list(zip(ff._starts, ff._sizes, strict=True))
        assert all(a + n < b for (a, n), (b, _) in itertools.pairwise(blocks))
        spans = sorted(blocks + list(live.items()))
        pos = 0
        for start, n in spans:
            assert start == pos
            pos += n
        assert pos == size
    for addr, n in list(live.items()):
        ff.free(addr, n)
    assert (ff._starts, ff._sizes) == ([0], [size])
    with pytest.raises(RuntimeError):
        ff.allocate(size + 1)
