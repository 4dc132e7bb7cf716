"""Build hook: compile libpinmem and generate its cffi module during builds.

Everything declarative lives in pyproject.toml.  This file only adds:

* ``build_py`` that runs :mod:`build` (``build.py`` at the repository root)
  so ``pip install .`` from a clean clone compiles ``libpinmem.so`` and
  writes ``_pinmem_ffi.py`` into the package (into the source tree for
  editable installs, into the build directory otherwise);
* ``kvpool-lmcache.pth`` at the root of the installed packages: the start-up
  hook of ``KVPOOL_LMCACHE=1`` (see ``kvpool_lmcache_hook.py``);
* a platform-specific wheel (it carries a .so) tagged ``py3-none-<platform>``:
  the library is loaded with cffi's ABI mode, so it does not depend on the
  Python version.  ``make wheel`` then has ``auditwheel`` check that the
  library needs nothing outside the manylinux policy and retag the wheel
  ``manylinux_*`` (a plain ``linux_*`` wheel is refused by package indexes).

The compiler is build.py's (``$KVPOOL_CC``, else ``$CC``, else ``cc``):
``make wheel`` sets ``KVPOOL_CC`` to zig's clang aimed at glibc 2.17, and
for a cross-compiled wheel (``make wheel-aarch64``) passes ``--plat-name``,
which the platform tag below follows.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
PTH = "kvpool-lmcache.pth"


def _native_build():
    spec = importlib.util.spec_from_file_location("kvpool_native_build", ROOT / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithNative(build_py):
    """build_py, then libpinmem.so and _pinmem_ffi.py into the package."""

    def run(self) -> None:
        super().run()
        native = _native_build()
        if getattr(self, "editable_mode", False):
            out = ROOT / "kvpool" / "native"
        else:
            out = Path(self.build_lib) / "kvpool" / "native"
        build_dir = Path(self.build_lib).parent / "libpinmem-objects"
        if getattr(self, "editable_mode", False):
            build_dir = ROOT / "libpinmem" / "build"
        native.build(out, build_dir, verbose=bool(self.verbose))
        if not getattr(self, "editable_mode", False):
            self.copy_file(str(ROOT / PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            for name in ("libpinmem.so", "_pinmem_ffi.py"):
                path = os.path.join(self.build_lib, "kvpool", "native", name)
                if path not in outputs:
                    outputs.append(path)
            outputs.append(os.path.join(self.build_lib, PTH))
        return outputs


class BinaryDistribution(Distribution):
    """A distribution that carries a compiled library."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: any Python 3, this platform only."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": PlatformWheel},
)
