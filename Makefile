# twintrace: `make demo` and `make test` set everything up themselves (run as root on
# Debian/Ubuntu). See README.md.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.lock | cksum | cut -d' ' -f1)
DEMO_DATA := data/unet3d-demo
DEMO_RUNS := runs

.PHONY: setup system venv build demo test lint clean-runs

setup: system venv

system:
	@sh tracing/setup-host.sh

venv: $(STAMP)

$(STAMP): requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	@rm -f $(VENV)/.installed-* && touch $@

build: setup
	$(PY) cli.py build

# Small UNet3D data, the images, then traced runs: instrumented, a sleep profile fitted to it on
# this host, original, sleep with that profile (and their similarity: the emulator's fidelity),
# and sleep emulating an A100. Prints the reports and the timeline HTML files (experiments/demo.sh).
demo: build
	PY=$(PY) DEMO_DATA=$(DEMO_DATA) DEMO_RUNS=$(DEMO_RUNS) bash experiments/demo.sh

# While the images build, tests/prepare.py compiles the ingest's kernels and builds the cluster's
# node image (the builds leave about half of the CPU idle); stopped if the build fails. The tests
# run one at a time (CONTRIBUTING.md: why not yet in two lanes).
test: setup
	@setsid $(PY) -m tests.prepare & prepare=$$!; trap 'kill -TERM -- -$$prepare 2>/dev/null; wait' EXIT; \
	$(PY) cli.py build && wait $$prepare
	CI=$${CI:-} $(PY) -m pytest -q

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean-runs:
	rm -rf $(DEMO_RUNS)
