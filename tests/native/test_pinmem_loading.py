"""Loading libpinmem and the status -> exception table."""

from __future__ import annotations

import subprocess

from kvpool import errors, native


def test_library_loaded_by_absolute_path() -> None:
    path = native.library_path()
    assert path.startswith("/")
    assert path.endswith("libpinmem.so")
    assert native.lib.pinmem_version() == native.lib.PINMEM_VERSION


def test_import_error_lists_every_path_tried(python: str, child_env: dict[str, str]) -> None:
    env = dict(child_env, KVPOOL_LIBPINMEM="/nonexistent/dir/libpinmem.so")
    proc = subprocess.run(
        [python, "-c", "import kvpool.native.calls"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "/nonexistent/dir/libpinmem.so: no such file" in proc.stderr
    assert "make" in proc.stderr


def test_import_error_for_a_file_that_is_not_a_library(
    python: str, child_env: dict[str, str], tmp_path
) -> None:
    bogus = tmp_path / "libpinmem.so"
    bogus.write_text("not an ELF file")
    env = dict(child_env, KVPOOL_LIBPINMEM=str(bogus))
    proc = subprocess.run(
        [python, "-c", "import kvpool.native.calls"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert str(bogus) in proc.stderr


def test_every_status_has_one_exception_and_a_name() -> None:
    lib = native.lib
    codes = range(1, lib.PINMEM_STATUS_COUNT)
    assert set(native.STATUS_EXCEPTIONS) == set(codes)
    for code in codes:
        assert issubclass(native.STATUS_EXCEPTIONS[code], errors.KVPoolError)
        text = native.ffi.string(lib.pinmem_strerror(code)).decode()
        assert text and text != "unknown libpinmem status"
    assert native.ffi.string(lib.pinmem_strerror(999)) == b"unknown libpinmem status"


def test_exceptions_are_also_builtins() -> None:
    table = native.STATUS_EXCEPTIONS
    lib = native.lib
    assert issubclass(table[lib.PINMEM_EINVAL], ValueError)
    assert issubclass(table[lib.PINMEM_ENOMEM], MemoryError)
    assert issubclass(table[lib.PINMEM_EHUGEPAGES], MemoryError)
    assert issubclass(table[lib.PINMEM_ESHM_EXISTS], FileExistsError)
    assert issubclass(table[lib.PINMEM_ESHM_NOT_FOUND], FileNotFoundError)
    assert issubclass(table[lib.PINMEM_ESYS], OSError)
    assert issubclass(table[lib.PINMEM_EUNKNOWN_PTR], ValueError)


def test_check_passes_ok_and_carries_status_and_detail() -> None:
    native.check(native.lib.PINMEM_OK, "nothing")
    try:
        native.free(4096)
    except errors.InvalidHandleError as exc:
        assert exc.status == native.lib.PINMEM_EUNKNOWN_PTR
        assert "0x1000" in str(exc)
        assert "not a live mapping" in exc.detail
    else:  # pragma: no cover
        raise AssertionError("free of an unknown pointer did not raise")
