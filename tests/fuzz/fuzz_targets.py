"""The public API as a table of fuzz targets, and the hostile values thrown at it.

A :class:`Target` is one public constructor, function or method: how to get
the callable from a :class:`Context` of small live objects, and a valid
value for each argument.  The fuzz test replaces any subset of those
values with hostile ones (:data:`HOSTILE`) and checks what escapes.

Sizes that reach an allocator are drawn from ranges that are either small
(at most a few MiB) or far beyond any machine (>= 2**48), never in between,
so that no fuzz case really populates gigabytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import kvpool
import kvpool.remote as remote
from kvpool import MemoryFormat, MemoryObjMetadata

KIB = 1024
MIB = 1 << 20
SHAPE = torch.Size([2, 2, 16, 8])  # 1 KiB of float16: one page of the paged pools
DTYPE = torch.float16
PAGE = 1024
ROW = 4096  # a registered row of the range calls: one page, so direct_io moves it with O_DIRECT


def _meta_tensor() -> torch.Tensor:
    return torch.empty(64, dtype=torch.uint8, device="meta")


def _sparse() -> torch.Tensor:
    return torch.zeros(8, dtype=torch.uint8).to_sparse()


class Ctx:
    """A hostile value that needs the live context (a freed object, a foreign handle)."""

    def __init__(self, name: str, build: Callable[[Context], Any]) -> None:
        self.name = name
        self.build = build

    def __repr__(self) -> str:
        return f"<{self.name}>"


#: Values no public argument should choke on (they may be refused, typed).
HOSTILE: list[Any] = [
    None,
    True,
    False,
    np.bool_(True),
    0,
    1,
    -1,
    3,
    4095,
    2**62 + 1,
    2**63,
    2**64,
    2**100,
    -(2**63),
    1.5,
    -0.0,
    float("nan"),
    float("inf"),
    np.int64(4096),
    np.int32(-1),
    np.uint64(2**64 - 1),
    np.uint8(255),
    np.float64(2.0),
    "",
    "x",
    "KV_2LTD",
    "cpu",
    "meta",
    "cuda:99",
    "/",
    "/kvpool-fuzz-" + "a" * 300,
    "\x00",
    b"x",
    bytearray(3),
    memoryview(b"abc"),
    [],
    [1],
    [None],
    (),
    (4, 8),
    {},
    {"a": 1},
    object(),
    type,
    print,
    torch.Size([]),
    torch.Size([0]),
    torch.Size([2**62 + 1, 4]),
    torch.Size([2**31, 2**31, 4]),
    torch.Size([2**63 - 1, 2]),
    torch.Size([-1, 4]),
    [torch.Size([2**62 + 1, 4])],
    [torch.Size([4]), torch.Size([2**62, 4])],
    [SHAPE, SHAPE],
    torch.float16,
    torch.bool,
    torch.complex128,
    [torch.float16, torch.float32],
    MemoryFormat.KV_2LTD,
    MemoryFormat.BINARY_BUFFER,
    MemoryFormat.UNDEFINED,
    torch.tensor(3),  # 0-d
    torch.tensor(True),
    torch.zeros(64, dtype=torch.uint8)[::2],  # not contiguous
    torch.zeros(8, 8, dtype=torch.float64).t(),  # not contiguous, another dtype
    torch.zeros(16, dtype=torch.float64),
    torch.zeros(0, dtype=torch.uint8),
    torch.zeros(4, dtype=torch.bool),
    torch.zeros(4, requires_grad=True),
    _meta_tensor(),
    _sparse(),
    np.zeros(16, dtype=np.uint8),
    np.array(5),
    kvpool.NUMAMapping({0: 99}),
    Ctx("freed object", lambda c: c.freed_obj),
    Ctx("foreign object", lambda c: c.foreign_obj),
    Ctx("byte buffer object", lambda c: kvpool.BytesBufferMemoryObj(bytearray(16))),
    Ctx("closed pool", lambda c: c.closed_pool),
    Ctx("gds object", lambda c: c.gds),
]


def hostile_value(value: Any, ctx: Context) -> Any:
    """The value to pass: a :class:`Ctx` is built from the context."""
    return value.build(ctx) if isinstance(value, Ctx) else value


class Context:
    """Small live objects the method targets are called on; closed by :meth:`close`."""

    def __init__(self) -> None:
        self._closers: list[Callable[[], Any]] = []
        self._stack = contextlib.ExitStack()

    def keep(self, obj: Any, closer: Callable[[], Any] | None = None) -> Any:
        """Close ``obj`` (or call ``closer``) with the context."""
        close = closer or getattr(obj, "close", None)
        if close is not None:
            self._closers.append(close)
        return obj

    def close(self) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()
        self._closers.clear()
        self._stack.close()

    # Lazily built members (each target builds only what it uses).

    def __getattr__(self, name: str) -> Any:
        build = _MEMBERS.get(name)
        if build is None:
            raise AttributeError(name)
        value = build(self)
        setattr(self, name, value)
        return value


def _tmpdir(c: Context) -> str:
    return c._stack.enter_context(tempfile.TemporaryDirectory(prefix="kvpool-fuzz-"))


def _extent(c: Context) -> kvpool.TensorMemoryAllocator:
    return c.keep(kvpool.TensorMemoryAllocator(torch.zeros(64 * KIB, dtype=torch.uint8)))


def _paged(c: Context) -> kvpool.PagedTensorMemoryAllocator:
    return c.keep(
        kvpool.PagedTensorMemoryAllocator(
            torch.zeros(8 * PAGE, dtype=torch.uint8), [SHAPE], [DTYPE], MemoryFormat.KV_2LTD
        )
    )


def _mixed(c: Context) -> Any:
    return c.keep(kvpool.MixedMemoryAllocator(1 * MIB, pin="none"))


def _mixed_paged(c: Context) -> Any:
    return c.keep(
        kvpool.MixedMemoryAllocator(
            64 * PAGE, use_paging=True, shapes=[SHAPE], dtypes=[DTYPE], fmt=MemoryFormat.KV_2LTD
        )
    )


def _closed_pool(c: Context) -> Any:
    pool = kvpool.HostMemoryAllocator(64 * KIB)
    pool.close()
    return pool


def _freed(c: Context) -> Any:
    obj = c.extent.allocate(SHAPE, DTYPE)
    obj.ref_count_down()
    return obj


def _foreign(c: Context) -> Any:
    other = c.keep(kvpool.TensorMemoryAllocator(torch.zeros(16 * KIB, dtype=torch.uint8)))
    return other.allocate(SHAPE, DTYPE)


def _meta(c: Context) -> MemoryObjMetadata:
    return MemoryObjMetadata(SHAPE, DTYPE, 0, 1024, 1, 0, MemoryFormat.KV_2LTD)


def _hand_obj(c: Context) -> kvpool.TensorMemoryObj:
    return kvpool.TensorMemoryObj(torch.zeros(1024, dtype=torch.uint8), _meta(c), None)


def _store(c: Context) -> remote.FileStore:
    store = c.keep(remote.FileStore(_tmpdir(c)))
    store.put("k", c.obj)
    return _with_rows(c, store)


def _with_rows(c: Context, store: remote.FileStore) -> remote.FileStore:
    """``store`` with ``c.rows`` registered and row ``"r"`` stored (for the range calls)."""
    store.register_memory(c.rows)
    store.put_ranges(["r"], [c.row], [ROW])
    return store


def _row(c: Context) -> int:
    """The first page-aligned address in ``c.rows`` (a row ``direct_io`` moves with O_DIRECT)."""
    return -(-c.rows.data_ptr() // ROW) * ROW


def _evicted(keys: list[bytes]) -> None:
    """A bounded store's ``on_evict``: the keys are dropped."""


def _bounded_store(c: Context) -> remote.FileStore:
    # Room for the row and the 1 KiB object it holds, headers included: every put evicts.
    store = c.keep(remote.FileStore(_tmpdir(c), max_bytes=6 * KIB, on_evict=_evicted))
    store.put("k", c.obj)
    return _with_rows(c, store)


def _direct_store(c: Context) -> remote.FileStore:
    store = c.keep(remote.FileStore(_tmpdir(c), direct_io=True))
    store.put("k", c.obj)
    return _with_rows(c, store)


def _cpu_gpu(c: Context) -> kvpool.PagedCpuGpuMemoryAllocator:
    pool = c.keep(kvpool.PagedCpuGpuMemoryAllocator())
    pool.init_cpu_memory_allocator(16 * PAGE, [SHAPE], [DTYPE])
    return pool


def _lazy(c: Context) -> Any:
    return c.keep(kvpool.LazyMemoryAllocator(1 * MIB, 2 * MIB, step_size=1 * MIB))


def _shm(c: Context) -> str:
    name = f"/kvpool-fuzz-{uuid.uuid4().hex[:12]}"
    buf = c.keep(kvpool.allocate_host(64 * KIB, pin="none", shm_name=name))
    c.shm_buffer = buf
    return name


def _monitor(c: Context) -> kvpool.PinMonitor:
    # A monitor of its own: the process-wide one is left alone.
    monitor = kvpool.PinMonitor()
    return c.keep(monitor, monitor.reset)


_MEMBERS: dict[str, Callable[[Context], Any]] = {
    "extent": _extent,
    "paged": _paged,
    "am": lambda c: kvpool.AddressManager(64 * KIB),
    "mixed": _mixed,
    "mixed_paged": _mixed_paged,
    "host_pool": lambda c: c.keep(kvpool.HostMemoryAllocator(256 * KIB)),
    "closed_pool": _closed_pool,
    "obj": lambda c: c.extent.allocate(SHAPE, DTYPE),
    "multi_obj": lambda c: c.extent.allocate([SHAPE, torch.Size([4])], [DTYPE, torch.float32]),
    "pool_obj": lambda c: c.mixed.allocate(SHAPE, DTYPE),
    "page_obj": lambda c: c.paged.allocate(SHAPE, DTYPE),
    "freed_obj": _freed,
    "foreign_obj": _foreign,
    "meta": _meta,
    "hand_obj": _hand_obj,
    "bytes_obj": lambda c: kvpool.BytesBufferMemoryObj(bytearray(64)),
    "gds": lambda c: kvpool.GDSMemoryObject(_meta(c)),
    "host_buffer": lambda c: c.keep(kvpool.allocate_host(64 * KIB, pin="none", populate=False)),
    "registration": lambda c: _registration(c),
    "store": _store,
    "rows": lambda c: torch.zeros(3 * ROW, dtype=torch.uint8),
    "row": _row,
    "more_rows": lambda c: torch.zeros(ROW, dtype=torch.uint8),
    "bounded_store": _bounded_store,
    "direct_store": _direct_store,
    "tmpdir": _tmpdir,
    "cpu_gpu": _cpu_gpu,
    "lazy": _lazy,
    "buffers": lambda c: kvpool.BufferAllocator("cpu"),
    "adhoc": lambda c: kvpool.AdHocMemoryAllocator("cpu"),
    "shm": _shm,
    "monitor": _monitor,
    "paged_am": lambda c: c.paged.address_manager,
    "pinned": lambda c: _pinned(c),
    "pinned_ptr": lambda c: (c.pinned, c.__dict__["pinned_ptr"])[1],
}


@dataclass
class Target:
    """One public callable and a valid value for each of its arguments.

    Attributes:
        name: what the test reports, e.g. ``"MixedMemoryAllocator()"``.
        get: the callable, from a context.
        args: a valid value (or ``context -> value``) per positional argument.
        kwargs: a valid value (or ``context -> value``) per keyword argument;
            the fuzzer may leave any keyword out.
        unknown_keywords: whether a misspelt keyword may be added (callables
            without ``**kwargs`` refuse it with Python's own TypeError, which
            is not kvpool's to type).
    """

    name: str
    get: Callable[[Context], Callable[..., Any]]
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    unknown_keywords: bool = False


def valid(value: Any, ctx: Context) -> Any:
    """A target's valid value: ``value(ctx)`` for a ``_V``, also inside a list."""
    if isinstance(value, _V):
        return value(ctx)
    if isinstance(value, list) and any(isinstance(v, _V) for v in value):
        return [valid(v, ctx) for v in value]
    return value


class _V:
    """A valid argument that needs the context."""

    def __init__(self, build: Callable[[Context], Any]) -> None:
        self.build = build

    def __call__(self, ctx: Context) -> Any:
        return self.build(ctx)


def V(attr: str) -> _V:
    """The context member ``attr`` as a valid argument."""
    return _V(lambda c: getattr(c, attr))


def method(attr: str, name: str) -> Callable[[Context], Callable[..., Any]]:
    """``getattr(context.attr, name)``."""
    return lambda c: getattr(getattr(c, attr), name)


def prop(attr: str, name: str) -> Callable[[Context], Callable[..., Any]]:
    """A property read as a call with no arguments."""
    return lambda c: lambda: getattr(getattr(c, attr), name)


def _pool_targets(label: str, attr: str) -> list[Target]:
    """The allocator interface of one pool-like context member."""
    return [
        Target(f"{label}.allocate", method(attr, "allocate"), [SHAPE, DTYPE, MemoryFormat.KV_2LTD]),
        Target(
            f"{label}.batched_allocate",
            method(attr, "batched_allocate"),
            [SHAPE, DTYPE, 2, MemoryFormat.KV_2LTD],
        ),
        Target(f"{label}.free", method(attr, "free"), [V("obj")]),
        Target(f"{label}.batched_free", method(attr, "batched_free"), [[]]),
        Target(f"{label}.memcheck", method(attr, "memcheck")),
    ]


def _obj_targets(label: str, attr: str) -> list[Target]:
    """Every method and property of one memory object of the context."""
    calls = [
        "is_valid",
        "get_size",
        "get_shape",
        "get_dtype",
        "get_shapes",
        "get_dtypes",
        "get_memory_format",
        "get_physical_size",
        "get_num_tokens",
        "get_ref_count",
        "pin",
        "unpin",
        "ref_count_up",
        "ref_count_down",
        "parent",
        "invalidate",
    ]
    props = [
        "metadata",
        "tensor",
        "byte_array",
        "data_ptr",
        "is_pinned",
        "can_evict",
        "raw_tensor",
        "shm_offset",
        "shm_byte_length",
        "raw_data",
    ]
    out = [Target(f"{label}.{m}", method(attr, m)) for m in calls]
    out += [Target(f"{label}.{p}", prop(attr, p)) for p in props]
    out.append(Target(f"{label}.get_tensor", method(attr, "get_tensor"), [0]))
    out.append(Target(f"{label}.set_used_size", method(attr, "set_used_size"), [16]))
    return out


def _store_targets() -> list[Target]:
    s = "store"
    return [
        Target(
            "FileStore()",
            lambda c: remote.FileStore,
            [V("tmpdir")],
            {
                "checksum": False,
                "durable": False,
                "io_threads": 1,
                "reuse_files": True,
                "cleanup_temp_age_s": 60.0,
                "make_parents": False,
                "max_bytes": 1 * MIB,
                "on_evict": _evicted,
                "direct_io": False,
            },
        ),
        Target("FileStore.put", method(s, "put"), ["k2", V("obj")]),
        Target(
            "FileStore.get",
            method(s, "get"),
            ["k", V("extent"), SHAPE, DTYPE, MemoryFormat.KV_2LTD],
        ),
        Target("FileStore.exists", method(s, "exists"), ["k"]),
        Target("FileStore.delete", method(s, "delete"), ["k"]),
        Target("FileStore.head", method(s, "head"), ["k"]),
        Target("FileStore.path", method(s, "path"), ["k"]),
        Target("FileStore.cleanup_temp", method(s, "cleanup_temp"), [60.0]),
        Target("FileStore.batched_put", method(s, "batched_put"), [["k3"], [V("obj")]]),
        Target("FileStore.batched_get", method(s, "batched_get"), [["k"], V("extent")]),
        Target("FileStore.batched_exists", method(s, "batched_exists"), [["k"]]),
        Target("FileStore.batched_delete", method(s, "batched_delete"), [["k"]]),
        Target("FileStore.delete_prefix", method(s, "delete_prefix"), ["k"]),
        Target(
            "FileStore.register_memory",
            method(s, "register_memory"),
            [V("more_rows")],
            {"nbytes": ROW},
        ),
        Target("FileStore.unregister_memory", method(s, "unregister_memory"), [V("rows")]),
        Target("FileStore.put_ranges", method(s, "put_ranges"), [["r2"], [V("row")], [ROW]]),
        Target("FileStore.get_ranges", method(s, "get_ranges"), [["r"], [V("row")], [ROW]]),
        *_bounded_and_direct_targets(),
        Target("open_store()", lambda c: remote.open_store, [V("tmpdir")]),
        Target(
            "store_options()", lambda c: remote.store_options, ["redis://h:1/0"], {"asyncio": False}
        ),
        Target("store_kind()", lambda c: remote.store_kind, ["redis://h:1/0"]),
        Target(
            "RedisStore()",
            lambda c: remote.RedisStore,
            ["redis://[::1"],  # never a reachable server: a bad URL by default
            {"prefix": "kvpool:", "checksum": False, "timeout": 0.5, "ping": True},
        ),
        Target(
            "open_store(redis)",
            lambda c: remote.open_store,
            ["redis://host:99999999/0"],
            {"timeout": 0.5},
        ),
    ]


def _bounded_and_direct_targets() -> list[Target]:
    """A bounded store's calls (their puts evict) and a ``direct_io`` store's (O_DIRECT rows)."""
    b, d = "bounded_store", "direct_store"
    get_args = ["k", V("extent"), SHAPE, DTYPE, MemoryFormat.KV_2LTD]
    return [
        Target("FileStore(max_bytes).bound", prop(b, "bound")),
        Target("FileStore(max_bytes).put", method(b, "put"), ["k2", V("obj")]),
        Target(
            "FileStore(max_bytes).batched_put",
            method(b, "batched_put"),
            [["k3", "k4"], [V("obj"), V("obj")]],
        ),
        Target("FileStore(max_bytes).get", method(b, "get"), get_args),
        Target("FileStore(max_bytes).delete_prefix", method(b, "delete_prefix"), ["k"]),
        Target(
            "FileStore(max_bytes).put_ranges", method(b, "put_ranges"), [["r2"], [V("row")], [ROW]]
        ),
        Target(
            "FileStore(max_bytes).get_ranges", method(b, "get_ranges"), [["r"], [V("row")], [ROW]]
        ),
        Target("FileStore(direct_io).put", method(d, "put"), ["k2", V("obj")]),
        Target("FileStore(direct_io).get", method(d, "get"), get_args),
        Target("FileStore(direct_io).batched_get", method(d, "batched_get"), [["k"], V("extent")]),
        Target(
            "FileStore(direct_io).put_ranges", method(d, "put_ranges"), [["r2"], [V("row")], [ROW]]
        ),
        Target(
            "FileStore(direct_io).get_ranges", method(d, "get_ranges"), [["r"], [V("row")], [ROW]]
        ),
    ]


def _dax_file(c: Context) -> str:
    """A file standing in for a DAX device (4 MiB)."""
    path = f"{_tmpdir(c)}/dax{uuid.uuid4().hex[:8]}.0"
    with open(path, "wb") as f:
        f.truncate(4 * MIB)
    return path


def _dax_pool(c: Context) -> Any:
    return c.keep(kvpool.DevDaxMemoryAllocator(2 * MIB, c.dax_file))


def _later_targets() -> list[Target]:
    """Names added by later rooms (LMCache helpers, DevDax, cluster stores), where present."""
    k = kvpool
    out: list[Target] = []
    if hasattr(k, "HostSpec"):
        out.append(
            Target(
                "HostSpec()",
                lambda c: k.HostSpec,
                [64 * KIB],
                {
                    "pin": "none",
                    "numa_node": None,
                    "hugepages": "never",
                    "shm_name": None,
                    "shm_reuse": False,
                    "populate": True,
                    "threads": None,
                },
            )
        )
        out.append(
            Target(
                "HostSpec.replace",
                lambda c: k.HostSpec(4096).replace,
                [],
                {"size": 8192, "pin": "none", "threads": 2},
            )
        )
    if hasattr(k, "align_to"):
        out += [
            Target("align_to", lambda c: k.align_to, [5, 4096]),
            Target("get_numa_id", lambda c: k.get_numa_id, [None]),
            Target("synchronized", lambda c: k.synchronized, ["lock"]),
            Target("_get_cached_ubyte_array_type", lambda c: k._get_cached_ubyte_array_type, [64]),
            Target("_allocate_gpu_memory", lambda c: k._allocate_gpu_memory, [64 * KIB, "cpu"]),
            Target(
                "_resolve_pinned_alloc_free",
                lambda c: k._resolve_pinned_alloc_free,
                [None, None, 64 * KIB, False],
            ),
            Target("PinnedAllocFree.free", _pinned_free, [V("pinned_ptr")]),
        ]
    if hasattr(k, "DevDaxMemoryAllocator"):
        _MEMBERS["dax_file"] = _dax_file
        _MEMBERS["dax"] = _dax_pool
        out += [
            Target(
                "DevDaxMemoryAllocator()",
                lambda c: k.DevDaxMemoryAllocator,
                [2 * MIB, V("dax_file")],
                {"local_size": 0, "shm_name": None, "align_bytes": 4096, "use_hugepages": False},
            ),
            Target("DevDaxBacking()", lambda c: k.DevDaxBacking, [V("dax_file"), MIB]),
            Target("DevDaxArenaState()", lambda c: k.DevDaxArenaState, ["active"]),
            Target("DevDaxRemoveMode()", lambda c: k.DevDaxRemoveMode, ["drain"]),
            Target(
                "DevDaxArenaStatus()",
                lambda c: k.DevDaxArenaStatus,
                ["/dev/dax0.0", MIB, 0, MIB, 0, _V(lambda c: next(iter(k.DevDaxArenaState))), True],
            ),
            Target(
                "DevDaxMemoryAllocator.add_device",
                method("dax", "add_device"),
                [_V(_dax_file), MIB],
            ),
            Target(
                "DevDaxMemoryAllocator.remove_device",
                method("dax", "remove_device"),
                [_V(lambda c: c.dax_file)],
            ),
            Target(
                "DevDaxMemoryAllocator.arena_status",
                method("dax", "arena_status"),
                [_V(lambda c: c.dax_file)],
            ),
            Target(
                "DevDaxMemoryAllocator.owns_device",
                method("dax", "owns_device"),
                [_V(lambda c: c.dax_file)],
            ),
            Target(
                "DevDaxMemoryAllocator.is_devdax_obj", method("dax", "is_devdax_obj"), [V("obj")]
            ),
            Target("DevDaxMemoryAllocator.get_memory_usage", method("dax", "get_memory_usage")),
            Target("DevDaxMemoryAllocator.arena_statuses", method("dax", "arena_statuses")),
        ]
        out += _pool_targets("DevDaxMemoryAllocator", "dax")
    if hasattr(remote, "RedisClusterStore"):
        out.append(
            Target(
                "RedisClusterStore()",
                lambda c: remote.RedisClusterStore,
                ["redis-cluster://[::1"],  # no server: a bad URL by default
                {"prefix": "kvpool:", "checksum": False, "timeout": 0.5, "ttl": None},
            )
        )
    if hasattr(remote, "MooncakeStore"):
        out.append(
            Target(
                "MooncakeStore()",
                lambda c: remote.MooncakeStore,
                ["[::1"],  # no master: a bad address by default
                {"prefix": "kvpool:", "checksum": False, "timeout": 0.5, "replicas": 1},
            )
        )
        out.append(
            Target(
                "MooncakeStore.from_url",
                lambda c: remote.MooncakeStore.from_url,
                ["mooncake://[::1"],
            )
        )
    return out


def _pinned(c: Context) -> Any:
    pair = kvpool._resolve_pinned_alloc_free(None, None, 64 * KIB, False)
    ptr = pair.alloc()
    c.pinned_ptr = ptr
    c.keep(pair, lambda: _free_quietly(pair, ptr))
    return pair


def _free_quietly(pair: Any, ptr: int) -> None:
    with contextlib.suppress(Exception):  # freed by the call under test already
        pair.free(ptr)


def _pinned_free(c: Context) -> Callable[..., Any]:
    return c.pinned.free


def _async_store(c: Context) -> Any:
    store = remote.AsyncFileStore(_tmpdir(c))
    c.keep(store, lambda: asyncio.run(store.aclose()))
    asyncio.run(store.put("k", c.obj))
    return store


def _async_targets() -> list[Target]:
    """The asyncio stores, where this kvpool has them (their coroutines are run)."""
    if not hasattr(remote, "AsyncFileStore"):
        return []
    a = "async_store"
    _MEMBERS["async_store"] = _async_store
    return [
        Target(
            "AsyncFileStore()",
            lambda c: lambda *a, **k: c.keep(remote.AsyncFileStore(*a, **k), None),
            [V("tmpdir")],
            {"checksum": False},
        ),
        Target("AsyncFileStore.put", method(a, "put"), ["k2", V("obj")]),
        Target(
            "AsyncFileStore.get",
            method(a, "get"),
            ["k", V("extent"), SHAPE, DTYPE, MemoryFormat.KV_2LTD],
        ),
        Target("AsyncFileStore.exists", method(a, "exists"), ["k"]),
        Target("AsyncFileStore.delete", method(a, "delete"), ["k"]),
        Target("AsyncFileStore.head", method(a, "head"), ["k"]),
        Target("AsyncFileStore.batched_put", method(a, "batched_put"), [["k3"], [V("obj")]]),
        Target("AsyncFileStore.batched_get", method(a, "batched_get"), [["k"], V("extent")]),
        Target("AsyncFileStore.batched_exists", method(a, "batched_exists"), [["k"]]),
        Target("AsyncFileStore.batched_delete", method(a, "batched_delete"), [["k"]]),
        Target("open_async_store()", lambda c: remote.open_async_store, [V("tmpdir")]),
        Target(
            "AsyncRedisStore()",
            lambda c: remote.AsyncRedisStore,
            ["redis://[::1"],  # no server: a bad URL by default
            {"prefix": "kvpool:", "checksum": False, "timeout": 0.5},
        ),
        Target(
            "AsyncRedisClusterStore()",
            lambda c: remote.AsyncRedisClusterStore,
            ["redis-cluster://[::1"],  # no server: a bad URL by default
            {"prefix": "kvpool:", "checksum": False, "timeout": 0.5, "ttl": None},
        ),
        Target(
            "AsyncMooncakeStore()",
            lambda c: remote.AsyncMooncakeStore,
            ["[::1"],  # no master: a bad address by default
            {"threads": 2, "prefix": "kvpool:", "timeout": 0.5},
        ),
        Target(
            "AsyncMooncakeStore.from_url",
            lambda c: remote.AsyncMooncakeStore.from_url,
            ["mooncake://[::1"],
        ),
    ]


def targets() -> list[Target]:
    """Every public constructor and method of ``kvpool.__all__`` and ``kvpool.remote``."""
    k = kvpool
    host_kwargs = {"numa_node": None, "align_bytes": 4096}
    out = [
        # -- constructors and functions of kvpool.__all__ ---------------------
        Target(
            "AddressManager()", lambda c: k.AddressManager, [64 * KIB, 4096], {"max_size": None}
        ),
        Target("FreeBlock()", lambda c: k.FreeBlock, [0, 4096]),
        Target(
            "TensorMemoryAllocator()",
            lambda c: k.TensorMemoryAllocator,
            [_V(lambda c: torch.zeros(64 * KIB, dtype=torch.uint8)), 4096, None],
        ),
        Target(
            "PagedTensorMemoryAllocator()",
            lambda c: k.PagedTensorMemoryAllocator,
            [_V(lambda c: torch.zeros(8 * PAGE, dtype=torch.uint8)), [SHAPE], [DTYPE]],
            {"fmt": MemoryFormat.KV_2LTD},
        ),
        Target(
            "HostMemoryAllocator()",
            lambda c: k.HostMemoryAllocator,
            [256 * KIB, False],
            host_kwargs,
            unknown_keywords=True,
        ),
        Target(
            "PinMemoryAllocator()",
            lambda c: k.PinMemoryAllocator,
            [256 * KIB, False],
            host_kwargs,
            unknown_keywords=True,
        ),
        Target(
            "MixedMemoryAllocator()",
            lambda c: k.MixedMemoryAllocator,
            [256 * KIB, False, False],
            {
                "pin": "none",
                "shm_name": None,
                "shm_reuse": False,
                "numa_mapping": None,
                "align_bytes": 4096,
            },
            unknown_keywords=True,
        ),
        Target(
            "MixedMemoryAllocator(paged)",
            lambda c: k.MixedMemoryAllocator,
            [16 * PAGE, True],
            {"shapes": [SHAPE], "dtypes": [DTYPE], "fmt": MemoryFormat.KV_2LTD},
            unknown_keywords=True,
        ),
        Target(
            "LazyMemoryAllocator()",
            lambda c: k.LazyMemoryAllocator,
            [1 * MIB, 2 * MIB, 4096, None],
            {
                "step_size": 1 * MIB,
                "use_hugepages": False,
                "byte_buffers": True,
                "start": False,
            },
            unknown_keywords=True,
        ),
        Target(
            "GPUMemoryAllocator()",
            lambda c: k.GPUMemoryAllocator,
            [64 * KIB, "cpu", None, False],
            unknown_keywords=True,
        ),
        Target(
            "XPUMemoryAllocator()",
            lambda c: k.XPUMemoryAllocator,
            [64 * KIB],
            unknown_keywords=True,
        ),
        Target("CuFileMemoryAllocator()", lambda c: k.CuFileMemoryAllocator, [64 * KIB, None]),
        Target("HipFileMemoryAllocator()", lambda c: k.HipFileMemoryAllocator, [64 * KIB, None]),
        Target("AdHocMemoryAllocator()", lambda c: k.AdHocMemoryAllocator, ["cpu"]),
        Target("BufferAllocator()", lambda c: k.BufferAllocator, ["cpu"]),
        Target(
            "BufferAllocator.bounded",
            lambda c: k.BufferAllocator.bounded,
            [4096],
            {"name": "pool", "device": "cpu"},
        ),
        Target("PagedCpuGpuMemoryAllocator()", lambda c: k.PagedCpuGpuMemoryAllocator),
        Target(
            "PagedCpuGpuMemoryAllocator.init_cpu_memory_allocator",
            lambda c: k.PagedCpuGpuMemoryAllocator().init_cpu_memory_allocator,
            [16 * PAGE, [SHAPE], [DTYPE], MemoryFormat.KV_2LTD, None],
        ),
        Target(
            "PagedCpuGpuMemoryAllocator.init_gpu_memory_allocator",
            lambda c: k.PagedCpuGpuMemoryAllocator().init_gpu_memory_allocator,
            [16 * PAGE, [SHAPE], [DTYPE], MemoryFormat.KV_2LTD, "cpu"],
        ),
        Target(
            "MemoryPool()",
            lambda c: k.MemoryPool,
            [
                _V(lambda c: kvpool.pool.backing.TorchBacking(64 * KIB)),
                _V(lambda c: kvpool.pool.policy.PlacementSpec("extent")),
            ],
            {"byte_buffers": False, "name": "MemoryPool"},
        ),
        Target(
            "MemoryObjMetadata()",
            lambda c: k.MemoryObjMetadata,
            [SHAPE, DTYPE, 0, 1024, 1, 0, MemoryFormat.KV_2LTD],
        ),
        Target(
            "MemoryObjMetadata.from_dict",
            lambda c: k.MemoryObjMetadata.from_dict,
            [_V(lambda c: c.meta.to_dict())],
        ),
        Target("MemoryObjMetadata.get_size", method("meta", "get_size")),
        Target(
            "TensorMemoryObj()",
            lambda c: k.TensorMemoryObj,
            [_V(lambda c: torch.zeros(1024, dtype=torch.uint8)), V("meta"), None],
        ),
        Target("BytesBufferMemoryObj()", lambda c: k.BytesBufferMemoryObj, [bytearray(8), None]),
        Target("GDSMemoryObject()", lambda c: k.GDSMemoryObject, [V("meta")]),
        Target("MemoryFormat()", lambda c: k.MemoryFormat, [1]),
        Target("MemoryFormat.token_dim", lambda c: MemoryFormat.KV_2LTD.token_dim),
        Target("NUMAMapping()", lambda c: k.NUMAMapping, [{0: 0}]),
        Target("NUMAMapping.detect", lambda c: k.NUMAMapping.detect, [], {"devices": lambda: []}),
        Target(
            "PinMonitor()",
            lambda c: _monitor_kept(c),
            [],
            {
                "timeout": 300.0,
                "interval": 10.0,
                "force_unpin": False,
                "enabled": True,
                "on_timeout": None,
            },
        ),
        Target(
            "PinMonitor.configure",
            method("monitor", "configure"),
            [],
            {
                "timeout": 300.0,
                "interval": 10.0,
                "force_unpin": False,
                "enabled": True,
                "on_timeout": None,
            },
        ),
        Target("PinMonitor.overdue", method("monitor", "overdue"), [None]),
        Target("PinMonitor.forget_owner", method("monitor", "forget_owner"), [V("extent")]),
        Target("PinMonitor.stop", method("monitor", "stop"), [1.0]),
        Target("StatsMonitor.snapshot", lambda c: k.StatsMonitor.GetOrCreate().snapshot),
        Target("PoolStats.build", lambda c: k.PoolStats.build, [4096, 0, 0, 0, 4096]),
        Target("get_size_bytes", lambda c: k.get_size_bytes, [[SHAPE], [DTYPE]]),
        Target("parse_size", lambda c: k.parse_size, ["64MB"]),
        Target("set_strict_mode", lambda c: _set_strict_and_restore, [False]),
        Target("strict_mode", lambda c: k.strict_mode),
        Target("capabilities", lambda c: k.capabilities),
        Target("_read_hugepage_info", lambda c: k._read_hugepage_info),
        Target("_allocate_cpu_memory", lambda c: _allocate_and_free, [64 * KIB, None, None, False]),
        Target(
            "_free_cpu_memory",
            lambda c: k._free_cpu_memory,
            [_V(lambda c: k._allocate_cpu_memory(64 * KIB))],
        ),
        Target(
            "allocate_host",
            lambda c: _allocate_host_and_close,
            [64 * KIB],
            {
                "pin": "none",
                "numa_node": None,
                "hugepages": "never",
                "shm_name": None,
                "shm_reuse": False,
                "populate": False,
                "threads": None,
                "shm_unlink_on_close": True,
            },
        ),
        Target(
            "attach_shm",
            lambda c: _attach_and_close(k.attach_shm),
            [V("shm"), None],
            {"pin": "none", "populate": False},
        ),
        Target("attach_pool", lambda c: _attach_and_close(k.attach_pool), [V("shm"), None]),
        Target("unlink_shm", lambda c: k.unlink_shm, ["/kvpool-fuzz-never-made"]),
        # A libpinmem mapping's address: register_host refuses it (commit it instead)
        # before any CUDA call, so hostile values never reach a driver with live memory.
        Target(
            "register_host",
            lambda c: _register_and_close,
            [_V(lambda c: c.host_buffer.address), 64 * KIB],
            {"chunk": None, "read_only": False, "io_memory": False, "populate": False},
        ),
        Target("Registration.spans", method("registration", "spans")),
        Target("Registration.close", method("registration", "close")),
        # -- methods of live objects ------------------------------------------
        Target("AddressManager.allocate", method("am", "allocate"), [4096]),
        Target("AddressManager.batched_allocate", method("am", "batched_allocate"), [4096, 2]),
        Target("AddressManager.free", method("am", "free"), [0, 4096]),
        Target("AddressManager.sbrk", method("am", "sbrk"), [4096]),
        Target("AddressManager.compute_aligned_size", method("am", "compute_aligned_size"), [5]),
        Target("AddressManager.check_consistency", method("am", "check_consistency")),
        Target(
            "HostBuffer.commit",
            method("host_buffer", "commit"),
            [0, 4096],
            {"pin": "none", "threads": None},
        ),
        Target("HostBuffer.memoryview", method("host_buffer", "memoryview")),
        Target("HostBuffer.tensor", method("host_buffer", "tensor")),
        Target("LazyMemoryAllocator.wait_ready", method("lazy", "wait_ready"), [5.0]),
        Target("LazyMemoryAllocator.start_growth", method("lazy", "start_growth")),
        Target(
            "PagedAddressManager()",
            lambda c: lambda a: k.PagedAddressManager(a).get_free_size(),
            [V("paged")],
        ),
        Target("PagedAddressManager.get_heap_size", method("paged_am", "get_heap_size")),
        Target("PagedAddressManager.get_free_size", method("paged_am", "get_free_size")),
        Target("MemoryPool.stats", method("mixed", "stats")),
        Target("MemoryPool.describe", method("mixed", "describe")),
        Target("TensorMemoryAllocator.stats", method("extent", "stats")),
        Target("PagedTensorMemoryAllocator.stats", method("paged", "stats")),
        Target(
            "PagedCpuGpuMemoryAllocator.allocate",
            method("cpu_gpu", "allocate"),
            [SHAPE, DTYPE, MemoryFormat.KV_2LTD, "cpu"],
        ),
        Target(
            "PagedCpuGpuMemoryAllocator.batched_allocate",
            method("cpu_gpu", "batched_allocate"),
            [SHAPE, DTYPE, 2, MemoryFormat.KV_2LTD, "cpu"],
        ),
        Target(
            "PagedCpuGpuMemoryAllocator.free",
            method("cpu_gpu", "free"),
            [_V(lambda c: c.cpu_gpu.allocate(SHAPE, DTYPE)), "cpu"],
        ),
        Target(
            "PagedCpuGpuMemoryAllocator.batched_free", method("cpu_gpu", "batched_free"), [[], None]
        ),
    ]
    for label, attr in (
        ("TensorMemoryAllocator", "extent"),
        ("PagedTensorMemoryAllocator", "paged"),
        ("MixedMemoryAllocator", "mixed"),
        ("MixedMemoryAllocator(paged)", "mixed_paged"),
        ("HostMemoryAllocator", "host_pool"),
        ("LazyMemoryAllocator", "lazy"),
        ("BufferAllocator", "buffers"),
        ("AdHocMemoryAllocator", "adhoc"),
    ):
        out += _pool_targets(label, attr)
    for label, attr in (
        ("TensorMemoryObj", "obj"),
        ("TensorMemoryObj(groups)", "multi_obj"),
        ("TensorMemoryObj(paged)", "page_obj"),
        ("TensorMemoryObj(mixed)", "pool_obj"),
        ("TensorMemoryObj(freed)", "freed_obj"),
        ("TensorMemoryObj(by hand)", "hand_obj"),
        ("BytesBufferMemoryObj", "bytes_obj"),
        ("GDSMemoryObject", "gds"),
    ):
        out += _obj_targets(label, attr)
    out += _store_targets()
    out += _async_targets()
    out += _later_targets()
    return out


def _monitor_kept(c: Context) -> Callable[..., kvpool.PinMonitor]:
    def build(**kwargs: Any) -> kvpool.PinMonitor:
        monitor = kvpool.PinMonitor(**kwargs)
        return c.keep(monitor, monitor.reset)

    return build


def _set_strict_and_restore(enabled: Any) -> bool:
    previous = kvpool.set_strict_mode(enabled)
    kvpool.set_strict_mode(previous)
    return previous


def _allocate_and_free(*args: Any) -> None:
    tensor = kvpool._allocate_cpu_memory(*args)
    if tensor.numel():
        kvpool._free_cpu_memory(tensor)


def _allocate_host_and_close(*args: Any, **kwargs: Any) -> None:
    kvpool.allocate_host(*args, **kwargs).close()


def _register_and_close(*args: Any, **kwargs: Any) -> None:
    kvpool.register_host(*args, **kwargs).close()


def _registration(c: Context) -> Any:
    """A Registration object over a libpinmem mapping (made without CUDA: its calls refuse)."""
    from kvpool.native.registration import Registration

    return Registration(c.host_buffer.address, 64 * KIB, 1, "none", None)


def _attach_and_close(attach: Callable[..., Any]) -> Callable[..., None]:
    def call(*args: Any, **kwargs: Any) -> None:
        attach(*args, **kwargs).close()

    return call


@contextlib.contextmanager
def context() -> Iterator[Context]:
    """A fresh :class:`Context`, closed afterwards."""
    ctx = Context()
    try:
        yield ctx
    finally:
        ctx.close()
