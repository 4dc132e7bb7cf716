"""Argument validation shared by every public call: one message style, typed errors.

Each checker returns the value (normalised to a plain Python type) or raises
:class:`~kvpool.errors.InvalidArgumentError` (a ``ValueError``) whose message
names the argument, the value received, the limit and, where one is given,
the fix.  These are for public entry points; hot paths (``allocate``,
``free``, ``byte_array``) validate inline only what is not already known.
"""

from __future__ import annotations

import difflib
import operator
from collections.abc import Collection, Mapping
from typing import Any

from kvpool.errors import ArgumentTypeError, BatchSizeError, InvalidArgumentError

__all__ = [
    "check_batch_size",
    "check_bool",
    "check_keywords",
    "check_choice",
    "check_int",
    "check_optional_int",
    "check_power_of_two",
    "check_size",
]


def _hint(fix: str | None) -> str:
    return f"; {fix}" if fix else ""


def check_int(
    name: str,
    value: object,
    *,
    low: int | None = None,
    high: int | None = None,
    fix: str | None = None,
) -> int:
    """Return ``value`` as an ``int`` if it is an integer within ``[low, high]``.

    Python ints and numpy integers are accepted (through ``__index__``);
    ``bool``, floats, strings and ``None`` are not.

    Args:
        name: the argument's name, as the caller wrote it.
        value: what the caller passed.
        low: smallest value allowed, or None for no lower bound.
        high: largest value allowed, or None for no upper bound.
        fix: a hint appended to the message, e.g. ``"use a multiple of 4096"``.

    Returns:
        The value as a plain ``int``.

    Raises:
        InvalidArgumentError: not an integer, or outside the bounds.
    """
    if value.__class__ is int:  # the common case, checked without a call
        number = value  # type: ignore[assignment]
    else:
        if isinstance(value, bool) or getattr(value, "dtype", None) == "bool":
            raise ArgumentTypeError(f"{name} must be an int, got the bool {value!r}{_hint(fix)}")
        try:
            number = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            raise ArgumentTypeError(
                f"{name} must be an int, got {type(value).__name__} {value!r}{_hint(fix)}"
            ) from None
    if (low is not None and number < low) or (high is not None and number > high):
        if low is not None and high is not None:
            bound = f"{low}..{high}"
        elif low is not None:
            bound = f">= {low}"
        else:
            bound = f"<= {high}"
        raise InvalidArgumentError(f"{name} must be {bound}, got {number}{_hint(fix)}")
    return number


def check_size(name: str, value: object, *, high: int | None = None, fix: str | None = None) -> int:
    """Return ``value`` if it is a positive number of bytes (no larger than ``high``).

    Raises:
        InvalidArgumentError: not an int, ``< 1`` or ``> high``.
    """
    number = check_int(name, value, fix=fix)
    if number < 1:
        raise InvalidArgumentError(
            f"{name} must be greater than 0: a positive number of bytes, got {number}{_hint(fix)}"
        )
    if high is not None and number > high:
        raise InvalidArgumentError(f"{name} must be at most {high} bytes, got {number}{_hint(fix)}")
    return number


def check_power_of_two(name: str, value: object, *, fix: str | None = None) -> int:
    """Return ``value`` if it is a positive power of two (an alignment, a page size).

    Raises:
        InvalidArgumentError: not an int, or not a positive power of two.
    """
    number = check_int(name, value, fix=fix or "it must be a positive power of two")
    if number <= 0 or number & (number - 1):
        raise InvalidArgumentError(
            f"{name} must be a positive power of two, got {number!r}{_hint(fix)}"
        )
    return number


def check_optional_int(
    name: str,
    value: object,
    *,
    low: int | None = None,
    high: int | None = None,
    fix: str | None = None,
) -> int | None:
    """Like :func:`check_int`, but ``None`` passes through unchanged."""
    if value is None:
        return None
    return check_int(name, value, low=low, high=high, fix=fix)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` as a ``bool`` if it is one (numpy bools included).

    Raises:
        InvalidArgumentError: anything else (ints, strings, tensors...), so
            that a misplaced argument is not read as a flag.
    """
    if value is True or value is False:
        return value  # type: ignore[return-value]
    if type(value).__name__ == "bool_" and type(value).__module__ == "numpy":
        return bool(value)
    raise InvalidArgumentError(
        f"{name} must be True or False, got {type(value).__name__} {value!r}"
    )


def check_choice(name: str, value: object, choices: Mapping[str, Any]) -> Any:
    """Return ``choices[value]`` if ``value`` is one of its keys.

    Raises:
        InvalidArgumentError: naming every accepted key.
    """
    if isinstance(value, str) and value in choices:
        return choices[value]
    accepted = ", ".join(repr(key) for key in choices)
    raise InvalidArgumentError(f"{name} must be one of {accepted}; got {value!r}")


def check_keywords(owner: str, given: Mapping[str, Any], known: Collection[str]) -> None:
    """Refuse keyword arguments that ``owner`` does not document.

    A misspelt option (``shm_nmae=``) would otherwise be silently ignored.

    Args:
        owner: what was called, e.g. ``"MixedMemoryAllocator()"``.
        given: the keyword arguments received.
        known: every keyword ``owner`` accepts.

    Raises:
        ArgumentTypeError: a keyword is unknown; the message names the closest
            known one and lists them all.
    """
    for name in given:
        if name in known:
            continue
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ArgumentTypeError(
            f"{owner} got an unexpected keyword argument {name!r}{hint} "
            f"(accepted: {', '.join(sorted(known))})"
        )


def check_batch_size(batch_size: object) -> int:
    """Return ``batch_size`` if it is an int >= 0 (the count of a batched call).

    Raises:
        BatchSizeError: not an int, or negative (an ``InvalidArgumentError``
            that is also a ``RuntimeError``, which is what LMCache raises).
    """
    if batch_size.__class__ is not int and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int)
    ):
        raise BatchSizeError(f"batch_size must be an int, got {batch_size!r}")
    if batch_size < 0:  # type: ignore[operator]
        raise BatchSizeError(f"batch_size must be non-negative (>= 0), got {batch_size}")
    return batch_size  # type: ignore[return-value]
