"""The effective memory limit of this process: how many more bytes it may make resident.

The kernel answers a process that outgrows its memory cgroup with the OOM
killer, not with an error, so a pool is checked *before* it is populated.
:func:`headroom` collects every limit that applies to the calling process
and what is left under each:

* **memory cgroup** -- each level from the process's own cgroup up to the
  mount (nested cgroups all count; a parent's limit binds its children):
  v2 ``memory.max`` / ``memory.current``, v1 ``memory.limit_in_bytes`` /
  ``memory.usage_in_bytes``.  Use is the *working set*: the usage minus the
  inactive page cache (``inactive_file`` in ``memory.stat``), which the
  kernel reclaims before it kills anyone -- the same figure container
  runtimes evict on.  "Unlimited" (v2 ``max``, v1 a number near 2**63)
  is no limit.
* **host memory** -- ``MemAvailable`` in ``/proc/meminfo``.
* **memlock** -- RLIMIT_MEMLOCK minus what is locked already (``VmLck``),
  only when asked (``locking=True``) and only without CAP_IPC_LOCK.

Hugetlb pages are drawn from the reserved hugepage pool: they are neither
in ``MemAvailable`` nor charged to a v1 memory cgroup (nor to a v2 one,
unless it is mounted with ``memory_hugetlb_accounting``).  They have a
controller of their own, so ``headroom(hugetlb=True)`` checks the hugetlb
cgroup's 2 MiB limit (v1 ``hugetlb.2MB.limit_in_bytes`` / ``usage_in_bytes``,
v2 ``hugetlb.2MB.max`` / ``current``) instead of the memory cgroup and the
host's free memory; the pool's free pages are libpinmem's check.

Swap is not counted: a pool is meant to be resident.  Every path is a field
of :class:`Platform`, so tests point the reader at fake trees.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvpool.checks import check_int
from kvpool.errors import MemlockLimitError, MemoryLimitError
from kvpool.native.units import format_bytes

__all__ = [
    "Headroom",
    "Limit",
    "Platform",
    "cgroup_memory",
    "check_ram_bytes",
    "headroom",
    "host_ram",
]

#: v1 reports "no limit" as the largest page-aligned counter (9223372036854771712
#: with 4 KiB pages); anything this large is treated as unlimited.
_UNLIMITED = 1 << 62
_CAP_IPC_LOCK = 14


def _rlimit_memlock() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True)
class Platform:
    """Where the limits are read from (the real ones by default; tests fake them).

    Attributes:
        proc_cgroup: the process's cgroup membership (``/proc/self/cgroup``).
        mountinfo: its mounts, to find the cgroup filesystems.
        meminfo: the host's memory figures.
        proc_status: the process's status (``VmLck``, ``CapEff``).
        memlock: returns the soft RLIMIT_MEMLOCK in bytes, None when unlimited.
    """

    proc_cgroup: Path = Path("/proc/self/cgroup")
    mountinfo: Path = Path("/proc/self/mountinfo")
    meminfo: Path = Path("/proc/meminfo")
    proc_status: Path = Path("/proc/self/status")
    memlock: Callable[[], int | None] = field(default=_rlimit_memlock)


@dataclass(frozen=True)
class Limit:
    """One limit and what is left under it.

    Attributes:
        name: what it is, e.g. "memory cgroup /kvpool-test (v1)".
        limit: the limit in bytes.
        used: bytes counted against it now.
        available: bytes left, ``max(limit - used, 0)``.
        source: the file (or rlimit) it comes from.
        fix: how to get more room.
        kind: "memory-cgroup", "hugetlb-cgroup", "host" or "memlock".
    """

    name: str
    limit: int
    used: int
    available: int
    source: str
    fix: str
    kind: str

    def describe(self) -> str:
        """One line: the limit, the use, the room left and where it comes from."""
        return (
            f"{self.name}: {format_bytes(self.limit)} limit, {format_bytes(self.used)} in use, "
            f"{format_bytes(self.available)} left ({self.source})"
        )


@dataclass(frozen=True)
class Headroom:
    """Every limit that applies to a mapping, and the tightest of them.

    Attributes:
        limits: the limits found, tightest (least room left) first; empty when
            nothing could be read.
    """

    limits: tuple[Limit, ...]

    @property
    def binding(self) -> Limit | None:
        """The limit with the least room left, or None without any."""
        return self.limits[0] if self.limits else None

    @property
    def available(self) -> int | None:
        """Bytes that may still be made resident, or None when nothing limits it."""
        return None if not self.limits else self.limits[0].available

    def fits(self, nbytes: int) -> bool:
        """True when ``nbytes`` more fit under every limit."""
        return not self.limits or nbytes <= self.limits[0].available

    def check(self, nbytes: int, what: str) -> None:
        """Raise unless ``nbytes`` more fit under every limit.

        Args:
            nbytes: bytes about to be made resident (or locked).
            what: the request, for the message, e.g. "a 2 GiB pool".

        Raises:
            MemlockLimitError: the memlock limit binds (also a
                FeatureUnavailableError, as a refused mlock is).
            MemoryLimitError: a cgroup or the host's memory binds.
        """
        if self.fits(nbytes):
            return
        limit = self.limits[0]
        cls = MemlockLimitError if limit.kind == "memlock" else MemoryLimitError
        raise cls(
            f"{what} needs {format_bytes(nbytes)}, but the {limit.name} is "
            f"{format_bytes(limit.limit)} with {format_bytes(limit.used)} in use: "
            f"{format_bytes(limit.available)} left (from {limit.source}); {limit.fix}"
        )


# ------------------------------------------------------------------ reading


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if text == "max":
        return _UNLIMITED
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _read_keyed(path: Path, scale: int = 1) -> dict[str, int]:
    """``key value`` (or ``Key: value kB``) lines as a dict of ints."""
    out: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return out
    for line in lines:
        parts = line.replace(":", " ").split()
        if len(parts) >= 2:
            try:
                out[parts[0]] = int(parts[1]) * scale
            except ValueError:
                continue
    return out


def _unescape(text: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo.
    for code in ("\\040", "\\011", "\\012", "\\134"):
        text = text.replace(code, chr(int(code[1:], 8)))
    return text


@dataclass(frozen=True)
class _Mount:
    root: str
    point: Path
    fstype: str
    options: frozenset[str]


def _mounts(platform: Platform) -> list[_Mount]:
    try:
        lines = platform.mountinfo.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    mounts = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 1:
            continue
        options = set(fields[5].split(",")) if len(fields) > 5 else set()
        if len(tail) >= 3:
            options |= set(tail[2].split(","))
        mounts.append(
            _Mount(_unescape(fields[3]), Path(_unescape(fields[4])), tail[0], frozenset(options))
        )
    return mounts


def _memberships(platform: Platform) -> tuple[dict[str, str], str | None]:
    """(v1 controller -> cgroup path, the v2 cgroup path or None)."""
    v1: dict[str, str] = {}
    v2: str | None = None
    try:
        lines = platform.proc_cgroup.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return v1, v2
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            v2 = path
        for name in controllers.split(","):
            if name:
                v1[name] = path
    return v1, v2


def _levels(mount: _Mount, path: str) -> Iterator[tuple[Path, str]]:
    """(directory, cgroup path) from the process's cgroup up to the mount point."""
    root = mount.root.rstrip("/")
    # A mount of another part of the tree (no cgroup namespace): its top is all we see.
    inside = path == root or path.startswith(root + "/")
    rel = path[len(root) :].strip("/") if inside else ""
    parts = rel.split("/") if rel else []
    for depth in range(len(parts), -1, -1):
        sub = "/".join(parts[:depth])
        name = "/" + "/".join(p for p in (root.strip("/"), sub) if p)
        yield mount.point / sub if sub else mount.point, name


@dataclass(frozen=True)
class _Files:
    """The file names of one kind of cgroup limit."""

    limit: str
    usage: str
    reclaimable: tuple[str, ...]  # memory.stat keys, the first present wins
    label: str
    fix: str
    kind: str


_MEMORY_V1 = _Files(
    "memory.limit_in_bytes",
    "memory.usage_in_bytes",
    ("total_inactive_file", "inactive_file"),
    "memory cgroup {path} (v1)",
    "raise the cgroup's limit (echo <bytes> > {dir}/memory.limit_in_bytes; docker run "
    "--memory, Kubernetes resources.limits.memory), or use a smaller pool",
    "memory-cgroup",
)
_MEMORY_V2 = _Files(
    "memory.max",
    "memory.current",
    ("inactive_file",),
    "memory cgroup {path} (v2)",
    "raise the cgroup's limit (echo <bytes> > {dir}/memory.max; docker run --memory, "
    "Kubernetes resources.limits.memory), or use a smaller pool",
    "memory-cgroup",
)
_HUGETLB_V1 = _Files(
    "hugetlb.2MB.limit_in_bytes",
    "hugetlb.2MB.usage_in_bytes",
    (),
    "hugetlb cgroup {path} (v1, 2 MiB pages)",
    "raise it (echo <bytes> > {dir}/hugetlb.2MB.limit_in_bytes), or use hugepages='never'",
    "hugetlb-cgroup",
)
_HUGETLB_V2 = _Files(
    "hugetlb.2MB.max",
    "hugetlb.2MB.current",
    (),
    "hugetlb cgroup {path} (v2, 2 MiB pages)",
    "raise it (echo <bytes> > {dir}/hugetlb.2MB.max), or use hugepages='never'",
    "hugetlb-cgroup",
)


def _cgroup_levels(mount: _Mount, path: str, files: _Files) -> list[Limit]:
    found = []
    for directory, cgroup in _levels(mount, path):
        limit = _read_int(directory / files.limit)
        if limit is None or limit >= _UNLIMITED:
            continue  # no such file here (v2 root, controller off) or no limit
        usage = _read_int(directory / files.usage) or 0
        if files.reclaimable:
            stat = _read_keyed(directory / "memory.stat")
            cache = next((stat[k] for k in files.reclaimable if k in stat), 0)
            usage = max(usage - cache, 0)
        found.append(
            Limit(
                name=files.label.format(path=cgroup),
                limit=limit,
                used=usage,
                available=max(limit - usage, 0),
                source=str(directory / files.limit),
                fix=files.fix.format(dir=directory),
                kind=files.kind,
            )
        )
    return found


def _cgroup_limits(platform: Platform, *, hugetlb: bool) -> list[Limit]:
    v1_paths, v2_path = _memberships(platform)
    found: list[Limit] = []
    seen_v1: set[str] = set()
    for mount in _mounts(platform):
        if mount.fstype == "cgroup":
            controller = "hugetlb" if hugetlb else "memory"
            if controller in mount.options and controller in v1_paths:
                if controller in seen_v1:
                    continue  # the same hierarchy mounted twice
                seen_v1.add(controller)
                files = _HUGETLB_V1 if hugetlb else _MEMORY_V1
                found += _cgroup_levels(mount, v1_paths[controller], files)
        elif mount.fstype == "cgroup2" and v2_path is not None:
            if hugetlb:
                found += _cgroup_levels(mount, v2_path, _HUGETLB_V2)
                if "memory_hugetlb_accounting" in mount.options:
                    found += _cgroup_levels(mount, v2_path, _MEMORY_V2)
            else:
                found += _cgroup_levels(mount, v2_path, _MEMORY_V2)
            v2_path = None  # one v2 hierarchy per process
    return found


def _host_limit(platform: Platform) -> Limit | None:
    info = _read_keyed(platform.meminfo, scale=1024)
    if "MemTotal" not in info or "MemAvailable" not in info:
        return None
    total, available = info["MemTotal"], info["MemAvailable"]
    return Limit(
        name="host's available RAM",
        limit=total,
        used=max(total - available, 0),
        available=available,
        source=f"MemAvailable in {platform.meminfo}",
        fix="free memory on this machine, use a smaller pool, or back it with reserved "
        "hugepages (hugepages='required'; they are counted apart)",
        kind="host",
    )


def _memlock_limit(platform: Platform) -> Limit | None:
    status = _read_keyed(platform.proc_status, scale=1)
    try:
        cap_eff = int(platform.proc_status.read_text().split("CapEff:")[1].split()[0], 16)
    except (OSError, IndexError, ValueError):
        cap_eff = 0
    if cap_eff >> _CAP_IPC_LOCK & 1:
        return None  # CAP_IPC_LOCK: the limit is not enforced
    soft = platform.memlock()
    if soft is None:
        return None
    locked = status.get("VmLck", 0) * 1024  # reported in kB
    return Limit(
        name="memlock limit",
        limit=soft,
        used=locked,
        available=max(soft - locked, 0),
        source="RLIMIT_MEMLOCK (ulimit -l)",
        fix="raise it (ulimit -l unlimited, a 'memlock' line in /etc/security/limits.conf, "
        "docker run --ulimit memlock=-1), or use pin='auto' (unpinned when refused) or pin='none'",
        kind="memlock",
    )


def cgroup_memory(platform: Platform | None = None) -> Limit | None:
    """The tightest memory cgroup limit of this process, or None when no level has one.

    What ``kvpool info`` reports.  Complexity: a few small file reads per level.
    """
    levels = _cgroup_limits(platform or Platform(), hugetlb=False)
    return min(levels, key=lambda lim: lim.available, default=None)


def headroom(
    *,
    hugetlb: bool = False,
    locking: bool = False,
    memory: bool = True,
    platform: Platform | None = None,
) -> Headroom:
    """Every limit on making more memory resident in this process, tightest first.

    Memory and memlock limits count different bytes (a mapping's page tables
    and the process's other memory are charged, but not locked), so callers
    check them apart: ``headroom()`` then ``headroom(memory=False,
    locking=True)``.

    Args:
        hugetlb: the memory comes from the 2 MiB hugetlb pool: check the
            hugetlb cgroup (and a v2 memory cgroup that accounts hugetlb)
            instead of the memory cgroup and the host's free RAM.
        locking: the memory will be mlocked: check RLIMIT_MEMLOCK too
            (unless the process has CAP_IPC_LOCK).
        memory: include the memory limits (cgroups, RAM; False: memlock only).
        platform: where to read from (default: this process's real files).

    Returns:
        A :class:`Headroom`; unreadable sources are left out (never guessed).
    """
    platform = platform or Platform()
    found = _cgroup_limits(platform, hugetlb=hugetlb) if memory else []
    if memory and not hugetlb:
        host = _host_limit(platform)
        if host is not None:
            found.append(host)
    if locking:
        memlock = _memlock_limit(platform)
        if memlock is not None:
            found.append(memlock)
    return Headroom(tuple(sorted(found, key=lambda lim: lim.available)))


def host_ram(platform: Platform | None = None) -> int | None:
    """MemTotal in bytes, or None when unreadable."""
    return _read_keyed((platform or Platform()).meminfo, scale=1024).get("MemTotal")


def check_ram_bytes(name: str, value: object, *, low: int = 0, fix: str | None = None) -> int:
    """Return ``value`` if it is a byte count from ``low`` up to this host's RAM (MemTotal).

    For sizes another library allocates at once (where more than RAM can
    only fail later, less clearly); without a readable MemTotal the bound
    is ``2**62``.

    Raises:
        InvalidArgumentError: not an int, or outside ``[low, RAM]``.
    """
    return check_int(
        name, value, low=low, high=host_ram() or _UNLIMITED, fix=fix or "at most the host's RAM"
    )
