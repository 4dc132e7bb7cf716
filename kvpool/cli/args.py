"""Argument parsing shared by kvpool's command-line tools."""

from __future__ import annotations

import argparse

__all__ = ["parse_size", "positive_int", "size_arg"]


def parse_size(text: str) -> int:
    """A byte count as :func:`kvpool.parse_size` reads it: ``4G``, ``512MB``, ``1.5GiB``, ``4096``.

    The one reading of a size, the Python API's too (binary units however
    written).  Imported at the first call: importing :mod:`kvpool.native`
    loads libpinmem, and building the command line (``kvpool --version``)
    must not.

    Raises:
        ValueError: not a size, or not positive (an ``InvalidArgumentError``).
    """
    from kvpool.native.units import parse_size as native_parse_size

    return native_parse_size(text)


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
