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

# Small UNet3D data, the images, one traced `original` and one traced `sleep` run, their
# timelines and how similar the emulation is to the real run. Prints the timeline HTML files.
demo: build
	@set -euo pipefail; \
	if [ ! -f $(DEMO_DATA)/manifest.json ]; then \
	  $(PY) cli.py datagen unet3d --out $(DEMO_DATA) --size 300MB --scale 0.5 --force; fi; \
	sync; echo 3 > /proc/sys/vm/drop_caches; \
	orig=$$($(PY) cli.py trace --workload unet3d --variant original --data $(DEMO_DATA) --epochs 1 --batch-size 2 --workers 2 --out $(DEMO_RUNS) | tail -n 1); \
	sync; echo 3 > /proc/sys/vm/drop_caches; \
	sleep=$$($(PY) cli.py trace --workload unet3d --variant sleep --data $(DEMO_DATA) --epochs 1 --batch-size 2 --workers 2 --out $(DEMO_RUNS) | tail -n 1); \
	$(PY) cli.py plot timeline $$orig $$sleep --out $$sleep/timeline-original-vs-sleep.html >/dev/null; \
	$(PY) cli.py compare $$orig $$sleep; \
	echo "timelines:"; \
	$(PY) cli.py plot timeline $$orig; \
	$(PY) cli.py plot timeline $$sleep

test: build
	CI=$${CI:-} $(PY) -m pytest -q

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean-runs:
	rm -rf $(DEMO_RUNS)
