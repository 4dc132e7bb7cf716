"""Argument parsing shared by kvpool's command-line tools."""

from __future__ import annotations

import argparse

__all__ = ["parse_size", "positive_int", "size_arg"]

_UNITS = {"K": 10, "M": 20, "G": 30, "T": 40}


def parse_size(text: str) -> int:
    """Parse a byte count: ``4G``, ``512M``, ``1.5GiB``, ``4096`` (binary units).

    Raises:
        ValueError: not a size, or not positive.
    """
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        shift = _UNITS.get(t[-1:], 0)
        value = int(float(t[:-1]) * (1 << shift)) if shift else int(t)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 4G, 512M, 65536)") from None
    if value <= 0:
        raise ValueError(f"size must be > 0 bytes, got {text!r}")
    return value


def size_arg(text: str) -> int:
    """:func:`parse_size` as an argparse ``type`` (errors become usage errors)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """An int >= 1, as an argparse ``type``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value
