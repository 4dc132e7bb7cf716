"""What every pairs benchmark shares: its contenders and pairs, one run, and its command line.

A pairs benchmark (``sglang_hicache``, ``vllm_tier``) puts kvpool's side of
an engine's plug-in point beside what the engine's users would otherwise run,
each pair with bounds, every contender in every round (see
:mod:`kvpool.cli.bench.interleaved` for how ``kvpool bench`` takes those
rounds).  Each benchmark brings its own data (pages, rows), contenders and
report; the shapes here are the same for all:

* :class:`Contender` - one way of moving a round's data: write, then read;
* :class:`Pair` - kvpool's contender, the one it is compared with, bounds,
  and how its store is emptied and stopped;
* :func:`run_rounds` - measure a harness's pairs and put the result in the
  form the reports read;
* :func:`positive_int`, :func:`pair_names` and :func:`finish` - the
  command line's argument types and its ending.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kvpool.cli.bench.core import SkipBenchmark

__all__ = [
    "Contender",
    "Harness",
    "Pair",
    "finish",
    "pair_names",
    "positive_int",
    "run_rounds",
]


class Contender:
    """One way of moving a round's data: :meth:`round` returns (write, read) seconds.

    Attributes:
        label: how the report names it.
        cpu: per round, the process's CPU seconds of the write and of the read
            (all its threads), for a contender that measures them; else unset.
    """

    label = "?"
    cpu: list[tuple[float, float]]

    def round(self, data: Any, keys: list[Any]) -> tuple[float, float]:
        """Write ``keys``' data from the round's sources, read it back; the two times."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what it holds (idempotent)."""


@dataclass
class Pair:
    """A row of the report: kvpool's contender against another, with bounds.

    Attributes:
        name: the report's row.
        kvpool: kvpool's contender.
        other: the contender compared with (the engine's own, or a server's
            own benchmark tool).
        where: what the pair runs on (for the report).
        bounds: contenders shown as bounds (no ratio to beat); the first is
            the one in the pair's own I/O mode.
        empty: called after every round (untimed).
        stop: called once at the end.
    """

    name: str
    kvpool: Contender
    other: Contender
    where: str
    bounds: list[Contender] = field(default_factory=list)
    empty: Callable[[], None] = lambda: None
    stop: list[Callable[[], None]] = field(default_factory=list)

    def contenders(self) -> list[Contender]:
        """Every contender: kvpool's, the other, the bounds."""
        return [self.kvpool, self.other, *self.bounds]

    def close(self) -> None:
        """Close the contenders and stop the servers (idempotent)."""
        for c in self.contenders():
            c.close()
        while self.stop:
            self.stop.pop()()


class Harness(Protocol):
    """What :func:`run_rounds` needs of a benchmark's harness."""

    info: dict[str, Any]
    errors: dict[str, str]

    def measure(self, rounds: int) -> dict[str, Any]:
        """Every contender of every pair, ``rounds`` interleaved rounds: their samples."""
        ...

    def close(self) -> None:
        """Stop every pair."""
        ...


def run_rounds(
    harness: Harness,
    rounds: int,
    engine: tuple[str, str],
    summarize: Callable[[Any, dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Measure ``harness``'s pairs, then stop them; the result the reports read.

    Args:
        harness: the started pairs (closed here, whatever happens).
        rounds: interleaved rounds.
        engine: ``(name, version)`` of the engine, recorded in the result.
        summarize: ``(harness, samples) -> pairs``, the benchmark's figures.

    Returns:
        The engine's version under its name, ``rounds``, the load average
        before and after, the harness's ``info``, the pairs' figures, the raw
        samples and the pairs that could not start (``errors``).
    """
    load = [os.getloadavg()]
    try:
        samples = harness.measure(rounds)
        load.append(os.getloadavg())
        return {
            engine[0]: engine[1],
            "rounds": rounds,
            "load": [" ".join(f"{x:.2f}" for x in avg) for avg in load],
            "info": harness.info,
            "pairs": summarize(harness, samples),
            "samples": samples,
            "errors": harness.errors,
        }
    finally:
        harness.close()


def positive_int(text: str) -> int:
    """An argument type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def pair_names(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """An argument type: comma-separated names, each one of ``choices``."""

    def names(text: str) -> list[str]:
        picked = [n for n in text.split(",") if n]
        if not picked or any(n not in choices for n in picked):
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)}, got {text!r}")
        return picked

    return names


def finish(
    benchmark: str,
    run: Callable[[], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    json_path: str | None,
    asked: set[str],
) -> int:
    """Run, print the report, write the JSON if asked; the command's exit status.

    Returns:
        0 when every pair in ``asked`` was measured, 1 when one was not, 2 when
        the benchmark cannot run here (its engine is missing: said on stderr).
    """
    try:
        result = run()
    except SkipBenchmark as exc:
        print(f"{benchmark} cannot run here: {exc}", file=sys.stderr)
        return 2
    print(report(result))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if set(result["pairs"]) == asked else 1
