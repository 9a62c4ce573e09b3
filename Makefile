# The commands a person runs. `make demo` and `make test` set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
CONSTRAINTS := constraints.txt
# The demo's own venv: the package and its runtime dependencies only (pyte, which brings
# wcwidth), no extras and no dev tools, so a first `make demo` installs ~30 MB, not ~600.
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed-stamp
# A second venv with the newest SDK releases the extras allow (the main one stays pinned).
LATEST_VENV := .venv-latest
SDK_TESTS := tests/backends/test_e2b.py tests/backends/test_modal.py tests/backends/test_daytona.py
PYTEST_ARGS ?=

.PHONY: install system-deps demo test test-fast test-integration test-latest-sdks test-agents-sdk lint format typecheck check bench bench-quick mutation clean runner test-runner

install: $(STAMP) runner

# setup.py and the C source too: the editable install builds the extension in place.
$(STAMP): pyproject.toml $(CONSTRAINTS) setup.py $(wildcard src/sandbox/_native/*.c)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

# The runner (docs/runner.md): a static binary built from runner/ with cargo, copied
# into the package as package data. Optional: without cargo (or when the build fails)
# this warns and goes on, and the backends keep their per-exec path.
RUNNER_ARCH := $(shell uname -m)
RUNNER_TARGET := $(RUNNER_ARCH)-unknown-linux-gnu
RUNNER_BIN := src/sandbox/runner/bin/sandbox-runner-linux-$(RUNNER_ARCH)

runner:
	@if ! command -v cargo >/dev/null 2>&1; then \
		echo "warning: cargo not found: the sandbox runner is not built (the backends keep their per-exec path)"; \
	elif RUSTFLAGS='-C target-feature=+crt-static' cargo build --quiet --release --locked \
			--target $(RUNNER_TARGET) --manifest-path runner/Cargo.toml; then \
		mkdir -p $(dir $(RUNNER_BIN)) && \
		cp runner/target/$(RUNNER_TARGET)/release/sandbox-runner $(RUNNER_BIN).tmp && \
		mv -f $(RUNNER_BIN).tmp $(RUNNER_BIN); \
	else \
		echo "warning: the sandbox runner did not build (see above): the backends keep their per-exec path"; \
	fi

# The runner's own unit tests (frames, ring, arguments, payloads): quick, no processes.
test-runner:
	cargo test --quiet --manifest-path runner/Cargo.toml

system-deps:
	@bash scripts/system-deps.sh

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/sandbox demo

# Editable, like .venv: the demo runs the sources as they are now.
$(DEMO_STAMP): pyproject.toml
	@echo "installing sandbox and its one runtime dependency, pyte (with wcwidth), into $(DEMO_VENV): no extras, no dev tools ..."
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --disable-pip-version-check -e .
	touch $(DEMO_STAMP)

# The suite on parallel workers (pytest-xdist; TEST_WORKERS=0 runs it in one process).
# Most tests wait on processes, sockets and the engine rather than compute, so more
# workers than cores pay (docs/testing.md). `--dist loadgroup`: the tests marked
# `xdist_group` run on one worker, one after the other (tests/conftest.py says why).
TEST_WORKERS ?= 4
test: install system-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The inner loop, in under a minute: the unit layer (output, session, toolkit, workspace,
# testing) on unix_local only: no docker, and not the conformance checker's own run of
# the whole suite (make test runs both).
FAST_TESTS := tests/output tests/session tests/toolkit tests/workspace tests/testing
test-fast: install
	SANDBOX_CONFORMANCE_BACKENDS=unix_local $(BIN)/python -m pytest -q -n 2 -k "not docker" \
		--ignore=tests/testing/test_conformance_checker.py $(FAST_TESTS) $(PYTEST_ARGS)

test-integration: install
	$(BIN)/python -m pytest -q -m integration tests/integration $(PYTEST_ARGS)

# The newest release of each SDK within the extras' ranges, in $(LATEST_VENV): the drift
# checks and the SDK backends' tests (and their conformance runs) against it.
test-latest-sdks:
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[dev]'
	$(LATEST_VENV)/bin/python -m pip list 2>/dev/null | grep -iE '^(e2b|modal|daytona|blaxel|docker|mcp) '
	SANDBOX_CONFORMANCE_BACKENDS=e2b,modal,daytona $(LATEST_VENV)/bin/python -m pytest -q \
		$(SDK_TESTS) tests/test_conformance.py $(PYTEST_ARGS)

# The OpenAI Agents SDK's own sandbox tests (its sdist, the version constraints.txt pins)
# against our SandboxClient on unix_local and docker (tests/agents_sdk_upstream/).
test-agents-sdk: install system-deps
	bash tests/agents_sdk_upstream/run.sh $(PYTEST_ARGS)

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

# The share of deliberate bugs the unit tests catch, per core module (docs/testing.md).
# Not part of `make test`: it runs the tests once per mutant. MUTATION_ARGS="settle --survivors"
mutation: install
	$(BIN)/python tools/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(LATEST_VENV) .pytest_cache .mypy_cache .ruff_cache bench-results
