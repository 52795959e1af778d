# Entry points: `make demo` runs the demo, `make check` the fast checks; CI runs those,
# `make browser` (the console in headless Chromium) and `make test-vllm` (the gateway
# against real vLLM servers, which it installs and starts).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BROWSER_STAMP := $(VENV)/.browser-installed

.PHONY: demo check test test-vllm lint types tools browser screenshots

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -c constraints.txt -e . --group dev
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/speclane demo

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

types: $(STAMP)
	$(BIN)/mypy

# In parallel processes (docs/development.md, "Tests in parallel"): the tests mostly wait on
# loopback servers and subprocesses, so more workers than cores overlap the waiting. The
# `paced` tests (a live run held to replay's clock) run after the rest, one at a time.
TEST_WORKERS ?= 6
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "$(NOT_TIERS) and not paced"
	$(BIN)/python -m pytest -m "$(NOT_TIERS) and paced"
NOT_TIERS = not browser and not vllm

# promtool and a Prometheus server for the dashboard's queries (Debian's package, when missing)
tools:
	sh tests/deploy/promtool.sh

# A session fixture runs `speclane local-vllm up` (tests/vllm/conftest.py gives the first test
# the time a cold start needs). pytest's exit code 5 (nothing ran) fails the target.
test-vllm: $(STAMP)
	$(BIN)/python -m pytest -m vllm --timeout 300 tests/vllm

check: lint types tools test

$(BROWSER_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt --group browser
	touch $(BROWSER_STAMP)

# The ops console in Debian's headless Chromium (installed when missing), driven by Playwright.
browser: $(BROWSER_STAMP)
	sh tests/browser/chromium.sh
	$(BIN)/python -m pytest tests/browser -m browser

# The README's console screenshots, taken by the browser tests.
screenshots: $(BROWSER_STAMP)
	sh tests/browser/chromium.sh
	SPECLANE_SCREENSHOTS=docs/console $(BIN)/python -m pytest tests/browser -m browser
