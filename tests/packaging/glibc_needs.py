"""The glibc versions and libraries a shared library asks for, read from its ELF sections.

A library linked against glibc records, per symbol, the version tag it was
bound to (``GLIBC_2.17``, ``GLIBC_2.34``, ...) in its ``.gnu.version_r``
section; the loader refuses the library on a glibc older than the newest
tag.  ``objdump -T`` shows the same; this reads it with pyelftools (which
auditwheel depends on), so the tests need no binutils.  The libraries it
names (``DT_NEEDED`` in ``.dynamic``) are what the loader must find.
pyelftools is imported by the functions that read ELF, not with this
module, so that a machine without the test extra still collects the tests
(``pytest -m gpu tests``).
"""

from __future__ import annotations

import io
import re

_TAG = re.compile(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?")

#: ELF e_machine names, as pyelftools spells them, of the wheels' architectures.
MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}


def glibc_versions(library: bytes) -> set[tuple[int, int]]:
    """Return the (major, minor) glibc versions the library's symbols are bound to.

    Args:
        library: the bytes of an ELF shared library.

    Returns:
        Every ``GLIBC_x.y[.z]`` requirement as ``(x, y)``; empty for a library
        that needs nothing versioned from glibc.
    """
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    found: set[tuple[int, int]] = set()
    elf = ELFFile(io.BytesIO(library))
    for section in elf.iter_sections():
        if not isinstance(section, GNUVerNeedSection):
            continue
        for _needed, entries in section.iter_versions():
            for entry in entries:
                match = _TAG.fullmatch(entry.name)
                if match:
                    found.add((int(match.group(1)), int(match.group(2))))
    return found


def needed_libraries(library: bytes) -> set[str]:
    """Return the libraries the ELF shared library names as ``DT_NEEDED``."""
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(library))
    dynamic = elf.get_section_by_name(".dynamic")
    if dynamic is None:
        return set()
    return {tag.needed for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_NEEDED"}


def machine(library: bytes) -> str:
    """Return the ELF machine of the library (``EM_X86_64``, ``EM_AARCH64``, ...)."""
    from elftools.elf.elffile import ELFFile

    return str(ELFFile(io.BytesIO(library)).header["e_machine"])
