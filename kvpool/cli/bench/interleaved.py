"""Contenders measured together, round by round, handed to ``kvpool bench`` as its variants.

A pairs benchmark (``sglang_hicache``, ``vllm_tier``) measures every side of
every pair in the same interleaved rounds, so the machine's drift hits all
of them alike.  ``kvpool bench`` asks for one variant at a time;
:func:`interleaved_variants` makes the first variant asked in a trial run
the trial's rounds, and the others return their share of the same rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["interleaved_variants"]

#: ``samples[pair][contender label][f"{op}_s"]``: one run of rounds' seconds.
Samples = Mapping[str, Mapping[str, Mapping[str, Sequence[float]]]]


def interleaved_variants(
    measure: Callable[[bool], Samples],
    pairs: Callable[[], Iterable[tuple[str, Any]]],
    sides: Mapping[str, Callable[[Any], Sequence[Any]]],
    ops: Sequence[str],
    key: Callable[[str, str], str],
) -> dict[str, Callable[[], dict[str, float]]]:
    """``kvpool bench`` variants, one per side, all measured by the same rounds.

    Args:
        measure: runs one trial's rounds (its argument: warm up first, True
            for the first trial only) and returns their seconds.
        pairs: the pairs that started, as ``(name, pair)``.
        sides: variant name -> the pair's contenders that variant reports
            (each has a ``label``).
        ops: the operations a round times (``"store"``, ``"load"``...).
        key: the metric key of a pair's operation.

    Returns:
        Variant name -> a call that returns ``{metric key: median seconds}``.
    """
    trial: dict[str, dict[str, float]] = {}
    warm: list[bool] = []

    def variant(name: str) -> Callable[[], dict[str, float]]:
        def one() -> dict[str, float]:
            if name not in trial:
                trial.clear()
                samples = measure(not warm)
                warm.append(True)
                for side, members in sides.items():
                    trial[side] = {
                        key(pair_name, op): statistics.median(times)
                        for pair_name, pair in pairs()
                        for contender in members(pair)
                        for op in ops
                        if (
                            times := samples.get(pair_name, {})
                            .get(contender.label, {})
                            .get(f"{op}_s")
                        )
                    }
            return trial.pop(name)

        return one

    return {name: variant(name) for name in sides}
