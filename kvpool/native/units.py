"""Byte counts as short text and back: the one format of every message, report and size option."""

from __future__ import annotations

from kvpool.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["format_bytes", "parse_size"]

#: What a size's unit letter multiplies by: binary units, however they are spelt.
_SHIFTS = {"K": 10, "M": 20, "G": 30, "T": 40, "P": 50}


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it short: 4 GiB, 256 MiB, 1.5 KiB."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n:.0f} B"


def parse_size(text: str) -> int:
    """Bytes from a size as the command line reads it: ``4G``, ``512MB``, ``1.5GiB``, ``65536``.

    Units are binary whichever way they are written: ``64M``, ``64MB`` and
    ``64MiB`` are all 64 MiB (67108864 bytes); a bare number is bytes.  The
    Python API takes sizes as ints: ``MixedMemoryAllocator(parse_size("64MB"))``.

    Args:
        text: the size.

    Returns:
        The number of bytes, > 0.

    Raises:
        ArgumentTypeError: ``text`` is not a str.
        InvalidArgumentError: not a size, or not positive.
    """
    if not isinstance(text, str):
        raise ArgumentTypeError(f"a size to parse must be a str, got {type(text).__name__}")
    number = text.strip().upper().removesuffix("IB").removesuffix("B")
    shift = _SHIFTS.get(number[-1:], 0)
    try:
        value = int(float(number[:-1]) * (1 << shift)) if shift else int(number)
    except (ValueError, OverflowError):
        raise InvalidArgumentError(
            f"not a size: {text!r}; write a number of bytes with an optional binary unit, "
            "e.g. 4G, 512MB, 1.5GiB or 65536"
        ) from None
    if value <= 0:
        raise InvalidArgumentError(f"a size must be > 0 bytes, got {text!r}")
    return value
