"""Which torch to install first: README, getting-started and the installers tell CPU and GPU users.

From PyPI, ``pip install torch`` on x86-64 Linux is the CUDA build (several
GB with its NVIDIA packages), whatever the machine; the CPU build comes
from PyTorch's CPU wheel index.  The pages' install blocks take the CPU
build first and their prose says what a GPU machine takes instead; the
make targets' paragraph names ``TORCH_INDEX`` (the Makefile's side is
tests/packaging/test_make_targets.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from kvpool.integrations.install import TORCH_ADVICE

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PAGES = (ROOT / "README.md", ROOT / "docs" / "getting-started.md")


def install_lines(page: Path) -> list[str]:
    """The commands of the page's sh block that installs kvpool (``pip install .``)."""
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S):
        lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
        if "pip install ." in lines:
            return [line for line in lines if line]
    raise AssertionError(f"{page.name}: no sh block with `pip install .`")


def prose(page: Path) -> str:
    """The page's text outside code blocks, on one line."""
    return " ".join(re.sub(r"```.*?```", " ", page.read_text(), flags=re.S).split())


def test_the_install_blocks_take_the_cpu_build_before_kvpool() -> None:
    for page in PAGES:
        lines = install_lines(page)
        torch = [line for line in lines if line.startswith("pip install torch")]
        assert torch == [f"pip install torch --index-url {CPU_INDEX}"], (page.name, lines)
        assert lines.index(torch[0]) < lines.index("pip install ."), page.name


def test_the_pages_say_what_a_gpu_machine_takes_and_what_make_does() -> None:
    for page in PAGES:
        text = prose(page)
        gpu = re.search(r"NVIDIA GPU\**[:,]? `pip install torch`", text)
        assert gpu, f"{page.name}: no `pip install torch` for a machine with an NVIDIA GPU"
        assert re.search(r"`pip install torch`.{0,60}CUDA", text), page.name
        assert f"TORCH_INDEX={CPU_INDEX}" in text, page.name
        assert "`.venv`" in text, page.name  # where make installs


def test_the_installers_refusal_without_torch_says_the_same() -> None:
    assert f"pip install torch==2.13.0 --index-url {CPU_INDEX}" in TORCH_ADVICE
    assert TORCH_ADVICE.endswith("with one: pip install torch==2.13.0")
