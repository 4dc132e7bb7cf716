"""Results of a ``kvpool bench`` run as a table, as JSON and as a bar chart."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

from kvpool.cli.bench.core import BenchmarkResult, Settings

__all__ = [
    "PLOT_HINT",
    "format_table",
    "format_value",
    "machine_info",
    "plot_formats",
    "plot_ratios",
    "require_matplotlib",
    "to_json",
]

#: What to install for ``--plot``.
PLOT_HINT = "pip install 'kvpool[plot]'"


def format_value(value: float | None) -> str:
    """A number with about three significant digits ("-" for None)."""
    if value is None:
        return "-"
    a = abs(value)
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    if a == 0:
        return "0"
    if a >= 0.001:
        return f"{value:.3f}"
    return f"{value:.2e}"


def _format_ratio(ratio: float | None, bound: bool = False) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:.0%} of bound" if bound else f"{ratio:.2f}x"


def machine_info() -> dict[str, Any]:
    """CPU, memory and software versions, for the report's header and the JSON."""
    import numpy
    import torch

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        cpus = os.cpu_count() or 1
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": cpus,
        "cpu_model": model,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": numpy.__version__,
    }


def format_table(
    results: Sequence[BenchmarkResult], settings: Settings, machine: dict[str, Any]
) -> str:
    """The human-readable report: one row per metric, kvpool next to its baseline.

    Under the table, per benchmark: what the baseline is, informative
    extra variants, and skipped or failed benchmarks with the reason.  A
    metric the benchmark could not measure here (:attr:`Case.left_out`)
    has the reason next to its "n/a".
    """
    header = ("benchmark", "metric", "unit", "kvpool", "baseline", "ratio", "median ratio")
    rows: list[tuple[str, ...]] = []
    after: list[str] = []  # what follows each row: the reason of an n/a left out
    notes: list[str] = []
    for r in results:
        if r.status == "skipped":
            rows.append((r.name, "not run here: see below", "", "", "", "", ""))
            after.append("")
            notes.append(f"{r.name}: not run here: {r.note}")
            continue
        if r.status != "ok":
            rows.append((r.name, f"{r.status}: see below", "", "", "", "", ""))
            after.append("")
            notes.append(f"{r.name}: {r.status.upper()}: {r.note}")
            continue
        said: set[str] = set()
        for i, m in enumerate(r.metrics):
            rows.append(
                (
                    r.name if i == 0 else "",
                    m.metric.label,
                    m.metric.unit,
                    format_value(m.best(r.subject)),
                    format_value(m.best(r.baseline)),
                    _format_ratio(m.ratio(), m.metric.bound),
                    _format_ratio(m.ratio_median(), m.metric.bound),
                )
            )
            why = r.left_out.get(m.metric.key)
            if why is None or m.ratio() is not None:
                after.append("")
                continue
            after.append(f"  not run here: {'as above' if why in said else why}")
            said.add(why)
        line = f"{r.name}: kvpool = {r.subject}; baseline = {r.baseline}"
        if any(m.metric.bound for m in r.metrics):
            line += (
                "\n    the baseline is a bound nothing can beat: the ratio is the fraction "
                "of it reached"
            )
        extras = [v for v in r.variants if v not in (r.subject, r.baseline)]
        for extra in extras:
            figures = ", ".join(
                f"{format_value(m.best(extra))} {m.metric.unit}"
                for m in r.metrics
                if m.best(extra) is not None
            )
            line += f"\n    also: {extra}: {figures}"
        notes.append(line)
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    right = {3, 4, 5, 6}

    def fmt(row: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(widths[c]) if c in right else cell.ljust(widths[c])
            for c, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    lines = [
        f"kvpool bench: {machine['cpus']} CPU(s) {machine['cpu_model']}".rstrip(),
        f"  Python {machine['python']}, torch {machine['torch']} "
        f"({machine['torch_threads']} threads), numpy {machine['numpy']}",
        f"  best of {settings.repeat} interleaved trial(s), scale {settings.scale:g}"
        + (", --quick" if settings.quick else ""),
        "",
        fmt(header),
        fmt(tuple("-" * w for w in widths)),
        *(fmt(row) + tail for row, tail in zip(rows, after, strict=True)),
        "",
        "ratio: kvpool's best trial against the baseline's best, oriented so that > 1 means",
        "kvpool is better (faster, more GB/s); median ratio: the same from the medians.",
        "Against a bound (memcpy) the ratio is the fraction of the bound kvpool reaches.",
        "",
        *notes,
    ]
    return "\n".join(lines)


def _installed_version() -> str:
    # Read from the installed distribution: the package facade sits above this layer.
    try:
        return importlib.metadata.version("kvpool")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def to_json(
    results: Sequence[BenchmarkResult], settings: Settings, machine: dict[str, Any]
) -> dict[str, Any]:
    """The machine-readable report (structure in :mod:`kvpool.cli.bench`)."""
    return {
        "kvpool": _installed_version(),
        "settings": {
            "repeat": settings.repeat,
            "scale": settings.scale,
            "size": settings.size,
            "quick": settings.quick,
            "seed": settings.seed,
        },
        "machine": machine,
        "benchmarks": {r.name: r.to_dict() for r in results},
    }


def require_matplotlib() -> None:
    """Raise ImportError, naming the extra to install, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"--plot needs matplotlib, which is not installed: {PLOT_HINT}") from exc


def plot_formats() -> dict[str, str]:
    """The file types ``--plot`` can write: ``{suffix: description}`` (matplotlib's).

    Raises:
        ImportError: matplotlib is missing.
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return dict(FigureCanvasAgg.get_supported_filetypes())


def _bars(results: Sequence[BenchmarkResult], bound: bool) -> tuple[list[str], list[float]]:
    labels: list[str] = []
    ratios: list[float] = []
    for r in results:
        if r.status != "ok":
            continue
        for m in r.metrics:
            ratio = m.ratio()
            if ratio is not None and m.metric.bound == bound:
                labels.append(f"{r.name}: {m.metric.label}\nvs {r.baseline}")
                ratios.append(ratio)
    return labels, ratios


def plot_ratios(results: Sequence[BenchmarkResult], path: str, title: str = "") -> int:
    """Draw the ratios into ``path`` (its suffix picks the file type).

    Against naive baselines: one bar per ratio on a log scale, 1x marked,
    green where kvpool wins and red where it loses.  Against a bound no
    implementation can beat (:attr:`Metric.bound`, e.g. memcpy): a second
    panel, linear from 0 to 100 % of the bound, in a neutral colour - a
    fraction of the bound is not a loss.

    Returns:
        The number of bars drawn.

    Raises:
        ImportError: matplotlib is missing (the message says what to install).
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ratios = _bars(results, bound=False)
    bound_labels, fractions = _bars(results, bound=True)
    rows = [max(1, len(labels))] + ([len(bound_labels)] if bound_labels else [])
    fig, axes = plt.subplots(
        len(rows),
        1,
        figsize=(9, 0.55 * sum(rows) + 1.6 * len(rows)),
        gridspec_kw={"height_ratios": rows},
        squeeze=False,
    )
    try:
        ax = axes[0][0]
        if ratios:
            ys = list(range(len(ratios)))[::-1]
            colors = ["#2e7d32" if x >= 1 else "#c62828" for x in ratios]
            ax.barh(ys, ratios, color=colors, height=0.6)
            ax.set_yticks(ys, labels, fontsize=8)
            ax.set_xscale("log")
            lo = min(min(ratios), 1.0) / 1.6
            hi = max(max(ratios), 1.0) * 2.2
            ax.set_xlim(lo, hi)
            ax.axvline(1.0, color="black", linewidth=1)
            for y, x in zip(ys, ratios, strict=True):
                ax.text(x * 1.05, y, f"{x:.2f}x", va="center", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no ratios against naive baselines", ha="center", va="center")
            ax.set_yticks([])
        ax.set_xlabel("kvpool vs naive baseline (x better, log scale; > 1: kvpool wins)")
        ax.set_title(title or "kvpool bench: kvpool against naive baselines", fontsize=10)
        ax.grid(axis="x", which="both", alpha=0.25)
        if bound_labels:
            bx = axes[1][0]
            ys = list(range(len(fractions)))[::-1]
            bx.barh(ys, [min(f, 1.0) * 100 for f in fractions], color="#1565c0", height=0.6)
            bx.set_yticks(ys, bound_labels, fontsize=8)
            bx.set_xlim(0, 110)
            bx.axvline(100, color="black", linewidth=1)
            for y, f in zip(ys, fractions, strict=True):
                bx.text(min(f, 1.0) * 100 + 1.5, y, f"{f:.0%}", va="center", fontsize=8)
            bx.set_xlabel("fraction of a bound no implementation can beat (100 % = the bound)")
            bx.grid(axis="x", alpha=0.25)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return len(ratios) + len(fractions)
