"""vLLM secondary tier store/load: kvpool's tier against vLLM's own ``fs`` tier, same chunks, jobs.

::

    python -m kvpool bench --only vllm_tier                   # in an environment with vLLM
    python -m kvpool.cli.bench.vllm_tier [--rounds 7] [--sizes 2M,256K] [--round-bytes 128M]
        [--job-chunks 8] [--only file_shm,file_disk,redis] [--disk-dir DIR]
        [--kvpool-option KEY=VALUE ...] [--json PATH]

Runs in an environment with vLLM 0.33 (``python -m kvpool install-vllm`` puts
its scheduler side into this one, on a CPU machine too).  A pair whose server
cannot start here is left out, its rows "n/a" with the reason.  The
contenders and what a round is: :mod:`kvpool.cli.bench.vllm_tier_pairs`
(vLLM's own primary region and tier factory; a round stores ``--round-bytes``
of chunks in jobs of ``--job-chunks``, all submitted at once and polled, then
loads them back, every byte checked).  Each pair runs at every chunk size of
``--sizes``:

=========  ==========================================  ================================  ======
pair       kvpool's tier on                            compared with                     target
=========  ==========================================  ================================  ======
file_shm   a /dev/shm folder, its defaults             vLLM ``fs``, a sibling folder     1.0x
file_disk  a ``--disk-dir`` folder (/var/tmp), with    vLLM ``fs``, a sibling folder     1.0x
           ``direct_io`` where vLLM's probe picks
           ``O_DIRECT`` (else both buffered)
redis      ``redis://``, one local server              ``redis-benchmark`` at its best   0.9x
=========  ==========================================  ================================  ======

The file pairs also time bounds on the same file system: one thread writing
each chunk to a temporary file and renaming it, then reading it back with one
``os.readv`` (buffered, and with ``O_DIRECT`` where the file system takes it),
and print each side's CPU time per chunk (all its threads): a figure a busy
machine disturbs less than seconds.  Where vLLM's C file I/O
(``vllm.fs_io_C``) does not load - a machine without CUDA's libraries - vLLM's
tier runs its Python I/O path, and the report says so.

Rounds interleave every contender of every pair (the order rotating from
round to round); each round's store starts empty (after every round, untimed,
the keys are deleted, the files removed on tmpfs and moved aside on a disk,
see :class:`~kvpool.cli.bench.pairs.Pair`); the first round is a
warm-up.  A ratio is the other contender's seconds over kvpool's (> 1: kvpool
is faster), per round; the report gives the median of the rounds' ratios and
their spread (min-max), and the median GB/s of each side.  The load average
before and after is printed: a shared machine's figures mean little without it.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpool.cli.bench import needs
from kvpool.cli.bench.core import (
    Benchmark,
    Case,
    KiB,
    Lack,
    Metric,
    MiB,
    Settings,
    SkipBenchmark,
)
from kvpool.cli.bench.interleaved import interleaved_variants
from kvpool.cli.bench.pairs import finish, pair_names, positive_int, run_rounds

__all__ = [
    "DEFAULT_JOB_CHUNKS",
    "DEFAULT_ROUNDS",
    "DEFAULT_ROUND_BYTES",
    "DEFAULT_SIZES",
    "PAIRS",
    "PAIR_NEEDS",
    "Harness",
    "kvpool_benchmark",
    "main",
    "require_vllm",
]

DEFAULT_ROUNDS = 7
#: Bytes of chunks a round stores and loads, whatever their size.
DEFAULT_ROUND_BYTES = 128 * MiB
#: Chunk sizes every pair runs at.
DEFAULT_SIZES = (2 * MiB, 256 * KiB)
#: Chunks per job (a request's chunks of one scheduler step).
DEFAULT_JOB_CHUNKS = 8
#: The folder of ``file_disk`` unless ``--disk-dir`` says otherwise (a disk, not tmpfs).
DEFAULT_DISK_DIR = "/var/tmp"
#: Every pair, in the order they are reported.
PAIRS = ("file_shm", "file_disk", "redis")
_OPS = ("store", "load")
_PAGE = 4096


def _redis_lacks() -> str | None:
    return needs.redis_client() or needs.redis_server() or needs.redis_benchmark()


#: What each pair needs here besides vLLM: a probe giving why not, with the fix (None: it can).
PAIR_NEEDS: dict[str, Callable[[], str | None]] = {
    "file_shm": lambda: None if Path("/dev/shm").is_dir() else "this machine has no /dev/shm",
    "file_disk": lambda: None,
    "redis": _redis_lacks,
}
#: What each pair's kvpool tier is compared with, for the rows of a pair that did not start.
_OTHERS = {
    "file_shm": "vLLM fs",
    "file_disk": "vLLM fs",
    "redis": "redis-benchmark",
}


def require_vllm() -> str:
    """vLLM's version, or SkipBenchmark saying how to get it (its tiering code must import)."""
    import importlib.metadata

    why = needs.vllm()
    if why is not None:
        raise SkipBenchmark(why)
    try:
        import vllm.v1.kv_offload.tiering.fs.manager  # noqa: F401
    except ImportError as exc:
        raise SkipBenchmark(
            f"vLLM's tiering code does not import here ({exc}); `python -m kvpool "
            "install-vllm` installs what its scheduler side imports"
        ) from exc
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def size_label(size: int) -> str:
    """``2M``, ``256K``: a chunk size in the rows' names."""
    return f"{size // MiB}M" if size % MiB == 0 else f"{size // KiB}K"


class Harness:
    """The rows and the pairs of one run; :meth:`measure` runs interleaved rounds.

    Args:
        only: the pairs to start (names of :data:`PAIRS`).
        sizes: chunk sizes, each a multiple of 4096.
        round_bytes: bytes of chunks a round moves at each size.
        job_chunks: chunks per job.
        disk_dir: the folder of ``file_disk``.
        seed: of the chunks' contents.
        options: more keys of kvpool's tier entry in every pair (e.g.
            ``{"threads": 16}``); None: the tier's defaults.

    Raises:
        ValueError: a size that is not a multiple of 4096, or larger than ``round_bytes``.

    Attributes:
        pairs: the pairs that started, as ``(pair, rows)``; a pair's name is
            ``<pair>/<size>`` (``file_shm/2M``).
        errors: pair name -> why it could not start, or the round that failed it.
        info: the run's parameters and where each pair runs.
    """

    def __init__(
        self,
        only: list[str],
        sizes: list[int],
        round_bytes: int,
        job_chunks: int,
        disk_dir: str = DEFAULT_DISK_DIR,
        seed: int = 1,
        options: dict[str, Any] | None = None,
    ) -> None:
        from kvpool.cli.bench import vllm_tier_pairs as vp

        for size in sizes:
            if size % _PAGE or size > round_bytes:
                raise ValueError(
                    f"chunk size {size} must be a multiple of {_PAGE} and at most the round's "
                    f"{round_bytes} bytes; give sizes like 2M or 256K"
                )
        self.errors: dict[str, str] = {}
        self.pairs: list[tuple[vp.Pair, vp.Rows]] = []
        self._rows: list[vp.Rows] = []
        makers: dict[str, Callable[[str, vp.Rows], vp.Pair]] = {
            "file_shm": lambda n, r: vp.file_pair(n, r, "/dev/shm", job_chunks, False, options),
            "file_disk": lambda n, r: vp.file_pair(n, r, disk_dir, job_chunks, True, options),
            "redis": lambda n, r: vp.redis_pair(n, r, job_chunks, options),
        }
        try:
            for size in sizes:
                rows = vp.Rows(round_bytes // size, size, seed)
                self._rows.append(rows)
                for name in only:
                    label = f"{name}/{size_label(size)}"
                    why = PAIR_NEEDS[name]()
                    if why is not None:  # found by looking: nothing to start
                        self.errors[label] = f"not started: {why}"
                        continue
                    try:
                        self.pairs.append((makers[name](label, rows), rows))
                    except (SkipBenchmark, ImportError, RuntimeError, OSError) as exc:
                        self.errors[label] = f"not started: {type(exc).__name__}: {exc}"
        except BaseException:
            self.close()
            raise
        self.info: dict[str, Any] = {
            "sizes": [size_label(s) for s in sizes],
            "round_bytes": round_bytes,
            "job_chunks": job_chunks,
            "kvpool_options": dict(options or {}),
            "chunks": {size_label(r.row_bytes): r.count for r in self._rows},
            "where": {p.name: p.where for p, _ in self.pairs},
            "vllm_fs_io_c": vp.fs_io_c() or "loaded",
        }

    def measure(self, rounds: int, warmup: bool = True) -> dict[str, dict[str, dict[str, list]]]:
        """Interleaved rounds of every contender; pair -> contender -> {"store_s", "load_s"}.

        A pair whose round fails (a chunk lost, a job failed, a server gone)
        is dropped from the run, the error kept in :attr:`errors`.
        """
        samples: dict[str, dict[str, dict[str, list[float]]]] = {
            p.name: {c.label: {"store_s": [], "load_s": []} for c in p.contenders()}
            for p, _ in self.pairs
        }
        first = 0 if warmup else 1
        for r in range(first, rounds + 1):
            for i, (pair, rows) in enumerate(list(self.pairs)):
                order = pair.contenders()
                k = (r + i) % len(order)
                for contender in order[k:] + order[:k]:
                    try:
                        s, g = contender.round(rows, rows.keys())
                        pair.empty()
                    except Exception as exc:
                        self.errors[pair.name] = f"{contender.label}: {type(exc).__name__}: {exc}"
                        self.pairs.remove((pair, rows))
                        pair.close()
                        del samples[pair.name]
                        break
                    if r:
                        mine = samples[pair.name][contender.label]
                        mine["store_s"].append(s)
                        mine["load_s"].append(g)
                        if contender.cpu:  # CPU seconds, where the work runs in this process
                            store_cpu, load_cpu = contender.cpu[-1]
                            mine.setdefault("store_cpu_s", []).append(store_cpu)
                            mine.setdefault("load_cpu_s", []).append(load_cpu)
        return samples

    def close(self) -> None:
        """Shut every tier down, stop every server, unmap the rows (idempotent)."""
        while self.pairs:
            self.pairs.pop()[0].close()
        while self._rows:
            self._rows.pop().close()


def summarize(harness: Harness, samples: dict[str, Any]) -> dict[str, Any]:
    """Per pair and operation: GB/s of each side, ratios per round, median and spread."""
    out: dict[str, Any] = {}
    for pair, rows in harness.pairs:
        got = samples.get(pair.name)
        if not got:
            continue
        gb = rows.nbytes / 1e9
        row: dict[str, Any] = {"where": pair.where}
        for op in _OPS:
            kv = got[pair.kvpool.label][f"{op}_s"]
            other = got[pair.other.label][f"{op}_s"]
            ratios = [o / k for k, o in zip(kv, other, strict=True)]
            row[op] = {
                "kvpool_gb_s": gb / statistics.median(kv),
                "other": pair.other.label,
                "other_gb_s": gb / statistics.median(other),
                "ratios": ratios,
                "ratio": statistics.median(ratios),
                "spread": [min(ratios), max(ratios)],
                "bounds": {},
            }
            cpu = {
                c.label: statistics.median(got[c.label][f"{op}_cpu_s"]) / rows.count * 1e6
                for c in pair.contenders()
                if got[c.label].get(f"{op}_cpu_s")
            }
            if pair.kvpool.label in cpu and pair.other.label in cpu:
                row[op]["cpu_us_per_chunk"] = cpu
            for bound in pair.bounds:
                times = got[bound.label][f"{op}_s"]
                share = [b / k for k, b in zip(kv, times, strict=True)]
                row[op]["bounds"][bound.label] = {
                    "gb_s": gb / statistics.median(times),
                    "kvpool_share": statistics.median(share),
                    "spread": [min(share), max(share)],
                }
        out[pair.name] = row
    return out


def format_report(result: dict[str, Any]) -> str:
    """The printed table: one line per pair and operation, then the bounds and errors."""
    info = result["info"]
    lines = [
        f"vLLM secondary tier, {info['round_bytes'] >> 20} MiB of chunks a round "
        f"({', '.join(f'{n} x {s}' for s, n in info['chunks'].items())}), jobs of "
        f"{info['job_chunks']} chunks, {result['rounds']} rounds (load average before "
        f"{result['load'][0]}, after {result['load'][1]})"
    ]
    if info["kvpool_options"]:
        lines.append(f"kvpool's tier with {json.dumps(info['kvpool_options'])}")
    for name, row in result["pairs"].items():
        for op in _OPS:
            r = row[op]
            lines.append(
                f"{name:13s} {op}: kvpool {r['kvpool_gb_s']:5.2f} GB/s, {r['other']} "
                f"{r['other_gb_s']:5.2f} GB/s: {r['ratio']:.2f}x (rounds "
                f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f})"
            )
            for label, b in r["bounds"].items():
                lines.append(
                    f"{'':13s} {op}: {label} {b['gb_s']:5.2f} GB/s; kvpool at "
                    f"{b['kvpool_share']:.2f} of it ({b['spread'][0]:.2f}-{b['spread'][1]:.2f})"
                )
            if "cpu_us_per_chunk" in r:
                cpu = ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_us_per_chunk"].items())
                lines.append(f"{'':13s} {op}: CPU us a chunk (all threads): {cpu}")
    for name, row in result["pairs"].items():
        lines.append(f"{name}: {row['where']}")
    if info["vllm_fs_io_c"] != "loaded":
        lines.append(
            "vLLM fs ran its Python I/O path: its C extension (vllm.fs_io_C) does not load "
            f"here ({info['vllm_fs_io_c']})"
        )
    for name, why in result["errors"].items():
        lines.append(f"{name}: {why}")
    return "\n".join(lines)


def run(
    only: list[str],
    sizes: list[int],
    rounds: int,
    round_bytes: int = DEFAULT_ROUND_BYTES,
    job_chunks: int = DEFAULT_JOB_CHUNKS,
    disk_dir: str = DEFAULT_DISK_DIR,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Start the pairs, measure, stop them; the result as :func:`format_report` reads it."""
    version = require_vllm()
    harness = Harness(only, sizes, round_bytes, job_chunks, disk_dir, options=options)
    return run_rounds(harness, rounds, ("vllm", version), summarize)


def _size(text: str) -> int:
    from kvpool.cli.args import size_arg

    size = size_arg(text)
    if size % _PAGE:
        raise argparse.ArgumentTypeError(
            f"a chunk size must be a multiple of {_PAGE} (vLLM's rows are page-aligned), "
            f"got {text} = {size}"
        )
    return size


def _option(text: str) -> tuple[str, Any]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, e.g. threads=16, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value  # a plain string


def _sizes(text: str) -> list[int]:
    sizes = [_size(t) for t in text.split(",") if t]
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected SIZE[,SIZE], e.g. 2M,256K, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    """Command line; 0 when every pair asked for was measured, 1 otherwise, 2 without vLLM."""
    from kvpool.cli.args import size_arg

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS)
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=list(DEFAULT_SIZES),
        metavar="SIZE[,SIZE]",
        help="chunk sizes (default 2M,256K)",
    )
    parser.add_argument(
        "--round-bytes",
        type=size_arg,
        default=DEFAULT_ROUND_BYTES,
        metavar="SIZE",
        help="bytes of chunks a round moves (default 128M)",
    )
    parser.add_argument(
        "--job-chunks",
        type=positive_int,
        default=DEFAULT_JOB_CHUNKS,
        metavar="N",
        help=f"chunks per job (default {DEFAULT_JOB_CHUNKS})",
    )
    parser.add_argument(
        "--kvpool-option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another key of kvpool's tier entry, e.g. threads=16 or io_threads=2 (repeatable)",
    )
    parser.add_argument(
        "--only", type=pair_names(PAIRS), default=list(PAIRS), metavar="PAIR[,PAIR]"
    )
    parser.add_argument(
        "--disk-dir",
        default=DEFAULT_DISK_DIR,
        help=f"file_disk's folder, on a disk (default {DEFAULT_DISK_DIR})",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every round's figures")
    args = parser.parse_args(argv)
    if any(size > args.round_bytes for size in args.sizes):
        parser.error(f"--round-bytes {args.round_bytes} is smaller than a chunk of --sizes")
    logging.disable(logging.WARNING)  # vLLM's start-up chatter
    options = dict(args.kvpool_option)
    return finish(
        "vllm_tier",
        lambda: run(
            args.only,
            args.sizes,
            args.rounds,
            args.round_bytes,
            args.job_chunks,
            args.disk_dir,
            options,
        ),
        format_report,
        args.json,
        {f"{n}/{size_label(s)}" for n in args.only for s in args.sizes},
    )


# -- kvpool bench -------------------------------------------------------------


def _metric_key(name: str, op: str) -> str:
    return f"{name.replace('/', '_')}_{op}"


def _setup(settings: Settings) -> Case:
    """``kvpool bench`` form: each trial is the medians of its interleaved rounds."""
    version = require_vllm()
    logging.disable(logging.WARNING)
    round_bytes = 8 * MiB if settings.quick else DEFAULT_ROUND_BYTES
    rounds = settings.count(5)
    harness = Harness(list(PAIRS), list(DEFAULT_SIZES), round_bytes, DEFAULT_JOB_CHUNKS,
                      seed=settings.seed)  # fmt: skip
    harness.info.update({"vllm": version, "rounds_per_trial": rounds, "errors": harness.errors})
    if not harness.pairs:
        harness.close()
        raise SkipBenchmark(f"no pair could start: {harness.errors}")
    names = [f"{n}/{size_label(s)}" for s in DEFAULT_SIZES for n in PAIRS]
    others = {name: _OTHERS[name.split("/")[0]] for name in names}
    others.update({p.name: p.other.label for p, _ in harness.pairs})
    metrics = [
        Metric(_metric_key(n, op), f"{n} {op} vs {others[n]}", "s") for n in names for op in _OPS
    ]
    left_out = {
        _metric_key(name, op): why.removeprefix("not started: ")
        for name, why in harness.errors.items()
        for op in _OPS
    }
    sides: dict[str, Callable[[Any], list[Any]]] = {
        "kvpool tier": lambda p: [p.kvpool],
        "vLLM fs tier / redis-benchmark": lambda p: [p.other],
        # The bound in the pair's own I/O mode (buffered on tmpfs, O_DIRECT on disk).
        "bare write+rename/readv (bound)": lambda p: p.bounds[:1],
    }
    variants = interleaved_variants(
        lambda warmup: harness.measure(rounds, warmup=warmup),
        lambda: [(p.name, p) for p, _ in harness.pairs],
        sides,
        _OPS,
        _metric_key,
    )
    return Case(
        metrics=metrics,
        variants=variants,
        subject="kvpool tier",
        baseline="vLLM fs tier / redis-benchmark",
        info=harness.info,
        cleanup=harness.close,
        left_out=left_out,
    )


def _lacks() -> list[Lack]:
    """vLLM missing (the whole benchmark), else the pairs that cannot start here."""
    why = needs.vllm()
    if why is not None:
        return [Lack("", why)]
    return [Lack(f"the {name} rows", r) for name, probe in PAIR_NEEDS.items() if (r := probe())]


VLLM_TIER = Benchmark(
    "vllm_tier",
    "vLLM secondary tier store/load of 2 MiB and 256 KiB chunks: kvpool's tier vs vLLM's fs",
    _setup,
    _lacks,
)


def kvpool_benchmark() -> Benchmark:
    """The hook :mod:`kvpool.cli.bench` looks for (SkipBenchmark without vLLM; imports none)."""
    why = needs.vllm()
    if why is not None:
        raise SkipBenchmark(why)
    return VLLM_TIER


if __name__ == "__main__":
    sys.exit(main())
