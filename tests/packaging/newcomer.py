"""What a newcomer starts from: a fresh, never-built clone, and the CPU build of torch.

A newcomer clones the repository and installs from it; the clone has no
build outputs (``kvpool/native/_pinmem_ffi.py``, ``libpinmem.so``), and
commands run from its root see its unbuilt ``kvpool/`` first.  The copy is
what git would give: the tracked files and the new ones it does not
ignore, as they are in the working tree (so uncommitted work is tested).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

#: The CPU build of this interpreter's torch, pinned with its local label, so
#: that no CUDA build can be picked.
CPU_TORCH = torch.__version__.split("+", 1)[0] + "+cpu"


def copy_checkout(dest: Path) -> Path:
    """Copy this checkout's files, as a fresh clone of it would have them, into ``dest``.

    Returns:
        ``dest``, which holds no build output.
    """
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # not a file deleted in the working tree and not yet committed
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    assert not (dest / "kvpool" / "native" / "_pinmem_ffi.py").exists(), "a build output"
    return dest
