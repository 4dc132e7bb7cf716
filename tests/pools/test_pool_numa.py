"""NUMAMapping and resolve_numa_node, with the GPU, CPU and sysfs probes faked."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvpool
from kvpool.native.numa import resolve_numa_node


def fakes(nodes: list[int], gpu: int | None, cpu_node: int) -> dict[str, object]:
    return {
        "nodes": lambda: list(nodes),
        "current_gpu": lambda: gpu,
        "current_node": lambda: cpu_node,
    }


def test_no_mapping_means_no_binding() -> None:
    def boom() -> object:
        raise AssertionError("no probe may run without a mapping")

    assert resolve_numa_node(None, nodes=boom, current_gpu=boom, current_node=boom) is None


def test_without_gpus_the_calling_cpus_node_is_used() -> None:
    mapping = kvpool.NUMAMapping({0: 0, 1: 1})
    assert resolve_numa_node(mapping, **fakes([0, 1], gpu=None, cpu_node=1)) == 1
    assert resolve_numa_node(mapping, **fakes([0, 1], gpu=None, cpu_node=0)) == 0


def test_without_gpus_a_mapping_for_other_gpus_still_uses_the_cpu_node() -> None:
    mapping = kvpool.NUMAMapping({3: 1})
    assert resolve_numa_node(mapping, **fakes([0, 1], gpu=None, cpu_node=0)) == 0


def test_with_gpus_the_current_gpus_node_is_used() -> None:
    mapping = kvpool.NUMAMapping({0: 0, 1: 1, 2: 1, 3: 0})
    for gpu, node in mapping.gpu_to_numa_mapping.items():
        # the calling CPU's node does not matter when a GPU is current
        assert resolve_numa_node(mapping, **fakes([0, 1], gpu=gpu, cpu_node=1 - node)) == node


def test_current_gpu_missing_from_the_mapping() -> None:
    mapping = kvpool.NUMAMapping({0: 0})
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        resolve_numa_node(mapping, **fakes([0, 1], gpu=2, cpu_node=0))
    message = str(info.value)
    assert "2" in message and "[0]" in message
    assert "NUMAMapping.detect" in message


def test_a_node_the_machine_lacks_lists_the_real_nodes() -> None:
    mapping = kvpool.NUMAMapping({0: 7})
    for gpu in (None, 0):
        with pytest.raises(kvpool.NumaNodeError) as info:
            resolve_numa_node(mapping, **fakes([0, 1], gpu=gpu, cpu_node=0))
        message = str(info.value)
        assert "7" in message
        assert "[0, 1]" in message
        assert isinstance(info.value, ValueError)


def test_not_a_numa_mapping() -> None:
    with pytest.raises(kvpool.InvalidArgumentError, match="NUMAMapping"):
        resolve_numa_node({0: 0}, **fakes([0], gpu=None, cpu_node=0))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", [[(0, 0)], {0: -1}, {-1: 0}, {0: "1"}, {0: 1.0}, {True: 0}, {0: None}]
)
def test_numa_mapping_validates_its_entries(bad: object) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.NUMAMapping(bad)  # type: ignore[arg-type]


def test_numa_mapping_defaults_to_empty() -> None:
    assert kvpool.NUMAMapping().gpu_to_numa_mapping == {}
    assert kvpool.NUMAMapping({0: 1}) == kvpool.NUMAMapping(gpu_to_numa_mapping={0: 1})


# -- NUMAMapping.detect over a fake sysfs ------------------------------------------


def pci_tree(root: Path, nodes: dict[str, str]) -> Path:
    for bus, text in nodes.items():
        (root / bus).mkdir(parents=True)
        (root / bus / "numa_node").write_text(text)
    return root


def test_detect_reads_each_gpus_numa_node(tmp_path: Path) -> None:
    root = pci_tree(
        tmp_path,
        {"0000:3b:00.0": "0\n", "0000:5e:00.0": "0\n", "0000:af:00.0": "1\n", "0000:d8:00.0": "1"},
    )
    buses = ["0000:3b:00.0", "0000:5e:00.0", "0000:af:00.0", "0000:d8:00.0"]
    mapping = kvpool.NUMAMapping.detect(root, devices=lambda: buses)
    assert mapping == kvpool.NUMAMapping({0: 0, 1: 0, 2: 1, 3: 1})


def test_detect_follows_the_device_order(tmp_path: Path) -> None:
    root = pci_tree(tmp_path, {"0000:3b:00.0": "0", "0000:af:00.0": "1"})
    mapping = kvpool.NUMAMapping.detect(root, devices=lambda: ["0000:af:00.0", "0000:3b:00.0"])
    assert mapping == kvpool.NUMAMapping({0: 1, 1: 0})


def test_detect_skips_gpus_without_affinity_or_sysfs_entry(tmp_path: Path) -> None:
    root = pci_tree(
        tmp_path, {"0000:01:00.0": "-1\n", "0000:02:00.0": "1\n", "0000:03:00.0": "bogus\n"}
    )
    buses = ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"]
    mapping = kvpool.NUMAMapping.detect(root, devices=lambda: buses)
    assert mapping == kvpool.NUMAMapping({1: 1})


def test_detect_without_gpus_or_affinity_is_none(tmp_path: Path) -> None:
    assert kvpool.NUMAMapping.detect(tmp_path, devices=lambda: []) is None
    root = pci_tree(tmp_path / "pci", {"0000:01:00.0": "-1"})
    assert kvpool.NUMAMapping.detect(root, devices=lambda: ["0000:01:00.0"]) is None


def test_detect_on_this_machine_without_gpus() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("GPUs are present: detect() answers from the real sysfs")
    assert kvpool.NUMAMapping.detect() is None


def test_a_detected_mapping_builds_a_pool(tmp_path: Path) -> None:
    root = pci_tree(tmp_path, {"0000:3b:00.0": "0"})
    mapping = kvpool.NUMAMapping.detect(root, devices=lambda: ["0000:3b:00.0"])
    with kvpool.MixedMemoryAllocator(1 << 20, numa_mapping=mapping) as pool:
        assert pool.describe()["numa_node"] in kvpool.capabilities().numa_nodes
