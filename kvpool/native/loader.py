"""libpinmem loaded with cffi: finding the library, its constants, status codes to exceptions.

The library is loaded by absolute path (ABI mode; the cffi declarations live
in the generated ``kvpool/native/_pinmem_ffi.py``):

1. ``$KVPOOL_LIBPINMEM``, when set (only that path is tried);
2. ``libpinmem.so`` next to this file (what ``make`` and ``pip install``
   put there).

A failure raises one :class:`ImportError` that lists every path tried and
why each failed.  Every libpinmem status maps to one exception of
:mod:`kvpool.errors` through :data:`STATUS_EXCEPTIONS`; :func:`check` raises
it.  The wrappers of the C calls are in :mod:`kvpool.native.calls`.

An option variable (``KVPOOL_*``, see :data:`OPTIONS`) that libpinmem
rejected is reported once, when this module loads, as a ``RuntimeWarning``
naming the variable, its value and the accepted range
(:func:`option_problems` lists them).

Thread safety: libpinmem guards its own state; the failure detail is per
thread in C and is read right after the failing call on the same thread.
"""

from __future__ import annotations

import importlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvpool.errors as errors

__all__ = [
    "COMMIT_PIN_MODES",
    "ENV_LIBRARY",
    "HUGEPAGE_MODES",
    "HUGEPAGE_RESULTS",
    "KINDS",
    "OPTIONS",
    "OptionProblem",
    "PINNED",
    "PIN_MODES",
    "POPULATE_METHODS",
    "STATUS_EXCEPTIONS",
    "check",
    "describe_option",
    "ffi",
    "lib",
    "library_path",
    "option_problems",
]

#: Environment variable that names the libpinmem.so to load instead.
ENV_LIBRARY = "KVPOOL_LIBPINMEM"

_HERE = Path(__file__).resolve().parent


def _load() -> tuple[Any, Any, str]:
    """Load the cffi module and the library; raise one ImportError if not."""
    try:
        # Loaded by name: the module is generated at build time (build.py)
        # and may be missing, which gets the clear error below.
        _ffi = importlib.import_module("kvpool.native._pinmem_ffi").ffi
    except ImportError as exc:
        raise ImportError(
            "kvpool's native layer is not built: kvpool/native/_pinmem_ffi.py is missing "
            f"({exc}). Run `make` in the source tree, or install with `pip install .`."
        ) from exc
    override = os.environ.get(ENV_LIBRARY)
    candidates = [override] if override else [str(_HERE / "libpinmem.so")]
    tried: list[str] = []
    for candidate in candidates:
        path = os.path.abspath(candidate)
        if not os.path.exists(path):
            tried.append(f"{path}: no such file")
            continue
        try:
            loaded = _ffi.dlopen(path)
        except OSError as exc:
            tried.append(f"{path}: {exc}")
            continue
        version = loaded.pinmem_version()
        if version != loaded.PINMEM_VERSION:
            tried.append(
                f"{path}: library version {version}, kvpool expects {loaded.PINMEM_VERSION} "
                "(rebuild with `make`)"
            )
            continue
        return _ffi, loaded, path
    how = f" (from ${ENV_LIBRARY})" if override else ""
    raise ImportError(
        f"could not load libpinmem{how}; tried:\n  "
        + "\n  ".join(tried)
        + "\nBuild it with `make` in the source tree, or reinstall with `pip install .`."
    )


ffi, lib, _library_path = _load()


def library_path() -> str:
    """Return the absolute path of the loaded libpinmem.so."""
    return _library_path


# ----------------------------------------------------------- enumerations

#: pin= strings accepted by :func:`alloc`, to libpinmem's pin modes.
PIN_MODES: dict[str, int] = {
    "auto": lib.PINMEM_PIN_AUTO,
    "none": lib.PINMEM_PIN_NONE,
    "mlock": lib.PINMEM_PIN_MLOCK,
    "cuda-alloc": lib.PINMEM_PIN_CUDA_ALLOC,
    "cuda-register": lib.PINMEM_PIN_CUDA_REGISTER,
}

#: pin= strings accepted by :func:`commit` (cudaHostAlloc cannot pin a range).
COMMIT_PIN_MODES: dict[str, int] = {
    name: PIN_MODES[name] for name in ("auto", "none", "mlock", "cuda-register")
}

#: hugepages= strings accepted by :func:`alloc`.
HUGEPAGE_MODES: dict[str, int] = {
    "never": lib.PINMEM_HUGE_NEVER,
    "thp": lib.PINMEM_HUGE_THP,
    "auto": lib.PINMEM_HUGE_AUTO,
    "required": lib.PINMEM_HUGE_REQUIRED,
}

#: How a region is pinned, by libpinmem's value.
PINNED: dict[int, str] = {
    lib.PINMEM_PINNED_NONE: "none",
    lib.PINMEM_PINNED_MLOCK: "mlock",
    lib.PINMEM_PINNED_CUDA_ALLOC: "cuda-alloc",
    lib.PINMEM_PINNED_CUDA_REGISTER: "cuda-register",
}

#: Which pages back a region.
HUGEPAGE_RESULTS: dict[int, str] = {
    lib.PINMEM_HUGE_RESULT_NONE: "none",
    lib.PINMEM_HUGE_RESULT_THP: "thp",
    lib.PINMEM_HUGE_RESULT_HUGETLB_2M: "hugetlb-2MiB",
}

#: Kinds of mapping.
KINDS: dict[int, str] = {
    lib.PINMEM_KIND_ANONYMOUS: "anonymous",
    lib.PINMEM_KIND_HUGETLB: "hugetlb",
    lib.PINMEM_KIND_SHM: "shm",
    lib.PINMEM_KIND_CUDA_HOST: "cuda-host",
    lib.PINMEM_KIND_EXTERNAL: "external",
}

#: How pages were made resident.
POPULATE_METHODS: dict[int, str] = {
    lib.PINMEM_POPULATE_NONE: "none",
    lib.PINMEM_POPULATE_MADVISE: "madvise",
    lib.PINMEM_POPULATE_FIRST_TOUCH: "first-touch",
    lib.PINMEM_POPULATE_BY_DRIVER: "driver",
}

# ------------------------------------------------------------ status codes

#: One table: libpinmem status -> the exception raised for it.
STATUS_EXCEPTIONS: dict[int, type[errors.KVPoolError]] = {
    lib.PINMEM_EINVAL: errors.InvalidArgumentError,
    lib.PINMEM_ENOMEM: errors.OutOfMemoryError,
    lib.PINMEM_EHUGEPAGES: errors.HugePagesExhaustedError,
    lib.PINMEM_ENUMA_NODE: errors.NumaNodeError,
    lib.PINMEM_ESHM_EXISTS: errors.SharedMemoryExistsError,
    lib.PINMEM_ESHM_NOT_FOUND: errors.SharedMemoryNotFoundError,
    lib.PINMEM_ESHM_NAME: errors.InvalidArgumentError,
    lib.PINMEM_EUNKNOWN_PTR: errors.InvalidHandleError,
    lib.PINMEM_ENO_CUDA: errors.FeatureUnavailableError,
    lib.PINMEM_ECUDA: errors.NativeError,
    lib.PINMEM_EMLOCK: errors.FeatureUnavailableError,
    lib.PINMEM_EPERM: errors.NativeError,
    lib.PINMEM_ESYS: errors.NativeError,
    lib.PINMEM_EBUSY: errors.NativeError,
    lib.PINMEM_ETOO_LARGE: errors.OutOfMemoryError,
    lib.PINMEM_EOPTION: errors.InvalidArgumentError,
    lib.PINMEM_ELIMIT: errors.MemoryLimitError,
}

if len(STATUS_EXCEPTIONS) != lib.PINMEM_STATUS_COUNT - 1:  # pragma: no cover - build drift
    raise ImportError("kvpool.native.loader: STATUS_EXCEPTIONS misses every libpinmem status")


def check(status: int, what: str) -> None:
    """Raise the exception for a failed libpinmem status; return on success.

    Args:
        status: what the C call returned.
        what: the call in words, e.g. ``"allocate 4096 bytes"``; the
            message reads ``"<what>: <libpinmem's detail>"``.

    Raises:
        KVPoolError: the subclass that :data:`STATUS_EXCEPTIONS` names, with
            attributes ``status`` (the code), ``detail`` (libpinmem's text)
            and, for ``OSError`` subclasses, ``errno`` when the OS gave one.
    """
    if status == lib.PINMEM_OK:
        return
    detail = ffi.string(lib.pinmem_last_detail()).decode("utf-8", "replace")
    err = lib.pinmem_last_errno()
    cls = STATUS_EXCEPTIONS.get(status, errors.NativeError)
    text = ffi.string(lib.pinmem_strerror(status)).decode()
    exc = cls(f"{what}: {detail or text}")
    exc.status = status  # type: ignore[attr-defined]
    exc.detail = detail  # type: ignore[attr-defined]
    if isinstance(exc, OSError) and err:
        exc.errno = err  # strerror stays None so str(exc) keeps the message
    raise exc


# ---------------------------------------------------------------- options


def describe_option(option: int) -> Any:
    """libpinmem's ``pinmem_option_info`` for one option (a cffi struct)."""
    info = ffi.new("pinmem_option_info *")
    check(lib.pinmem_option_describe(option, info), f"describe option {option}")
    return info


def _option_table() -> dict[str, tuple[int, str]]:
    table = {}
    for option in range(lib.PINMEM_OPT_COUNT):
        info = describe_option(option)
        table[ffi.string(info.name).decode()] = (option, ffi.string(info.env).decode())
    return table


#: Option names for ``option_get`` / ``option_set``, with the environment
#: variable that sets each at load time -- read from libpinmem, whose header
#: (pinmem.h) documents them.
OPTIONS: dict[str, tuple[int, str]] = _option_table()


@dataclass(frozen=True)
class OptionProblem:
    """A ``KVPOOL_*`` variable libpinmem rejected (the default stayed in effect).

    Attributes:
        name: the option, e.g. ``"mlock_mode"``.
        env: its variable, e.g. ``"KVPOOL_MLOCK_MODE"``.
        text: what the variable held.
        low, high: the accepted range, inclusive.
        default: the value in effect instead.
    """

    name: str
    env: str
    text: str
    low: int
    high: int
    default: int

    def message(self) -> str:
        """The warning text: the variable, its value, the accepted range and the fix."""
        bound = f">= {self.low}" if self.high == (1 << 63) - 1 else f"in {self.low}..{self.high}"
        return (
            f"{self.env}={self.text!r} is not a number {bound}; libpinmem ignores it and uses "
            f"the default {self.default} (fix or unset {self.env})"
        )


def option_problems() -> list[OptionProblem]:
    """Return the option variables libpinmem rejected when it read them.

    (``pinmem_option_check`` and ``pinmem_option_describe``.)  Complexity:
    O(number of options).
    """
    if lib.pinmem_option_check() == lib.PINMEM_OK:
        return []
    found = []
    for name, (option, env) in OPTIONS.items():
        info = describe_option(option)
        if info.env_rejected:
            text = ffi.string(info.env_text).decode("utf-8", "replace")
            low, high, default = int(info.min), int(info.max), int(info.default_value)
            found.append(OptionProblem(name, env, text, low, high, default))
    return found


def _warn_option_problems() -> None:
    """One RuntimeWarning per rejected variable, when this module loads."""
    for problem in option_problems():
        warnings.warn(problem.message(), RuntimeWarning, stacklevel=2)


_warn_option_problems()
