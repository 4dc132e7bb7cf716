"""One thin wrapper per libpinmem call: validate with ``raise``, call, return Python values.

Every wrapper may be called from any thread.  Arguments are checked with
:mod:`kvpool.checks` before anything reaches C; a failed call raises the
exception :func:`kvpool.native.loader.check` picks for its status.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import kvpool.errors as errors
from kvpool.checks import check_bool, check_choice, check_int, check_size
from kvpool.native.loader import (
    COMMIT_PIN_MODES,
    ENV_LIBRARY,
    HUGEPAGE_MODES,
    HUGEPAGE_RESULTS,
    KINDS,
    OPTIONS,
    PIN_MODES,
    PINNED,
    POPULATE_METHODS,
    STATUS_EXCEPTIONS,
    OptionProblem,
    check,
    ffi,
    lib,
    library_path,
    option_problems,
)

__all__ = [
    "ENV_LIBRARY",
    "HUGEPAGE_MODES",
    "HUGEPAGE_RESULTS",
    "KINDS",
    "OPTIONS",
    "OptionProblem",
    "PINNED",
    "PIN_MODES",
    "COMMIT_PIN_MODES",
    "POPULATE_METHODS",
    "STATUS_EXCEPTIONS",
    "Region",
    "alloc",
    "check",
    "commit",
    "cuda_reload",
    "current_cpu",
    "ffi",
    "free",
    "hugepages_2m",
    "lib",
    "library_path",
    "live",
    "numa_nodes",
    "option_get",
    "option_problems",
    "option_set",
    "PLAN_SOURCES",
    "PopulateFacts",
    "PopulatePlan",
    "memory_room",
    "populate",
    "populate_decide",
    "populate_plan",
    "populate_probe",
    "probe",
    "query",
    "resident_bytes",
    "shm_attach",
    "shm_name_check",
    "shm_release_name",
    "shm_size",
    "shm_unlink",
]

# ------------------------------------------------------------- validation


def _name(value: object) -> bytes:
    if not isinstance(value, str):
        raise errors.InvalidArgumentError(
            f"shared-memory name must be a str such as '/kvpool-cache', got {type(value).__name__}"
        )
    if "\0" in value:
        raise errors.InvalidArgumentError(f"shared-memory name {value!r} contains a NUL character")
    if value and not value.startswith("/"):
        # As Python's multiprocessing.shared_memory does: "name" is "/name"
        # (LMCache names its segments lmcache_l1_pool_<pid>).
        value = "/" + value
    return value.encode("utf-8", "surrogateescape")


def _ptr(address: object) -> Any:
    addr = check_int("address", address, low=0, high=(1 << 64) - 1)
    return ffi.cast("void *", addr)


_SIZE_MAX = (1 << (8 * ffi.sizeof("size_t"))) - 1


# ----------------------------------------------------------------- region


@dataclass(frozen=True)
class Region:
    """A snapshot of one live mapping as libpinmem describes it.

    Attributes:
        address: base address.
        size: usable bytes (what was asked for).
        mapped_size: bytes mapped, rounded up to the page size in use.
        kind: "anonymous", "hugetlb", "shm", "cuda-host" or "external" (a
            registration of memory libpinmem did not map).
        pinned: "none", "mlock", "cuda-alloc" or "cuda-register": how the
            whole mapping is pinned ("none" while any part of it is not;
            the weakest pinning when parts differ).
        hugepages: "none", "thp" or "hugetlb-2MiB".
        numa_node: the node asked for, or None.
        numa_bound: True when mbind(MPOL_BIND) took effect.
        shm_owner: True for the creator of a shared-memory segment.
        populate_method: "none", "madvise", "first-touch" or "driver" (the
            allocation's, or the most recent commit's).
        threads_used: threads of that population.
        register_chunks: cudaHostRegister calls behind it (0 if none).
        page_size: page size in use, bytes.
        committed_bytes: bytes made resident by the allocation (all of
            ``mapped_size`` when it populated or pinned) or by :func:`commit`.
        pinned_bytes: of those, bytes pinned (mlock or CUDA).
    """

    address: int
    size: int
    mapped_size: int
    kind: str
    pinned: str
    hugepages: str
    numa_node: int | None
    numa_bound: bool
    shm_owner: bool
    populate_method: str
    threads_used: int
    register_chunks: int
    page_size: int
    committed_bytes: int
    pinned_bytes: int


def _region(r: Any) -> Region:
    return Region(
        address=int(ffi.cast("uintptr_t", r.addr)),
        size=int(r.size),
        mapped_size=int(r.mapped_size),
        kind=KINDS.get(r.kind, f"unknown({r.kind})"),
        pinned=PINNED.get(r.pinned, f"unknown({r.pinned})"),
        hugepages=HUGEPAGE_RESULTS.get(r.hugepages, f"unknown({r.hugepages})"),
        numa_node=None if r.numa_node < 0 else int(r.numa_node),
        numa_bound=bool(r.numa_bound),
        shm_owner=bool(r.shm_owner),
        populate_method=POPULATE_METHODS.get(r.populate_method, "none"),
        threads_used=int(r.threads_used),
        register_chunks=int(r.register_chunks),
        page_size=int(r.page_size),
        committed_bytes=int(r.committed_bytes),
        pinned_bytes=int(r.pinned_bytes),
    )


# --------------------------------------------------------------- wrappers


def alloc(
    size: int,
    *,
    pin: str = "auto",
    hugepages: str = "never",
    numa_node: int | None = None,
    populate: bool = True,
    threads: int | None = None,
    shm_name: str | None = None,
    shm_reuse: bool = False,
    shm_keep: bool = False,
    shm_mode: int = 0o600,
    register_chunk: int | None = None,
) -> Region:
    """Map memory per the arguments (``pinmem_alloc``).

    Args:
        size: bytes wanted, > 0.
        pin: "auto", "none", "mlock", "cuda-alloc" or "cuda-register".
        hugepages: "never", "thp", "auto" or "required".
        numa_node: bind to this node, or None.
        populate: make every page resident now (pinning always does).
        threads: populate threads, None for the default.
        shm_name: create a POSIX shared-memory segment of this name.
        shm_reuse: replace a leftover segment of that name.
        shm_keep: the free of the creator leaves the name in place.
        shm_mode: permission bits of a new segment.
        register_chunk: bytes per ``cudaHostRegister`` call, for this mapping
            and its commits (rounded down to its page size, capped by the
            ``register_chunk`` option); None: that option.

    Returns:
        The new mapping's :class:`Region`.

    Raises:
        InvalidArgumentError: a bad argument.
        OutOfMemoryError: the memory is not there (or size is absurd).
        HugePagesExhaustedError: hugepages="required" and the pool is short.
        NumaNodeError: the node does not exist.
        SharedMemoryExistsError: the name is taken and shm_reuse is False.
        FeatureUnavailableError: CUDA or mlock pinning asked for and refused.
        NativeError: the OS or the CUDA runtime failed otherwise.
    """
    nbytes = check_size("size", size, high=_SIZE_MAX)
    params = ffi.new("pinmem_alloc_params *")
    lib.pinmem_params_init(params)
    params.size = nbytes
    params.pin = check_choice("pin", pin, PIN_MODES)
    params.hugepages = check_choice("hugepages", hugepages, HUGEPAGE_MODES)
    params.numa_node = (
        -1 if numa_node is None else check_int("numa_node", numa_node, low=0, high=(1 << 31) - 1)
    )
    params.populate = 1 if populate else 0
    params.threads = 0 if threads is None else check_int("threads", threads, low=1, high=1024)
    params.shm_mode = check_int("shm_mode", shm_mode, low=0, high=0o7777)
    if register_chunk is not None:
        params.register_chunk = check_int("register_chunk", register_chunk, low=1, high=_SIZE_MAX)
    keep_alive = None
    if shm_name is not None:
        keep_alive = ffi.new("char[]", _name(shm_name))
        params.shm_name = keep_alive
        params.flags = (lib.PINMEM_SHM_REUSE if shm_reuse else 0) | (
            lib.PINMEM_SHM_KEEP_ON_FREE if shm_keep else 0
        )
    out = ffi.new("pinmem_region *")
    status = lib.pinmem_alloc(params, out)
    del keep_alive
    check(status, f"allocate {nbytes} bytes (pin={pin!r}, hugepages={hugepages!r})")
    return _region(out)


def shm_attach(name: str, size: int = 0, *, pin: str = "auto", populate: bool = False) -> Region:
    """Map an existing shared-memory segment (``pinmem_shm_attach``).

    Args:
        name: the segment's name, "/something".
        size: bytes to map; 0 maps the whole segment.
        pin: "auto", "none", "mlock" or "cuda-register".
        populate: prefault every page (contents are never changed).

    Returns:
        The attached mapping's :class:`Region` (``shm_owner`` False).

    Raises:
        SharedMemoryNotFoundError: no segment of that name.
        InvalidArgumentError: bad name, or size beyond the segment.
        NativeError: the OS refused (permissions...).
    """
    raw = _name(name)
    nbytes = check_int("size", size, low=0, high=_SIZE_MAX)
    mode = check_choice("pin", pin, PIN_MODES)
    out = ffi.new("pinmem_region *")
    fill = 1 if check_bool("populate", populate) else 0
    check(lib.pinmem_shm_attach(raw, nbytes, mode, fill, out), f"attach {name!r}")
    return _region(out)


def shm_unlink(name: str) -> None:
    """Remove a shared-memory name (``pinmem_shm_unlink``).

    Raises:
        SharedMemoryNotFoundError: no segment of that name.
        InvalidArgumentError: the name breaks the naming rule.
    """
    check(lib.pinmem_shm_unlink(_name(name)), f"unlink shared memory {name!r}")


def shm_size(name: str) -> int:
    """Return the size in bytes of a named segment (``pinmem_shm_size``).

    Raises:
        SharedMemoryNotFoundError: no segment of that name.
    """
    out = ffi.new("size_t *")
    check(lib.pinmem_shm_size(_name(name), out), f"size of shared memory {name!r}")
    return int(out[0])


def shm_name_check(name: str) -> None:
    """Raise InvalidArgumentError unless name is a valid segment name.

    The rule: '/' followed by 1..255 bytes (NAME_MAX), none of them '/'; a
    name without the leading '/' gets one (``"kv"`` is ``"/kv"``).
    """
    check(lib.pinmem_shm_name_check(_name(name)), f"shared-memory name {name!r}")


def shm_release_name(address: int) -> bool:
    """Unlink the name of a segment this process created, if still its own.

    Returns:
        True when the name was removed now; False when it was already gone
        or now names another segment.

    Raises:
        InvalidHandleError: address is not a live mapping.
        InvalidArgumentError: the mapping is not a segment this process created.
    """
    out = ffi.new("int *")
    check(lib.pinmem_shm_release_name(_ptr(address), out), f"release name of {address:#x}")
    return bool(out[0])


def free(address: int) -> None:
    """Free the mapping at address the way its kind requires (``pinmem_free``).

    Raises:
        InvalidHandleError: not the base of a live mapping (double free,
            interior pointer, never allocated).
        NativeError: munmap or CUDA unregister failed.
    """
    check(lib.pinmem_free(_ptr(address)), f"free {address:#x}")


def query(address: int) -> Region:
    """Describe the live mapping at address (``pinmem_query``).

    Raises:
        InvalidHandleError: not the base of a live mapping.
    """
    out = ffi.new("pinmem_region *")
    check(lib.pinmem_query(_ptr(address), out), f"query {address:#x}")
    return _region(out)


def commit(
    address: int, offset: int, length: int, *, pin: str = "auto", threads: int | None = None
) -> str:
    """Make a range of a live mapping resident and pinned (``pinmem_commit``).

    The mapping never moves, so a pool can reserve it whole (``alloc(...,
    pin="none", populate=False)``) and commit it step by step.  Contents of
    the range are kept.  A range is committed once; commits of disjoint
    ranges may run in parallel threads, and a :func:`free` of the mapping
    waits for the commits in progress.

    Args:
        address: base address of the mapping.
        offset: start of the range, a multiple of the mapping's page size
            (4 KiB, or 2 MiB for hugetlb).
        length: bytes, > 0, a multiple of the page size; the range must end
            within ``mapped_size``.
        pin: "auto" (cudaHostRegister when CUDA is usable, else mlock if
            allowed, else none), "none", "mlock" or "cuda-register".
        threads: populate threads, None for the default.

    Returns:
        How the range ended up pinned: "cuda-register", "mlock" or "none".

    Raises:
        InvalidArgumentError: a bad argument, a range that is unaligned, out
            of the mapping or overlapping one committed before.
        InvalidHandleError: address is not the base of a live mapping (or
            it is being freed).
        FeatureUnavailableError: pin="mlock" refused, or pin="cuda-register"
            without CUDA.
        OutOfMemoryError: populating or registering failed for lack of memory.
        NativeError: the range overlaps a commit in progress (``EBUSY``), or
            the OS or the CUDA runtime failed otherwise.
    """
    start = check_int("offset", offset, low=0, high=_SIZE_MAX)
    nbytes = check_int("length", length, low=1, high=_SIZE_MAX)
    if pin.__class__ is str and pin == "cuda-alloc":
        raise errors.InvalidArgumentError(
            "pin='cuda-alloc' cannot pin a range of an existing mapping; use 'cuda-register' "
            "(or 'auto')"
        )
    mode = check_choice("pin", pin, COMMIT_PIN_MODES)
    nthreads = 0 if threads is None else check_int("threads", threads, low=1, high=1024)
    out = ffi.new("int *")
    status = lib.pinmem_commit(_ptr(address), start, nbytes, mode, nthreads, out)
    check(status, f"commit {nbytes} bytes at offset {start} of {address:#x} (pin={pin!r})")
    return PINNED.get(out[0], f"unknown({out[0]})")


def live() -> tuple[int, int]:
    """Return (number of live mappings, their mapped bytes) (``pinmem_live``)."""
    count = ffi.new("size_t *")
    nbytes = ffi.new("size_t *")
    check(lib.pinmem_live(count, nbytes), "count live mappings")
    return int(count[0]), int(nbytes[0])


def populate(address: int, length: int, threads: int | None = None) -> tuple[str, int]:
    """Make fresh memory resident (``pinmem_populate``).

    Writes zeros where MADV_POPULATE_WRITE is unavailable, so use it only
    on memory that holds nothing yet.

    Returns:
        (method, threads used): method is "madvise" or "first-touch".
    """
    nbytes = check_int("length", length, low=1, high=_SIZE_MAX)
    nthreads = 0 if threads is None else check_int("threads", threads, low=1, high=1024)
    method = ffi.new("int *")
    used = ffi.new("int *")
    check(lib.pinmem_populate(_ptr(address), nbytes, nthreads, method, used), "populate")
    return POPULATE_METHODS.get(method[0], "none"), int(used[0])


#: Where a part of the populate plan came from, by libpinmem's value.
PLAN_SOURCES: dict[int, str] = {
    lib.PINMEM_PLAN_RULE: "rule",
    lib.PINMEM_PLAN_PROBE: "probe",
    lib.PINMEM_PLAN_OPTION: "option",
}

_PROBE_RUN = {"report": 0, "once": 1, "again": 2}


@dataclass(frozen=True)
class PopulateFacts:
    """What the populate probe measured (GB/s of fresh 4 KiB pages made resident).

    Attributes:
        probed: False until the probe ran (then only the next two are set).
        populate_write: MADV_POPULATE_WRITE works here.
        cpus: CPUs this process may run on.
        madvise_gbps: MADV_POPULATE_WRITE, one thread (0.0 if not measured).
        touch_gbps: one write per page, one thread.
        seconds: what the probe cost.
        bytes: memory it made resident (and gave back).
    """

    probed: bool
    populate_write: bool
    cpus: int
    madvise_gbps: float = 0.0
    touch_gbps: float = 0.0
    seconds: float = 0.0
    bytes: int = 0


@dataclass(frozen=True)
class PopulatePlan:
    """How large mappings are made resident, and why.

    Attributes:
        method: ``"madvise"`` (MADV_POPULATE_WRITE) or ``"first-touch"``.
        threads: threads for a mapping of 1 GiB (``PINMEM_PROBE_MIN_BYTES``) or more
            (the rule: usable CPUs, at most 16, unless an option says otherwise).
        method_source, threads_source: ``"rule"``, ``"probe"`` or ``"option"``.
    """

    method: str
    threads: int
    method_source: str
    threads_source: str


def _facts(f: Any) -> PopulateFacts:
    return PopulateFacts(
        probed=bool(f.probed),
        populate_write=bool(f.populate_write),
        cpus=int(f.cpus),
        madvise_gbps=float(f.madvise_gbps),
        touch_gbps=float(f.touch_gbps),
        seconds=float(f.seconds),
        bytes=int(f.bytes),
    )


def _plan(p: Any) -> PopulatePlan:
    return PopulatePlan(
        method=POPULATE_METHODS.get(p.method, "none"),
        threads=int(p.threads),
        method_source=PLAN_SOURCES.get(p.method_source, "rule"),
        threads_source=PLAN_SOURCES.get(p.threads_source, "rule"),
    )


def populate_probe(run: str = "once") -> PopulateFacts:
    """The populate probe's facts (``pinmem_populate_probe``).

    Args:
        run: ``"report"`` -- what is known, never probes; ``"once"`` -- probe
            first if this process has not (tens of milliseconds); ``"again"``
            -- probe now.

    Raises:
        InvalidArgumentError: run is none of those.
    """
    mode = check_choice("run", run, _PROBE_RUN)
    out = ffi.new("pinmem_populate_facts *")
    check(lib.pinmem_populate_probe(mode, out), f"populate probe ({run})")
    return _facts(out)


def populate_decide(facts: PopulateFacts) -> PopulatePlan:
    """The plan libpinmem's rule makes of facts (``pinmem_populate_decide``; no options).

    A pure function: tests and callers may pass made-up facts.

    Raises:
        InvalidArgumentError: facts out of range (a CPU count outside
            0..2**20, a negative or NaN rate).
    """
    if not isinstance(facts, PopulateFacts):
        raise errors.InvalidArgumentError(
            f"facts must be a PopulateFacts, got {type(facts).__name__}"
        )
    f = ffi.new("pinmem_populate_facts *")
    f.probed = 1 if facts.probed else 0
    f.populate_write = 1 if facts.populate_write else 0
    f.cpus = check_int("facts.cpus", facts.cpus, low=0, high=1 << 20)
    f.madvise_gbps = facts.madvise_gbps
    f.touch_gbps = facts.touch_gbps
    out = ffi.new("pinmem_populate_plan *")
    check(lib.pinmem_populate_decide(f, out), "decide the populate plan")
    return _plan(out)


def populate_plan() -> PopulatePlan:
    """The plan in effect for large populations, options applied (never probes)."""
    out = ffi.new("pinmem_populate_plan *")
    check(lib.pinmem_populate_plan_get(out), "read the populate plan")
    return _plan(out)


def memory_room(*, pinned: bool = True) -> tuple[int | None, str]:
    """Bytes this process may still make resident, and the binding limit (``pinmem_memory_room``).

    Args:
        pinned: the memory will be pinned (swap does not count then).

    Returns:
        ``(bytes, limit)``: limit is e.g. ``"MemAvailable"`` or ``"the memory
        cgroup's limit"``; bytes is None when no limit could be read.
    """
    room = ffi.new("uint64_t *")
    limit = ffi.new("const char **")
    check(lib.pinmem_memory_room(1 if pinned else 0, room, limit), "read the memory room")
    value = int(room[0])
    return (None if value == (1 << 64) - 1 else value), ffi.string(limit[0]).decode()


def resident_bytes(address: int, length: int) -> int:
    """Bytes of [address, address+length) resident in RAM (mincore).

    Raises:
        InvalidArgumentError: unaligned address or a range not mapped.
    """
    nbytes = check_int("length", length, low=1, high=_SIZE_MAX)
    out = ffi.new("size_t *")
    check(lib.pinmem_resident_bytes(_ptr(address), nbytes, out), "count resident bytes")
    return int(out[0])


def probe() -> dict[str, Any]:
    """Run the capability probe (``pinmem_probe``) and return it as a dict.

    Keys: cuda_loaded, cuda_device_count, cuda_runtime_version, cuda_status,
    cuda_runtime_path, cuda_error, hugepages (list of (page_size_kib,
    total, free)), numa_nodes (list), memlock_soft, memlock_hard (None =
    unlimited), cap_ipc_lock, populate_write, cpu_count, cpu_affinity,
    thp_mode (int), page_size, default_populate_threads, mem_total.
    """
    c = ffi.new("pinmem_caps *")
    check(lib.pinmem_probe(c), "probe capabilities")
    unlimited = (1 << 64) - 1
    return {
        "cuda_loaded": bool(c.cuda_loaded),
        "cuda_device_count": int(c.cuda_device_count),
        "cuda_runtime_version": int(c.cuda_runtime_version),
        "cuda_status": int(c.cuda_status),
        "cuda_runtime_path": ffi.string(c.cuda_runtime_path).decode("utf-8", "replace"),
        "cuda_error": ffi.string(c.cuda_error).decode("utf-8", "replace"),
        "hugepages": [
            (int(c.hugepages[i].page_size_kib), int(c.hugepages[i].total), int(c.hugepages[i].free))
            for i in range(c.hugepage_size_count)
        ],
        "numa_nodes": [int(c.numa_nodes[i]) for i in range(c.numa_node_count)],
        "memlock_soft": None if c.memlock_soft == unlimited else int(c.memlock_soft),
        "memlock_hard": None if c.memlock_hard == unlimited else int(c.memlock_hard),
        "cap_ipc_lock": bool(c.cap_ipc_lock),
        "populate_write": bool(c.populate_write),
        "cpu_count": int(c.cpu_count),
        "cpu_affinity": int(c.cpu_affinity),
        "thp_mode": int(c.thp_mode),
        "page_size": int(c.page_size),
        "default_populate_threads": int(c.default_populate_threads),
        "mem_total": int(c.mem_total),
    }


def numa_nodes() -> list[int]:
    """Return the online NUMA nodes, ascending (``pinmem_numa_nodes``)."""
    cap = lib.PINMEM_MAX_NUMA_NODES
    nodes = ffi.new("int[]", cap)
    count = ffi.new("int *")
    check(lib.pinmem_numa_nodes(nodes, cap, count), "list NUMA nodes")
    return [int(nodes[i]) for i in range(count[0])]


def current_cpu() -> tuple[int, int]:
    """Return (cpu, numa node) the calling thread runs on (getcpu)."""
    cpu = ffi.new("int *")
    node = ffi.new("int *")
    check(lib.pinmem_current_cpu(cpu, node), "getcpu")
    return int(cpu[0]), int(node[0])


def hugepages_2m(node: int | None = None) -> tuple[int, int]:
    """Return (total, available) 2 MiB hugepages, system-wide or on a node.

    Available is free minus reserved pages (what a new mapping can get).

    Raises:
        NativeError: there is no 2 MiB pool (sysfs entries missing).
        NumaNodeError: the node does not exist.
    """
    n = -1 if node is None else check_int("node", node, low=0, high=(1 << 31) - 1)
    total = ffi.new("int64_t *")
    free_pages = ffi.new("int64_t *")
    check(lib.pinmem_hugepages_2m(n, total, free_pages), "read the 2 MiB hugepage pool")
    return int(total[0]), int(free_pages[0])


def _option(name: object) -> int:
    if not isinstance(name, str) or name not in OPTIONS:
        raise errors.InvalidArgumentError(
            f"option must be one of {', '.join(sorted(OPTIONS))}; got {name!r}"
        )
    return OPTIONS[name][0]


def option_get(name: str) -> int:
    """Return the current value of a libpinmem option (see :data:`OPTIONS`)."""
    out = ffi.new("int64_t *")
    check(lib.pinmem_option_get(_option(name), out), f"read option {name}")
    return int(out[0])


def option_set(name: str, value: int) -> int:
    """Set a libpinmem option; return its previous value.

    Raises:
        InvalidArgumentError: unknown option or value out of its range.
    """
    opt = _option(name)
    v = check_int("value", value, low=-(1 << 63), high=(1 << 63) - 1)
    old = option_get(name)
    check(lib.pinmem_option_set(opt, v), f"set option {name}={v}")
    return old


def cuda_reload(path: str | None = None) -> None:
    """Choose the CUDA runtime again (``pinmem_cuda_reload``).

    Args:
        path: None = discovery ($KVPOOL_CUDART, a libcudart already loaded,
            the usual sonames); "" = no CUDA; else that file.

    Raises:
        NativeError: CUDA-pinned mappings are still live.
    """
    if path is None:
        check(lib.pinmem_cuda_reload(ffi.NULL), "reload the CUDA runtime")
        return
    if not isinstance(path, str) or "\0" in path:
        raise errors.InvalidArgumentError(f"path must be a str without NUL, got {path!r}")
    check(lib.pinmem_cuda_reload(os.fsencode(path)), f"load the CUDA runtime {path!r}")
