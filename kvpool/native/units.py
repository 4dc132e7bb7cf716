"""Byte counts as short text: the one format of every message and report."""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it short: 4 GiB, 256 MiB, 1.5 KiB."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n:.0f} B"
