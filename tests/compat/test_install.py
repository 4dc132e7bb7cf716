"""install(): LMCache's memory-management modules are kvpool's, the rest is LMCache's.

The public names are checked against LMCache's own source files (parsed,
never imported), so a name the installed LMCache defines and kvpool does
not serve fails here.  Refusals (imported too early, untested version) and
the ``KVPOOL_LMCACHE=1`` start-up hook run in child processes, each with a
fresh interpreter.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

import kvpool
import kvpool.integrations.lmcache as kv_lmcache
from kvpool.integrations.lmcache.finder import is_served
from kvpool.integrations.lmcache.names import ALLOCATORS, MEMORY_MANAGEMENT, SERVED

CHILD_TIMEOUT = 120


def lmcache_source(module: str) -> Path:
    """The installed LMCache file of ``module`` (found, not imported)."""
    package = Path(importlib.util.find_spec("lmcache").origin).parent  # type: ignore[arg-type]
    return package.joinpath(*module.split(".")[1:]).with_suffix(".py")


def defined_names(path: Path) -> set[str]:
    """Top-level classes, functions and assignments of an LMCache source file."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def imported_names(path: Path, source: str) -> set[str]:
    """Names an LMCache file imports ``from source``."""
    tree = ast.parse(path.read_text())
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == source
        for alias in node.names
    }


def run_child(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout's kvpool."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join([str(REPO), child_env.get("PYTHONPATH", "")])
    child_env.pop("KVPOOL_LMCACHE", None)
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=child_env,
        cwd=str(REPO),
    )


def allocator_modules() -> list[str]:
    folder = lmcache_source(ALLOCATORS + ".x").parent
    return sorted(f"{ALLOCATORS}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__")


def test_every_allocator_module_of_lmcache_is_served() -> None:
    assert allocator_modules() == sorted(n for n in SERVED if n != MEMORY_MANAGEMENT)


@pytest.mark.parametrize("module", sorted(SERVED))
def test_served_module_has_every_public_name_of_lmcaches(module: str) -> None:
    served = importlib.import_module(module)
    assert is_served(served)
    path = lmcache_source(module)
    missing = sorted(n for n in defined_names(path) if not hasattr(served, n))
    # Private helpers of LMCache's implementation are not API.
    missing = [n for n in missing if not n.startswith("_") or n in _PRIVATE_API]
    assert not missing, f"{module} lacks {missing}"
    reexported = imported_names(path, MEMORY_MANAGEMENT)
    assert not sorted(n for n in reexported if not hasattr(served, n))


# Underscored names LMCache's other modules import, so kvpool serves them.
_PRIVATE_API = {
    "_allocate_cpu_memory",
    "_free_cpu_memory",
    "_allocate_gpu_memory",
    "_read_hugepage_info",
    "_resolve_pinned_alloc_free",
    "_get_cached_ubyte_array_type",
}


def test_served_classes_are_kvpools() -> None:
    from lmcache.v1.memory_allocators.lazy_memory_allocator import LazyMemoryAllocator
    from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
    from lmcache.v1.memory_management import AddressManager, MemoryObj, TensorMemoryObj

    assert MixedMemoryAllocator is kvpool.MixedMemoryAllocator
    assert LazyMemoryAllocator is kvpool.LazyMemoryAllocator
    assert TensorMemoryObj is kvpool.TensorMemoryObj
    assert MemoryObj is kvpool.MemoryObj
    assert AddressManager is kvpool.AddressManager


def test_everything_else_stays_lmcaches() -> None:
    import lmcache.v1.pin_monitor
    import lmcache.v1.storage_backend.local_cpu_backend as backend

    for module in (lmcache.v1.pin_monitor, backend):
        assert not is_served(module)
        assert Path(module.__file__).is_relative_to(lmcache_source(MEMORY_MANAGEMENT).parent)
    # LMCache's monitors are re-exported by the served module, as in its own.
    import lmcache.v1.memory_management as mm

    assert mm.PinMonitor is lmcache.v1.pin_monitor.PinMonitor


def test_install_is_idempotent() -> None:
    finders = [f for f in sys.meta_path if type(f).__name__ == "KvpoolModuleFinder"]
    kv_lmcache.install()
    kv_lmcache.install()
    assert kv_lmcache.installed()
    assert [f for f in sys.meta_path if type(f).__name__ == "KvpoolModuleFinder"] == finders
    assert len(finders) == 1


def test_an_unknown_allocator_module_is_refused() -> None:
    with pytest.raises(ImportError, match="serves no module"):
        importlib.import_module(f"{ALLOCATORS}.no_such_allocator")


def test_installing_after_lmcaches_memory_management_was_imported_is_refused() -> None:
    proc = run_child(
        """
        import lmcache.v1.memory_management
        import kvpool.integrations.lmcache as b
        try:
            b.install()
        except b.LMCacheBridgeError as exc:
            assert isinstance(exc, ImportError)
            print("refused:", exc)
        else:
            raise SystemExit("install() accepted an LMCache that was already imported")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "already imported (lmcache.v1.memory_management)" in proc.stdout
    assert "before importing it" in proc.stdout


def test_importing_lmcache_itself_first_is_fine() -> None:
    proc = run_child(
        """
        import lmcache
        import kvpool.integrations.lmcache as b
        b.install()
        import lmcache.v1.memory_management as mm
        import kvpool
        assert mm.MemoryObj is kvpool.MemoryObj
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")


def fake_lmcache_version(tmp_path: Path, version: str) -> Path:
    """A folder whose dist-info says lmcache is ``version`` (put first on sys.path)."""
    info = tmp_path / f"lmcache-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: lmcache\nVersion: {version}\n")
    return tmp_path


def test_an_untested_version_is_refused_unless_allowed(tmp_path: Path) -> None:
    site = fake_lmcache_version(tmp_path, "0.4.1")
    code = f"""
        import sys
        sys.path.insert(0, {str(site)!r})
        import kvpool.integrations.lmcache as b
        assert b.lmcache_version() == "0.4.1"
        try:
            b.install()
        except b.LMCacheBridgeError as exc:
            print("refused:", exc)
        b.install(allow_untested=True)
        print("installed:", b.installed())
        """
    proc = run_child(code)
    assert proc.returncode == 0, proc.stderr
    assert "LMCache 0.4.1 is outside the versions kvpool is tested with (0.5.6)" in proc.stdout
    assert "installed: True" in proc.stdout
    env_proc = run_child(
        code.replace("b.install()\n", "b.install(); print('env ok')\n"),
        env={kv_lmcache.ALLOW_UNTESTED_ENV: "1"},
    )
    assert env_proc.returncode == 0, env_proc.stderr
    assert "env ok" in env_proc.stdout


def hook_site(tmp_path: Path) -> Path:
    """A site folder holding kvpool's .pth hook, as an installed wheel has it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "kvpool-lmcache.pth").write_text((REPO / "kvpool-lmcache.pth").read_text())
    return site


HOOK_CHILD = """
    import site, sys
    site.addsitedir({site!r})
    loaded_kvpool = any(m == "kvpool" or m.startswith("kvpool.") for m in sys.modules)
    import lmcache.v1.memory_management as mm
    print("kvpool before lmcache:", loaded_kvpool)
    print("served:", hasattr(mm, "__kvpool_served__"))
    """


def test_the_startup_hook_installs_on_first_lmcache_import(tmp_path: Path) -> None:
    code = HOOK_CHILD.format(site=str(hook_site(tmp_path)))
    on = run_child(code, env={"KVPOOL_LMCACHE": "1"})
    assert on.returncode == 0, on.stderr
    assert "kvpool before lmcache: False" in on.stdout  # nothing of kvpool at start-up
    assert "served: True" in on.stdout
    off = run_child(code)
    assert off.returncode == 0, off.stderr
    assert "served: False" in off.stdout


def test_the_startup_hook_reports_a_refusal_at_import(tmp_path: Path) -> None:
    (tmp_path / "fake").mkdir()
    fake = fake_lmcache_version(tmp_path / "fake", "0.4.1")
    code = f"""
        import site, sys
        sys.path.insert(0, {str(fake)!r})
        site.addsitedir({str(hook_site(tmp_path))!r})
        try:
            import lmcache.v1.memory_management
        except ImportError as exc:
            print("import failed:", exc)
        """
    proc = run_child(code, env={"KVPOOL_LMCACHE": "yes"})
    assert proc.returncode == 0, proc.stderr
    assert "import failed: LMCache 0.4.1 is outside the versions" in proc.stdout
