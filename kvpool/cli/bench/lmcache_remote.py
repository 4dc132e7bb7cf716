"""LMCache's StorageManager round trip: kvpool's remote plugin against LMCache's own connectors.

::

    python -m kvpool bench --only lmcache_remote          # in an environment with LMCache
    python -m kvpool.cli.bench.lmcache_remote [--rounds 7] [--passes 1] [--chunks 32]
        [--only-stores redis,cluster,file,mooncake] [--memory lmcache|kvpool]
        [--file-dir DIR] [--json PATH]

A *pass* of a contender is what LMCache's engine does with a remote
backend, through LMCache 0.5.6's own ``StorageManager`` built from an engine
config (YAML): ``chunks`` KV chunks of 2 MiB (bfloat16, KV_2LTD,
``[2, 16, 256, 128]``) are allocated through the manager and filled
(untimed); **put** is ``batched_put`` until every remote write has
completed (LMCache's ``on_complete_callback``) and the remote backend's
``contains`` finds every key; **get** is ``batched_get_blocking``
of every key from the remote backend (``RemoteBackend`` or
``RemoteBackend-<plugin>``).  Every chunk read back is compared byte for
byte (untimed); a pass that loses or changes a chunk stops that
contender.  After every pass the server is emptied (untimed,
:mod:`kvpool.cli.bench.lmcache_stack`), so each pass writes new keys into
an empty store: new files for both file contenders, each in a folder of
its own on the same file system (/dev/shm, or ``--file-dir``).

The pairs, each on the same server (configs: :mod:`kvpool.cli.bench.lmcache_configs`):

=================  ====================================  =====================  ======
pair               LMCache's connector                   kvpool's plugin url    target
=================  ====================================  =====================  ======
redis              ``redis`` plugin (``redis://``)       ``redis://``           1.5x
resp               ``resp://`` (save_chunk_meta off)     ``redis://``           1.0x
cluster            ``redis-cluster://``, 3 masters       ``redis-cluster://``   1.5x
file               ``fs`` plugin, on /dev/shm            ``file://`` /dev/shm   1.0x
mooncake           ``mooncakestore`` (chunk meta on)     ``mooncake://``        1.5x
mooncake_nometa    ``mooncakestore`` (chunk meta off)    ``...&headerless=1``   0.9x
=================  ====================================  =====================  ======

A ratio is LMCache's seconds over kvpool's (> 1: kvpool is faster), of the
medians of the passes, for put and for get apart.  Rounds are interleaved:
in every round each pair runs both its contenders one after the other,
each for ``--passes`` passes back to back, the order flipping from round
to round and pair to pair.  A case's *spread* is how widely its passes
vary: (90th - 10th percentile) / median (:func:`spread`).  The first pass
of every contender is a warm-up and is not counted; before it, each
contender makes one ``contains`` lookup (as LMCache's engine does before
it stores), so no client connects inside a timed put.

Each side runs in a process of its own (:mod:`kvpool.cli.bench.lmcache_child`):
one for kvpool's plugin, one for LMCache's connectors, each holding one
StorageManager per contender; both import the kvpool this process runs
(the parent refuses to measure when one imported another).  ``--memory kvpool`` puts both on kvpool
memory (:func:`kvpool.integrations.lmcache.install`); the default leaves
LMCache's allocators in place.  At the end every manager is closed in a
thread, with a deadline: LMCache 0.5.6's ``close()`` of its Redis, RESP and
Redis Cluster connectors never returns, so the child reports the close
that hung and exits without it; the parent kills a child that does not exit.

Without LMCache the benchmark says so and exits with status 2 (``kvpool
bench`` reports it as unable to run here).  A kind of server that cannot
start here (no redis-server, no Mooncake) is left out, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from kvpool.cli.bench import needs
from kvpool.cli.bench.core import Benchmark, Case, Lack, Metric, Settings, SkipBenchmark
from kvpool.cli.bench.lmcache_configs import CONTENDERS, PAIRS, STORES, Pair, engine_yaml

__all__ = ["DEFAULT_CHUNKS", "DEFAULT_ROUNDS", "KV_SHAPE", "Harness", "kvpool_benchmark", "main"]

#: LMCache's kv_shape: layers, K/V, tokens per chunk, heads, head size (2 MiB of bfloat16).
KV_SHAPE = (16, 2, 256, 2, 64)
CHUNK_BYTES = 2 * KV_SHAPE[0] * KV_SHAPE[2] * KV_SHAPE[3] * KV_SHAPE[4] * 2
DEFAULT_ROUNDS = 7
DEFAULT_CHUNKS = 32
DEFAULT_PASSES = 1
#: Seconds a put may take until the remote holds every key.
PUT_DEADLINE_S = 60.0
#: Seconds the children may take to build every manager (Mooncake's set-up is slow).
START_S = 300.0
#: Seconds the closes of one child may take, all together.
CLOSE_S = 10.0
_CHILD = "kvpool.cli.bench.lmcache_child"
#: The folder that holds the kvpool package this process runs (the children import it too).
KVPOOL_ROOT = str(Path(__file__).resolve().parents[3])


def require_lmcache() -> str:
    """LMCache's version, or SkipBenchmark saying how to get an environment that has it."""
    why = needs.lmcache()
    if why is not None:
        raise SkipBenchmark(why)
    try:
        return importlib.metadata.version("lmcache")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _Child:
    """One side's process: JSON lines in and out, every wait bounded."""

    def __init__(self, side: str, spec: dict[str, Any], logs: Path) -> None:
        self.side = side
        self.log_path = logs / f"{side}.log"
        env = dict(os.environ)
        env.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
        env.setdefault("LMCACHE_TRACK_USAGE", "false")
        env.setdefault("DO_NOT_TRACK", "1")
        env.update({"MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_LOG_LEVEL": "ERROR"})
        # The child runs in the logs folder: without this it would import
        # whatever kvpool the interpreter's install points at, not this one.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (KVPOOL_ROOT, env.get("PYTHONPATH", "")) if p
        )
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", _CHILD],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=logs,
                text=True,
            )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name=f"lmcache-bench-{side}", daemon=True).start()
        self._send(spec)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise RuntimeError(
                f"the {self.side} process is gone ({exc}): {self.log_tail()}"
            ) from None

    def log_tail(self, nbytes: int = 1500) -> str:
        """The end of the process's stderr."""
        try:
            return self.log_path.read_bytes()[-nbytes:].decode(errors="replace").strip()
        except OSError:
            return ""

    def ask(self, message: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        """Send ``message`` (None: just wait) and return the reply.

        Raises:
            RuntimeError: no reply within ``timeout`` s, or the process ended
                (with the end of its log).
        """
        if message is not None:
            self._send(message)
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(
                f"the {self.side} process did not answer within {timeout:g} s: {self.log_tail()}"
            ) from None
        if line is None:
            raise RuntimeError(
                f"the {self.side} process exited ({self.proc.poll()}): {self.log_tail()}"
            )
        return json.loads(line)  # type: ignore[no-any-return]

    def stop(self) -> dict[str, str]:
        """Close its managers (bounded), end the process (killed if need be); the close reports."""
        closed: dict[str, str] = {}
        if self.proc.poll() is None:
            try:
                closed = self.ask({"op": "stop", "close_s": CLOSE_S}, CLOSE_S + 20).get(
                    "closed", {}
                )
            except (RuntimeError, ValueError) as exc:
                closed = {"*": f"no close report: {exc}"}
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                closed["*"] = "the process did not exit; killed"
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        return closed


class Harness:
    """Servers, the two side processes and every contender's manager, warmed up.

    Attributes:
        pairs: the pairs whose server started.
        errors: contender -> why it cannot run (set up, or a failed round).
        info: JSON-able facts of the run (servers, configs, connectors, closes).
    """

    def __init__(
        self,
        stores: list[str],
        chunks: int = DEFAULT_CHUNKS,
        memory: str = "lmcache",
        seed: int = 1,
        file_dir: str | None = None,
    ) -> None:
        from kvpool.cli.bench.lmcache_stack import Stack

        if memory not in ("lmcache", "kvpool"):
            raise ValueError(f"memory must be 'lmcache' or 'kvpool', got {memory!r}")
        self.chunks = chunks
        self._tags = itertools.count()
        self._logs = tempfile.TemporaryDirectory(prefix="kvpool-bench-lmcache-logs-")
        self.children: dict[str, _Child] = {}
        self.errors: dict[str, str] = {}
        self.stack = Stack(stores, chunks * CHUNK_BYTES, file_dir)
        try:
            self._start(memory, seed)
        except BaseException:
            self.close()
            raise

    def _start(self, memory: str, seed: int) -> None:
        stack = self.stack
        self.pairs: list[Pair] = [p for p in PAIRS if CONTENDERS[p.kvpool].store in stack.stores]
        names = list(dict.fromkeys(n for p in self.pairs for n in (p.kvpool, p.lmcache)))
        # The local CPU backend holds a round's chunks twice (put and read back).
        cpu_gb = round(3 * self.chunks * CHUNK_BYTES / 2**30 + 0.05, 2)
        configs = {n: engine_yaml(n, stack.endpoints, KV_SHAPE[2], cpu_gb) for n in names}
        self.info: dict[str, Any] = {
            "chunks": self.chunks,
            "chunk_bytes": CHUNK_BYTES,
            "kv_shape": list(KV_SHAPE),
            "memory": memory,
            "servers": dict(stack.where),
            "stores_left_out": dict(stack.missing),
            "configs": configs,
        }
        run = os.urandom(4).hex()
        for side in ("kvpool", "lmcache"):
            mine = [n for n in names if CONTENDERS[n].side == side]
            if not mine:
                continue
            spec = {
                "memory": memory,
                "chunks": self.chunks,
                "seed": seed,
                "deadline_s": PUT_DEADLINE_S,
                "kv_shape": list(KV_SHAPE),
                "run": run,
                "contenders": [{"name": n, "yaml": configs[n]} for n in mine],
            }
            self.children[side] = _Child(side, spec, Path(self._logs.name))
        built: dict[str, Any] = {}
        for side, child in self.children.items():
            ready = child.ask(None, START_S)
            if "fatal" in ready:
                raise SkipBenchmark(f"the {side} process: {ready['fatal']}")
            if ready.get("kvpool_root") != KVPOOL_ROOT:
                raise RuntimeError(
                    f"the {side} process imported kvpool from {ready.get('kvpool_root')}, "
                    f"not from {KVPOOL_ROOT} as this one: it would measure other code"
                )
            self.errors.update(ready.get("errors", {}))
            built.update(ready.get("built", {}))
        self.info["built"] = built
        for name in names:  # warm-up, not counted
            self.one_pass(name)

    def one_pass(self, name: str) -> dict[str, float] | None:
        """One put + get of contender ``name``, then its server emptied; None once it failed."""
        if name in self.errors:
            return None
        contender = CONTENDERS[name]
        child = self.children[contender.side]
        try:
            reply = child.ask(
                {"op": "round", "name": name, "tag": next(self._tags)}, 2 * PUT_DEADLINE_S + 60
            )
        except RuntimeError as exc:
            reply = {"error": str(exc)}
        if "error" not in reply and (reply["missing"] or reply["wrong"]):
            reply = {
                "error": f"a get returned {reply['missing']} of {self.chunks} chunks missing "
                f"and {reply['wrong']} with other bytes than were put; {reply.get('log', '')}"
            }
        self.stack.wipe(contender.store)
        if "error" in reply:
            self.errors[name] = reply["error"]
            return None
        if reply.get("late"):
            late = self.info.setdefault("late_keys", {})
            late[name] = late.get(name, 0) + reply["late"]
        return {"put_s": reply["put_s"], "get_s": reply["get_s"]}

    def measure(self, rounds: int, passes: int = 1) -> dict[str, dict[str, dict[str, list[float]]]]:
        """``rounds`` interleaved rounds of every pair: pair -> side -> put_s/get_s -> seconds.

        In a round each pair runs its two contenders one after the other,
        each for ``passes`` passes back to back; every pass is a sample.
        """
        out = {
            p.key: {s: {"put_s": [], "get_s": []} for s in ("kvpool", "lmcache")}
            for p in self.pairs
        }
        for r in range(rounds):
            for i, pair in enumerate(self.pairs):
                order = [("kvpool", pair.kvpool), ("lmcache", pair.lmcache)]
                if (r + i) % 2:
                    order.reverse()
                for side, name in order:
                    for _ in range(passes):
                        got = self.one_pass(name)
                        if got is None:
                            break
                        for what, seconds in got.items():
                            out[pair.key][side][what].append(seconds)
        return out

    def close(self) -> None:
        """Stop the processes (bounded) and the servers; the close reports go to ``info``."""
        reports: dict[str, dict[str, str]] = {}
        stops = [
            threading.Thread(target=lambda s=side, c=child: reports.update({s: c.stop()}))
            for side, child in self.children.items()
        ]  # both sides at once: each may wait out its closes' deadline
        for t in stops:
            t.start()
        for t in stops:
            t.join()
        closes = {
            name if name != "*" else side: how
            for side, report in reports.items()
            for name, how in report.items()
        }
        self.children = {}
        if closes and hasattr(self, "info"):
            self.info["close"] = closes
        self.stack.close()
        self._logs.cleanup()


def spread(seconds: list[float]) -> float | None:
    """How widely the passes of one case vary: (90th - 10th percentile) / median.

    The deciles rather than the extremes: on a shared machine one pass in
    twenty or thirty meets another job, and max - min would measure that
    job.  None for fewer than two passes.
    """
    if len(seconds) < 2:
        return None
    deciles = statistics.quantiles(seconds, n=10, method="inclusive")
    return (deciles[-1] - deciles[0]) / statistics.median(seconds)


def summarize(harness: Harness, samples: dict[str, Any]) -> dict[str, Any]:
    """Medians, ratios, spreads and targets per pair, plus why a pair has no figures."""
    rows: dict[str, Any] = {}
    for pair in harness.pairs:
        row: dict[str, Any] = {
            "kvpool": pair.kvpool,
            "lmcache": pair.lmcache,
            "label": CONTENDERS[pair.lmcache].label,
            "target": pair.target,
        }
        for what in ("put", "get"):
            k = samples[pair.key]["kvpool"][f"{what}_s"]
            lmc = samples[pair.key]["lmcache"][f"{what}_s"]
            km = statistics.median(k) if k else None
            lm = statistics.median(lmc) if lmc else None
            ratio = lm / km if km and lm else None
            row[what] = {
                "kvpool_s": km,
                "lmcache_s": lm,
                "ratio": ratio,
                # the fastest rounds, the least disturbed on a busy machine
                "ratio_best": min(lmc) / min(k) if k and lmc else None,
                "met": None if ratio is None else ratio >= pair.target,
                "rounds": [len(k), len(lmc)],
                "spread": [spread(k), spread(lmc)],
                "range_s": [[min(k), max(k)] if k else None, [min(lmc), max(lmc)] if lmc else None],
            }
        problems = {
            n: harness.errors[n] for n in (pair.kvpool, pair.lmcache) if n in harness.errors
        }
        if problems:
            row["errors"] = problems
        rows[pair.key] = row
    return rows


def _cell(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if unit == "x" else f"{value:.3f}"


def _spreads(pair: dict[str, Any]) -> str:
    """``kvpool/LMCache`` spread of one pair's put or get."""
    return "/".join("-" if v is None else f"{v:.2f}" for v in pair["spread"])


def format_report(result: dict[str, Any]) -> str:
    """The table: per pair, put and get seconds of each side, their ratios and spreads."""
    s = result["settings"]
    passes = s.get("passes", 1)
    lines = [
        f"LMCache {result['lmcache']} StorageManager round trip: {s['chunks']} chunks x "
        f"{CHUNK_BYTES >> 20} MiB bf16 KV_2LTD per pass, median of {s['rounds']} interleaved "
        f"rounds x {passes} pass(es) (+1 warm-up), {s['memory']} memory"
        + (f", files under {s['file_dir']}" if s.get("file_dir") else "")
        + "; ratio = LMCache s / kvpool s",
    ]
    head = ("pair", "LMCache connector", "put LMC", "put kvp", "put x", "(best)", "spread",
            "get LMC", "get kvp", "get x", "(best)", "spread", "target")  # fmt: skip
    rows = [head]
    for key, row in result["pairs"].items():
        put, get = row["put"], row["get"]
        marks = [m for m in (put["met"], get["met"]) if m is not None]
        verdict = "" if not marks else ("met" if all(marks) else "NOT met")
        rows.append(
            (key, row["label"], _cell(put["lmcache_s"]), _cell(put["kvpool_s"]),
             _cell(put["ratio"], "x"), _cell(put["ratio_best"], "x"), _spreads(put),
             _cell(get["lmcache_s"]), _cell(get["kvpool_s"]), _cell(get["ratio"], "x"),
             _cell(get["ratio_best"], "x"), _spreads(get),
             f">={row['target']:g}x {verdict}".rstrip())
        )  # fmt: skip
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    for r in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    lines.append(
        "(medians, in seconds per pass of every chunk; put = until the remote holds every key; "
        "(best) = the ratio of the fastest passes; spread = kvpool/LMCache (90th - 10th "
        "percentile) / median of the passes; 'met' reads the median ratios)"
    )
    errors = {n: e for row in result["pairs"].values() for n, e in row.get("errors", {}).items()}
    for name, why in errors.items():
        lines.append(f"not measured: {name}: {why}")
    for name, count in result["info"].get("late_keys", {}).items():
        lines.append(
            f"late: {name}: {count} key(s) not there yet when LMCache said their write had "
            "completed (the put's time ran on until they were)"
        )
    for kind, why in result["info"].get("stores_left_out", {}).items():
        lines.append(f"left out: {kind}: {why}")
    for name, how in result["info"].get("close", {}).items():
        if how != "ok":
            lines.append(f"close: {name}: {how}")
    return "\n".join(lines)


def run(
    rounds: int,
    chunks: int,
    stores: list[str],
    memory: str = "lmcache",
    seed: int = 1,
    passes: int = 1,
    file_dir: str | None = None,
) -> dict[str, Any]:
    """Start everything, measure ``rounds`` interleaved rounds, stop everything; the result."""
    from kvpool.cli.bench.report import machine_info

    version = require_lmcache()
    harness = Harness(stores, chunks, memory, seed, file_dir)
    try:
        samples = harness.measure(rounds, passes)
        pairs = summarize(harness, samples)
    finally:
        harness.close()
    return {
        "lmcache": version,
        "settings": {
            "rounds": rounds,
            "passes": passes,
            "chunks": chunks,
            "stores": stores,
            "memory": memory,
            "file_dir": file_dir,
        },
        "machine": machine_info(),
        "info": harness.info,
        "pairs": pairs,
        "samples": samples,
    }


def _stores(text: str) -> list[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in STORES]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(STORES)}, got {text!r}")
    return list(dict.fromkeys(chosen))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Command line; 0 when every pair was measured, 1 when one was not, 2 without LMCache."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--rounds",
        type=_positive,
        default=DEFAULT_ROUNDS,
        help=f"interleaved rounds per contender, after one warm-up (default {DEFAULT_ROUNDS})",
    )
    p.add_argument(
        "--chunks",
        type=_positive,
        default=DEFAULT_CHUNKS,
        help=f"2 MiB chunks per round (default {DEFAULT_CHUNKS})",
    )
    p.add_argument(
        "--passes",
        type=_positive,
        default=DEFAULT_PASSES,
        help=f"passes of each contender, back to back, in every round (default {DEFAULT_PASSES})",
    )
    p.add_argument(
        "--only-stores",
        type=_stores,
        default=list(STORES),
        metavar="KIND[,KIND]",
        help=f"servers to measure on (default {','.join(STORES)})",
    )
    p.add_argument(
        "--memory",
        choices=("lmcache", "kvpool"),
        default="lmcache",
        help="whose allocators hold the chunks, on both sides (default lmcache)",
    )
    p.add_argument(
        "--file-dir",
        metavar="DIR",
        help="make the file store's folders under DIR (default /dev/shm): e.g. a disk folder",
    )
    p.add_argument("--json", metavar="PATH", help="also write every pass's figures as JSON")
    args = p.parse_args(argv)
    if args.json and not Path(args.json).resolve().parent.is_dir():
        print(f"lmcache_remote: --json {args.json}: no such directory", file=sys.stderr)
        return 2
    # A SIGTERM (e.g. a test's timeout) unwinds, so the servers and children are stopped.
    signal.signal(signal.SIGTERM, _terminated)
    try:
        if args.file_dir is not None and not os.path.isdir(args.file_dir):
            print(f"lmcache_remote: --file-dir {args.file_dir}: no such folder", file=sys.stderr)
            return 2
        result = run(
            args.rounds,
            args.chunks,
            args.only_stores,
            args.memory,
            passes=args.passes,
            file_dir=args.file_dir,
        )
    except SkipBenchmark as exc:
        print(f"lmcache_remote cannot run here: {exc}", file=sys.stderr)
        return 2
    print(format_report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"JSON: {args.json}")
    measured = all(
        row[w]["ratio"] is not None for row in result["pairs"].values() for w in ("put", "get")
    )
    return 0 if measured and result["pairs"] else 1


# -- kvpool bench ------------------------------------------------------------


def _setup(settings: Settings) -> Case:
    """``kvpool bench`` form: every store, each trial the medians of its interleaved rounds."""
    version = require_lmcache()
    chunks = 8 if settings.quick else DEFAULT_CHUNKS
    rounds = settings.count(5)
    harness = Harness(list(STORES), chunks, "lmcache", settings.seed)
    harness.info.update({"lmcache": version, "rounds_per_trial": rounds})
    metrics = [
        Metric(f"{p.key}_{w}", f"{p.key} {w} vs {CONTENDERS[p.lmcache].label}", "s")
        for p in PAIRS
        for w in ("put", "get")
    ]
    left_out: dict[str, str] = {}
    for p in PAIRS:
        why = harness.stack.missing.get(CONTENDERS[p.kvpool].store) or "; ".join(
            f"{name} did not set up: {harness.errors[name]}"
            for name in (p.kvpool, p.lmcache)
            if name in harness.errors
        )
        left_out.update({f"{p.key}_{w}": why for w in ("put", "get") if why})
    trial: dict[str, dict[str, float]] = {}

    def side(name: str) -> Any:
        # Both sides are measured together, interleaved round by round; the
        # variant the runner calls first in a trial measures, the other one
        # returns its half of the same trial.
        def one() -> dict[str, float]:
            if name not in trial:
                trial.clear()
                samples = harness.measure(rounds)
                for s in ("kvpool", "lmcache"):
                    trial[s] = {
                        f"{key}_{w}": statistics.median(v[s][f"{w}_s"])
                        for key, v in samples.items()
                        for w in ("put", "get")
                        if v[s][f"{w}_s"]
                    }
            return trial.pop(name)

        return one

    harness.info["errors"] = harness.errors
    return Case(
        metrics=metrics,
        variants={"kvpool plugin": side("kvpool"), "LMCache connector": side("lmcache")},
        subject="kvpool plugin",
        baseline="LMCache connector",
        info=harness.info,
        cleanup=harness.close,
        left_out=left_out,
    )


def _lacks() -> list[Lack]:
    """LMCache missing (the whole benchmark), else the pairs whose server cannot start here."""
    from kvpool.cli.bench.lmcache_stack import STORE_NEEDS

    why = needs.lmcache()
    if why is not None:
        return [Lack("", why)]
    lacks = []
    for store, probe in STORE_NEEDS.items():
        reason = probe()
        rows = [p.key for p in PAIRS if CONTENDERS[p.kvpool].store == store]
        if reason is not None and rows:
            lacks.append(Lack(f"the {'/'.join(rows)} rows", reason))
    return lacks


LMCACHE_REMOTE = Benchmark(
    "lmcache_remote",
    "LMCache StorageManager put/get of 32 x 2 MiB: kvpool's plugin vs LMCache's connectors",
    _setup,
    _lacks,
)


def kvpool_benchmark() -> Benchmark:
    """The hook :mod:`kvpool.cli.bench` looks for (SkipBenchmark without LMCache)."""
    require_lmcache()
    return LMCACHE_REMOTE


if __name__ == "__main__":
    sys.exit(main())
