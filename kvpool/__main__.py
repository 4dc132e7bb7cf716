"""``python -m kvpool``: the command line (see :mod:`kvpool.cli`), and a word when a clone hides it.

``python -m`` looks in the current directory first, so at the root of a
kvpool clone it runs the clone's ``kvpool/`` folder, not the kvpool
installed in the environment.  Where that folder is not built (no native
layer) and an installed kvpool is there to be hidden, a command that needs
the native layer stops with what happened and what to do (exit status 2);
the installers (``install-lmcache``, ``install-sglang``,
``install-vllm``) need none and run.
"""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

#: This kvpool package: a source tree's ``kvpool/`` when run from a clone's root.
PACKAGE = Path(__file__).resolve().parent


def hidden_install() -> str | None:
    """The installed kvpool this unbuilt package hides, or None.

    None when this package is built (its native layer was generated: it
    runs as it is) or when no other kvpool is installed (then the native
    layer's own error says to build it or install kvpool).
    """
    if (PACKAGE / "native" / "_pinmem_ffi.py").is_file():
        return None
    # sys.path without the folder that holds this package, then the
    # import system's other finders (an editable install's), as Python
    # would search if this folder were not first.
    rest = [p for p in sys.path if Path(p or ".").resolve() != PACKAGE.parent]
    spec = importlib.machinery.PathFinder.find_spec("kvpool", rest)
    for finder in sys.meta_path:
        if spec is not None:
            break
        if finder is not importlib.machinery.PathFinder and hasattr(finder, "find_spec"):
            spec = finder.find_spec("kvpool", None)
    if spec is None or not spec.submodule_search_locations:
        return None
    where = Path(next(iter(spec.submodule_search_locations))).resolve()
    return None if where == PACKAGE else str(where)


def shadow_message(installed: str) -> str:
    """What to tell a user whose clone hides the kvpool installed at ``installed``."""
    return (
        f"python -m kvpool: the kvpool folder here ({PACKAGE}) is a source tree that is not "
        f"built, and Python runs it instead of the kvpool installed at {installed}, because "
        "python -m looks in the current directory first. Run the command from another "
        "directory (or run the installed `kvpool` command), or build this tree with `make`."
    )


def run() -> int:
    """Run the command line; stop first when an unbuilt tree hides the install."""
    from kvpool.cli import build_parser, main

    installed = hidden_install()
    if installed is not None:
        args = build_parser().parse_args()  # --help, --version and usage errors exit here
        if getattr(args, "needs_native", True):
            print(shadow_message(installed), file=sys.stderr)
            return 2
    return main()


if __name__ == "__main__":
    sys.exit(run())
