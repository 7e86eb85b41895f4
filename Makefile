# templm: `make demo` and `make test` each set up .venv when it is missing, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# templm and its dependencies (what make demo needs); then the test extra (pytest, the GCS emulator, Beam) for make test
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
DEMO_DIR ?= runs/demo
# XLA's CPU runtime allocates a step's large buffers afresh each time; glibc malloc backed by transparent huge pages
# touches them in 2 MB pages instead of 4 KB ones (fewer page faults, faster CPU steps: BENCHMARKS.md). glibc older
# than 2.35 ignores it.
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

.PHONY: venv demo test test-fast test-network bench bench-device clean

$(STAMP): setup.py
	@test -x $(BIN)/python || $(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
	  "templm needs Python 3.11 or newer (its pinned jax 0.10.2 does), and $(PYTHON) is " + sys.version.split()[0] + \
	  ": make ... PYTHON=python3.11")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install -qq -e '.[test]'
	touch $(TEST_STAMP)

venv: $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/templm reproduce --preset smoke --out $(DEMO_DIR)

# The whole suite, with its 25 slowest tests; test-fast leaves out the end-to-end runs of the command line (tests
# marked e2e) and the tests that train or build for seconds each (marked slow: tests/conftest.py's SLOW). Neither reaches the network: the tests that ask the package index are test-network's. Two pytest-xdist
# workers, a test file each at a time (its module fixtures built once): measured faster than one process on two cores
# (BENCHMARKS.md, "The suite"); TEST_WORKERS=0 runs it in one process. The files go out in collection order, which
# tests/conftest.py starts with the slowest files (SLOWEST_FILES), so that the two workers end together.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q $(XDIST) --durations=25 -m "not network" tests

test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest -q $(XDIST) --durations=10 -m "not e2e and not slow and not network" tests

test-network: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -m network tests

# Benchmarks (BENCHMARKS.md): each tool prints one JSON line per figure; they are appended to $(BENCH_OUT).
# The PyTorch peer of bench_t5 needs the bench extra (`$(BIN)/python -m pip install -e '.[bench]'`), else skipped.
BENCH_OUT ?= bench_results.jsonl
bench: $(TEST_STAMP)
	bash -o pipefail -c '$(BIN)/python tools/bench_t5.py | tee -a $(BENCH_OUT)'
	bash -o pipefail -c '$(BIN)/python tools/bench_txl.py | tee -a $(BENCH_OUT)'
	bash -o pipefail -c '$(BIN)/python tools/bench_data.py | tee -a $(BENCH_OUT)'
	bash -o pipefail -c '$(BIN)/python tools/bench_checkpoint.py | tee -a $(BENCH_OUT)'
	bash -o pipefail -c '$(BIN)/python tools/bench_beam.py | tee -a $(BENCH_OUT)'
	bash -o pipefail -c '$(BIN)/python tools/bench_step_packing.py | tee -a $(BENCH_OUT)'

# On a machine with a GPU or TPU (and a jax that sees it): the accelerator figures, within 10 minutes.
bench-device:
	bash tools/bench_device.sh

clean:
	rm -rf $(VENV) runs
