"""Run a test's child process in a memory cgroup with a limit (as root), and remove the cgroup.

:func:`memory_cgroup` makes a fresh cgroup -- v1 (``memory.limit_in_bytes``)
or v2 (``memory.max``), whichever memory controller the machine mounts --
under this process's own memory cgroup when it can (so the test cgroup is
nested and the hierarchy is walked for real), else at the mount's top.  The
child joins it by writing its own pid to ``cgroup.procs`` before it runs
anything else, and the cgroup is removed after the child exits, always.
Tests skip, with the reason, only where no memory cgroup can be made.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# The child's first act: join the cgroup (argv[1]), check it did, then run
# the script (argv[2]) as __main__.
_JOIN = """
import os, sys
procs, script = sys.argv[1], sys.argv[2]
del sys.argv[1:3]
with open(procs, "w") as f:
    f.write(str(os.getpid()))
name = os.path.basename(os.path.dirname(procs))
if not any(line.rstrip().endswith("/" + name) for line in open("/proc/self/cgroup")):
    print("child did not join the cgroup", open("/proc/self/cgroup").read(), file=sys.stderr)
    raise SystemExit(97)
exec(compile(script, "<child>", "exec"), {"__name__": "__main__"})
"""

#: Exit status of a child that could not join its cgroup.
NOT_JOINED = 97


@dataclass(frozen=True)
class MemoryCgroup:
    """A memory cgroup made for a test.

    Attributes:
        path: its directory.
        version: 1 or 2.
        limit_file: the file holding its limit.
    """

    path: Path
    version: int
    limit_file: Path

    def run(
        self, script: str, *, env: dict[str, str], timeout: float, cwd: Path
    ) -> subprocess.CompletedProcess[str]:
        """Run ``script`` in a child Python inside this cgroup and wait (at most ``timeout`` s).

        Raises:
            subprocess.TimeoutExpired: the child ran longer (it is killed).
        """
        return subprocess.run(
            [sys.executable, "-c", _JOIN, str(self.path / "cgroup.procs"), script],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
        )


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(mount root, mount point, fstype, super options) of every cgroup mount."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and tail and tail[0] in ("cgroup", "cgroup2"):
            options = set(tail[2].split(",")) if len(tail) >= 3 else set()
            found.append((fields[3], Path(fields[4]), tail[0], options))
    return found


def _own_path(version: int) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hier, controllers, path = line.split(":", 2)
        if version == 2 and hier == "0" and controllers == "":
            return path
        if version == 1 and "memory" in controllers.split(","):
            return path
    return None


def _candidates() -> list[tuple[Path, int]]:
    """(parent directory, version) where a test cgroup may be made, best first."""
    out: list[tuple[Path, int]] = []
    for root, point, fstype, options in _mounts():
        if fstype == "cgroup" and "memory" in options:
            own = _own_path(1)
            if own is not None and root == "/" and own != "/":
                out.append((point / own.lstrip("/"), 1))
            out.append((point, 1))
        elif fstype == "cgroup2":
            # v2 lets a cgroup hand the memory controller to its children only
            # while it holds no processes, which in practice means the top.
            controllers = (point / "cgroup.subtree_control").read_text(errors="replace")
            if "memory" in controllers.split():
                out.append((point, 2))
    return out


def _remove(path: Path, deadline_s: float = 10.0) -> None:
    """rmdir the cgroup, retrying while the kernel still lists the exited child."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling with a deadline: the reaped task leaves soon


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[MemoryCgroup]:
    """Yield a fresh memory cgroup limited to ``limit`` bytes; remove it on exit.

    Skips the test (with the reason) when not root, when no memory
    controller is mounted, or when no cgroup with a limit can be made.
    """
    if os.geteuid() != 0:
        pytest.skip("creating a memory cgroup needs root")
    candidates = _candidates()
    if not candidates:
        pytest.skip("no memory cgroup controller is mounted (v1 memory or v2 with +memory)")
    reasons = []
    for parent, version in candidates:
        path = parent / f"kvpool-test-{os.getpid()}-{secrets.token_hex(4)}"
        limit_file = path / ("memory.limit_in_bytes" if version == 1 else "memory.max")
        try:
            path.mkdir()
        except OSError as exc:
            reasons.append(f"mkdir {path}: {exc}")
            continue
        try:
            try:
                limit_file.write_text(str(limit))
                if version == 2 and (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")  # the limit is the RAM one
            except OSError as exc:
                reasons.append(f"setting {limit_file}: {exc}")
                continue
            yield MemoryCgroup(path, version, limit_file)
            return
        finally:
            _remove(path)
    pytest.skip("no memory cgroup could be made: " + "; ".join(reasons))
