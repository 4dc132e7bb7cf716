"""Which NUMA node a pool's memory should live on.

A :class:`NUMAMapping` says, for each GPU, the NUMA node closest to it.
It is either given by hand or detected from sysfs (each GPU's PCI device
directory has a ``numa_node`` file).  :func:`resolve_numa_node` turns a
mapping into the node for the calling process: the node of the current
GPU where GPUs exist, the node of the calling CPU where none does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvpool.checks import check_callable
from kvpool.errors import ArgumentTypeError, InvalidArgumentError, NumaNodeError

__all__ = ["NUMAMapping", "resolve_numa_node"]

_PCI_DEVICES = Path("/sys/bus/pci/devices")


def _cuda_devices() -> list[str]:
    """PCI bus ids of the visible CUDA devices (empty without CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return []
    if not torch.cuda.is_available():
        return []
    ids = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        bus = getattr(props, "pci_bus_id", None)
        if bus is None:  # older torch: build it from the numeric parts
            bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        ids.append(str(bus).lower())
    return ids


@dataclass
class NUMAMapping:
    """GPU index -> NUMA node.

    Attributes:
        gpu_to_numa_mapping: the node closest to each GPU.
    """

    gpu_to_numa_mapping: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.gpu_to_numa_mapping, dict):
            raise InvalidArgumentError(
                "gpu_to_numa_mapping must be a dict {gpu index: numa node}, "
                f"got {type(self.gpu_to_numa_mapping).__name__}"
            )
        for gpu, node in self.gpu_to_numa_mapping.items():
            for what, value in (("GPU index", gpu), ("NUMA node", node)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise InvalidArgumentError(
                        f"{what} must be an int >= 0 in gpu_to_numa_mapping, got {value!r}"
                    )

    @classmethod
    def detect(
        cls,
        pci_root: str | Path = _PCI_DEVICES,
        devices: Callable[[], list[str]] = _cuda_devices,
    ) -> NUMAMapping | None:
        """Build the mapping from sysfs for the visible GPUs.

        Args:
            pci_root: the PCI devices directory (a parameter for tests).
            devices: returns the GPUs' PCI bus ids in device order (a
                parameter for tests).

        Returns:
            The mapping, or None when there are no GPUs or sysfs does not
            say (a ``numa_node`` of -1 means "no affinity").
        """
        check_callable("devices", devices)
        try:
            root = Path(pci_root)
        except TypeError:
            raise ArgumentTypeError(
                f"pci_root must be a path, got {type(pci_root).__name__}"
            ) from None
        try:
            buses = devices()
        except TypeError as exc:  # not callable without arguments
            raise ArgumentTypeError(f"devices() must take no arguments: {exc}") from None
        if not isinstance(buses, (list, tuple)):
            raise ArgumentTypeError(
                f"devices() must return a list of PCI bus ids, got {type(buses).__name__}"
            )
        mapping = {}
        for index, bus in enumerate(buses):
            if not isinstance(bus, str):
                raise ArgumentTypeError(f"devices() must return PCI bus ids (str), got {bus!r}")
            path = root / bus / "numa_node"
            try:
                node = int(path.read_text().strip())
            except (OSError, ValueError):
                continue
            if node >= 0:
                mapping[index] = node
        return cls(mapping) if mapping else None


def _current_gpu() -> int | None:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.current_device())


def resolve_numa_node(
    mapping: NUMAMapping | None,
    *,
    nodes: Callable[[], list[int]] | None = None,
    current_gpu: Callable[[], int | None] = _current_gpu,
    current_node: Callable[[], int] | None = None,
) -> int | None:
    """The node a pool built with ``mapping`` should bind its memory to.

    Args:
        mapping: a :class:`NUMAMapping` (or any object with a
            ``gpu_to_numa_mapping`` dict, such as LMCache's), or None.
        nodes: returns the machine's NUMA nodes (parameter for tests).
        current_gpu: returns the current GPU index or None without GPUs.
        current_node: returns the calling CPU's node (parameter for tests).

    Returns:
        None for no mapping; the current GPU's node when GPUs exist; the
        calling CPU's node when none does.

    Raises:
        InvalidArgumentError: not a mapping, or the current GPU is not in it.
        NumaNodeError: the mapping names a node this machine lacks; the
            message lists the real ones.
    """
    if mapping is None:
        return None
    if not isinstance(mapping, NUMAMapping):
        # Another project's mapping of the same shape (LMCache's) is
        # validated like ours.
        table = getattr(mapping, "gpu_to_numa_mapping", None)
        if not isinstance(table, dict):
            raise InvalidArgumentError(
                "numa_mapping must be a kvpool.NUMAMapping (or have a gpu_to_numa_mapping "
                f"dict), got {type(mapping).__name__}"
            )
        mapping = NUMAMapping(dict(table))
    if nodes is None or current_node is None:
        import kvpool.native.machine as system

        nodes = nodes or system.numa_nodes
        current_node = current_node or system.current_numa_node
    real = nodes()
    for gpu, node in mapping.gpu_to_numa_mapping.items():
        if node not in real:
            raise NumaNodeError(
                f"numa_mapping maps GPU {gpu} to NUMA node {node}, but this machine has "
                f"node(s) {real}; fix the mapping or use NUMAMapping.detect()"
            )
    gpu = current_gpu()
    if gpu is None:
        return current_node()
    if gpu not in mapping.gpu_to_numa_mapping:
        raise InvalidArgumentError(
            f"the current GPU {gpu} is not in numa_mapping (it maps GPUs "
            f"{sorted(mapping.gpu_to_numa_mapping)}); add it or use NUMAMapping.detect()"
        )
    return mapping.gpu_to_numa_mapping[gpu]
