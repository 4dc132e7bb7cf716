"""Build libpinmem and its cffi module.

This is the one place that knows how libpinmem is compiled.  ``make`` runs
it, and so does the setuptools build hook in ``setup.py`` (so ``pip install
.`` from a clean clone builds the library itself).  It needs a C compiler
and cffi; no CUDA or libnuma headers (libpinmem loads CUDA with dlopen and
calls mbind through the raw syscall).

Outputs (in ``--out``, default ``kvpool/native/``):

* ``libpinmem.so``   -- the shared library, loaded by absolute path;
* ``_pinmem_ffi.py`` -- the out-of-line ABI-mode cffi module, generated
  from the blocks of ``libpinmem/pinmem.h`` between the ``PINMEM_CDEF``
  and ``PINMEM_TEST_CDEF`` markers (a production library lacks the test
  calls; cffi resolves a call only when it is used).

With ``--testing`` it also builds the test build of the library,
``<build-dir>/testing/libpinmem.so``: the same sources compiled with
``-DPINMEM_TESTING``, which adds the fault switches of pinmem.h
(``pinmem_test_set_fault``).  The C tests and the Python test suites load
that one; nothing installed ever contains it.

Usage: ``python build.py [--out DIR] [--build-dir DIR] [--force] [--testing]``.
The compiler is ``$KVPOOL_CC``, else ``$CC``, else ``cc``; ``$CFLAGS`` and
``$LDFLAGS`` are appended to the fixed flags (warnings are errors with every
compiler).  A change of compiler or flags rebuilds everything.

The release build (``make wheel``) sets ``KVPOOL_CC`` to zig's clang aimed
at glibc 2.17 (``python -m ziglang cc -target x86_64-linux-gnu.2.17``, or
``aarch64-...`` to cross-compile), so that the wheel loads on any glibc from
2.17 on (manylinux2014); the system's own cc links against the glibc it runs
on, whose newest symbol versions set the wheel's floor.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
SRC = ROOT / "libpinmem"
HEADER = SRC / "pinmem.h"
CFLAGS = [
    "-O2",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-std=gnu11",
    "-fvisibility=hidden",
    "-pthread",
]
LDFLAGS = ["-shared", "-pthread", "-Wl,--no-undefined"]
LIBS = ["-ldl", "-lrt"]
LIBRARY = "libpinmem.so"
FFI_MODULE = "_pinmem_ffi.py"
#: Where, under the build directory, the test build goes.
TESTING_DIR = "testing"
TESTING_CFLAGS = ["-DPINMEM_TESTING"]
#: The file, beside the objects, that records the commands they were built with.
RECIPE = "commands.txt"


def sources() -> list[Path]:
    """Return the C sources of the library (not its tests), sorted."""
    return sorted(SRC.glob("*.c"))


def _block(text: str, marker: str, header: Path) -> str:
    match = re.search(rf"/\* {marker}_BEGIN \*/(.*?)/\* {marker}_END \*/", text, re.S)
    if match is None:
        raise RuntimeError(f"{header}: {marker}_BEGIN/END markers not found")
    return match.group(1).replace("PINMEM_API ", "")


def cdef_text(header: Path = HEADER) -> str:
    """Return the cffi declarations: the header's PINMEM_CDEF and PINMEM_TEST_CDEF blocks.

    Raises:
        RuntimeError: the markers are missing.
    """
    text = header.read_text()
    return _block(text, "PINMEM_CDEF", header) + _block(text, "PINMEM_TEST_CDEF", header)


def compiler() -> list[str]:
    """Return the C compiler command: ``$KVPOOL_CC``, else ``$CC``, else ``cc``.

    ``KVPOOL_CC`` is for the release build (``make wheel`` sets it to zig's
    clang aimed at an old glibc); ``CC`` may be set for other reasons, so the
    more specific name wins.
    """
    return shlex.split(os.environ.get("KVPOOL_CC") or os.environ.get("CC") or "cc")


def _newer(target: Path, deps: list[Path]) -> bool:
    """True when target exists and is newer than every dependency."""
    if not target.exists():
        return False
    mtime = target.stat().st_mtime
    return all(dep.stat().st_mtime <= mtime for dep in deps)


def _run(cmd: list[str], verbose: bool) -> None:
    if verbose:
        print(" ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True)


def build_library(
    build_dir: Path, *, force: bool = False, verbose: bool = True, testing: bool = False
) -> Path:
    """Compile and link libpinmem into build_dir; return the .so path.

    testing: build the test build (``-DPINMEM_TESTING``) into
    ``build_dir/testing`` instead.
    """
    if testing:
        build_dir = build_dir / TESTING_DIR
    build_dir.mkdir(parents=True, exist_ok=True)
    headers = sorted(SRC.glob("*.h"))
    cc = compiler()
    extra_cflags = shlex.split(os.environ.get("CFLAGS", ""))
    extra_ldflags = shlex.split(os.environ.get("LDFLAGS", ""))
    flags = [*CFLAGS, *(TESTING_CFLAGS if testing else []), *extra_cflags]
    link = [*cc, *LDFLAGS, *extra_ldflags]
    # Timestamps cannot tell that the compiler or the flags changed (the
    # system cc for development, zig for a release): the commands are kept
    # beside the objects, and any change rebuilds everything.  The record is
    # removed while building, so a build that stops half-way is redone.
    recipe_file = build_dir / RECIPE
    recipe = f"{shlex.join([*cc, *flags])}\n{shlex.join([*link, *LIBS])}\n"
    if not recipe_file.exists() or recipe_file.read_text() != recipe:
        force = True
    if force:
        recipe_file.unlink(missing_ok=True)
    objects = []
    for src in sources():
        obj = build_dir / (src.stem + ".o")
        objects.append(obj)
        if force or not _newer(obj, [src, *headers]):
            _run([*cc, *flags, "-c", str(src), "-o", str(obj)], verbose)
    lib = build_dir / LIBRARY
    if force or not _newer(lib, objects):
        _run([*link, "-o", str(lib), *map(str, objects), *LIBS], verbose)
    recipe_file.write_text(recipe)
    return lib


def write_ffi_module(path: Path) -> None:
    """Generate the ABI-mode cffi module at path."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(cdef_text())
    ffi.set_source("kvpool.native._pinmem_ffi", None)
    tmp = path.with_suffix(".tmp")
    ffi.emit_python_code(str(tmp))
    os.replace(tmp, path)


def build(
    out_dir: Path | str = ROOT / "kvpool" / "native",
    build_dir: Path | str = SRC / "build",
    *,
    force: bool = False,
    verbose: bool = True,
    testing: bool = False,
) -> list[Path]:
    """Build the library and the cffi module into out_dir; return their paths.

    testing: also build the test build into ``build_dir/testing`` (its path
    is returned last).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lib = build_library(Path(build_dir), force=force, verbose=verbose)
    lib_out = out / LIBRARY
    if force or not _newer(lib_out, [lib]):
        tmp = out / (LIBRARY + ".tmp")
        shutil.copy2(lib, tmp)
        os.replace(tmp, lib_out)  # a process that loaded the old copy keeps its inode
    ffi_out = out / FFI_MODULE
    if force or not _newer(ffi_out, [HEADER, Path(__file__)]):
        write_ffi_module(ffi_out)
    built = [lib_out, ffi_out]
    if testing:
        built.append(build_library(Path(build_dir), force=force, verbose=verbose, testing=True))
    return built


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "kvpool" / "native"), help="package directory")
    parser.add_argument("--build-dir", default=str(SRC / "build"), help="object directory")
    parser.add_argument("--force", action="store_true", help="rebuild everything")
    parser.add_argument("--quiet", action="store_true", help="do not echo commands")
    parser.add_argument(
        "--testing", action="store_true", help="also build the test build (-DPINMEM_TESTING)"
    )
    args = parser.parse_args(argv)
    try:
        built = build(
            args.out, args.build_dir, force=args.force, verbose=not args.quiet, testing=args.testing
        )
        for path in built:
            if not args.quiet:
                print(f"built {path}")
    except subprocess.CalledProcessError as exc:
        print(f"build.py: command failed with status {exc.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
