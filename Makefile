# tpufleet: two commands for a newcomer, `make demo` and `make test`. Both bootstrap .venv themselves.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tpufleet-installed
TORCH_STAMP := $(VENV)/.tpufleet-torch-installed
UV_PIN := uv==0.13.8
UV     := $(BIN)/uv pip install --python $(BIN)/python
# make test fails, never skips, when a service the tests start is missing
REQUIRE := TPUFLEET_REQUIRE_POSTGRES=1 TPUFLEET_REQUIRE_CHROMIUM=1 TPUFLEET_REQUIRE_PROMETHEUS=1 TPUFLEET_REQUIRE_TORCH=1
.PHONY: venv torch bytecode test lint lint-beside tests-side-by-side services unit host integration demo bench clean help

help:
	@echo "make demo   - start an emulated TPU fleet and run the main job end to end"
	@echo "make test   - ruff, mypy, import-linter contracts and the whole pytest suite"
	@echo "make venv   - create or update .venv with the pinned dependencies"
	@echo "make torch  - add PyTorch and PyTorch/XLA to .venv (make test does)"
	@echo "make bench  - run the benchmarks in bench/ (not part of the tests)"

# The stamp is rebuilt only when the pins or the package metadata change, so a second run is instant.
# uv installs the pins (the same 135 packages pip would) in ~40 s where pip took ~90 s, compiling
# their bytecode as pip does (this environment's PYTHONDONTWRITEBYTECODE=1 would otherwise make
# every process compile what it imports).
$(STAMP): requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 (or run: make PYTHON=/path/to/python3.11)"; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(UV_PIN)
	$(UV) --quiet --compile-bytecode -r requirements.lock
	$(UV) --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)

venv: $(STAMP)

# PyTorch and PyTorch/XLA (the `torch` extra, requirements-torch.lock): `make test` installs them so
# that the PyTorch tests always run; `make demo` does without them. From PyPI they are about 4 GB (the
# CUDA libraries torch's wheel needs), ~30 s to fetch here; from uv's cache a few seconds.
$(TORCH_STAMP): $(STAMP) requirements-torch.lock
	$(UV) --quiet --compile-bytecode -r requirements.lock -r requirements-torch.lock
	@touch $@

torch: $(TORCH_STAMP)

# This machine's environment sets PYTHONDONTWRITEBYTECODE=1, so a process never caches what it
# compiles: every `tpufleet` CLI call, runner actor and host script the tests start would compile
# tpufleet's modules again (~0.2 s of CPU each). Compiling them once here (the installed packages
# were compiled by pip) is read by every later process; a module edited since is compiled in memory.
bytecode: venv
	@$(BIN)/python -m compileall -q src

# mypy keeps its cache beside uv's, one for every checkout of this user, not in the checkout: a cold
# check of src and the libraries it reads is ~31 CPU-s, a warm one ~1, and a fresh clone (CI) at a
# new path finds it warm (a clone's first check with another checkout's cache: ~2 CPU-s). The cache
# is mypy's own incremental mode (each entry checked against its source's hash, written by rename):
# a stale or missing entry costs time, never a wrong answer.
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tpufleet/mypy-cache

lint: venv
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy --cache-dir "$(MYPY_CACHE)" src
	$(BIN)/lint-imports

# What the tests need beyond Python packages (PostgreSQL, Chromium, ...): on a fresh machine apt-get
# fetches them, which `make test` does at the same time as it builds .venv and lints (make -j2).
services:
	./scripts/ensure-test-services.sh

test:
	@$(MAKE) --no-print-directory -j2 services bytecode torch
	@# The linters (niced) beside the tests, three pytest processes side by side (side-by-side-tests.sh):
	@# the host, unit and in-memory conformance tests (niced, a test at a time on three workers; no two
	@# host tests that sweep or scan processes overlap, see tests/host/conftest.py), the tests that
	@# share an emulated Ray fleet (with the conformance suites' Ray cases) and those that start a
	@# fleet of their own, each on two workers a file at a time. The fleet streams keep both cores
	@# busy, and the niced tests, yielding to the fleets' processes, run mostly once those are done:
	@# the run takes about its CPU time over two (tests/unit/test_test_layout.py keeps the tests in
	@# place by kind).
	@$(MAKE) --no-print-directory -j2 lint-beside tests-side-by-side

lint-beside: venv
	@nice -n 10 $(MAKE) --no-print-directory lint

tests-side-by-side: bytecode
	$(REQUIRE) ./scripts/side-by-side-tests.sh $(BIN)/python

unit: venv
	$(BIN)/python -m pytest tests/unit tests/conformance -m "not integration" -q

host: venv
	$(BIN)/python -m pytest tests/host -q

integration: venv
	$(BIN)/python -m pytest tests/integration tests/conformance -m integration -q

demo: bytecode
	$(BIN)/tpufleet demo

bench: venv
	@for b in bench/[!_]*.py; do echo "== $$b"; $(BIN)/python $$b || exit $$?; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info src/*.egg-info
