"""The reference's allocator classes and helpers: names, signatures, str(), device variants."""

from __future__ import annotations

import inspect

import pytest
import torch
from pool_helpers import cuda_present

import kvpool
from kvpool import MemoryFormat
from kvpool.checks import REQUIRED

P = inspect.Parameter
POS = P.POSITIONAL_OR_KEYWORD
KW = P.VAR_KEYWORD
EMPTY = P.empty
# The allocation calls check their keywords in place (kvpool.checks.HOT_CALLS):
# a required parameter defaults to REQUIRED (left out, it still raises
# Python's missing-argument TypeError) and a catch-all takes a misspelt keyword.
UNKNOWN = ("unknown", KW, EMPTY)

# (name, kind, default) of each parameter after ``self``, as in the reference.
CONSTRUCTORS = {
    "BufferAllocator": [("device", POS, "cpu")],
    "HostMemoryAllocator": [
        ("size", POS, EMPTY),
        ("use_paging", POS, False),
        ("kwargs", KW, EMPTY),
    ],
    "PinMemoryAllocator": [("size", POS, EMPTY), ("use_paging", POS, False), ("kwargs", KW, EMPTY)],
    "MixedMemoryAllocator": [
        ("size", POS, EMPTY),
        ("use_paging", POS, False),
        ("use_hugepages", POS, False),
        ("kwargs", KW, EMPTY),
    ],
    "GPUMemoryAllocator": [
        ("size", POS, EMPTY),
        ("device", POS, "cuda"),
        ("align_bytes", POS, None),
        ("use_paging", POS, False),
        ("kwargs", KW, EMPTY),
    ],
    "XPUMemoryAllocator": [
        ("size", POS, EMPTY),
        ("device", POS, "xpu"),
        ("align_bytes", POS, None),
        ("use_paging", POS, False),
        ("kwargs", KW, EMPTY),
    ],
    "AdHocMemoryAllocator": [("device", POS, "cpu")],
    "CuFileMemoryAllocator": [("size", POS, EMPTY), ("device", POS, None)],
    "HipFileMemoryAllocator": [("size", POS, EMPTY), ("device", POS, None)],
    "PagedCpuGpuMemoryAllocator": [],
}

HELPERS = {
    "_allocate_cpu_memory": [
        ("size", POS, EMPTY),
        ("numa_mapping", POS, None),
        ("shm_name", POS, None),
        ("use_hugepages", POS, False),
    ],
    "_free_cpu_memory": [
        ("buffer", POS, EMPTY),
        ("size", POS, None),
        ("numa_mapping", POS, None),
        ("shm_name", POS, None),
        ("use_hugepages", POS, False),
    ],
    "_read_hugepage_info": [],
}

# The default ``fmt`` of allocate/batched_allocate per class, as in the reference.
DEFAULT_FMT = {
    "BufferAllocator": MemoryFormat.BINARY_BUFFER,
    "HostMemoryAllocator": MemoryFormat.KV_2LTD,
    "PinMemoryAllocator": MemoryFormat.KV_2LTD,
    "MixedMemoryAllocator": MemoryFormat.KV_2LTD,
    "GPUMemoryAllocator": MemoryFormat.KV_2LTD,
    "XPUMemoryAllocator": MemoryFormat.KV_2LTD,
    "AdHocMemoryAllocator": MemoryFormat.KV_2LTD,
    "PagedCpuGpuMemoryAllocator": MemoryFormat.UNDEFINED,
}


def params(func: object, skip_self: bool = True) -> list[tuple[str, object, object]]:
    items = list(inspect.signature(func).parameters.values())  # type: ignore[arg-type]
    if skip_self and items and items[0].name == "self":
        items = items[1:]
    return [(p.name, p.kind, p.default) for p in items]


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
def test_constructor_signature_matches_the_reference(name: str) -> None:
    cls = getattr(kvpool, name)
    assert name in kvpool.__all__
    assert params(cls.__init__) == CONSTRUCTORS[name]


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_helper_signature_matches_the_reference(name: str) -> None:
    func = getattr(kvpool, name)
    assert name in kvpool.__all__
    assert params(func, skip_self=False) == HELPERS[name]


@pytest.mark.parametrize("name", sorted(DEFAULT_FMT))
def test_allocation_methods_match_the_reference(name: str) -> None:
    cls = getattr(kvpool, name)
    fmt = DEFAULT_FMT[name]
    alloc_type = "cpu" if name == "PagedCpuGpuMemoryAllocator" else None
    batch_type = "gpu" if name == "PagedCpuGpuMemoryAllocator" else None
    free_type = "cpu" if name == "PagedCpuGpuMemoryAllocator" else None
    assert params(cls.allocate) == [
        ("shapes", POS, REQUIRED),
        ("dtypes", POS, REQUIRED),
        ("fmt", POS, fmt),
        ("allocator_type", POS, alloc_type),
        UNKNOWN,
    ]
    assert params(cls.batched_allocate) == [
        ("shapes", POS, REQUIRED),
        ("dtypes", POS, REQUIRED),
        ("batch_size", POS, REQUIRED),
        ("fmt", POS, fmt),
        ("allocator_type", POS, batch_type),
        UNKNOWN,
    ]
    assert params(cls.free) == [
        ("memory_obj", POS, REQUIRED),
        ("allocator_type", POS, free_type),
        UNKNOWN,
    ]
    assert params(cls.batched_free) == [
        ("memory_objs", POS, REQUIRED),
        ("allocator_type", POS, None),
        ("update_stats", POS, True),
        UNKNOWN,
    ]


def test_paged_cpu_gpu_init_methods_match_the_reference() -> None:
    cls = kvpool.PagedCpuGpuMemoryAllocator
    assert params(cls.init_gpu_memory_allocator) == [
        ("size", POS, EMPTY),
        ("shapes", POS, EMPTY),
        ("dtypes", POS, EMPTY),
        ("fmt", POS, MemoryFormat.KV_2LTD),
        ("device", POS, "cuda"),
    ]
    assert params(cls.init_cpu_memory_allocator) == [
        ("size", POS, EMPTY),
        ("shapes", POS, EMPTY),
        ("dtypes", POS, EMPTY),
        ("fmt", POS, MemoryFormat.KV_2LTD),
        ("numa_mapping", POS, None),
    ]


def test_every_allocator_is_a_memory_allocator_interface() -> None:
    for name in CONSTRUCTORS:
        assert issubclass(getattr(kvpool, name), kvpool.MemoryAllocatorInterface), name
    # The GDS variants are GPU pools, as in the reference.
    assert issubclass(kvpool.CuFileMemoryAllocator, kvpool.GPUMemoryAllocator)
    assert issubclass(kvpool.HipFileMemoryAllocator, kvpool.GPUMemoryAllocator)


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: kvpool.BufferAllocator(), "BufferAllocator"),
        (lambda: kvpool.HostMemoryAllocator(1 << 20), "HostMemoryAllocator"),
        (lambda: kvpool.PinMemoryAllocator(1 << 20), "PinMemoryAllocator"),
        (lambda: kvpool.MixedMemoryAllocator(1 << 20), "MixedMemoryAllocator"),
        (lambda: kvpool.GPUMemoryAllocator(1 << 20), "GPUMemoryAllocator"),
        (lambda: kvpool.AdHocMemoryAllocator(), "AdHocMemoryAllocator"),
        (lambda: kvpool.PagedCpuGpuMemoryAllocator(), "PDMemoryAllocator"),
    ],
    ids=["buffer", "host", "pin", "mixed", "gpu", "adhoc", "paged-cpu-gpu"],
)
def test_str_is_the_reference_name(build, expected: str) -> None:
    allocator = build()
    try:
        assert str(allocator) == expected
    finally:
        allocator.close()


def test_xpu_without_a_device_says_what_it_needs() -> None:
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        pytest.skip("an XPU is present: the absent path cannot be exercised here")
    with pytest.raises(kvpool.FeatureUnavailableError) as info:
        kvpool.XPUMemoryAllocator(1 << 20)
    assert isinstance(info.value, OSError)
    message = str(info.value)
    assert "XPU" in message
    assert "torch" in message and "xpu" in message.lower()


def _module_present(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_cufile_without_bindings_says_what_to_install() -> None:
    if _module_present("cufile"):
        pytest.skip("the cufile bindings are installed: the absent path cannot be exercised")
    with pytest.raises(kvpool.FeatureUnavailableError) as info:
        kvpool.CuFileMemoryAllocator(1 << 20)
    assert isinstance(info.value, OSError)
    message = str(info.value)
    assert "cufile" in message
    assert "pip install" in message
    assert "GPUDirect Storage" in message


def test_hipfile_without_bindings_says_what_it_needs() -> None:
    if _module_present("hipfile"):
        pytest.skip("the hipfile bindings are installed: the absent path cannot be exercised")
    with pytest.raises(kvpool.FeatureUnavailableError) as info:
        kvpool.HipFileMemoryAllocator(1 << 20)
    message = str(info.value)
    assert "hipfile" in message
    assert "install" in message


def test_gds_variants_leave_no_mapping_when_the_bindings_are_missing(mappings: int) -> None:
    if _module_present("cufile") or _module_present("hipfile"):
        pytest.skip("GDS bindings are installed")
    from pool_helpers import count_mappings

    for cls in (kvpool.CuFileMemoryAllocator, kvpool.HipFileMemoryAllocator):
        with pytest.raises(kvpool.FeatureUnavailableError):
            cls(1 << 20)
    assert count_mappings() == mappings


def test_gpu_allocator_falls_back_to_cpu_memory_without_cuda() -> None:
    if cuda_present():
        pytest.skip("CUDA is present: the CPU fallback is not taken")
    with kvpool.GPUMemoryAllocator(1 << 20) as pool:
        assert pool.tensor.device.type == "cpu"
        assert pool.tensor.numel() == 1 << 20
        assert pool.describe()["device"] == "cpu"


def test_adhoc_allocator_uses_cpu_without_cuda() -> None:
    if cuda_present():
        pytest.skip("CUDA is present: the CPU fallback is not taken")
    assert kvpool.AdHocMemoryAllocator("cuda").device == "cpu"
