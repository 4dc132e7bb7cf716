"""Argument validation shared by every public call: one message style, typed errors.

Each checker returns the value (normalised to a plain Python type) or raises
:class:`~kvpool.errors.InvalidArgumentError` (a ``ValueError``) whose message
names the argument, the value received, the limit and, where one is given,
the fix.  These are for public entry points; hot paths (``allocate``,
``free``, ``byte_array``) validate inline only what is not already known.
"""

from __future__ import annotations

import difflib
import enum
import functools
import inspect
import math
import operator
import sys
import threading
import types
from collections.abc import Callable, Collection, Mapping
from enum import EnumMeta
from typing import Any, NoReturn, TypeVar

from kvpool.errors import ArgumentTypeError, BatchSizeError, InvalidArgumentError, KVPoolError

__all__ = [
    "HOT_CALLS",
    "INTERNAL_CALLS",
    "REQUIRED",
    "RefusesUnknownKeywords",
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
    "refuse_in_place",
    "refuse_unknown_keywords",
    "refuse_unknown_keywords_in",
    "takes_keywords",
    "unguarded",
]


_Fn = TypeVar("_Fn", bound=Callable[..., Any])

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
        InvalidArgumentError: not an int (a size as text names the fix), ``< 1`` or ``> high``.
    """
    if isinstance(value, str):  # e.g. "64MB": the command line's size, which the API takes as bytes
        fix = f"pass kvpool.parse_size({value!r}), which reads it as the command line does"
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
        The names: its named parameters, plus, for one that takes
        ``**kwargs``, the keywords it declares with :func:`takes_keywords`;
        None when it takes ``**kwargs`` and declares none (any name).
        Cached per function.
    """
    params = list(inspect.signature(function).parameters.values())
    options: frozenset[str] | None = frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        declarer = function.__init__ if isinstance(function, type) else function  # type: ignore[misc]
        options = getattr(declarer, _OPTIONS, None)
        if options is None:
            return None
    return options | frozenset(
        p.name
        for p in params[skip:]
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


def takes_keywords(*groups: Collection[str]) -> Callable[[_Fn], _Fn]:
    """A decorator declaring what a call's ``**kwargs`` takes (the union of ``groups``).

    Declared, the call is guarded like any other (:func:`refuse_unknown_keywords`):
    a keyword neither named nor declared is refused before the call runs,
    with the closest of all of them named and all listed (a list given to
    :func:`check_keywords` by hand missed the named parameters).
    """
    names = frozenset().union(*groups)

    def declare(fn: _Fn) -> _Fn:
        setattr(fn, _OPTIONS, names)
        return fn

    return declare


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


# -- unknown keywords: one mechanism for every public call ---------------
#
# Python refuses a misspelt keyword with a bare TypeError raised in the
# caller's frame, before the callee runs, so nothing inside the callee can
# improve it.  refuse_unknown_keywords() puts a thin wrapper in front of a
# function: it has the function's own parameters plus a catch-all
# **kwargs, which is empty on every correct call, and forwards the call
# positionally.  Only a keyword the function does not take lands in the
# catch-all, and the wrapper then raises check_keywords' error.  Required
# parameters get a sentinel default in the wrapper, so a misspelt keyword
# meant for one (``allocate(s, dtype=d)``) is reported as the misspelling,
# as Python itself reports it, not as a missing argument.  Nothing is
# validated on a correct call beyond one test, and no TypeError raised
# inside the function is touched.  A function taking **kwargs declares what
# they take (takes_keywords): its wrapper tests them against that, and its
# message lists the named parameters too.  Undeclared, it is left alone.
#
# Hot calls (HOT_CALLS: a pool's allocate/free family) cannot afford the
# wrapper's extra call, so they take the wrapper's shape themselves and
# check in place: **unknown, REQUIRED defaults, and one test on their first
# line whose slow path, refuse_in_place(), raises exactly what a wrapper
# raises.  They take **kwargs, so refuse_unknown_keywords leaves them alone;
# one that does not check in place (a user's subclass) gets the wrapper.

_Target = TypeVar("_Target")

#: Attribute set on every wrapper; refuse_unknown_keywords skips those.
_GUARD_MARK = "_kvpool_keywords_guard"
#: Attribute holding the keywords a ``**kwargs`` call declares (:func:`takes_keywords`).
_OPTIONS = "_kvpool_options"

#: A class attribute naming methods that kvpool's own code calls on a hot path
#: under a written contract (a pool's handles calling ``open_lease``...);
#: they are not guarded.  Inherited: a subclass's methods of those names are
#: not guarded either.  Methods named ``*_locked`` (called with the caller
#: already holding the object's lock: kvpool's own code) are never guarded.
INTERNAL_CALLS = "_internal_calls"

#: A class attribute naming public calls so hot that a wrapper's cost shows
#: (a pool's ``allocate``/``free`` family: a forwarding call costs 5-17% of
#: an allocate + free, measured).  kvpool's own methods of those names check
#: their keywords in place instead (:func:`refuse_in_place`): about 500
#: instructions a call on CPython 3.11 (a ``**unknown`` frame and one test;
#: a wrapper costs about 850), measured with callgrind.  A subclass's method
#: that does not check in place is guarded like any other.  Inherited;
#: tests/core/test_unknown_keywords.py holds every kvpool class to it.
HOT_CALLS = "_hot_calls"


class _Missing:
    """The type of :data:`REQUIRED` (never a real argument)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<required>"


#: The default a guarded call gives its required parameters (shown as
#: ``<required>`` in its signature): a wrapper's, or a hot call's own (see
#: :func:`refuse_in_place`).  Never a real argument.
REQUIRED: Any = _Missing()


def _owner(fn: Callable[..., Any], kind: str, first: Any) -> str:
    name = fn.__name__
    if kind == "method":
        return (
            f"{type(first).__name__}()"
            if name == "__init__"
            else f"{type(first).__name__}.{name}()"
        )
    if kind == "classmethod":
        return f"{first.__name__}.{name}()"
    return f"{fn.__qualname__}()"


def _refuse(
    fn: Callable[..., Any],
    kind: str,
    first: Any,
    unknown: Mapping[str, Any],
    given: list[tuple[str, Any, Any]],
) -> Any:
    """The slow path of a guarded call: an unknown keyword, or a required argument missing.

    Raises check_keywords' error for an unknown keyword; otherwise calls
    ``fn`` with the arguments that were given (``given``: name, kind,
    value), so that Python reports the missing one in its own words.
    """
    if unknown:
        known = keywords_of(fn, skip=0 if kind == "function" else 1) or frozenset()
        check_keywords(_owner(fn, kind, first), unknown, known)
    P = inspect.Parameter
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, param_kind, value in given:
        if value is REQUIRED:
            continue
        if param_kind is P.POSITIONAL_ONLY:
            args.append(value)
        elif param_kind is P.VAR_POSITIONAL:
            args.extend(value)
        elif param_kind is P.VAR_KEYWORD:
            kwargs.update(value)
        else:
            kwargs[name] = value
    return fn(*args, **kwargs)


def refuse_in_place(first: object, unknown: Mapping[str, Any], *required: object) -> NoReturn:
    """The slow path of a hot call that checks its keywords in place; always raises.

    A hot call (:data:`HOT_CALLS`) cannot afford a wrapper, so it takes the
    wrapper's shape itself: ``**unknown`` (empty on every correct call)
    and :data:`REQUIRED` as the default of each required parameter, and
    its first line is one test that calls this::

        def allocate(self, shapes=REQUIRED, dtypes=REQUIRED, fmt=..., **unknown):
            if unknown or shapes is REQUIRED or dtypes is REQUIRED:
                refuse_in_place(self, unknown, shapes, dtypes)

    The method itself (for its name and parameters) is the one running in
    the caller's frame, found on ``type(first)`` (or, for a stand-in
    ``first``, among the classes of the method's module).

    Args:
        first: the method's ``self``.
        unknown: its ``**unknown``.
        required: the values of its :data:`REQUIRED`-defaulted parameters,
            in order.

    Raises:
        ArgumentTypeError: an unknown keyword: the same error a wrapper
            raises (:func:`check_keywords`, naming the closest known one).
        TypeError: no unknown keyword but a required argument missing, in
            Python's own words.
    """
    method = _running_method(type(first), sys._getframe(1))
    if unknown:
        check_keywords(_owner(method, "method", first), unknown, _named_keywords(method))
    params = [p for p in inspect.signature(method).parameters.values() if p.default is REQUIRED]
    missing = [p for p, value in zip(params, required, strict=True) if value is REQUIRED]
    # Python names the missing positional arguments, else the keyword-only ones.
    positional = [p for p in missing if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    missing = positional or missing
    names = [repr(p.name) for p in missing]
    listed = f"{', '.join(names[:-1])}, and {names[-1]}" if len(names) > 2 else " and ".join(names)
    raise TypeError(
        f"{method.__qualname__}() missing {len(names)} required "
        f"{'positional' if positional else 'keyword-only'} "
        f"argument{'s' if len(names) > 1 else ''}: {listed}"
    )


def _running_method(cls: type, frame: types.FrameType) -> Callable[..., Any]:
    """The method whose code runs in ``frame``: on ``cls`` or a base, else a class of its module."""
    code = frame.f_code
    classes = [*cls.__mro__, *(v for v in frame.f_globals.values() if isinstance(v, type))]
    for klass in classes:
        for value in vars(klass).values():
            fn = inspect.unwrap(value) if callable(value) else None
            if getattr(fn, "__code__", None) is code:
                return fn  # type: ignore[return-value]
    raise LookupError(f"refuse_in_place() called outside a method ({code.co_qualname})")


@functools.cache
def _named_keywords(method: Callable[..., Any]) -> frozenset[str]:
    """The keywords a method that also takes ``**unknown`` names (``self`` left out)."""
    P = inspect.Parameter
    params = list(inspect.signature(method).parameters.values())[1:]
    return frozenset(p.name for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY))


def _guard_function(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """``fn`` behind a wrapper that refuses unknown keywords (``fn`` itself if it needs none)."""
    if getattr(fn, _GUARD_MARK, False) or not isinstance(fn, types.FunctionType):
        return fn
    P = inspect.Parameter
    params = list(inspect.signature(fn).parameters.values())  # through decorators
    named = params[0 if kind == "function" else 1 :]
    var_kw = next((p for p in params if p.kind is P.VAR_KEYWORD), None)
    options = getattr(fn, _OPTIONS, None)
    if var_kw is not None and options is None:
        return fn  # takes any keyword (and checks them itself)
    if var_kw is None and all(p.kind in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL) for p in named):
        return fn  # takes no keyword at all
    if any(p.name.startswith("_kvpool_") for p in params):
        return fn  # would shadow the wrapper's own names; never the case in kvpool
    namespace: dict[str, Any] = {"_kvpool_fn": fn, "_kvpool_refuse": _refuse, "_M": REQUIRED}
    namespace["_kvpool_options"] = options
    decl: list[str] = []
    call: list[str] = []
    required: list[str] = []
    star = False
    for i, p in enumerate(params):
        if p.kind is P.VAR_KEYWORD:
            call.append("**" + p.name)  # declared last, in place of the catch-all
            continue
        if p.kind is P.VAR_POSITIONAL:
            decl.append("*" + p.name)
            call.append("*" + p.name)
            star = True
            continue
        if p.kind is P.KEYWORD_ONLY and not star:
            decl.append("*")
            star = True
        if p.default is not P.empty:
            namespace[f"_kvpool_default_{i}"] = p.default
            decl.append(f"{p.name}=_kvpool_default_{i}")
        elif i == 0 and kind != "function":
            decl.append(p.name)  # self or cls: always bound
        else:
            decl.append(f"{p.name}=_M")
            required.append(p.name)
        call.append(f"{p.name}={p.name}" if p.kind is P.KEYWORD_ONLY else p.name)
        if p.kind is P.POSITIONAL_ONLY and (
            i + 1 == len(params) or params[i + 1].kind is not p.kind
        ):
            decl.append("/")
    namespace["_kvpool_kinds"] = [(p.name, p.kind) for p in params]
    if var_kw is None:  # a catch-all, empty on every correct call
        catch_all = refused = unknown = "_kvpool_unknown"
    else:  # the call's own **kwargs: only the declared names may be in it
        catch_all = var_kw.name
        refused = f"not {catch_all}.keys() <= _kvpool_options"
        unknown = f"{{k: v for k, v in {catch_all}.items() if k not in _kvpool_options}}"
    test = " or ".join([refused, *(f"{name} is _M" for name in required)])
    first = params[0].name if params and kind != "function" else "None"
    is_async = inspect.iscoroutinefunction(fn)
    source = (
        f"{'async ' if is_async else ''}def {fn.__name__}"
        f"({', '.join([*decl, '**' + catch_all])}):\n"
        f"    if {test}:\n"
        f"        return {'await ' if is_async else ''}_kvpool_refuse(_kvpool_fn, {kind!r}, "
        f"{first}, {unknown}, [(n, k, v) for (n, k), v in "
        f"zip(_kvpool_kinds, ({', '.join(p.name for p in params)},))])\n"
        f"    return {'await ' if is_async else ''}_kvpool_fn({', '.join(call)})\n"
    )
    exec(compile(source, f"<keywords of {fn.__qualname__}>", "exec"), namespace)
    wrapper = functools.update_wrapper(namespace[fn.__name__], fn)
    setattr(wrapper, _GUARD_MARK, True)
    return wrapper  # type: ignore[no-any-return]


def _guard_class(cls: type) -> None:
    """Guard ``cls.__init__`` and the public methods ``cls`` defines, in place."""
    if isinstance(cls, enum.EnumMeta):
        return  # Enum(value) is a lookup (TypedEnumLookup), not a constructor with keywords
    # Hot calls are not skipped: kvpool's check in place (they take
    # **unknown, so _guard_function returns them as they are).
    internal = frozenset(getattr(cls, INTERNAL_CALLS, ()))
    for name, attr in list(vars(cls).items()):
        if (name.startswith("_") and name != "__init__") or name in internal:
            continue
        if name.endswith("_locked"):
            continue
        if isinstance(attr, staticmethod):
            guarded: Any = staticmethod(_guard_function(attr.__func__, "function"))
            changed = guarded.__func__ is not attr.__func__
        elif isinstance(attr, classmethod):
            guarded = classmethod(_guard_function(attr.__func__, "classmethod"))
            changed = guarded.__func__ is not attr.__func__
        elif isinstance(attr, types.FunctionType):
            guarded = _guard_function(attr, "method")
            changed = guarded is not attr
        else:
            continue
        if changed:
            setattr(cls, name, guarded)


def refuse_unknown_keywords(target: _Target) -> _Target:
    """Make ``target`` refuse an unknown keyword with the closest known one named.

    For a function: returns a wrapper (same name, docstring and signature;
    ``__wrapped__`` is the function) whose only work on a correct call is
    to forward it; a keyword the function does not take raises
    :class:`~kvpool.errors.ArgumentTypeError` (a ``TypeError``) from
    :func:`check_keywords`, e.g. ``TensorMemoryAllocator.allocate() got an
    unexpected keyword argument 'dtype'; did you mean 'dtypes'? (accepted:
    ...)``.  A coroutine function gets a coroutine wrapper.  One that takes
    ``**kwargs`` is guarded if it declares them (:func:`takes_keywords`);
    undeclared, or taking no keyword at all, it is returned unchanged.

    For a class: guards, in place, its ``__init__`` and every public method,
    static method and class method it defines itself (inherited ones are
    guarded where they are defined), except those named in its
    ``_internal_calls`` (:data:`INTERNAL_CALLS`); returns the class.
    Subclasses of :class:`RefusesUnknownKeywords` get this when they are
    defined.  Methods that take ``**kwargs`` are left as they are: the hot
    calls (:data:`HOT_CALLS`) of kvpool's classes take ``**unknown`` and
    check in place with :func:`refuse_in_place`, which raises the same error.

    Idempotent.  Cost: one forwarding call per guarded call (tens of ns).
    """
    if isinstance(target, type):
        _guard_class(target)
        return target
    return _guard_function(target, "function")  # type: ignore[arg-type, return-value]


def refuse_unknown_keywords_in(namespace: dict[str, Any], names: Collection[str]) -> None:
    """Apply :func:`refuse_unknown_keywords` to a package's public ``names``.

    Functions are replaced in ``namespace`` by their wrappers (the module that
    defines one keeps the bare function for its own callers); classes are
    guarded in place.  Exceptions, enums and values are left alone.
    """
    for name in names:
        value = namespace.get(name)
        if isinstance(value, type) and issubclass(value, BaseException):
            continue
        if isinstance(value, (type, types.FunctionType)):
            namespace[name] = refuse_unknown_keywords(value)


def unguarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function behind a :func:`refuse_unknown_keywords` wrapper (bound again if bound).

    For kvpool's own hot paths that call a guarded public method of another
    kvpool object with arguments they know are right.
    """
    if isinstance(fn, types.MethodType) and getattr(fn.__func__, _GUARD_MARK, False):
        return types.MethodType(fn.__func__.__wrapped__, fn.__self__)
    if getattr(fn, _GUARD_MARK, False):
        return fn.__wrapped__  # type: ignore[attr-defined, no-any-return]
    return fn


class RefusesUnknownKeywords:
    """Base of kvpool's public class families: subclasses refuse unknown keywords.

    Every class deriving from it (kvpool's pools, memory objects and stores,
    and users' subclasses of them) is passed to
    :func:`refuse_unknown_keywords` when it is defined.
    """

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        refuse_unknown_keywords(cls)
