"""What this machine offers for host memory, and advice on getting more.

:func:`capabilities` runs libpinmem's probe once per call and returns a
frozen :class:`Capabilities`: CUDA runtime and devices, hugepage pools,
NUMA nodes, the memlock limit, MADV_POPULATE_WRITE, CPUs and the THP mode.
:meth:`Capabilities.report` is what ``python -m kvpool info`` prints.

Helpers for the pools: :func:`numa_nodes`, :func:`current_numa_node` and
:func:`read_hugepage_info`.  The last reads sysfs directly and works even
when libpinmem is not built; the others load it on first use.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvpool.native.limits import Limit, cgroup_memory
from kvpool.native.units import format_bytes

__all__ = [
    "Capabilities",
    "format_bytes",
    "rss_bytes",
    "HugePagePool",
    "capabilities",
    "current_numa_node",
    "numa_nodes",
    "nvidia_gpus",
    "read_hugepage_info",
]

_HUGEPAGES_2M = Path("/sys/kernel/mm/hugepages/hugepages-2048kB")
_NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")
_PCI_DEVICES = Path("/sys/bus/pci/devices")
_NVIDIA_VENDOR = "0x10de"
_DISPLAY_CLASS = "0x03"  # PCI class 03: display controllers (VGA, 3D: every NVIDIA GPU)
# cudaError_t values that name the cause (CUDA runtime API).
_CUDA_NO_DRIVER = {35, 3}  # cudaErrorInsufficientDriver, cudaErrorInitializationError
_CUDA_NO_DEVICE = {100, 101}  # cudaErrorNoDevice, cudaErrorInvalidDevice
_THP_MODES = {0: "never", 1: "madvise", 2: "always", -1: "unknown"}


_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process, in bytes (from ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


@dataclass(frozen=True)
class HugePagePool:
    """One hugepage pool from sysfs.

    Attributes:
        page_size_kib: page size in KiB (2048 for 2 MiB, 1048576 for 1 GiB).
        total: pages in the pool (nr_hugepages), -1 if unreadable.
        free: free pages (free_hugepages), -1 if unreadable.
    """

    page_size_kib: int
    total: int
    free: int


@dataclass(frozen=True)
class Capabilities:
    """The capability probe, frozen.

    Attributes:
        cuda_available: a CUDA runtime is loaded and sees at least one device.
        cuda_device_count: devices the runtime sees (0 without).
        cuda_runtime_path: the libcudart that was loaded, or None.
        cuda_runtime_version: e.g. 12040, or None.
        cuda_error: why CUDA is not usable, or None.
        hugepages: every hugepage pool, smallest page first.
        numa_nodes: online NUMA nodes.
        memlock_limit: soft RLIMIT_MEMLOCK in bytes, None when unlimited.
        memlock_hard_limit: hard RLIMIT_MEMLOCK in bytes, None when unlimited.
        memlock_exempt: the process has CAP_IPC_LOCK (the limit does not apply).
        populate_write: MADV_POPULATE_WRITE works (Linux 5.14+).
        cpu_count: CPUs online.
        cpu_affinity: CPUs this process may run on.
        thp_mode: transparent hugepages: "always", "madvise", "never" or "unknown".
        page_size: base page size in bytes.
        default_populate_threads: threads a large populate uses (the populate plan's).
        mem_total: bytes of RAM.
        library_path: the libpinmem.so in use.
        populate_method: how large mappings are made resident: "madvise"
            (MADV_POPULATE_WRITE) or "first-touch" (the populate plan).
        populate_method_source: why: "rule", "probe" (measured here) or "option".
        populate_threads_source: the same for ``default_populate_threads``.
        populate_probe: the probe's measurements (``PopulateFacts`` as a
            dict), or None when it has not run in this process.
        memory_cgroup: the tightest memory cgroup limit on this process (limit,
            working set, room left, its file), None without one.
        nvidia_gpus: NVIDIA GPUs on the PCI bus, driver or not (:func:`nvidia_gpus`).
    """

    cuda_available: bool
    cuda_device_count: int
    cuda_runtime_path: str | None
    cuda_runtime_version: int | None
    cuda_error: str | None
    hugepages: tuple[HugePagePool, ...]
    numa_nodes: tuple[int, ...]
    memlock_limit: int | None
    memlock_hard_limit: int | None
    memlock_exempt: bool
    populate_write: bool
    cpu_count: int
    cpu_affinity: int
    thp_mode: str
    page_size: int
    default_populate_threads: int
    mem_total: int
    library_path: str
    populate_method: str = "madvise"
    populate_method_source: str = "rule"
    populate_threads_source: str = "rule"
    populate_probe: dict[str, Any] | None = None
    memory_cgroup: Limit | None = None
    nvidia_gpus: int = 0

    def hugepage_pool(self, page_size_kib: int = 2048) -> HugePagePool | None:
        """Return the pool of that page size, or None if the kernel has none."""
        for pool in self.hugepages:
            if pool.page_size_kib == page_size_kib:
                return pool
        return None

    def to_dict(self) -> dict[str, Any]:
        """Return the probe as plain JSON-ready values."""
        return asdict(self)

    def cuda_problem(self) -> tuple[str, str]:
        """Why CUDA is not usable and what fixes it: ``(cause, fix)``, in plain words.

        The cause is one of: the machine has no NVIDIA GPU and no driver
        (the fix is then ``""``: there is nothing to advise); no CUDA runtime
        (libcudart) was found; no NVIDIA driver is loaded, or it is older
        than the runtime; the driver sees no device.  ``("", "")`` when CUDA
        is usable.
        """
        if self.cuda_available:
            return "", ""
        if self.nvidia_gpus == 0 and not _NVIDIA_DRIVER.exists():
            return "this machine has no NVIDIA GPU (none on its PCI bus, no driver loaded)", ""
        if not self.cuda_runtime_path:
            detail = f" ({self.cuda_error})" if self.cuda_error else ""
            return (
                f"no CUDA runtime (libcudart) was found{detail}",
                "a CUDA build of torch brings one, or set KVPOOL_CUDART=/path/to/libcudart.so.12",
            )
        error = self.cuda_error or ""
        match = re.search(r"\((\d+)\)\s*$", error)
        code = int(match.group(1)) if match else None
        if code in _CUDA_NO_DRIVER or "driver" in error.lower():
            if not _NVIDIA_DRIVER.exists():
                return (
                    f"no NVIDIA driver is loaded (the CUDA runtime {self.cuda_runtime_path} "
                    f"reports: {error or 'no driver'})",
                    "install the NVIDIA driver on the host (in a container, run it with the "
                    "GPUs passed through, e.g. docker run --gpus all)",
                )
            return (
                f"the NVIDIA driver is older than the CUDA runtime {self.cuda_runtime_path} "
                f"(it reports: {error})",
                "upgrade the driver, or point KVPOOL_CUDART at a runtime the driver supports",
            )
        if code in _CUDA_NO_DEVICE or self.cuda_device_count == 0:
            return (
                f"the NVIDIA driver sees no CUDA device ({error or '0 devices'})",
                "check that the machine has a GPU, and CUDA_VISIBLE_DEVICES and the "
                "container's --gpus option",
            )
        return f"CUDA is not usable ({error or 'unknown reason'})", "see the error above"

    def advice(self) -> list[str]:
        """Return one line per thing worth changing, with the command that does it."""
        tips: list[str] = []
        cause, fix = self.cuda_problem()
        if fix:  # none without a GPU or a driver: there is no GPU to set up
            tips.append(f"CUDA: {cause}; pin='auto' uses mlock instead. Fix: {fix}.")
        pool = self.hugepage_pool(2048)
        # How pools pick pages (kvpool.pool.backing.default_hugepages): 4 KiB
        # pages unless a pool asks (use_hugepages=True) or KVPOOL_HUGEPAGES=auto.
        auto = os.environ.get("KVPOOL_HUGEPAGES", "").strip().lower() == "auto"
        asked = (
            "pools take 2 MiB pages only when asked: use_hugepages=True (kvpool demo "
            "--hugepages) requires them, KVPOOL_HUGEPAGES=auto uses them when enough are free; "
            "other pools get 4 KiB pages, about 3x slower to populate"
        )
        if pool is None:
            tips.append(
                "Hugepages: this kernel has no 2 MiB hugepage pool; pools get 4 KiB pages "
                "(use_hugepages=True is refused)."
            )
        elif pool.free < 512:
            free, total = max(pool.free, 0), max(pool.total, 0)
            tips.append(
                f"Hugepages: {free} free 2 MiB pages of {total} ({format_bytes(free << 21)}); "
                f"{asked}. To reserve 4 GiB more: echo {total + 2048} | sudo tee "
                "/proc/sys/vm/nr_hugepages (per node: /sys/devices/system/node/node<N>/"
                "hugepages/hugepages-2048kB/nr_hugepages; persist with vm.nr_hugepages in "
                "/etc/sysctl.conf)."
            )
        elif not auto:
            tips.append(
                f"Hugepages: {pool.free} free 2 MiB pages ({format_bytes(pool.free << 21)}), "
                f"unused unless asked: {asked}."
            )
        if self.memlock_limit is not None:
            if self.memlock_exempt:
                tips.append(
                    f"memlock: limit {format_bytes(self.memlock_limit)} does not bind: this "
                    "process has CAP_IPC_LOCK (root), so mlock pinning works at any size."
                )
            else:
                tips.append(
                    f"memlock: limit {format_bytes(self.memlock_limit)}; mlock pinning of larger "
                    "pools is refused (pinned='none'). Raise it: ulimit -l unlimited, a "
                    "'memlock' line in /etc/security/limits.conf, or docker run --ulimit "
                    "memlock=-1."
                )
        if self.thp_mode == "never":
            tips.append(
                "THP: disabled; hugepages='thp' gets 4 KiB pages. Enable: echo madvise | sudo "
                "tee /sys/kernel/mm/transparent_hugepage/enabled"
            )
        if not self.populate_write:
            tips.append(
                "Populate: the kernel lacks MADV_POPULATE_WRITE (Linux 5.14+); pools are made "
                "resident by touching each page, which is slower."
            )
        if len(self.numa_nodes) == 1:
            tips.append("NUMA: one node; numa_node=0 is the only choice and binding is moot.")
        return tips

    def _populate_lines(self) -> list[str]:
        lines = [
            f"  populate             {self.populate_method} ({self.populate_method_source}), "
            f"{self.default_populate_threads} thread(s) ({self.populate_threads_source}); "
            "override: KVPOOL_POPULATE_METHOD, KVPOOL_POPULATE_THREADS"
        ]
        facts = self.populate_probe
        if facts:
            madvise = f"{facts['madvise_gbps']:.2f}" if facts["populate_write"] else "n/a"
            lines.append(
                f"    probe: 1 thread madvise {madvise} vs first touch {facts['touch_gbps']:.2f} "
                f"GB/s; cost {facts['seconds'] * 1e3:.0f} ms (threads: usable CPUs, at most 16)"
            )
        return lines

    def report(self) -> str:
        """Return the human-readable report that ``kvpool info`` prints."""
        lines = ["kvpool host-memory capabilities", ""]
        if self.cuda_available:
            cuda = (
                f"yes, {self.cuda_device_count} device(s), runtime {self.cuda_runtime_version} "
                f"({self.cuda_runtime_path})"
            )
        else:
            cuda = f"not usable: {self.cuda_problem()[0]}"
        lines.append(f"  CUDA                 {cuda}")
        for pool in self.hugepages:
            size = format_bytes(pool.page_size_kib * 1024)
            lines.append(
                f"  hugepages {size:<10} {pool.free} free of {pool.total}"
                f" ({format_bytes(max(pool.free, 0) * pool.page_size_kib * 1024)} free)"
            )
        if not self.hugepages:
            lines.append("  hugepages            none (no hugetlb support)")
        lines.append(f"  THP                  {self.thp_mode}")
        count = len(self.numa_nodes)
        nodes = ", ".join(map(str, self.numa_nodes))
        lines.append(f"  NUMA                 {count} node{'s' if count != 1 else ''}: {nodes}")
        limit = "unlimited" if self.memlock_limit is None else format_bytes(self.memlock_limit)
        exempt = " (CAP_IPC_LOCK: not enforced)" if self.memlock_exempt else ""
        lines.append(f"  memlock limit        {limit}{exempt}")
        lines.append(f"  MADV_POPULATE_WRITE  {'yes' if self.populate_write else 'no'}")
        cpus = f"{self.cpu_affinity} usable of {self.cpu_count} online"
        lines.append(f"  CPUs                 {cpus}")
        lines += self._populate_lines()
        lines.append(f"  RAM                  {format_bytes(self.mem_total)}")
        lines.append(f"  memory cgroup        {_cgroup_line(self.memory_cgroup)}")
        lines.append(f"  page size            {self.page_size} bytes")
        lines.append(f"  libpinmem            {self.library_path}")
        tips = self.advice()
        if tips:
            lines += ["", "Advice:"]
            lines += [f"  - {tip}" for tip in tips]
        return "\n".join(lines)


def capabilities(*, probe_populate: bool = False) -> Capabilities:
    """Probe the machine now and return what it offers.

    Args:
        probe_populate: also run libpinmem's populate probe if this process
            has not yet (tens of milliseconds; ``kvpool info`` does), so the
            populate plan shows measured facts.

    Returns:
        A frozen :class:`Capabilities`.

    Raises:
        ImportError: libpinmem is not built or cannot be loaded.
    """
    import kvpool.native.calls as _native

    facts = _native.populate_probe("once" if probe_populate else "report")
    plan = _native.populate_plan()
    raw = _native.probe()
    loaded = raw["cuda_loaded"]
    return Capabilities(
        cuda_available=loaded and raw["cuda_device_count"] > 0,
        cuda_device_count=raw["cuda_device_count"],
        cuda_runtime_path=raw["cuda_runtime_path"] or None,
        cuda_runtime_version=raw["cuda_runtime_version"] or None,
        cuda_error=raw["cuda_error"] or None,
        hugepages=tuple(HugePagePool(*pool) for pool in raw["hugepages"]),
        numa_nodes=tuple(raw["numa_nodes"]),
        memlock_limit=raw["memlock_soft"],
        memlock_hard_limit=raw["memlock_hard"],
        memlock_exempt=raw["cap_ipc_lock"],
        populate_write=raw["populate_write"],
        cpu_count=raw["cpu_count"],
        cpu_affinity=raw["cpu_affinity"],
        thp_mode=_THP_MODES.get(raw["thp_mode"], "unknown"),
        page_size=raw["page_size"],
        default_populate_threads=raw["default_populate_threads"],
        mem_total=raw["mem_total"],
        library_path=_native.library_path(),
        populate_method=plan.method,
        populate_method_source=plan.method_source,
        populate_threads_source=plan.threads_source,
        populate_probe=asdict(facts) if facts.probed else None,
        memory_cgroup=cgroup_memory(),
        nvidia_gpus=nvidia_gpus(),
    )


def nvidia_gpus(base: str | os.PathLike[str] = _PCI_DEVICES) -> int:
    """Count the NVIDIA GPUs on the PCI bus, from sysfs: no driver or CUDA needed.

    Args:
        base: the PCI devices folder (a parameter so tests can point it elsewhere).

    Returns:
        The devices of NVIDIA's vendor id in a display class; 0 where sysfs
        is unreadable.
    """
    try:
        devices = sorted(Path(base).iterdir())
    except OSError:
        return 0
    count = 0
    for device in devices:
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            kind = (device / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == _NVIDIA_VENDOR and kind.startswith(_DISPLAY_CLASS):
            count += 1
    return count


def _cgroup_line(limit: Limit | None) -> str:
    if limit is None:
        return "no memory cgroup limit"
    return (
        f"{format_bytes(limit.limit)} limit, {format_bytes(limit.used)} in use, "
        f"{format_bytes(limit.available)} left ({limit.source})"
    )


def numa_nodes() -> list[int]:
    """Return the online NUMA nodes, ascending (``[0]`` without NUMA support)."""
    import kvpool.native.calls as _native

    return _native.numa_nodes()


def current_numa_node() -> int:
    """Return the NUMA node of the CPU the calling thread runs on (getcpu).

    The thread may migrate right after; pin it (os.sched_setaffinity) when
    the answer must stay true.
    """
    import kvpool.native.calls as _native

    return _native.current_cpu()[1]


def read_hugepage_info(base: str | os.PathLike[str] = _HUGEPAGES_2M) -> tuple[int, int, int] | None:
    """Read the 2 MiB hugepage pool from sysfs.

    Args:
        base: the pool's sysfs directory (a parameter so tests can point it
            elsewhere).

    Returns:
        ``(nr_hugepages, free_hugepages, 2)`` -- the last item is the page
        size in MiB -- or None when the pool's sysfs entries are missing or
        unreadable.  free_hugepages counts pages reserved by mappings that
        have not touched them yet.
    """
    path = Path(base)
    try:
        total = int((path / "nr_hugepages").read_text().strip())
        free = int((path / "free_hugepages").read_text().strip())
    except (OSError, ValueError):
        return None
    return total, free, 2
