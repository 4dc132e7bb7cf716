"""Every public call refuses a misspelt keyword, naming the closest known one.

The walk covers every callable in ``kvpool.__all__`` and
``kvpool.remote.__all__``: functions, constructors, and the public methods,
static methods and class methods of every exported class (inherited ones
included).  Each is called with each of its keywords misspelt (first letter
upper-cased) and nothing else: the call's own binding fails before any of
its code runs, so no real argument is needed.  The error must be kvpool's
``ArgumentTypeError`` (a ``TypeError``) naming the keyword as misspelt,
suggesting the right one and listing every keyword the call takes (its
named parameters and, for one taking ``**kwargs``, those it declares with
``kvpool.checks.takes_keywords``).  A new public call is covered by the walk as soon
as it is exported; the only calls left to Python's own ``TypeError`` are the
ones a class declares internal (``_internal_calls``, ``*_locked``: kvpool's
own contracts).

The calls a class declares hot (``_hot_calls``: a pool's allocate/free
family, where a wrapper's cost shows) are walked too, over every exported
class and every allocator class kvpool defines: each must check in place
(``**unknown`` and ``kvpool.checks.refuse_in_place`` on its first line, no
wrapper), refuse every one of its keywords misspelt, and report a missing
argument in Python's own words.  A new pool class whose ``allocate`` forgets
the check fails that walk.
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
from kvpool.checks import HOT_CALLS, INTERNAL_CALLS, REQUIRED, keywords_of
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
            skipped = frozenset(getattr(value, INTERNAL_CALLS, ()))
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


def _hot(fn: Callable[..., Any], owner: Any) -> bool:
    """True for a call ``owner`` declares hot: it takes ``**unknown`` and checks in place."""
    return owner is not None and fn.__name__ in getattr(owner, HOT_CALLS, ())


def _keywords(fn: Callable[..., Any], kind: str, owner: Any = None) -> list[str] | None:
    params = list(inspect.signature(fn).parameters.values())[0 if kind == "function" else 1 :]
    if any(p.kind is P.VAR_KEYWORD for p in params) and not _hot(fn, owner):
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


#: Calls whose ``**options`` go on to another walked call, which names them
#: (the store ``open_store`` picked lists its own options, not every store's;
#: test_calls_taking_any_keyword_refuse_an_unknown_one checks the refusal).
#: Their one named parameter is positional in practice: ``spec=`` misspelt
#: gets Python's own missing-argument error.
FORWARDERS = frozenset(
    {"kvpool.HostSpec.replace", "kvpool.remote.open_store", "kvpool.remote.open_async_store"}
)


def _accepted(text: str) -> set[str]:
    """The names a refusal lists after ``(accepted: ``."""
    listed = text.rsplit("(accepted: ", 1)[1].rstrip(")")
    return {name for name in listed.split(", ") if name}


WALKED = [c for c in CALLS if c[0] not in FORWARDERS]


@pytest.mark.parametrize(("call_id", "fn", "kind", "owner"), WALKED, ids=[c[0] for c in WALKED])
def test_a_misspelt_keyword_names_the_closest_one(
    call_id: str, fn: Callable[..., Any], kind: str, owner: Any
) -> None:
    """Each keyword misspelt is refused naming it, and the list holds every keyword.

    Every keyword: the named parameters (those of a call taking ``**kwargs``
    too: ``MixedMemoryAllocator(size, use_hugepage=True)`` once suggested
    nothing and left ``use_hugepages`` out of the list) and what its
    ``**kwargs`` takes (declared with ``kvpool.checks.takes_keywords``).
    """
    params = list(inspect.signature(fn).parameters.values())[0 if kind == "function" else 1 :]
    named = {p.name for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    declared = keywords_of(fn, skip=0 if kind == "function" else 1)
    everything = named | set(declared or ())
    for right in sorted(everything):
        wrong = _misspelt(right)
        with pytest.raises(ArgumentTypeError) as info:
            _call(fn, kind, owner, **{wrong: 1})
        text = str(info.value)
        assert f"unexpected keyword argument {wrong!r}" in text, text
        assert f"did you mean {right!r}?" in text, text
        assert _accepted(text) == everything, text
        assert isinstance(info.value, TypeError)
    assert not _takes_kwargs(fn) or declared is not None or _hot(fn, owner), (
        f"{call_id} takes **kwargs without declaring them (kvpool.checks.takes_keywords): "
        "a misspelt option would not be suggested"
    )


def test_use_hugepage_names_use_hugepages() -> None:
    """The issue's case: a named parameter beside ``**kwargs`` is suggested and listed."""
    with pytest.raises(ArgumentTypeError) as info:
        kvpool.MixedMemoryAllocator(1 << 20, use_hugepage=True)
    text = str(info.value)
    assert text.startswith(
        "MixedMemoryAllocator() got an unexpected keyword argument 'use_hugepage'; "
        "did you mean 'use_hugepages'? (accepted: "
    ), text
    assert {"size", "use_paging", "use_hugepages", "shm_name", "numa_node"} <= _accepted(text)


def test_takes_keywords_guards_a_kwargs_function() -> None:
    """A declared ``**kwargs`` call: its options pass, a misspelling of either kind is named."""
    from kvpool.checks import refuse_unknown_keywords, takes_keywords

    @refuse_unknown_keywords
    @takes_keywords({"colour"}, {"shade"})
    def paint(size: int, *, fast: bool = False, **options: Any) -> tuple[int, bool, dict[str, Any]]:
        return size, fast, options

    assert paint(1, colour="red") == (1, False, {"colour": "red"})
    assert paint(size=2, fast=True, shade=3) == (2, True, {"shade": 3})
    with pytest.raises(
        ArgumentTypeError,
        match=r"'colur'; did you mean 'colour'\? \(accepted: "
        r"colour, fast, shade, size\)",
    ):
        paint(1, colur="red")
    with pytest.raises(ArgumentTypeError, match=r"did you mean 'size'\?"):
        paint(sise=1)
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'size'") as info:
        paint(colour="red")  # type: ignore[call-arg]
    assert type(info.value) is TypeError
    assert keywords_of(paint) == {"size", "fast", "colour", "shade"}

    @refuse_unknown_keywords
    @takes_keywords({"colour"})
    async def apaint(**options: Any) -> dict[str, Any]:
        return options

    assert asyncio.run(apaint(colour=1)) == {"colour": 1}
    with pytest.raises(ArgumentTypeError, match=r"did you mean 'colour'\?"):
        asyncio.run(apaint(color=1))


def _takes_kwargs(fn: Callable[..., Any]) -> bool:
    return any(p.kind is P.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


# Calls that take **kwargs check them themselves, before doing anything else.
KWARGS_CALLS = [c for c in CALLS if _keywords(c[1], c[2], c[3]) is None]


@pytest.mark.parametrize(
    ("call_id", "fn", "kind", "owner"), KWARGS_CALLS, ids=[c[0] for c in KWARGS_CALLS]
)
def test_calls_taking_any_keyword_refuse_an_unknown_one(
    call_id: str, fn: Callable[..., Any], kind: str, owner: Any, tmp_path: Any
) -> None:
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


# -- hot calls: checked in place -------------------------------------------


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _hot_calls() -> Iterator[tuple[str, type, Callable[..., Any]]]:
    """``(qualified name, class, function)`` of the hot calls of exported and kvpool classes."""
    classes = [v for _, v in _exported() if isinstance(v, type)]
    classes += [
        c
        for c in _subclasses(kvpool.MemoryAllocatorInterface)
        if c.__module__.startswith("kvpool.")
    ]
    seen: set[int] = set()
    for owner in classes:
        for name in sorted(getattr(owner, HOT_CALLS, ())):
            fn = inspect.getattr_static(owner, name, None)
            if inspect.isfunction(fn) and id(fn) not in seen:
                seen.add(id(fn))
                yield fn.__qualname__, owner, fn


HOT = list(_hot_calls())


def _python_missing_message(fn: Callable[..., Any], given: int = 0) -> str:
    """What Python says when ``fn`` is called with only ``given`` of its required arguments."""
    params = list(inspect.signature(fn).parameters.values())
    required = [p.name for p in params[1:] if p.default is REQUIRED]
    namespace: dict[str, Any] = {}
    exec(f"def plain({', '.join([params[0].name, *required])}): pass", namespace)
    plain = namespace["plain"]
    plain.__qualname__ = fn.__qualname__
    try:
        plain(None, *[object()] * given)
    except TypeError as exc:
        return str(exc)
    raise AssertionError(f"{fn.__qualname__} has no required argument")


def _assert_checks_in_place(fn: Callable[..., Any]) -> None:
    """``fn`` refuses every misspelt keyword in place, and a missing argument as Python does."""
    assert not hasattr(fn, "__wrapped__"), (
        f"{fn.__qualname__} refuses unknown keywords through a wrapper (an extra call on the "
        "hot path): take **unknown and call kvpool.checks.refuse_in_place on the first line"
    )
    params = list(inspect.signature(fn).parameters.values())[1:]
    assert params[-1].kind is P.VAR_KEYWORD, f"{fn.__qualname__} takes no **unknown"
    required = [p for p in params if p.default is REQUIRED]
    assert required, f"{fn.__qualname__}: required arguments must default to REQUIRED"
    assert not [p for p in params if p.default is P.empty and p.kind is not P.VAR_KEYWORD], (
        f"{fn.__qualname__}: a required argument without REQUIRED is missing, not misspelt"
    )
    for param in params[:-1]:
        wrong = _misspelt(param.name)
        with pytest.raises(ArgumentTypeError) as info:
            fn(_Stand(), **{wrong: 1})
        text = str(info.value)
        assert f"unexpected keyword argument {wrong!r}; did you mean {param.name!r}?" in text
    for given in range(len(required)):  # none of them, then all but the last ones
        with pytest.raises(TypeError) as missing:
            fn(_Stand(), *[object()] * given)
        assert type(missing.value) is TypeError
        assert str(missing.value) == _python_missing_message(fn, given)


def test_the_hot_walk_finds_every_pool_class() -> None:
    ids = {call_id for call_id, *_ in HOT}
    for expected in (
        "MemoryAllocatorInterface.allocate",
        "TensorMemoryAllocator.allocate",
        "TensorMemoryAllocator.batched_free",
        "PagedTensorMemoryAllocator.allocate",
        "PlacementPolicy.free",
        "MemoryPool.batched_allocate",
        "IndexedPool.free",
        "LazyMemoryAllocator.allocate",
        "BufferAllocator.free",
        "AdHocMemoryAllocator.batched_free",
        "PagedCpuGpuMemoryAllocator.allocate",
        "DevDaxMemoryAllocator.batched_allocate",
    ):
        assert expected in ids, expected


@pytest.mark.parametrize(("call_id", "owner", "fn"), HOT, ids=[c[0] for c in HOT])
def test_hot_calls_check_in_place(call_id: str, owner: type, fn: Callable[..., Any]) -> None:
    _assert_checks_in_place(fn)


def test_a_hot_call_that_forgets_the_check_fails_the_walk() -> None:
    class Forgetful(kvpool.BufferAllocator):
        def allocate(self, shapes: Any, dtypes: Any, fmt: Any = None, allocator_type: Any = None):  # type: ignore[no-untyped-def, override]
            return None

    class HalfDone(kvpool.BufferAllocator):
        def allocate(  # type: ignore[no-untyped-def, override]
            self, shapes: Any = REQUIRED, dtypes: Any = REQUIRED, fmt: Any = None, **unknown: Any
        ):
            return None

    for cls in (Forgetful, HalfDone):
        with pytest.raises((AssertionError, pytest.fail.Exception)):  # the walk's failures
            _assert_checks_in_place(cls.allocate)
    # Outside kvpool's own classes the wrapper still refuses it, at a wrapper's cost.
    with pytest.raises(ArgumentTypeError, match=r"Forgetful\.allocate\(\).*did you mean 'dtypes'"):
        Forgetful().allocate(__import__("torch").Size([4]), dtype=1)


def _pools() -> Iterator[tuple[str, Callable[[], tuple[Any, Any]]]]:
    """(id, factory): each factory returns (the pool to call, the owner to close).

    Built in the test, not at collection: a pool made for a parameter would
    keep its mapping for the whole session (the native tests count them).
    """
    import torch

    shape, dtype = torch.Size([2, 8]), torch.float16

    def mixed() -> tuple[Any, Any]:
        pool = kvpool.MixedMemoryAllocator(1 << 20)
        return pool, pool

    def mixed_paged() -> tuple[Any, Any]:
        pool = kvpool.MixedMemoryAllocator(
            1 << 20,
            use_paging=True,
            shapes=[shape],
            dtypes=[dtype],
            fmt=kvpool.MemoryFormat.KV_2LTD,
        )
        return pool, pool

    def host() -> tuple[Any, Any]:
        pool = kvpool.HostMemoryAllocator(1 << 20)
        return pool, pool

    def tensor() -> tuple[Any, Any]:
        pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
        return pool, pool

    def policy() -> tuple[Any, Any]:
        owner = kvpool.MixedMemoryAllocator(1 << 20)
        return owner.allocator, owner  # a pool's policy, called directly

    yield "MixedMemoryAllocator", mixed
    yield "MixedMemoryAllocator-paged", mixed_paged
    yield "HostMemoryAllocator", host
    yield "TensorMemoryAllocator", tensor
    yield "MixedMemoryAllocator.allocator", policy


POOLS = list(_pools())


@pytest.mark.parametrize("make", [f for _, f in POOLS], ids=[i for i, _ in POOLS])
def test_allocate_with_dtype_names_dtypes(make: Callable[[], tuple[Any, Any]]) -> None:
    """The issue's case: ``allocate(shape, dtype=...)`` names ``dtypes``, allocating nothing."""
    import torch

    shape, dtype = torch.Size([2, 8]), torch.float16
    pool, owner = make()
    name = type(pool).__name__
    with pytest.raises(
        ArgumentTypeError,
        match=rf"^{name}\.allocate\(\) got an unexpected keyword argument 'dtype'; "
        r"did you mean 'dtypes'\? \(accepted: allocator_type, dtypes, fmt, shapes\)$",
    ):
        pool.allocate(shape, dtype=dtype)
    with pytest.raises(ArgumentTypeError, match=r"did you mean 'batch_size'\?"):
        pool.batched_allocate(shape, dtype, batchsize=2)
    assert pool.num_active_allocations == 0
    # Correct calls, by position (as kvpool's own callers make them) and by keyword.
    obj = pool.allocate(shape, dtype)
    with pytest.raises(ArgumentTypeError, match=rf"^{name}\.free\(\) .*did you mean 'memory_obj'"):
        pool.free(memory_object=obj)
    assert obj.is_valid()
    pool.free(memory_obj=obj, allocator_type=None)
    objs = pool.batched_allocate(
        shapes=shape, dtypes=dtype, batch_size=2, fmt=kvpool.MemoryFormat.KV_2LTD
    )
    with pytest.raises(ArgumentTypeError, match=r"did you mean 'memory_objs'\?"):
        pool.batched_free(memory_obj=objs)
    pool.batched_free(objs, None, True)
    assert pool.num_active_allocations == 0
    owner.close()


def test_open_async_store_names_the_asyncio_store_s_own_options(tmp_path: Any) -> None:
    """``threads`` is AsyncFileStore's own option: suggested, listed, and the opener named."""
    with pytest.raises(ArgumentTypeError) as info:
        kvpool.remote.open_async_store(str(tmp_path), thread=2)
    text = str(info.value)
    assert text.startswith(
        "AsyncFileStore (opened by open_async_store) got an unexpected keyword argument "
        "'thread'; did you mean 'threads'? (accepted: "
    ), text
    assert "threads" in _accepted(text) and "io_threads" not in _accepted(text), text
