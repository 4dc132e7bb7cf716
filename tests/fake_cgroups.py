"""A fake /proc and /sys/fs/cgroup (v1 and v2, nested) for the memory-limit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.native import limits
from kvpool.native.limits import Platform

__all__ = ["CAP_IPC_LOCK", "NO_CAPS", "V1_UNLIMITED", "FakeHost", "level"]

V1_UNLIMITED = 9223372036854771712  # what v1 writes for "no limit" with 4 KiB pages
NO_CAPS = "CapEff:\t0000000000000000\n"
CAP_IPC_LOCK = "CapEff:\t0000000000004000\n"


class FakeHost:
    """A fake /proc and /sys/fs/cgroup under one temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounts: list[str] = []
        self.memberships: list[str] = []
        self.meminfo = "MemTotal:       16777216 kB\nMemAvailable:    8388608 kB\n"
        self.status = NO_CAPS + "VmLck:\t       0 kB\n"
        self.memlock: int | None = None

    def v1(self, controller: str = "memory", *, cgroup: str, mount_root: str = "/") -> Path:
        point = self.root / "sys/fs/cgroup" / controller
        point.mkdir(parents=True, exist_ok=True)
        self.mounts.append(
            f"35 31 0:32 {mount_root} {point} rw,nosuid - cgroup cgroup rw,{controller}"
        )
        self.memberships.append(f"{len(self.memberships) + 1}:{controller}:{cgroup}")
        return point

    def v2(self, *, cgroup: str, options: str = "rw,nsdelegate") -> Path:
        point = self.root / "sys/fs/cgroup/unified"
        point.mkdir(parents=True, exist_ok=True)
        self.mounts.append(f"41 31 0:38 / {point} rw,relatime - cgroup2 cgroup2 {options}")
        self.memberships.append(f"0::{cgroup}")
        return point

    def platform(self) -> Platform:
        proc = self.root / "proc"
        proc.mkdir(exist_ok=True)
        (proc / "cgroup").write_text("\n".join(self.memberships) + "\n")
        (proc / "mountinfo").write_text("\n".join(self.mounts) + "\n")
        (proc / "meminfo").write_text(self.meminfo)
        (proc / "status").write_text(self.status)
        memlock = self.memlock
        return Platform(
            proc_cgroup=proc / "cgroup",
            mountinfo=proc / "mountinfo",
            meminfo=proc / "meminfo",
            proc_status=proc / "status",
            memlock=lambda: memlock,
        )

    def install(self, monkeypatch: pytest.MonkeyPatch) -> Platform:
        """Make kvpool read this fake host (until the test ends); return its platform."""
        platform = self.platform()
        monkeypatch.setattr(limits, "Platform", lambda: platform)
        return platform


def level(directory: Path, **files: object) -> Path:
    """Make a cgroup directory holding ``files`` (dots written as underscores)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (directory / name.replace("__", ".")).write_text(f"{value}\n")
    return directory
