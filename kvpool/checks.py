"""Argument validation shared by every public call: one message style, typed errors.

Each checker returns the value (normalised to a plain Python type) or raises
:class:`~kvpool.errors.InvalidArgumentError` (a ``ValueError``) whose message
names the argument, the value received, the limit and, where one is given,
the fix.  These are for public entry points; hot paths (``allocate``,
``free``, ``byte_array``) validate inline only what is not already known.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import operator
import threading
from collections.abc import Callable, Collection, Mapping
from enum import EnumMeta
from typing import Any

from kvpool.errors import ArgumentTypeError, BatchSizeError, InvalidArgumentError, KVPoolError

__all__ = [
    "TypedEnumLookup",
    "check_batch_size",
    "check_bool",
    "check_callable",
    "check_keywords",
    "check_choice",
    "check_int",
    "check_optional_int",
    "check_optional_str",
    "check_power_of_two",
    "check_seconds",
    "check_size",
    "keywords_of",
]


# numpy's and torch's names of their bool dtypes (both index like 0 and 1).
_BOOL_DTYPES = ("bool", "torch.bool")


class TypedEnumLookup(EnumMeta):
    """The metaclass of kvpool's enums: ``Enum(value)`` raises kvpool's error for a bad value.

    Python's own lookup raises a bare ``ValueError`` (or whatever comparing
    an odd value raises); this one raises :class:`InvalidArgumentError`
    listing the accepted values, with ``_lookup_hint(value)`` appended when
    the enum defines it.
    """

    def __call__(cls, value: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(value, *args, **kwargs)
        except (ValueError, TypeError, RuntimeError) as exc:
            if args or kwargs or isinstance(exc, KVPoolError):
                raise
            names = ", ".join(f"{m.value!r} ({m.name})" for m in cls)  # type: ignore[var-annotated]
            hint = getattr(cls, "_lookup_hint", None)
            raise InvalidArgumentError(
                f"{value!r} is not a {cls.__name__} value; use one of {names}"
                f"{hint(value) if hint is not None else ''}"
            ) from None


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
        if isinstance(value, bool) or str(getattr(value, "dtype", "")) in _BOOL_DTYPES:
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
        ArgumentTypeError: anything else (ints, strings, tensors...), so
            that a misplaced argument is not read as a flag.
    """
    if value is True or value is False:
        return value  # type: ignore[return-value]
    if type(value).__name__ in ("bool", "bool_") and type(value).__module__ == "numpy":
        return bool(value)  # type: ignore[arg-type]
    raise ArgumentTypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_seconds(
    name: str, value: object, *, allow_none: bool = False, allow_zero: bool = False
) -> float | None:
    """Return ``value`` as a ``float`` if it is a finite, positive number of seconds.

    Ints, floats and numpy numbers are accepted; bools, NaN and infinities
    are not.  The result is capped at :data:`threading.TIMEOUT_MAX`, the
    longest wait the interpreter can express.

    Args:
        name: the argument's name.
        value: what the caller passed.
        allow_none: let ``None`` (no limit) through.
        allow_zero: accept 0 too.

    Raises:
        InvalidArgumentError: anything else (``ArgumentTypeError`` for a
            value that is not a number).
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) in _BOOL_DTYPES:
        raise ArgumentTypeError(f"{name} must be a number of seconds, got the bool {value!r}")
    if not isinstance(value, (int, float)) and type(value).__module__ != "numpy":
        raise ArgumentTypeError(
            f"{name} must be a number of seconds, got {type(value).__name__} {value!r}"
        )
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ArgumentTypeError(f"{name} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgumentError(
            f"{name} must be a finite number of seconds {bound}, got {value!r}"
        )
    return min(seconds, threading.TIMEOUT_MAX)


def check_callable(name: str, value: object, *, allow_none: bool = False) -> Any:
    """Return ``value`` if it can be called (or is None, when allowed).

    Raises:
        ArgumentTypeError: not callable.
    """
    if (value is None and allow_none) or callable(value):
        return value
    raise ArgumentTypeError(
        f"{name} must be callable{' or None' if allow_none else ''}, "
        f"got {type(value).__name__} {value!r}"
    )


def check_optional_str(name: str, value: object) -> str | None:
    """Return ``value`` if it is a str or None (a name such as ``shm_name``).

    Raises:
        ArgumentTypeError: anything else.
    """
    if value is None or isinstance(value, str):
        return value
    raise ArgumentTypeError(f"{name} must be a str or None, got {type(value).__name__} {value!r}")


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


@functools.cache
def keywords_of(function: Callable[..., Any], *, skip: int = 0) -> frozenset[str] | None:
    """The names ``function`` accepts as keywords, for :func:`check_keywords`.

    Args:
        function: a function, bound method or class (its constructor).
        skip: leading parameters to leave out (those the caller passes
            positionally, so a keyword of that name would be a duplicate).

    Returns:
        The names, or None when ``function`` takes ``**kwargs`` (any name).
        Cached per function.
    """
    params = list(inspect.signature(function).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(
        p.name
        for p in params[skip:]
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
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
