"""Every code block of the README and docs/ runs, or says why not (marks: ``doc_blocks.py``).

The runnable python blocks of a page run in one child process, each in a
fresh namespace as a script of its own (a ``continues`` block shares the
namespace of the block before it), from a scratch directory, with the test
servers' addresses in place of the defaults they name.  A block fails the
test when it raises, and the page fails when a kvpool warning (a leak, a
free under a live view) reaches stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import DEFAULT_URLS, ROOT, SERVERS, Block, blocks, pages

ALL = [b for page in pages() for b in blocks(page)]

# Runs each block of the JSON list on stdin; a block that fails stops the page.
RUNNER = r"""
import json, sys, traceback
todo = json.load(sys.stdin)
namespace = None
for block in todo:
    if not block["continues"] or namespace is None:
        namespace = {"__name__": "__main__"}
    print(f"--- {block['where']}", flush=True)
    try:
        exec(compile(block["text"], block["where"], "exec"), namespace)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            traceback.print_exc()
            sys.exit(f"FAILED {block['where']}")
    except BaseException:
        traceback.print_exc()
        sys.exit(f"FAILED {block['where']}")
"""

FAULTS = ("freed while views", "reclaiming <", "LeakedHandleWarning", "Traceback")


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_block_is_run_or_says_why_not() -> None:
    bad = []
    for block in ALL:
        if block.mark == "not run" and not block.detail:
            bad.append(f"{block.where}: 'not run' without a reason")
        elif block.mark == "run with" and block.detail not in SERVERS:
            bad.append(f"{block.where}: 'run with: {block.detail}' names no known server")
        elif block.lang != "python" and block.mark != "not run":
            bad.append(f"{block.where}: a {block.lang!r} block must say why it is not run")
        elif block.mark == "run with" and not any(
            url in block.text for url in DEFAULT_URLS[block.detail]
        ):
            bad.append(f"{block.where}: 'run with: {block.detail}' but no default address in it")
    assert not bad, "\n".join(bad)


def test_readme_quickstart_is_the_example() -> None:
    """The README's quickstart is examples/quickstart.py, which tests/examples runs."""
    example = (ROOT / "examples" / "quickstart.py").read_text()
    code = example.split('"""', 2)[2].lstrip("\n")  # without its docstring
    first = next(b for b in blocks(ROOT / "README.md") if b.lang == "python")
    assert first.text == code


def test_plugin_config_is_the_readmes_everywhere() -> None:
    """Every page shows the LMCache plugin configuration the README shows (tests/compat runs it)."""
    configs = [b for b in ALL if b.lang == "yaml" and "remote_storage_plugins" in b.text]
    readme = [b for b in configs if b.path.name == "README.md"]
    assert len(readme) == 1, "the README shows the plugin configuration once"
    different = [b.where for b in configs if b.text != readme[0].text]
    assert not different, f"plugin configurations that differ from the README's: {different}"


def _runnable(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.lang == "python" and b.mark != "not run"]


RUNNABLE_PAGES = [p for p in pages() if _runnable(p)]


@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=_page_id)
def test_page_blocks_run(
    page: Path, request: pytest.FixtureRequest, child_env: dict[str, str], tmp_path: Path
) -> None:
    todo = _runnable(page)
    env = dict(child_env)
    replace: dict[str, str] = {}
    for server in sorted({b.detail for b in todo if b.mark == "run with"}):
        fixture = {"redis": "redis_server", "redis-cluster": "redis_cluster"}.get(server, server)
        url = request.getfixturevalue(fixture).url
        replace.update(dict.fromkeys(DEFAULT_URLS[server], url))
        if server == "mooncake":
            env.update(MC_TCP_BIND_ADDRESS="127.0.0.1", MC_LOG_LEVEL="ERROR")
    payload = []
    for block in todo:
        text = block.text
        for default, url in replace.items():
            text = text.replace(default, url)
        payload.append({"where": block.where, "text": text, "continues": block.mark == "continues"})
    done = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(payload),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = f"exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, report
    for fault in FAULTS:
        assert fault not in done.stderr, report
