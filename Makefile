# Two commands do all set-up on a fresh machine:
#   make train   -> creates .venv, installs lkat-lens (+ Debian chromium), trains lkat_micro on digits (CPU, ~4.5 min)
#   make test    -> the same set-up, then the CPU test suite (browser tests in headless chromium): its files spread over
#                   two processes (pytest-xdist), then the tests that assert a wall-clock budget alone
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.lkat-lens-installed
# torch is pinned to the build this workplace ships on disk; override on other machines.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
# Python's default: cache compiled modules. Where the environment turns it off (PYTHONDONTWRITEBYTECODE), every pytest
# process and every child a test starts compiles lkat-lens and the test modules from source again (and pytest rewrites
# each test module's asserts again). Back to back in a fresh clone on the 2-core machine (2026-11-29): collecting the
# suite took 13-14 s of CPU instead of 17-18, and tests/test_cli.py with tests/test_report.py (their CLI children)
# 29 s instead of 34.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup chromium train test test-gpu lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

setup: $(STAMP) chromium

chromium:  # Debian's chromium (kaleido's figure export) and chromium-driver (the explorer's browser tests)
	command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || \
		{ apt-get update && apt-get install -y chromium chromium-driver; }

train: setup
	$(BIN)/python -m lkat_lens.train $(ARGS)

test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m 'not gpu and not timed' $(ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest -q -m 'not gpu and timed' $(ARGS) || [ $$? -eq 5 ]

test-gpu: setup
	$(BIN)/python -m pytest -q -m gpu tests/gpu $(ARGS)

lint: setup  # style, formatting and the layer contract (pyproject's [tool.importlinter], docs/architecture.md)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
