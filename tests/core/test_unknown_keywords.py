"""Every public call refuses a misspelt keyword, naming the closest known one.

The walk covers every callable in ``kvpool.__all__`` and
``kvpool.remote.__all__``: functions, constructors, and the public methods,
static methods and class methods of every exported class (inherited ones
included).  Each is called with one of its keywords misspelt (first letter
upper-cased) and nothing else: the call's own binding fails before any of
its code runs, so no real argument is needed.  The error must be kvpool's
``ArgumentTypeError`` (a ``TypeError``) naming the keyword as misspelt and
suggesting the right one.  A new public call is covered by the walk as soon
as it is exported; the only calls left to Python's own ``TypeError`` are the
ones a class declares hot (``_hot_calls``: a wrapper's cost shows there) or
internal (``_internal_calls``, ``*_locked``: kvpool's own contracts).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import kvpool
import kvpool.remote
from kvpool.checks import HOT_CALLS, INTERNAL_CALLS
from kvpool.errors import ArgumentTypeError

P = inspect.Parameter


def _exported() -> Iterator[tuple[str, Any]]:
    for module in (kvpool, kvpool.remote):
        for name in module.__all__:
            yield f"{module.__name__}.{name}", getattr(module, name)


def _calls() -> Iterator[tuple[str, Callable[..., Any], str, Any]]:
    """``(id, function, kind, owner class)`` of every public call to check."""
    seen: set[tuple[int, int]] = set()
    for qualname, value in _exported():
        if isinstance(value, type):
            if issubclass(value, (BaseException, enum.Enum)):
                continue
            skipped = frozenset(getattr(value, INTERNAL_CALLS, ())) | frozenset(
                getattr(value, HOT_CALLS, ())
            )
            for name in ["__init__", *dir(value)]:
                if (name.startswith("_") and name != "__init__") or name in skipped:
                    continue
                if name.endswith("_locked"):
                    continue
                raw = inspect.getattr_static(value, name)
                if isinstance(raw, staticmethod):
                    fn, kind = raw.__func__, "function"
                elif isinstance(raw, classmethod):
                    fn, kind = raw.__func__, "classmethod"
                elif inspect.isfunction(raw):
                    fn, kind = raw, "method"
                else:
                    continue
                if (id(fn), id(value)) in seen or (name == "__init__" and fn is object.__init__):
                    continue
                seen.add((id(fn), id(value)))
                yield f"{qualname}.{name}", fn, kind, value
        elif inspect.isfunction(value):
            yield qualname, value, "function", None


def _keywords(fn: Callable[..., Any], kind: str) -> list[str] | None:
    params = list(inspect.signature(fn).parameters.values())[0 if kind == "function" else 1 :]
    if any(p.kind is P.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)]


def _misspelt(name: str) -> str:
    """First letter upper-cased (the name itself stays the closest match), or doubled."""
    return name[0].upper() + name[1:] if len(name) >= 3 else name * 2


def _call(fn: Callable[..., Any], kind: str, owner: Any, **kwargs: Any) -> Any:
    """Call ``fn`` with only ``kwargs`` (and a stand-in first argument for methods)."""
    if kind == "method":
        result = fn(object.__new__(_Stand), **kwargs)
    elif kind == "classmethod":
        result = fn(owner, **kwargs)
    else:
        result = fn(**kwargs)
    if inspect.iscoroutine(result):
        return asyncio.run(result)
    return result


class _Stand:
    """The ``self`` of an unbound call: never used, since binding fails first."""


CALLS = list(_calls())


def test_the_walk_finds_the_calls_the_issue_names() -> None:
    ids = {call_id for call_id, *_ in CALLS}
    for expected in (
        "kvpool.remote.FileStore.__init__",
        "kvpool.remote.FileStore.get",
        "kvpool.remote.RedisStore.__init__",
        "kvpool.remote.AsyncRedisStore.get",
        "kvpool.TensorMemoryObj.get_tensor",
        "kvpool.MemoryObjMetadata.__init__",
        "kvpool.allocate_host",
    ):
        assert expected in ids
    assert len(CALLS) > 100


@pytest.mark.parametrize(("call_id", "fn", "kind", "owner"), CALLS, ids=[c[0] for c in CALLS])
def test_a_misspelt_keyword_names_the_closest_one(
    call_id: str, fn: Callable[..., Any], kind: str, owner: Any
) -> None:
    keywords = _keywords(fn, kind)
    if keywords is None:  # takes **kwargs: checks its own (check_keywords); see below
        return
    if not keywords:
        return
    right = keywords[0]
    wrong = _misspelt(right)
    with pytest.raises(ArgumentTypeError) as info:
        _call(fn, kind, owner, **{wrong: 1})
    text = str(info.value)
    assert f"unexpected keyword argument {wrong!r}" in text, text
    assert f"did you mean {right!r}?" in text, text
    assert isinstance(info.value, TypeError)


# Calls that take **kwargs check them themselves, before doing anything else.
KWARGS_CALLS = [c for c in CALLS if _keywords(c[1], c[2]) is None]


@pytest.mark.parametrize(
    ("call_id", "fn", "kind", "owner"), KWARGS_CALLS, ids=[c[0] for c in KWARGS_CALLS]
)
def test_calls_taking_any_keyword_refuse_an_unknown_one(
    call_id: str, fn: Callable[..., Any], kind: str, owner: Any, tmp_path: Any
) -> None:
    if call_id.endswith("XPUMemoryAllocator.__init__"):
        import torch

        if not getattr(torch, "xpu", None) or not torch.xpu.is_available():
            pytest.skip("no Intel XPU here: XPUMemoryAllocator refuses before reading keywords")
    if call_id.endswith("XPUMemoryAllocator.__init__"):
        import torch

        if not getattr(torch, "xpu", None) or not torch.xpu.is_available():
            pytest.skip("no Intel XPU here: XPUMemoryAllocator refuses before reading keywords")
    params = list(inspect.signature(fn).parameters.values())[0 if kind == "function" else 1 :]
    required = [p for p in params if p.default is P.empty and p.kind is P.POSITIONAL_OR_KEYWORD]
    stand_ins = {"size": 1 << 20, "spec": str(tmp_path), "url": "mooncake://127.0.0.1:1"}
    args = [stand_ins.get(p.name, str(tmp_path)) for p in required]
    if kind == "method" and fn.__name__ != "__init__":
        instance = owner(1 << 20) if owner is kvpool.HostSpec else object.__new__(owner)
        call = lambda: fn(instance, *args, Zz_not_an_option=1)  # noqa: E731
    elif kind == "method":
        call = lambda: fn(object.__new__(owner), *args, Zz_not_an_option=1)  # noqa: E731
    elif kind == "classmethod":
        call = lambda: fn(owner, *args, Zz_not_an_option=1)  # noqa: E731
    else:
        call = lambda: fn(*args, Zz_not_an_option=1)  # noqa: E731
    with pytest.raises(ArgumentTypeError, match="unexpected keyword argument 'Zz_not_an_option'"):
        result = call()
        if inspect.iscoroutine(result):
            asyncio.run(result)


def test_the_messages_name_the_class_called() -> None:
    from kvpool.remote import FileStore

    pool = kvpool.TensorMemoryAllocator(
        __import__("torch").empty(1 << 16, dtype=__import__("torch").uint8)
    )
    with pytest.raises(
        ArgumentTypeError,
        match=r"FileStore\(\) got an unexpected keyword argument 'checksun'; did you mean",
    ):
        FileStore("/nonexistent-kvpool-dir", checksun=True)
    with pytest.raises(
        ArgumentTypeError,
        match=r"TensorMemoryObj.get_tensor\(\) got an unexpected keyword argument 'idx'",
    ):
        obj = pool.allocate(__import__("torch").Size([4]), __import__("torch").uint8)
        try:
            obj.get_tensor(idx=0)
        finally:
            obj.ref_count_down()
    pool.close()


def test_hot_calls_keep_python_s_type_error() -> None:
    """The pools' allocate/free family is declared hot: Python's own TypeError, nothing slower."""
    assert kvpool.MemoryAllocatorInterface._hot_calls == {  # type: ignore[attr-defined]
        "allocate",
        "batched_allocate",
        "free",
        "batched_free",
    }
    pool = kvpool.TensorMemoryAllocator(
        __import__("torch").empty(1 << 16, dtype=__import__("torch").uint8)
    )
    with pytest.raises(TypeError, match="dtype"):
        pool.allocate(__import__("torch").Size([4]), dtype=__import__("torch").uint8)  # type: ignore[call-arg]
    pool.close()


def test_a_type_error_raised_inside_a_call_is_untouched() -> None:
    from kvpool.checks import refuse_unknown_keywords

    @refuse_unknown_keywords
    def inner(size: int, *, name: str = "x") -> None:
        raise TypeError("raised inside")

    with pytest.raises(TypeError, match="raised inside") as info:
        inner(1, name="y")
    assert type(info.value) is TypeError
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'size'") as info2:
        inner(name="y")  # type: ignore[call-arg]
    assert type(info2.value) is TypeError
    with pytest.raises(ArgumentTypeError, match="did you mean 'name'"):
        inner(1, nmae="y")  # type: ignore[call-arg]


def test_a_user_subclass_of_a_store_is_covered() -> None:
    from kvpool.remote import RemoteStore

    class MyStore(RemoteStore):
        def put(self, key: Any, memory_obj: Any) -> None: ...
        def get(
            self, key: Any, allocator: Any, shapes: Any = None, dtypes: Any = None, fmt: Any = None
        ) -> Any: ...
        def exists(self, key: Any) -> bool:
            return False

        def delete(self, key: Any) -> bool:
            return False

        def head(self, key: Any) -> Any:
            return None

    with (
        MyStore() as store,
        pytest.raises(ArgumentTypeError, match=r"MyStore\.get\(\).*did you mean 'shapes'"),
    ):
        store.get("k", None, shape=1)
