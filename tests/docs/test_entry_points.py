"""The docs' entry points name every integration: each package of kvpool/integrations/ but shared/.

For an integration ``N``: docs/index.md links its guide (``guide/N.md``) in
its introduction and in "Where to go", and its API reference
(``reference/N.md``); README's first paragraph names it; the examples
table of getting-started.md lists an ``examples/N_*.py`` script that
exists.  A new integration fails here until its entries are written (its
display name goes in :data:`NAMES`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "kvpool" / "integrations"
#: How the docs name each integration.
NAMES = {"lmcache": "LMCache", "sglang": "SGLang", "vllm": "vLLM"}
#: Packages of kvpool/integrations/ that are not an integration of their own.
NOT_INTEGRATIONS = {"shared"}

INTEGRATIONS = sorted(
    p.name
    for p in PACKAGES.iterdir()
    if (p / "__init__.py").is_file() and p.name not in NOT_INTEGRATIONS
)


def section(text: str, heading: str | None) -> str:
    """The part of a Markdown page under ``## heading`` (None: before the first ``##``)."""
    if heading is None:
        return text.split("\n## ", 1)[0]
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def links(text: str) -> set[str]:
    """The targets of the Markdown links in ``text``, anchors dropped."""
    return {target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", text)}


def test_the_integrations_are_found() -> None:
    assert {"lmcache", "sglang"} <= set(INTEGRATIONS)
    unnamed = [n for n in INTEGRATIONS if n not in NAMES]
    assert not unnamed, f"add the display name of {unnamed} to NAMES"


@pytest.mark.parametrize("name", INTEGRATIONS)
def test_the_home_page_leads_to_it(name: str) -> None:
    page = (ROOT / "docs" / "index.md").read_text()
    guide, reference = f"guide/{name}.md", f"reference/{name}.md"
    assert (ROOT / "docs" / guide).is_file() and (ROOT / "docs" / reference).is_file()
    assert guide in links(section(page, None)), f"the introduction does not link {guide}"
    where = section(page, "Where to go")
    assert guide in links(where), f"'Where to go' does not link {guide}"
    api = next(line for line in where.splitlines() if "API reference" in line)
    assert reference in links(api), f"the API reference row does not link {reference}"


@pytest.mark.parametrize("name", INTEGRATIONS)
def test_the_readme_names_it_to_its_audience(name: str) -> None:
    first = section((ROOT / "README.md").read_text(), None).split("\n\n", 1)[1]
    assert NAMES[name] in first, f"README's first paragraph does not name {NAMES[name]}"


@pytest.mark.parametrize("name", INTEGRATIONS)
def test_getting_started_lists_its_example(name: str) -> None:
    table = section((ROOT / "docs" / "getting-started.md").read_text(), "The examples")
    scripts = re.findall(rf"^\| `({name}_\w+\.py)", table, re.MULTILINE)
    assert scripts, f"the examples table lists no examples/{name}_*.py"
    for script in scripts:
        assert (ROOT / "examples" / script).is_file(), f"examples/{script} does not exist"
