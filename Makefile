# kvpool -- build, test and run.
#
#   make            build libpinmem and its cffi module into kvpool/native/
#   make check      build and run libpinmem's C test program
#   make test       install what a fresh machine lacks, build, make check, pytest
#   make demo       run the main job: the capability report, then a verified put/get round trip
#   make bench      kvpool's benchmarks against naive baselines (kvpool bench);
#                   options in BENCH_ARGS, e.g. make bench BENCH_ARGS=--quick
#   make lint       ruff check + ruff format --check
#
# PYTHON selects the interpreter: make test PYTHON=/path/to/venv/bin/python

PYTHON ?= python3
CC ?= cc
PIP := $(PYTHON) -m pip
BENCH_ARGS ?=
BUILD := libpinmem/build
CFLAGS_TEST := -O2 -Wall -Wextra -Werror -std=gnu11 -pthread
HEADERS := $(wildcard libpinmem/*.h)

.PHONY: all lib check test deps demo bench lint clean fake-cudart

all: lib

# build.py is incremental (it compares timestamps), so it always runs.
lib:
	$(PYTHON) build.py --quiet

fake-cudart: $(BUILD)/libfakecudart.so

$(BUILD)/libfakecudart.so: libpinmem/tests/fake_cudart.c
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_TEST) -fPIC -shared -o $@ $<

$(BUILD)/test_pinmem: libpinmem/tests/test_pinmem.c $(HEADERS) $(BUILD)/libpinmem.so
	$(CC) $(CFLAGS_TEST) -o $@ $< -L$(BUILD) -lpinmem -Wl,-rpath,$(abspath $(BUILD)) -ldl

$(BUILD)/libpinmem.so: lib

check: lib $(BUILD)/test_pinmem $(BUILD)/libfakecudart.so
	$(BUILD)/test_pinmem $(abspath $(BUILD)/libfakecudart.so)

# torch first and pinned: a bare "torch" would pull a multi-GB CUDA build.
deps:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[test]"

test: deps lib check fake-cudart
	$(PYTHON) -m pytest tests

demo: deps lib
	$(PYTHON) -m kvpool info
	$(PYTHON) -m kvpool demo

bench: lib
	$(PYTHON) -m kvpool bench $(BENCH_ARGS)

lint:
	ruff check .
	ruff format --check .

clean:
	rm -rf $(BUILD) kvpool/native/libpinmem.so kvpool/native/_pinmem_ffi.py build dist *.egg-info
