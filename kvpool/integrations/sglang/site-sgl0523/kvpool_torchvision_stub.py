"""A stand-in for torchvision where none is installed, so that SGLang imports on a CPU torch.

SGLang 0.5.23 imports ``torchvision.transforms`` at module level (its
InternVL and DeepSeek-OCR helpers, reached from ``sglang.srt.configs``),
but kvpool's backend and its tests never touch images.  PyPI's torchvision
cannot serve there: its wheels are built against CUDA torch and fail to
load over a CPU one.  So ``python -m kvpool install-sglang`` (and the
compatibility environment of ``make compat``) copies this module and
``kvpool_torchvision_stub.pth``, which loads it at interpreter start-up,
into site-packages where torchvision is not installed.  It serves three
empty modules - ``torchvision``, ``torchvision.transforms`` and
``torchvision.transforms.functional`` (with ``InterpolationMode``, the
one name SGLang takes at import) - from a finder at the end of
``sys.meta_path``: a real torchvision installed later is found first, and
the stand-in goes unused (delete the two files to remove it).

Transformers decides whether torchvision is installed with
``importlib.util.find_spec("torchvision")`` in its
``_is_package_available`` probe, and would then import parts of the real
package.  The finder does not answer that probe (it looks for the probe's
frame on the stack), so transformers sees torchvision as absent - exactly
the truth - while SGLang's plain imports succeed.  Why not the other ways:
a stub package on ``sys.path`` answers every ``find_spec``, so
transformers would take it for torchvision; patching transformers'
``is_torchvision_available`` misses the modules that imported it by name
first.  Any other attribute of the stand-ins raises ``ImportError``
naming this module.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import sys
import types

_NAMES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")
_PROBE = ("_is_package_available", "transformers.utils.import_utils")


class InterpolationMode(enum.Enum):
    """torchvision's interpolation names, for SGLang's module-level imports."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _missing(module: str):
    def __getattr__(name: str):
        if name.startswith("__"):  # the import system's own questions (__path__...)
            raise AttributeError(name)
        raise ImportError(
            f"{module}.{name}: torchvision is not installed here, only a stand-in for "
            "SGLang's imports (kvpool_torchvision_stub), which cannot run image code; install "
            "the torchvision built for your torch"
        )

    return __getattr__


def _probed_by_transformers() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if (frame.f_code.co_name, frame.f_globals.get("__name__")) == _PROBE:
            return True
        frame = frame.f_back
    return False


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _NAMES or _probed_by_transformers():
            return None
        package = fullname != _NAMES[-1]
        return importlib.machinery.ModuleSpec(fullname, self, is_package=package)

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__getattr__ = _missing(module.__name__)
        if module.__name__ != "torchvision":
            module.InterpolationMode = InterpolationMode
        if module.__spec__.submodule_search_locations is not None:
            module.__path__ = []


sys.meta_path.append(_StubFinder())
