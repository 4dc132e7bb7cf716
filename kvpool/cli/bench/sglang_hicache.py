"""SGLang HiCache L3 round trip: kvpool's backend against SGLang's own, same pages, same server.

::

    python -m kvpool bench --only sglang_hicache              # in an environment with SGLang
    python -m kvpool.cli.bench.sglang_hicache [--rounds 7] [--pages 32]
        [--only file_shm,file_disk,mooncake,redis,cluster] [--disk-dir DIR] [--json PATH]

Runs in an environment with SGLang 0.5.23 (``python -m kvpool install-sglang``
installs it into this one).  A pair whose server cannot start here is left
out, its rows "n/a" with the reason.  The contenders and what a round is:
:mod:`kvpool.cli.bench.sglang_pairs` (SGLang's own host pool, 32 pages of
4 MiB a round, every page read back checked).  The pairs:

=========  =======================================  ============================  ======
pair       kvpool's backend on                      compared with                 target
=========  =======================================  ============================  ======
file_shm   ``file://`` in /dev/shm (tmpfs)          ``HiCacheFile``, same folder  2x
file_disk  ``file://`` in ``--disk-dir`` (/tmp)     ``HiCacheFile``, same folder  2x
mooncake   ``mooncake://``, local master + node     SGLang's ``MooncakeStore``    1.0x
redis      ``redis://``, one local server           ``redis-benchmark``           -
cluster    ``redis-cluster://``, 3 local masters    ``redis-benchmark --cluster`` -
=========  =======================================  ============================  ======

The file pairs also time a bound, ``bare os.write/os.preadv`` (each range
into a new file with one call, read back with one), on the same file
system: what the file system itself costs for the round's bytes.

Rounds interleave every contender of every pair (the order rotating from
round to round); each contender's round starts on an empty store (the
server or folder is emptied after every round, untimed); the first round
is a warm-up.  A ratio is the other contender's seconds over kvpool's (> 1:
kvpool is faster), per round; the report gives the median of the rounds'
ratios and their spread (min-max), and the median MiB/s of each side.  The
load average before and after is printed: a shared machine's figures mean
little without it.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from kvpool.cli.bench import needs
from kvpool.cli.bench.core import Benchmark, Case, Lack, Metric, Settings, SkipBenchmark
from kvpool.cli.bench.interleaved import interleaved_variants
from kvpool.cli.bench.pairs import finish, pair_names, positive_int, run_rounds

__all__ = ["DEFAULT_PAGES", "DEFAULT_ROUNDS", "PAIRS", "Harness", "kvpool_benchmark", "main"]

DEFAULT_ROUNDS = 7
DEFAULT_PAGES = 32
#: Every pair, in the order they are reported.
PAIRS = ("file_shm", "file_disk", "mooncake", "redis", "cluster")
_OPS = ("set", "get")


#: What each pair needs here besides SGLang: a probe giving why not, with the fix (None: it can).
PAIR_NEEDS: dict[str, Callable[[], str | None]] = {
    "file_shm": lambda: None,
    "file_disk": lambda: None,
    "mooncake": needs.mooncake,
    "redis": lambda: needs.redis_client() or needs.redis_cluster_tools() or needs.redis_benchmark(),
    "cluster": lambda: (
        needs.redis_client() or needs.redis_cluster_tools() or needs.redis_benchmark()
    ),
}
#: What each pair's kvpool backend is compared with, for the rows of a pair that did not start.
_OTHERS = {
    "file_shm": "HiCacheFile",
    "file_disk": "HiCacheFile",
    "mooncake": "SGLang MooncakeStore",
    "redis": "redis-benchmark",
    "cluster": "redis-benchmark --cluster",
}


def require_sglang() -> str:
    """SGLang's version, or SkipBenchmark saying how to get an environment that has it."""
    import importlib.metadata

    why = needs.sglang()
    if why is not None:
        raise SkipBenchmark(why)
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Harness:
    """The pages and the pairs of one run; :meth:`measure` runs interleaved rounds.

    Args:
        only: the pairs to start (names of :data:`PAIRS`).
        pages: pages a round moves.
        disk_dir: the folder of ``file_disk`` (None: the system's temporary folder).
        seed: of the page contents.

    Attributes:
        pairs: the pairs that started.
        errors: pair name -> why it could not start, or the round that failed it.
        info: the run's parameters and where each pair runs.
    """

    def __init__(
        self, only: list[str], pages: int, disk_dir: str | None = None, seed: int = 1
    ) -> None:
        from kvpool.cli.bench import sglang_pairs as sp

        self.pages = sp.Pages(pages, seed)
        self.errors: dict[str, str] = {}
        self.pairs: list[sp.Pair] = []
        makers = {
            "file_shm": lambda: sp.file_pair("file_shm", self.pages, "/dev/shm"),
            "file_disk": lambda: sp.file_pair("file_disk", self.pages, disk_dir),
            "mooncake": lambda: sp.mooncake_pair(self.pages),
            "redis": lambda: sp.redis_pair(self.pages, cluster=False),
            "cluster": lambda: sp.redis_pair(self.pages, cluster=True),
        }
        for name in only:
            why = PAIR_NEEDS[name]()
            if why is not None:  # found by looking: nothing to start
                self.errors[name] = f"not started: {why}"
                continue
            try:
                self.pairs.append(makers[name]())
            except (SkipBenchmark, FileNotFoundError, ImportError, RuntimeError, OSError) as exc:
                self.errors[name] = f"not started: {type(exc).__name__}: {exc}"
        self.info: dict[str, Any] = {
            "pages": pages,
            "page_bytes": self.pages.nbytes // pages,
            "entry_bytes": self.pages.ranges,
            "where": {p.name: p.where for p in self.pairs},
        }

    def measure(self, rounds: int, warmup: bool = True) -> dict[str, dict[str, dict[str, list]]]:
        """Interleaved rounds of every contender; pair -> contender -> {"set_s", "get_s"}.

        A pair whose round fails (a page lost, a server gone) is dropped
        from the run, the error kept in :attr:`errors`.
        """
        samples: dict[str, dict[str, dict[str, list[float]]]] = {
            p.name: {c.label: {"set_s": [], "get_s": []} for c in p.contenders()}
            for p in self.pairs
        }
        first = 0 if warmup else 1
        for r in range(first, rounds + 1):
            for i, pair in enumerate(list(self.pairs)):
                order = pair.contenders()
                k = (r + i) % len(order)
                for contender in order[k:] + order[:k]:
                    try:
                        s, g = contender.round(self.pages, self.pages.keys())
                        pair.empty()
                    except Exception as exc:
                        self.errors[pair.name] = f"{contender.label}: {type(exc).__name__}: {exc}"
                        self.pairs.remove(pair)
                        pair.close()
                        del samples[pair.name]
                        break
                    if r:
                        mine = samples[pair.name][contender.label]
                        mine["set_s"].append(s)
                        mine["get_s"].append(g)
                        staging = getattr(contender, "staging", None)
                        if staging:  # SGLang's staging copies, inside its times
                            set_part, get_part = staging[-1]
                            mine.setdefault("set_staging_s", []).append(set_part)
                            mine.setdefault("get_staging_s", []).append(get_part)
        return samples

    def close(self) -> None:
        """Close every backend and stop every server (idempotent)."""
        while self.pairs:
            self.pairs.pop().close()


def summarize(harness: Harness, samples: dict[str, Any]) -> dict[str, Any]:
    """Per pair and operation: MiB/s of each contender, ratios per round, median and spread."""
    mib = harness.pages.nbytes / 2**20
    out: dict[str, Any] = {}
    for pair in harness.pairs:
        got = samples.get(pair.name)
        if not got:
            continue
        row: dict[str, Any] = {"where": pair.where}
        for op in _OPS:
            kv = got[pair.kvpool.label][f"{op}_s"]
            other = got[pair.other.label][f"{op}_s"]
            ratios = [o / k for k, o in zip(kv, other, strict=True)]
            row[op] = {
                "kvpool_mib_s": mib / statistics.median(kv),
                "other": pair.other.label,
                "other_mib_s": mib / statistics.median(other),
                "ratios": ratios,
                "ratio": statistics.median(ratios),
                "spread": [min(ratios), max(ratios)],
                "bounds": {},
            }
            staged = got[pair.other.label].get(f"{op}_staging_s")
            if staged:  # the share of the other's time spent in staging copies
                row[op]["other_staging_share"] = statistics.median(
                    st / t for st, t in zip(staged, other, strict=True)
                )
            for bound in pair.bounds:
                times = got[bound.label][f"{op}_s"]
                share = [b / k for k, b in zip(kv, times, strict=True)]
                row[op]["bounds"][bound.label] = {
                    "mib_s": mib / statistics.median(times),
                    "kvpool_share": statistics.median(share),
                    "spread": [min(share), max(share)],
                }
        out[pair.name] = row
    return out


def format_report(result: dict[str, Any]) -> str:
    """The printed table: one line per pair and operation, then the bounds and errors."""
    lines = [
        f"SGLang HiCache L3, {result['info']['pages']} pages of "
        f"{result['info']['page_bytes'] >> 20} MiB a round, {result['rounds']} rounds "
        f"(load average before {result['load'][0]}, after {result['load'][1]})"
    ]
    for name, row in result["pairs"].items():
        for op in _OPS:
            r = row[op]
            lines.append(
                f"{name:9s} {op}: kvpool {r['kvpool_mib_s']:7.0f} MiB/s, {r['other']} "
                f"{r['other_mib_s']:7.0f} MiB/s: {r['ratio']:.2f}x (rounds "
                f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f})"
            )
            if "other_staging_share" in r:
                lines.append(
                    f"{'':9s} {op}: {r['other']} spent {r['other_staging_share']:.0%} of its "
                    "time in its staging copies"
                )
            for label, b in r["bounds"].items():
                lines.append(
                    f"{'':9s} {op}: {label} {b['mib_s']:7.0f} MiB/s; kvpool at "
                    f"{b['kvpool_share']:.2f} of it ({b['spread'][0]:.2f}-{b['spread'][1]:.2f})"
                )
    for name, row in result["pairs"].items():
        lines.append(f"{name}: {row['where']}")
    for name, why in result["errors"].items():
        lines.append(f"{name}: {why}")
    return "\n".join(lines)


def run(only: list[str], pages: int, rounds: int, disk_dir: str | None) -> dict[str, Any]:
    """Start the pairs, measure, stop them; the result as :func:`format_report` reads it."""
    version = require_sglang()
    harness = Harness(only, pages, disk_dir)
    return run_rounds(harness, rounds, ("sglang", version), summarize)


def main(argv: list[str] | None = None) -> int:
    """Command line; 0 when every pair asked for was measured, 1 otherwise, 2 without SGLang."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS)
    parser.add_argument("--pages", type=positive_int, default=DEFAULT_PAGES)
    parser.add_argument(
        "--only", type=pair_names(PAIRS), default=list(PAIRS), metavar="PAIR[,PAIR]"
    )
    parser.add_argument(
        "--disk-dir", default=None, help=f"file_disk's folder (default {tempfile.gettempdir()})"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every round's figures")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # SGLang's and Mooncake's start-up chatter
    return finish(
        "sglang_hicache",
        lambda: run(args.only, args.pages, args.rounds, args.disk_dir),
        format_report,
        args.json,
        set(args.only),
    )


# -- kvpool bench -------------------------------------------------------------


def _setup(settings: Settings) -> Case:
    """``kvpool bench`` form: each trial is the medians of its interleaved rounds."""
    version = require_sglang()
    logging.disable(logging.WARNING)
    pages = 4 if settings.quick else DEFAULT_PAGES
    rounds = settings.count(5)
    harness = Harness(list(PAIRS), pages, seed=settings.seed)
    harness.info.update({"sglang": version, "rounds_per_trial": rounds, "errors": harness.errors})
    if not harness.pairs:
        raise SkipBenchmark(f"no pair could start: {harness.errors}")
    others = {**_OTHERS, **{p.name: p.other.label for p in harness.pairs}}
    metrics = [Metric(f"{n}_{op}", f"{n} {op} vs {others[n]}", "s") for n in PAIRS for op in _OPS]
    left_out = {
        f"{name}_{op}": why.removeprefix("not started: ")
        for name, why in harness.errors.items()
        for op in _OPS
    }
    sides = {
        "kvpool backend": lambda p: [p.kvpool],
        "SGLang backend / redis-benchmark": lambda p: [p.other],
        "bare file I/O (bound)": lambda p: p.bounds,
    }
    variants = interleaved_variants(
        lambda warmup: harness.measure(rounds, warmup=warmup),
        lambda: [(p.name, p) for p in harness.pairs],
        sides,
        _OPS,
        lambda name, op: f"{name}_{op}",
    )
    return Case(
        metrics=metrics,
        variants=variants,
        subject="kvpool backend",
        baseline="SGLang backend / redis-benchmark",
        info=harness.info,
        cleanup=harness.close,
        left_out=left_out,
    )


def _lacks() -> list[Lack]:
    """SGLang missing (the whole benchmark), else the pairs that cannot start here."""
    why = needs.sglang()
    if why is not None:
        return [Lack("", why)]
    return [Lack(f"the {name} rows", r) for name, probe in PAIR_NEEDS.items() if (r := probe())]


SGLANG_HICACHE = Benchmark(
    "sglang_hicache",
    "SGLang HiCache L3 set/get of 32 x 4 MiB pages: kvpool's backend vs SGLang's",
    _setup,
    _lacks,
)


def kvpool_benchmark() -> Benchmark:
    """The hook :mod:`kvpool.cli.bench` looks for (SkipBenchmark without SGLang)."""
    require_sglang()
    return SGLANG_HICACHE


if __name__ == "__main__":
    sys.exit(main())
