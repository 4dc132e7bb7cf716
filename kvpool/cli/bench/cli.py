"""The ``kvpool bench`` subcommand: options, the run, the reports."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpool.cli.args import positive_int, size_arg

if TYPE_CHECKING:
    from kvpool.cli.bench.core import Lack

__all__ = ["DEFAULT_REPEAT", "QUICK_SCALE", "add_parser", "run_bench"]

#: Interleaved trials per variant unless --repeat says otherwise.
DEFAULT_REPEAT = 3
#: Operation-count scale of --quick (unless --scale is given).
QUICK_SCALE = 0.1


def _names_list(text: str) -> list[str]:
    """argparse type: a comma-separated list of benchmark names."""
    from kvpool.cli.bench import names

    known = names()
    chosen = [n.strip() for n in text.split(",") if n.strip()]
    if not chosen:
        raise argparse.ArgumentTypeError("expected NAME[,NAME...]")
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown benchmark {', '.join(map(repr, unknown))}; choose from {', '.join(known)}"
        )
    return chosen


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to ``subparsers`` and return its parser."""
    p = subparsers.add_parser(
        "bench",
        help="run kvpool's benchmarks, each against a naive baseline",
        description=(
            "Run kvpool's own benchmarks. Each measures kvpool next to a naive way of doing "
            "the same thing, trials interleaved, and reports both best figures and their "
            "ratio (> 1: kvpool is better). A progress bar is drawn on stderr when it is a "
            "terminal (KVPOOL_PROGRESS=0/1 overrides)."
        ),
    )
    p.add_argument(
        "--only",
        metavar="NAME[,NAME]",
        type=_names_list,
        action="append",
        help="run only these benchmarks (repeatable); see --list",
    )
    p.add_argument(
        "--skip",
        metavar="NAME[,NAME]",
        type=_names_list,
        action="append",
        help="leave these benchmarks out (repeatable)",
    )
    p.add_argument(
        "--repeat",
        metavar="N",
        type=positive_int,
        default=None,
        help=f"interleaved trials per variant; the best counts (default {DEFAULT_REPEAT})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run: operation counts x{QUICK_SCALE:g} and a 256 MiB pool for pool_ready",
    )
    p.add_argument(
        "--scale",
        metavar="F",
        type=_positive_float,
        default=None,
        help="multiply every operation count by F (default 1, or 0.1 with --quick)",
    )
    p.add_argument(
        "--size",
        metavar="SIZE",
        type=size_arg,
        default=None,
        help="pool size for pool_ready, e.g. 4G, 512M (default 4G, or 256M with --quick)",
    )
    p.add_argument("--json", metavar="FILE", help="also write every trial as JSON to FILE")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the ratios as a bar chart (needs matplotlib: pip install 'kvpool[plot]')",
    )
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.set_defaults(func=run_bench)
    return p


def _selected(args: argparse.Namespace) -> list[str]:
    from kvpool.cli.bench import names

    only = {n for group in args.only or [] for n in group}
    skip = {n for group in args.skip or [] for n in group}
    return [n for n in names() if (not only or n in only) and n not in skip]


def _whole(lacks: list[Lack]) -> str | None:
    """Why a benchmark cannot run here at all, from its lacks (None: it can, in part or whole)."""
    whole = [lack.reason for lack in lacks if not lack.part]
    return "; ".join(whole) if whole else None


def _list() -> int:
    from kvpool.cli.bench import OPTIONAL, SkipBenchmark, names, resolve

    for name in names():
        try:
            bench = resolve(name)
        except SkipBenchmark as exc:
            title = OPTIONAL[name].title if name in OPTIONAL else name
            print(f"{name:16s} {title} [cannot run here: {exc}]")
            continue
        lacks = bench.lacks()
        whole = _whole(lacks)
        marks = (
            [f"cannot run here: {whole}"]
            if whole
            else [f"here without {lack.part}: {lack.reason}" for lack in lacks]
        )
        print(f"{name:16s} {bench.title}" + "".join(f" [{mark}]" for mark in marks))
    return 0


def _check_plot_file(path: str) -> str | None:
    """Why ``--plot path`` cannot be written (None when it can), found before running."""
    from kvpool.cli.bench.report import plot_formats, require_matplotlib

    try:
        require_matplotlib()
    except ImportError as exc:
        return str(exc)
    kinds = plot_formats()
    suffix = Path(path).suffix.lower().lstrip(".")
    if not suffix:
        return f"--plot {path}: the file name has no type; end it with .png, .svg or .pdf"
    if suffix not in kinds:
        return (
            f"--plot {path}: matplotlib cannot write .{suffix} files; "
            f"use one of {', '.join('.' + k for k in sorted(kinds))}"
        )
    return None


def run_bench(args: argparse.Namespace) -> int:
    """Run the selected benchmarks, print the table, write --json/--plot.

    Returns:
        0 when every benchmark ran (or, not named by --only, could not run
        here and was skipped with the reason); 1 when one failed, or one
        named by --only could not run; 2 for a problem found before
        running (--plot without matplotlib or to a file type it cannot
        write, a missing output directory, an --only benchmark that cannot
        run here, nothing selected).
    """
    if args.list:
        return _list()
    from kvpool.cli.bench import OPTIONAL, BenchmarkResult, SkipBenchmark, resolve
    from kvpool.cli.bench.core import GiB, Settings, run_benchmark
    from kvpool.cli.bench.pool_ready import QUICK_SIZE
    from kvpool.cli.bench.report import format_table, machine_info, plot_ratios, to_json
    from kvpool.cli.progress import Progress

    if args.plot:
        problem = _check_plot_file(args.plot)
        if problem:
            print(f"kvpool bench: {problem}", file=sys.stderr)
            return 2
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        # Found out now, not after minutes of benchmarking.
        if path and not Path(path).resolve().parent.is_dir():
            print(f"kvpool bench: {option} {path}: no such directory", file=sys.stderr)
            return 2
    selected = _selected(args)
    if not selected:
        print("kvpool bench: --only/--skip leave nothing to run", file=sys.stderr)
        return 2
    asked = {n for group in args.only or [] for n in group}
    found: dict[str, Any] = {}
    for name in selected:
        try:
            found[name] = resolve(name)
            # Found by looking, not by starting servers: skipped as if setup had said so.
            whole = _whole(found[name].lacks())
            if whole:
                raise SkipBenchmark(whole)
        except SkipBenchmark as exc:
            if name in asked:
                print(f"kvpool bench: {name} cannot run here: {exc}", file=sys.stderr)
                return 2
            found[name] = exc
    settings = Settings(
        repeat=args.repeat or DEFAULT_REPEAT,
        scale=args.scale if args.scale is not None else (QUICK_SCALE if args.quick else 1.0),
        size=args.size or (QUICK_SIZE if args.quick else 4 * GiB),
        quick=bool(args.quick),
    )
    results: list[BenchmarkResult] = []
    with Progress(len(selected), "kvpool bench") as bar:
        for name in selected:
            bench = found[name]
            if isinstance(bench, SkipBenchmark):
                title = OPTIONAL[name].title if name in OPTIONAL else name
                results.append(BenchmarkResult(name, title, status="skipped", note=str(bench)))
                bar.advance(1)
                continue
            results.append(run_benchmark(bench, settings, bar))
    machine = machine_info()
    print(format_table(results, settings, machine))
    status = 1 if any(r.status == "error" for r in results) else 0
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(results, settings, machine), indent=2) + "\n")
        print(f"\nJSON: {args.json}")
    if args.plot:
        bars = plot_ratios(results, args.plot)
        print(f"plot: {args.plot} ({bars} ratio(s))")
    for r in results:
        if r.status == "error" and r.traceback:
            print(f"\n{r.name} failed:\n{r.traceback}", file=sys.stderr)
        if r.status == "skipped" and r.name in asked:
            print(f"kvpool bench: {r.name} could not run here: {r.note}", file=sys.stderr)
            status = 1
    return status
