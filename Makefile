# The commands a person runs. `make demo` and `make test` set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install system-deps demo test test-integration lint format typecheck check bench bench-quick clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

system-deps:
	@bash scripts/system-deps.sh

demo: install
	$(BIN)/sandbox demo

test: install system-deps
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-integration: install
	$(BIN)/python -m pytest -q -m integration tests/integration $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: install
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

typecheck: install
	$(BIN)/mypy

check: lint typecheck test

bench: install system-deps
	$(BIN)/python -m bench

bench-quick: install system-deps
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache bench-results
