"""The public surface: names, MemoryFormat, signatures and defaults, exceptions.

kvpool is a drop-in for LMCache's memory-management module (the seeds in
``shared/seeds``), so every reference name must import from ``kvpool`` with
the same parameters, in the same order, with the same defaults.  The table
below is written from the seeds; when the seeds are present, a second test
parses them and checks every public method of every reference class.
"""

from __future__ import annotations

import abc
import ast
import inspect
import os
from pathlib import Path

import pytest
import torch

import kvpool
from kvpool import MemoryFormat

REFERENCE_NAMES = [
    "MemoryFormat",
    "FreeBlock",
    "MemoryObjMetadata",
    "MemoryObj",
    "TensorMemoryObj",
    "BytesBufferMemoryObj",
    "GDSMemoryObject",
    "MemoryAllocatorInterface",
    "AddressManager",
    "TensorMemoryAllocator",
    "PagedTensorMemoryAllocator",
    "get_size_bytes",
]


@pytest.mark.parametrize("name", REFERENCE_NAMES)
def test_reference_name_importable_and_exported(name: str) -> None:
    obj = getattr(kvpool, name)
    assert name in kvpool.__all__
    assert obj.__name__ == name


def test_all_names_resolve() -> None:
    missing = [n for n in kvpool.__all__ if not hasattr(kvpool, n)]
    assert missing == []


# -- MemoryFormat ------------------------------------------------------

# Written from the reference: values (auto() from UNDEFINED = 0) and token_dim().
REFERENCE_FORMATS = {
    "UNDEFINED": (0, 0),
    "KV_2LTD": (1, 2),
    "KV_T2D": (2, 1),
    "KV_2TD": (3, 0),
    "BINARY": (4, 0),
    "BINARY_BUFFER": (5, 0),
    "KV_MLA_FMT": (6, 2),
    "EC_TD": (7, 0),
    "HS_TD": (8, 0),
}


def test_memory_format_members_match_reference() -> None:
    assert [m.name for m in MemoryFormat] == list(REFERENCE_FORMATS)


@pytest.mark.parametrize(("name", "value_dim"), REFERENCE_FORMATS.items())
def test_memory_format_value_and_token_dim(name: str, value_dim: tuple[int, int]) -> None:
    member = MemoryFormat[name]
    assert (member.value, member.token_dim()) == value_dim
    assert MemoryFormat(value_dim[0]) is member


# -- signatures --------------------------------------------------------

ALIGN = kvpool.AddressManager.ALIGN_BYTES
KV = MemoryFormat.KV_2LTD
UNDEF = MemoryFormat.UNDEFINED
NOT_SET = inspect.Parameter.empty

# (owner, method): [(parameter, default or NOT_SET), ...] without self.
REFERENCE_SIGNATURES = {
    ("AddressManager", "__init__"): [("size", NOT_SET), ("align_bytes", 4096)],
    ("AddressManager", "allocate"): [("size", NOT_SET)],
    ("AddressManager", "batched_allocate"): [("size", NOT_SET), ("batch_size", NOT_SET)],
    ("AddressManager", "free"): [("address", NOT_SET), ("size", NOT_SET)],
    ("AddressManager", "sbrk"): [("size", NOT_SET)],
    ("AddressManager", "compute_aligned_size"): [("raw_size", NOT_SET)],
    ("AddressManager", "get_heap_size"): [],
    ("AddressManager", "get_free_size"): [],
    ("AddressManager", "check_consistency"): [],
    ("TensorMemoryAllocator", "__init__"): [
        ("tensor", NOT_SET),
        ("align_bytes", ALIGN),
        ("init_address_space", None),
    ],
    ("TensorMemoryAllocator", "allocate"): [
        ("shapes", NOT_SET),
        ("dtypes", NOT_SET),
        ("fmt", KV),
        ("allocator_type", None),
    ],
    ("TensorMemoryAllocator", "batched_allocate"): [
        ("shapes", NOT_SET),
        ("dtypes", NOT_SET),
        ("batch_size", NOT_SET),
        ("fmt", KV),
        ("allocator_type", None),
    ],
    ("TensorMemoryAllocator", "free"): [("memory_obj", NOT_SET), ("allocator_type", None)],
    ("TensorMemoryAllocator", "batched_free"): [
        ("memory_objs", NOT_SET),
        ("allocator_type", None),
        ("update_stats", True),
    ],
    ("TensorMemoryAllocator", "memcheck"): [],
    ("PagedTensorMemoryAllocator", "__init__"): [
        ("tensor", NOT_SET),
        ("shapes", NOT_SET),
        ("dtypes", NOT_SET),
        ("fmt", KV),
    ],
    ("PagedTensorMemoryAllocator", "allocate"): [
        ("shapes", NOT_SET),
        ("dtypes", NOT_SET),
        ("fmt", KV),
        ("allocator_type", None),
    ],
    ("PagedTensorMemoryAllocator", "batched_allocate"): [
        ("shapes", NOT_SET),
        ("dtypes", NOT_SET),
        ("batch_size", NOT_SET),
        ("fmt", KV),
        ("allocator_type", None),
    ],
    ("PagedTensorMemoryAllocator", "free"): [("memory_obj", NOT_SET), ("allocator_type", None)],
    ("PagedTensorMemoryAllocator", "batched_free"): [
        ("memory_objs", NOT_SET),
        ("allocator_type", None),
        ("update_stats", True),
    ],
    ("MemoryAllocatorInterface", "allocate"): [
        ("shapes", NOT_SET),
        ("dtypes", NOT_SET),
        ("fmt", UNDEF),
        ("allocator_type", None),
    ],
    ("MemoryAllocatorInterface", "batched_allocate"): [
        ("shapes", NOT_SET),
        ("dtypes", NOT_SET),
        ("batch_size", NOT_SET),
        ("fmt", UNDEF),
        ("allocator_type", None),
    ],
    ("MemoryAllocatorInterface", "free"): [("memory_obj", NOT_SET), ("allocator_type", None)],
    ("MemoryAllocatorInterface", "batched_free"): [
        ("memory_objs", NOT_SET),
        ("allocator_type", None),
        ("update_stats", True),
    ],
    ("TensorMemoryObj", "__init__"): [
        ("raw_data", NOT_SET),
        ("metadata", NOT_SET),
        # required in the reference; an added default keeps calls compatible
        ("parent_allocator", None),
    ],
    ("TensorMemoryObj", "set_used_size"): [("n", NOT_SET)],
    ("TensorMemoryObj", "get_tensor"): [("index", NOT_SET)],
    ("BytesBufferMemoryObj", "__init__"): [("raw_bytes", NOT_SET), ("metadata", None)],
    ("GDSMemoryObject", "__init__"): [("metadata", NOT_SET)],
    ("MemoryObjMetadata", "from_dict"): [("d", NOT_SET)],
    ("MemoryObjMetadata", "to_dict"): [],
    ("MemoryObjMetadata", "get_size"): [],
    ("FreeBlock", "can_be_coalesced"): [("succ", NOT_SET)],
}


def _positional(owner: str, method: str) -> list[inspect.Parameter]:
    func = getattr(getattr(kvpool, owner), method)
    params = list(inspect.signature(func).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return params


def _assert_compatible(owner: str, method: str, expected: list[tuple[str, object]]) -> None:
    params = _positional(owner, method)
    head = [(p.name, p.default) for p in params[: len(expected)]]
    for (name, default), (got_name, got_default) in zip(expected, head, strict=False):
        assert got_name == name, f"{owner}.{method}: parameter {got_name!r}, expected {name!r}"
        if default is not NOT_SET:
            assert got_default == default, f"{owner}.{method}({name}=) default {got_default!r}"
    assert len(head) == len(expected), f"{owner}.{method} lacks parameters of the reference"
    for p in params[: len(expected)]:
        assert p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD), (
            f"{owner}.{method}: {p.name} cannot be passed by position"
        )
    # Anything kvpool adds must not break a reference call (a ``**unknown``
    # catch-all is there to refuse a misspelt keyword: kvpool.checks.HOT_CALLS).
    for extra in params[len(expected) :]:
        optional = extra.kind in (extra.KEYWORD_ONLY, extra.VAR_KEYWORD)
        assert optional or extra.default is not NOT_SET, (
            f"{owner}.{method} adds a required parameter {extra.name!r}"
        )


@pytest.mark.parametrize(("owner", "method"), REFERENCE_SIGNATURES)
def test_signature_matches_reference(owner: str, method: str) -> None:
    _assert_compatible(owner, method, REFERENCE_SIGNATURES[owner, method])


def test_memory_format_default_of_interface_and_metadata() -> None:
    meta = kvpool.MemoryObjMetadata(torch.Size([1]), torch.uint8, 0, 1, 1)
    assert meta.pin_count == 0
    assert meta.fmt is MemoryFormat.UNDEFINED
    assert meta.cached_positions is None and meta.shapes is None and meta.dtypes is None


def test_abstract_classes_cannot_be_instantiated() -> None:
    assert inspect.isabstract(kvpool.MemoryObj)
    assert inspect.isabstract(kvpool.MemoryAllocatorInterface)
    with pytest.raises(TypeError):
        kvpool.MemoryObj(kvpool.MemoryObjMetadata(torch.Size([1]), torch.uint8, 0, 1, 1))  # type: ignore[abstract]
    for cls in (kvpool.TensorMemoryObj, kvpool.BytesBufferMemoryObj, kvpool.GDSMemoryObject):
        assert issubclass(cls, kvpool.MemoryObj)
        assert not inspect.isabstract(cls)
    for cls in (kvpool.TensorMemoryAllocator, kvpool.PagedTensorMemoryAllocator):
        assert issubclass(cls, kvpool.MemoryAllocatorInterface)
        assert not inspect.isabstract(cls)
    assert type(kvpool.MemoryObj) is abc.ABCMeta


def test_address_manager_align_constant() -> None:
    assert kvpool.AddressManager.ALIGN_BYTES == 4096


# -- the seeds themselves ------------------------------------------------


def _seeds_dir() -> Path | None:
    env = os.environ.get("KVPOOL_SEEDS")
    candidates = [Path(env)] if env else []
    # <repo>/../shared/seeds: the layout of this project's worktrees.
    candidates.append(Path(__file__).resolve().parents[3] / "shared" / "seeds")
    for path in candidates:
        if path.is_dir() and list(path.glob("001_*.txt")):
            return path
    return None


def _parse_seed(path: Path) -> ast.Module:
    text = path.read_text()
    if path.name.startswith("000_"):
        # The older seed is a diff that adds the whole file: keep "+" lines.
        text = "\n".join(line[1:] for line in text.splitlines() if line.startswith("+"))
    return ast.parse(text)


def _seed_methods() -> dict[tuple[str, str], ast.FunctionDef]:
    seeds = _seeds_dir()
    if seeds is None:
        return {}
    methods: dict[tuple[str, str], ast.FunctionDef] = {}
    # Older first, so that the newer seed wins where both define a method.
    for path in sorted(seeds.glob("00[01]_*.txt")):
        for node in _parse_seed(path).body:
            if isinstance(node, ast.ClassDef) and node.name in REFERENCE_NAMES:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and (
                        item.name == "__init__" or not item.name.startswith("_")
                    ):
                        methods[node.name, item.name] = item
    return methods


SEED_METHODS = _seed_methods()


def _seed_default(node: ast.expr) -> object:
    namespace = {
        "ALIGN_BYTES": kvpool.AddressManager.ALIGN_BYTES,
        "AddressManager": kvpool.AddressManager,
        "MemoryFormat": MemoryFormat,
    }
    return eval(compile(ast.Expression(node), "<seed>", "eval"), namespace)


# The seeds exist only in this project's own checkouts (shared/seeds beside
# the repository, or KVPOOL_SEEDS), and CI has them.  A user's checkout has
# none: there the test is not collected at all, rather than reported as a
# skip about files the user never had.
if SEED_METHODS:

    @pytest.mark.parametrize(("owner", "method"), sorted(SEED_METHODS))
    def test_signature_matches_seed(owner: str, method: str) -> None:
        node = SEED_METHODS[owner, method]
        ours = getattr(getattr(kvpool, owner), method, None)
        assert ours is not None, f"kvpool.{owner} has no {method}"
        if any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
            assert isinstance(inspect.getattr_static(getattr(kvpool, owner), method), property)
            return
        if isinstance(inspect.getattr_static(getattr(kvpool, owner), method), property):
            pytest.fail(f"{owner}.{method} is a property here but a method in the reference")
        args = node.args.args
        names = [a.arg for a in args if a.arg != "self"]
        defaults: list[object] = [NOT_SET] * (len(names) - len(node.args.defaults))
        defaults += [_seed_default(d) for d in node.args.defaults]
        expected = list(zip(names, defaults, strict=True))
        if owner == "TensorMemoryObj" and method == "__init__":
            expected[-1] = ("parent_allocator", NOT_SET)  # kvpool adds default None
        _assert_compatible(owner, method, expected)


# -- exceptions --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("InvalidArgumentError", ValueError),
        ("InvalidHandleError", ValueError),
        ("PoolClosedError", ValueError),
        ("RefCountError", RuntimeError),
        ("AddressSpaceExhaustedError", RuntimeError),
        ("AddressSpaceExhaustedError", MemoryError),
        ("OutOfMemoryError", MemoryError),
    ],
)
def test_exceptions_are_builtins_too(name: str, builtin: type[Exception]) -> None:
    cls = getattr(kvpool, name)
    assert issubclass(cls, kvpool.KVPoolError)
    assert issubclass(cls, builtin)


# -- get_size_bytes ------------------------------------------------------


@pytest.mark.parametrize(
    ("shapes", "dtypes", "expected"),
    [
        ([torch.Size([2, 3])], [torch.float32], 24),
        ([torch.Size([2, 3]), torch.Size([5])], [torch.float16, torch.int8], 12 + 5),
        ([torch.Size([4, 0])], [torch.float64], 0),
        ([torch.Size([])], [torch.int64], 8),
    ],
)
def test_get_size_bytes(shapes: list, dtypes: list, expected: int) -> None:
    assert kvpool.get_size_bytes(shapes, dtypes) == expected
