"""docs/guide/errors.md draws the real exception hierarchy.

Every exception class of :mod:`kvpool.errors` is in the page's tree, under
the class it derives from, with the builtins it also derives from named in
brackets where the page names them; and every class the tree shows exists
and derives from its parent there.
"""

from __future__ import annotations

import re
from pathlib import Path

import kvpool.errors

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "errors.md"
NODE = re.compile(
    r"^(?P<indent>[│ ├└─]*?)(?:[├└]── )?(?P<name>[A-Z]\w+)(?: \((?P<bases>[^)]*)\))?$"
)


def tree() -> dict[str, str | None]:
    """Each class of the page's hierarchy block (the first ``text`` block): name -> parent."""
    text = PAGE.read_text()
    block = text.split("## The hierarchy", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip() or "." in line.split(" ")[0]:
            continue  # a blank line, or a class of another module (kvpool.integrations...)
        match = NODE.match(line)
        assert match, f"errors.md: cannot read the hierarchy line {line!r}"
        depth = len(match["indent"]) // 4 + (1 if "──" in line else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[match["name"]] = stack[-1][1] if stack else None
        stack.append((depth, match["name"]))
    return parents


def test_every_error_class_is_in_the_tree_under_its_base() -> None:
    parents = tree()
    classes = {
        name: getattr(kvpool.errors, name)
        for name in kvpool.errors.__all__
        if isinstance(getattr(kvpool.errors, name), type)
    }
    missing = sorted(set(classes) - set(parents))
    assert not missing, f"errors.md's hierarchy lacks {missing}"
    for name, parent in parents.items():
        assert name in classes, f"errors.md shows {name}, which kvpool.errors does not define"
        if parent is not None:
            assert issubclass(classes[name], classes[parent]), f"{name} is not a {parent}"
