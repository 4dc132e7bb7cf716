"""Every way of making a fresh pool resident, side by side, without and with hugepages (W6).

One run, trials interleaved (the order rotates each trial), median of
``--trials``, GB/s of each of

* ``MixedMemoryAllocator(size)`` -- kvpool's default pool (4 KiB pages:
  hugetlb pages go to the pools that ask; the populate plan's method and
  threads; pinned as well as the machine allows);
* with hugepages, ``MixedMemoryAllocator(size, use_hugepages=True)`` -- the
  pool that asks for them;
* ``allocate_host(size, hugepages="auto")`` -- hugetlb pages when enough
  are free, else 4 KiB pages, without the pool;
* ``torch.zeros(size, dtype=uint8)`` -- the reference;
* the bare methods of :mod:`kvpool.cli.bench.bare`: touch, ``MAP_POPULATE``,
  ``MADV_POPULATE_WRITE`` (one thread and every CPU), ``mlock``,
  ``MAP_POPULATE|MAP_LOCKED``, ``MLOCK_ONFAULT`` + madvise; with hugepages
  also their hugetlb forms;

with the ratios of the default pool (and of the pool asking for hugepages)
to torch.zeros and to the fastest bare method of the same phase.  Each phase
starts with an untimed warm-up (the size faulted once, hugepages too), and
by default each variant runs right after the size was faulted and freed
again (untimed), so that every variant meets memory in the same state: on a
VM that gives freed memory back to its host, memory freed a few seconds ago
is cold, and the order of the variants would otherwise decide their speed.
The first phase runs on the machine as it is (reported: how many 2 MiB pages
were free); with ``--hugepages N`` (root) a second phase reserves N pages
(``/proc/sys/vm/nr_hugepages``) and the old value is restored afterwards,
also on errors.  A variant the machine refuses (mlock over the memlock
limit, no hugepages) is reported as skipped.

Usage::

    python -m kvpool.cli.bench.populate_variants [--size 4G] [--trials 3] \\
        [--hugepages 2100] [--json FILE] [--plot FILE.png]

``--plot`` draws one bar chart per phase (needs matplotlib: ``pip install
'kvpool[plot]'``).  This is a benchmark, not a test: it asserts nothing
about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvpool.cli.args import parse_size
from kvpool.cli.bench import bare
from kvpool.cli.bench.pool_ready import (
    DEFAULT_POOL,
    time_allocate_host,
    time_default_pool,
    time_torch_zeros,
    warm_up,
)
from kvpool.native.machine import capabilities

__all__ = ["main", "reserved_hugepages", "run_phase", "summarize"]

NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
ALLOCATE_HOST = "kvpool allocate_host(hugepages='auto')"
HUGE_POOL = "kvpool MixedMemoryAllocator(size, use_hugepages=True)"
TORCH = "torch.zeros"


@contextlib.contextmanager
def reserved_hugepages(pages: int) -> Iterator[None]:
    """Raise nr_hugepages to at least pages for the block (root only); restore it after."""
    old = int(NR_HUGEPAGES.read_text())
    NR_HUGEPAGES.write_text(str(max(pages, old)))
    print(f"nr_hugepages {old} -> {NR_HUGEPAGES.read_text().strip()} for this phase")
    try:
        yield
    finally:
        NR_HUGEPAGES.write_text(str(old))
        print(f"nr_hugepages restored to {NR_HUGEPAGES.read_text().strip()}")


def run_phase(
    size: int, trials: int, threads: int, *, hugetlb: bool, warm_each: bool = True
) -> dict[str, Any]:
    """Run every variant ``trials`` times, interleaved; return samples, skips and descriptions.

    warm_each: before each variant, fault and free ``size`` bytes of 4 KiB
    pages (untimed), so every variant meets memory the VM's host backs now;
    without it each meets what the one before left (on a VM with free-page
    reporting, memory freed seconds ago is already cold).

    Returns:
        ``{"samples": {name: [seconds...]}, "skipped": {name: reason},
        "got": {name: what kvpool's variants got}, "hugepages_free": int|None}``.
    """
    caps = capabilities(probe_populate=True)
    pool = caps.hugepage_pool(2048)
    got: dict[str, str] = {}
    variants: dict[str, Callable[[], float]] = {}

    def kvpool_variant(name: str, timer: Callable[[], tuple[float, str]]) -> None:
        def trial() -> float:
            seconds, how = timer()
            got[name] = how
            return seconds

        variants[name] = trial

    kvpool_variant(DEFAULT_POOL, lambda: time_default_pool(size))
    if hugetlb:
        kvpool_variant(HUGE_POOL, lambda: time_default_pool(size, use_hugepages=True))
    kvpool_variant(ALLOCATE_HOST, lambda: time_allocate_host(size, hugepages="auto"))
    variants[TORCH] = lambda: time_torch_zeros(size)[0]
    methods = bare.bare_methods(threads)
    if hugetlb:
        methods += bare.bare_methods(threads, hugetlb=True)
    for method in methods:
        variants[f"bare {method.name}"] = lambda m=method: m(size)
    warm_up(size, hugetlb=hugetlb)
    refresh = bare.BareMethod("warm-up", fill=lambda a, s: bare.madvise_all(a, s, threads))
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    skipped: dict[str, str] = {}
    for trial in range(trials):
        order = names[trial % len(names) :] + names[: trial % len(names)]
        for name in order:
            if name in skipped:
                continue
            if warm_each:
                refresh(size)
            try:
                seconds = variants[name]()
            except OSError as exc:
                skipped[name] = str(exc)
                print(f"  {name}: skipped: {exc}")
                continue
            samples[name].append(seconds)
            print(f"  trial {trial + 1} {name:44s} {size / seconds / 1e9:6.2f} GB/s", flush=True)
    return {
        "samples": {n: s for n, s in samples.items() if s},
        "skipped": skipped,
        "got": got,
        "hugepages_free": pool.free if pool else None,
        "populate_plan": {
            "method": caps.populate_method,
            "threads": caps.default_populate_threads,
            "probe": caps.populate_probe,
        },
    }


def summarize(size: int, phase: dict[str, Any]) -> dict[str, Any]:
    """Medians and bests in GB/s, and the kvpool pools' ratios.

    Returns:
        ``{"gbps": {name: {"median", "best"}}, "best_bare": name,
        "pool_vs_torch": float, "pool_vs_best_bare": float,
        "huge_pool_vs_torch": float, "huge_pool_vs_best_bare": float}``
        (ratios of medians; None when a side is missing, e.g. the pool
        asking for hugepages in a phase without them).
    """
    gbps = {
        name: {
            "median": size / statistics.median(times) / 1e9,
            "best": size / min(times) / 1e9,
        }
        for name, times in phase["samples"].items()
    }
    bares = {n: v["median"] for n, v in gbps.items() if n.startswith("bare ")}
    best_bare = max(bares, key=bares.__getitem__) if bares else None
    torch_ = gbps.get(TORCH, {}).get("median")
    out: dict[str, Any] = {"gbps": gbps, "best_bare": best_bare}
    for prefix, name in (("pool", DEFAULT_POOL), ("huge_pool", HUGE_POOL)):
        pool = gbps.get(name, {}).get("median")
        out[f"{prefix}_vs_torch"] = pool / torch_ if pool and torch_ else None
        out[f"{prefix}_vs_best_bare"] = pool / bares[best_bare] if pool and best_bare else None
    return out


def _print_table(title: str, size: int, phase: dict[str, Any], summary: dict[str, Any]) -> None:
    print(f"\n{title}")
    torch_ = summary["gbps"].get(TORCH, {}).get("median")
    print(f"  {'variant':44s} {'median':>7s} {'best':>7s} {'x torch':>8s}  GB/s")
    for name, v in summary["gbps"].items():
        ratio = f"{v['median'] / torch_:7.2f}x" if torch_ else "    n/a"
        mark = "  <- fastest bare" if name == summary["best_bare"] else ""
        print(f"  {name:44s} {v['median']:7.2f} {v['best']:7.2f} {ratio}{mark}")
    for name, reason in phase["skipped"].items():
        print(f"  {name:44s} skipped: {reason}")
    for name, how in phase["got"].items():
        print(f"  {name} got: {how}")
    for prefix, what in (("pool", "default pool"), ("huge_pool", "pool asking for hugepages")):
        vs_torch, vs_bare = summary[f"{prefix}_vs_torch"], summary[f"{prefix}_vs_best_bare"]
        if vs_torch is not None and vs_bare is not None:
            print(
                f"  {what}: {vs_torch:.2f}x torch.zeros, {vs_bare:.2f}x the fastest bare "
                f"method ({summary['best_bare']}), medians of the same run"
            )


def _plot(path: str, size: int, phases: dict[str, dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit(f"--plot needs matplotlib: pip install 'kvpool[plot]' ({exc})") from None
    fig, axes = plt.subplots(1, len(phases), figsize=(7 * len(phases), 6), squeeze=False)
    for ax, (title, summary) in zip(axes[0], phases.items(), strict=True):
        names = list(summary["gbps"])
        values = [summary["gbps"][n]["median"] for n in names]
        colors = [
            "tab:green" if n.startswith("kvpool") else "tab:gray" if n == TORCH else "tab:blue"
            for n in names
        ]
        ax.barh(names[::-1], values[::-1], color=colors[::-1])
        ax.set_xlabel(f"GB/s, {size / 2**30:.3g} GiB made resident (median)")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    """Run the phases; print the tables; write JSON and the plot when asked; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4G", help="pool size (default 4G)")
    parser.add_argument("--trials", type=int, default=3, help="interleaved trials (median of)")
    parser.add_argument(
        "--hugepages", type=int, default=None, metavar="N", help="second phase with N reserved"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="bar chart of both phases")
    parser.add_argument(
        "--no-warm-each",
        action="store_true",
        help="do not fault and free the size before each variant (see run_phase)",
    )
    args = parser.parse_args(argv)
    size = parse_size(args.size)
    if args.trials < 1:
        parser.error("--trials must be >= 1")
    if args.hugepages and os.geteuid() != 0:
        parser.error("--hugepages needs root (it writes /proc/sys/vm/nr_hugepages)")
    threads = max(1, min(len(os.sched_getaffinity(0)), 16))
    results: dict[str, Any] = {"size": size, "trials": args.trials, "phases": {}}
    summaries: dict[str, dict[str, Any]] = {}

    def phase(title: str, hugetlb: bool) -> None:
        print(f"{title}: {size / 2**30:.3g} GiB, {args.trials} interleaved trial(s)")
        ran = run_phase(
            size, args.trials, threads, hugetlb=hugetlb, warm_each=not args.no_warm_each
        )
        title = f"{title} ({ran['hugepages_free']} free 2 MiB pages)"
        summary = summarize(size, ran)
        _print_table(title, size, ran, summary)
        results["phases"][title] = {**ran, **summary}
        summaries[title] = summary

    phase("as the machine is", hugetlb=False)
    if args.hugepages:
        with reserved_hugepages(args.hugepages):
            phase(f"with {args.hugepages} hugepages reserved", hugetlb=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.plot:
        _plot(args.plot, size, summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
