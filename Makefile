# Phalanx: two commands on a fresh machine — `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test docs-check bench bench-training bench-federated bench-distributed bench-decentralized lint typecheck install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first: its exact version takes the CPU wheel that is on local disk (DEVELOPERS.md); the package's own
# requirement is a range that this version satisfies, so pip installs nothing more for it. A changed C kernel
# (or setup.py) reinstalls, which rebuilds the extension in place: a stale build would run the old kernel.
$(STAMP): $(BIN)/python pyproject.toml setup.py src/phalanx/aggregators/_cwkernel.c src/phalanx/aggregators/_normkernel.c \
		src/phalanx/aggregators/_normkernel_narrow.h src/phalanx/aggregators/_sumkernel.c
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/phalanx run --out runs/default

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# TEST_WORKERS: pytest-xdist workers, each test file on one worker (a module's fixture, often a real run, is built
# once), the files that start real processes first (tests/conftest.py, LONG_FILES; xdist would otherwise order the
# files by their number of tests). Two where the machine has two cores or more, else one (a serial run: pytest
# alone); TEST_WORKERS=1 for a serial run anywhere.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -ge 2 ] && echo 2 || echo 1)
XDIST := $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder,)
test: lint typecheck
	$(BIN)/python -m pytest -q --durations=40 $(XDIST)

# Every output the README and docs/ quote under a `regenerate` marker, produced again and compared — the full tier
# too (studies and grids: long). The quick tier runs in `make test` (tests/test_docs_check.py).
docs-check: $(STAMP)
	$(BIN)/python scripts/docs_check.py --full

$(VENV)/.bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/pip install --quiet --no-deps byzfl==0.0.11
	$(BIN)/pip install --quiet --no-deps byzpy==0.1.4
	touch $(VENV)/.bench

bench: $(VENV)/.bench
	$(BIN)/python benchmarks/aggregators.py

bench-training: $(VENV)/.bench
	$(BIN)/python benchmarks/training.py

bench-federated: $(VENV)/.bench
	$(BIN)/python benchmarks/federated.py

bench-distributed: $(STAMP)
	$(BIN)/python benchmarks/distributed.py

bench-decentralized: $(STAMP)
	$(BIN)/python benchmarks/decentralized.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
