"""Hostile arguments to every public call: only kvpool's typed errors may escape.

For each public constructor, function and method of ``kvpool.__all__`` and
``kvpool.remote`` (the table in :mod:`fuzz_targets`), hypothesis replaces
any subset of a valid call's arguments with hostile values - ints huge,
negative, bool, float, numpy; None; wrong types; odd tensors (0-d, not
contiguous, another dtype, sparse, on the 'meta' device); dead, foreign and
placeholder objects - sometimes after the object was freed, pinned or its
pool closed, sometimes in strict mode, sometimes with a misspelt keyword.

The call must succeed or raise a :class:`kvpool.KVPoolError` that is also a
``ValueError``, ``TypeError``, ``MemoryError`` or ``OSError``: never an
``AttributeError``, ``IndexError``, ``AssertionError``, an untyped
``OverflowError``, torch's ``RuntimeError`` or ``NotImplementedError``.
A call that runs longer than :data:`CALL_LIMIT_S` fails (nothing may hang).

Redis stores are only constructed, with URLs that reach no server; the
coroutines of asyncio stores (where this kvpool has them) run to the end.
``KVPOOL_FUZZ_EXAMPLES`` sets the examples per target (default 30) for a
deeper run.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from fuzz_targets import HOSTILE, Context, Target, context, hostile_value, targets, valid
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import kvpool
from kvpool.errors import KVPoolError

#: The builtins a kvpool error must also be, so that ordinary handlers catch it.
BUILTIN_BASES = (ValueError, TypeError, MemoryError, OSError)
#: Seconds one fuzzed call may take.
CALL_LIMIT_S = 20
TARGETS = targets()


class CallTookTooLong(BaseException):
    """Raised in the test by the watchdog alarm (a BaseException: no handler eats it)."""


@contextlib.contextmanager
def watchdog(seconds: int) -> Iterator[None]:
    """Interrupt the test's own thread if the block runs longer than ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise CallTookTooLong(f"the call ran for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def allowed(exc: BaseException) -> bool:
    """True for an error kvpool may raise: its own, and also a builtin handlers expect."""
    return isinstance(exc, KVPoolError) and isinstance(exc, BUILTIN_BASES)


# -- the hostile values ---------------------------------------------------

_INTS = st.one_of(
    st.integers(-(2**70), -1),
    st.integers(0, 1 << 16),
    # Beyond any machine, so that no size really gets populated.
    st.integers(1 << 48, 1 << 70),
)
_NUMPY_INTS = st.tuples(st.sampled_from([np.int8, np.int32, np.int64, np.uint64]), _INTS).map(
    lambda pair: _numpy_int(*pair)
)


def _numpy_int(kind: type, value: int) -> Any:
    info = np.iinfo(kind)
    return kind(min(max(value, info.min), info.max))


# A dimension is small or beyond any machine (as the sizes above): a byte
# buffer's first dimension is its length, and one of a few GiB would really
# be allocated.  Products past int64 come from huge dimensions combined.
_DIMS = st.one_of(st.integers(-4, 64), st.integers(1 << 48, (1 << 63) - 1))
_SHAPES = st.lists(_DIMS, max_size=4).map(torch.Size)
HOSTILE_VALUES = st.one_of(
    st.sampled_from(HOSTILE),
    _INTS,
    _NUMPY_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    _SHAPES,
    st.lists(_SHAPES, max_size=3),
)

#: States a call may find its objects in.
PRELUDES: dict[str, Callable[[Context], Any]] = {
    "strict mode": lambda c: None,  # switched on around the call, see below
    "object freed": lambda c: c.obj.ref_count_down(),
    "object pinned": lambda c: c.obj.pin(),
    "object views taken": lambda c: (c.obj.byte_array, c.obj.tensor),
    "object narrowed": lambda c: c.obj.set_used_size(8),
    "extent pool closed": lambda c: c.extent.close(),
    "paged pool closed": lambda c: c.paged.close(),
    "mixed pool closed": lambda c: c.mixed.close(),
    "paged object freed": lambda c: c.page_obj.ref_count_down(),
    "store closed": lambda c: c.store.close(),
}


def _draw_call(
    data: st.DataObject, target: Target, ctx: Context
) -> tuple[list[Any], dict[str, Any]]:
    args = []
    for i, default in enumerate(target.args):
        if data.draw(st.booleans(), label=f"replace arg {i}"):
            args.append(hostile_value(data.draw(HOSTILE_VALUES, label=f"arg {i}"), ctx))
        else:
            args.append(valid(default, ctx))
    kwargs = {}
    for name, default in target.kwargs.items():
        how = data.draw(st.sampled_from(["valid", "hostile", "omit"]), label=f"keyword {name}")
        if how == "hostile":
            kwargs[name] = hostile_value(data.draw(HOSTILE_VALUES, label=name), ctx)
        elif how == "valid":
            kwargs[name] = valid(default, ctx)
    if target.unknown_keywords and data.draw(st.booleans(), label="misspelt keyword"):
        kwargs[data.draw(st.sampled_from(["shm_nmae", "numa_nod", "use_hugepage", "pinn"]))] = 1
    return args, kwargs


@pytest.fixture(autouse=True)
def _quiet_and_restored() -> Iterator[None]:
    """Warnings of misuse are expected by the hundred: keep them out of the report."""
    logger = logging.getLogger("kvpool")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    strict = kvpool.set_strict_mode(False)
    yield
    kvpool.set_strict_mode(strict)
    logger.setLevel(level)


@pytest.fixture(autouse=True, scope="module")
def _in_scratch_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run from a scratch directory: a drawn text is a valid relative path, and
    ``FileStore(<text>)`` creates it - in the checkout, were the tests run there."""
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("fuzz-cwd"))
    yield
    os.chdir(previous)


def check_call(target: Target, data: st.DataObject) -> None:
    """Put the context in a drawn state, call ``target`` with drawn arguments, check."""
    with context() as ctx:
        preludes = data.draw(
            st.lists(st.sampled_from(sorted(PRELUDES)), max_size=2, unique=True), label="state"
        )
        strict = "strict mode" in preludes
        try:
            for name in preludes:
                PRELUDES[name](ctx)
            args, kwargs = _draw_call(data, target, ctx)
            call = target.get(ctx)
        except Exception as exc:  # the set-up may be refused too, but only typed
            if not allowed(exc):
                raise AssertionError(f"setting up {target.name} raised {exc!r}") from exc
            return
        note(f"{target.name}(*{args!r}, **{kwargs!r}) after {preludes}")
        previous = kvpool.set_strict_mode(strict)
        try:
            with watchdog(CALL_LIMIT_S):
                result = call(*args, **kwargs)
                if inspect.iscoroutine(result):  # an asyncio store's call
                    result = asyncio.run(result)
        except CallTookTooLong:
            pytest.fail(f"{target.name} ran for more than {CALL_LIMIT_S} s")
        except BaseException as exc:
            if not allowed(exc):
                raise AssertionError(
                    f"{target.name} let {type(exc).__module__}.{type(exc).__name__} escape: {exc}"
                ) from exc
        else:
            if hasattr(result, "close") and not isinstance(result, type):
                ctx.keep(result)
        finally:
            kvpool.set_strict_mode(previous)


def _params(chosen: list[Target]) -> list[Any]:
    return [pytest.param(t, id=t.name) for t in chosen]


WITH_ARGUMENTS = _params([t for t in TARGETS if t.args or t.kwargs])
WITHOUT_ARGUMENTS = _params([t for t in TARGETS if not (t.args or t.kwargs)])
_SETTINGS = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
}


@pytest.mark.parametrize("target", WITH_ARGUMENTS)
@settings(max_examples=int(os.environ.get("KVPOOL_FUZZ_EXAMPLES", "30")), **_SETTINGS)
@given(data=st.data())
def test_only_kvpool_errors_escape(target: Target, data: st.DataObject) -> None:
    check_call(target, data)


@pytest.mark.parametrize("target", WITHOUT_ARGUMENTS)
@settings(max_examples=8, **_SETTINGS)
@given(data=st.data())
def test_only_kvpool_errors_escape_in_any_state(target: Target, data: st.DataObject) -> None:
    """Calls without arguments: only the state of their object varies."""
    check_call(target, data)


def test_the_table_covers_the_public_api() -> None:
    """Every public class and function of both namespaces has at least one target."""
    import kvpool.remote as remote

    names = {t.name.split("(")[0].split(".")[0] for t in TARGETS}
    # Constants, and interfaces or records with nothing of their own to call.
    nothing_to_call = {"MAX_KEY_BYTES", "Key", "PinnedReport", "EntryInfo"}
    abstract = {"MemoryAllocatorInterface", "MemoryObj", "RemoteStore", "AsyncRemoteStore"}
    missing = []
    for module in (kvpool, remote):
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                continue
            if name in nothing_to_call | abstract:
                continue
            if name not in names:
                missing.append(f"{module.__name__}.{name}")
    assert missing == []
