"""The benchmark protocol and the interleaved runner.

A :class:`Benchmark` is a name, a title and a ``setup`` function.  Given
the run's :class:`Settings`, ``setup`` builds a :class:`Case`: the
figures it measures (:class:`Metric`) and its *variants* -- kvpool's way
(the subject) and a naive way of doing the same thing (the baseline),
plus any informative extras.  Each variant is a function that runs one
trial and returns ``{metric key: value}`` for the metrics it measures.

:func:`run_benchmark` runs ``settings.repeat`` trials.  Within a trial
every variant runs once; the order rotates from trial to trial, so slow
phases of a noisy machine hit every variant alike.  A metric's figure is
its best trial (the least disturbed one: min for times, max for rates);
the median is kept as well, and the ratio compares the subject with the
baseline oriented so that > 1 always means "kvpool is better".
"""

from __future__ import annotations

import gc
import math
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpool.cli.progress import Progress

__all__ = [
    "Benchmark",
    "BenchmarkResult",
    "Case",
    "Lack",
    "Metric",
    "MetricResult",
    "Settings",
    "SkipBenchmark",
    "format_bytes",
    "run_benchmark",
]


def format_bytes(n: int) -> str:
    """``n`` bytes in binary units, as :func:`kvpool.native.units.format_bytes` says them.

    Imported at the first call: importing :mod:`kvpool.native` loads
    libpinmem, and building the command line (``kvpool --version``) must
    not.
    """
    from kvpool.native.units import format_bytes as native_format_bytes

    return native_format_bytes(n)


KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Settings:
    """What the command line asked for, as the benchmarks see it.

    Attributes:
        repeat: interleaved trials per variant (>= 1).
        scale: multiplies every operation count (1.0 = the documented counts).
        size: bytes of the pool made resident by ``pool_ready``.
        quick: the ``--quick`` preset is active (benchmarks may shrink
            buffers that ``scale`` does not cover).
        seed: base seed of the random workloads.
    """

    repeat: int = 3
    scale: float = 1.0
    size: int = 4 * GiB
    quick: bool = False
    seed: int = 1

    def count(self, n: int, minimum: int = 1) -> int:
        """``n`` scaled by :attr:`scale`, at least ``minimum``."""
        return max(minimum, round(n * self.scale))


@dataclass(frozen=True)
class Metric:
    """One figure a benchmark reports.

    Attributes:
        key: identifier used in the variants' result dicts and in JSON.
        label: short human name (the table's "metric" column).
        unit: unit of the values (e.g. "us/op", "GB/s", "MiB").
        higher_is_better: True for rates, False for times and sizes.
        ratio: False for figures whose ratio means nothing (e.g. memory
            growth that should be zero); the table then shows "n/a".
        bound: the baseline is a bound the subject cannot beat (memcpy for
            a copy through a file): the ratio reads as the fraction of the
            bound reached, not as a win or a loss, and is shown so.
    """

    key: str
    label: str
    unit: str
    higher_is_better: bool = False
    ratio: bool = True
    bound: bool = False


@dataclass
class Case:
    """A benchmark set up and ready to run its trials.

    Attributes:
        metrics: the figures measured.
        variants: name -> function running one trial and returning
            ``{metric key: value}``; a variant may report a subset of the
            metrics.
        subject: the variant that is kvpool's way.
        baseline: the naive variant the subject is compared with.
        info: parameters, what kvpool actually got, notes (JSON-able).
        cleanup: called once after the last trial (also on error).
        left_out: metric key -> why it cannot be measured here, with the fix
            (e.g. a server that is missing); the table prints the reason next
            to its "n/a".
    """

    metrics: list[Metric]
    variants: dict[str, Callable[[], dict[str, float]]]
    subject: str
    baseline: str
    info: dict[str, Any] = field(default_factory=dict)
    cleanup: Callable[[], None] | None = None
    left_out: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Lack:
    """Something this machine lacks for a benchmark, found without running it.

    Attributes:
        part: what cannot run: "" for the whole benchmark, else its rows
            that need it (e.g. "the Redis rows").
        reason: why, ending with the command that fixes it.
    """

    part: str
    reason: str


@dataclass(frozen=True)
class Benchmark:
    """A registered benchmark.

    Attributes:
        name: the ``--only`` name.
        title: one line for the table.
        setup: builds the :class:`Case` for the given settings.  Raising
            :class:`SkipBenchmark` skips it with the reason.
        check: what this machine lacks for it (:class:`Lack`, none when it
            can run in full), found by looking for modules and programs
            only: ``kvpool bench --list`` calls it, and a run does before
            ``setup`` (a whole-benchmark lack skips it).  None: nothing to check.
    """

    name: str
    title: str
    setup: Callable[[Settings], Case]
    check: Callable[[], list[Lack]] | None = None

    def lacks(self) -> list[Lack]:
        """What :attr:`check` finds missing here ([] without a check)."""
        return [] if self.check is None else self.check()


class SkipBenchmark(Exception):
    """Raised by a benchmark's ``setup`` (or loader) to skip it with a reason."""


@dataclass
class MetricResult:
    """Every trial of one metric, per variant, and the summary figures."""

    metric: Metric
    trials: dict[str, list[float]]
    subject: str
    baseline: str

    def best(self, variant: str) -> float | None:
        """The variant's best trial (max for rates, min otherwise), or None."""
        values = self.trials.get(variant)
        if not values:
            return None
        return max(values) if self.metric.higher_is_better else min(values)

    def median(self, variant: str) -> float | None:
        """The median of the variant's trials, or None."""
        values = self.trials.get(variant)
        return statistics.median(values) if values else None

    def _ratio(self, a: float | None, b: float | None) -> float | None:
        if not self.metric.ratio or a is None or b is None:
            return None
        num, den = (a, b) if self.metric.higher_is_better else (b, a)
        if den <= 0 or num <= 0 or not math.isfinite(num / den):
            return None
        return num / den

    def ratio(self, variant: str | None = None) -> float | None:
        """How many times better ``variant`` (default: the subject) is than the baseline.

        Best trial against best trial; > 1 means better (faster, higher
        throughput, smaller).  None when the metric has no meaningful
        ratio or a value is missing or not positive.
        """
        v = self.subject if variant is None else variant
        return self._ratio(self.best(v), self.best(self.baseline))

    def ratio_median(self) -> float | None:
        """:meth:`ratio` computed from the medians instead of the best trials."""
        return self._ratio(self.median(self.subject), self.median(self.baseline))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: the metric, every variant's trials, best and median, the ratios."""
        return {
            "label": self.metric.label,
            "unit": self.metric.unit,
            "higher_is_better": self.metric.higher_is_better,
            "bound": self.metric.bound,
            "variants": {
                name: {"trials": list(values), "best": self.best(name), "median": self.median(name)}
                for name, values in self.trials.items()
            },
            "ratio": self.ratio(),
            "ratio_median": self.ratio_median(),
        }


@dataclass
class BenchmarkResult:
    """What one benchmark produced: figures, or the reason it has none.

    ``status`` is "ok", "skipped" (with ``note``) or "error" (with ``note``
    and ``traceback``); ``left_out`` is the case's (metric key -> why not
    measured here).
    """

    name: str
    title: str
    status: str = "ok"
    note: str = ""
    subject: str = ""
    baseline: str = ""
    variants: list[str] = field(default_factory=list)
    metrics: list[MetricResult] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    traceback: str = ""
    left_out: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (see the ``--json`` description in :mod:`kvpool.cli.bench`)."""
        out: dict[str, Any] = {
            "title": self.title,
            "status": self.status,
            "note": self.note,
            "subject": self.subject,
            "baseline": self.baseline,
            "variants": list(self.variants),
            "wall_s": self.wall_s,
            "info": self.info,
            "metrics": {m.metric.key: m.to_dict() for m in self.metrics},
            "left_out": dict(self.left_out),
        }
        if self.traceback:
            out["traceback"] = self.traceback
        return out


def _check_values(name: str, values: dict[str, float], metrics: dict[str, Metric]) -> None:
    for key, value in values.items():
        if key not in metrics:
            raise ValueError(f"variant {name!r} reported unknown metric {key!r}")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"variant {name!r} reported {key}={value!r}, not a finite number")


def run_benchmark(
    bench: Benchmark, settings: Settings, bar: Progress | None = None, weight: float = 1.0
) -> BenchmarkResult:
    """Set up ``bench``, run its interleaved trials and summarise them.

    Args:
        bench: the benchmark.
        settings: the run's settings.
        bar: a progress bar to advance by ``weight`` in total over the run.
        weight: this benchmark's share of the bar.

    Returns:
        The result; a setup or trial failure is recorded in it (status
        "error"), a :class:`SkipBenchmark` makes it "skipped".  Neither is
        raised, so one broken benchmark does not stop the others.
    """
    result = BenchmarkResult(bench.name, bench.title)
    start = time.perf_counter()
    advanced = 0.0
    if bar is not None:
        bar.set_label(f"{bench.name}: setting up", force=True)
    case: Case | None = None
    try:
        case = bench.setup(settings)
        result.subject, result.baseline = case.subject, case.baseline
        result.variants = list(case.variants)
        result.info = case.info
        for needed in (case.subject, case.baseline):
            if needed not in case.variants:
                raise ValueError(f"{bench.name}: no variant named {needed!r}")
        metrics = {m.key: m for m in case.metrics}
        unknown = [key for key in case.left_out if key not in metrics]
        if unknown:
            raise ValueError(f"{bench.name}: left_out names unknown metrics {unknown}")
        result.left_out = dict(case.left_out)
        trials: dict[str, dict[str, list[float]]] = {m.key: {} for m in case.metrics}
        names = list(case.variants)
        step = weight / (settings.repeat * len(names))
        for trial in range(settings.repeat):
            k = trial % len(names)
            for name in names[k:] + names[:k]:
                if bar is not None:
                    label = f"{bench.name}: trial {trial + 1}/{settings.repeat}, {name}"
                    bar.set_label(label, force=True)
                gc.collect()
                values = case.variants[name]()
                _check_values(name, values, metrics)
                for key, value in values.items():
                    trials[key].setdefault(name, []).append(float(value))
                if bar is not None:
                    bar.advance(step)
                    advanced += step
        result.metrics = [
            MetricResult(m, trials[m.key], case.subject, case.baseline) for m in case.metrics
        ]
    except SkipBenchmark as exc:
        result.status, result.note = "skipped", str(exc)
    except Exception as exc:
        result.status = "error"
        result.note = f"{type(exc).__name__}: {exc}"
        result.traceback = traceback.format_exc()
    finally:
        if case is not None and case.cleanup is not None:
            try:
                case.cleanup()
            except Exception as exc:
                if result.status == "ok":
                    result.status = "error"
                    result.note = f"cleanup failed: {type(exc).__name__}: {exc}"
                    result.traceback = traceback.format_exc()
        gc.collect()
        if bar is not None and advanced < weight:
            bar.advance(weight - advanced)
        result.wall_s = time.perf_counter() - start
    return result
