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
# node image, and the tests that need no image (`-m "not integration"`, about 4 minutes of CPU)
# run: the builds leave much of the CPU idle. Their report is shown when the images are built;
# a failed build stops them both. Then the integration tests, one at a time (CONTRIBUTING.md: why
# not in two lanes yet), whether or not a test of the first part failed; `make test` fails if
# any did, and then repeats the first part's summary of failures last, where a log's tail shows it.
# Its last line gives when each part ended, counted from the start (CI's goal: 30 minutes).
UNIT_LOG := .cache/unit-tests.log

test: setup
	@mkdir -p .cache; \
	setsid $(PY) -m tests.prepare & prepare=$$!; \
	setsid env CI=$${CI:-} $(PY) -m pytest -q -m "not integration" > $(UNIT_LOG) 2>&1 & units=$$!; \
	trap 'kill -TERM -- -$$prepare -$$units 2>/dev/null; wait' EXIT; \
	$(PY) cli.py build && wait $$prepare || exit 1; \
	built=$$SECONDS; \
	echo "the tests that need no image ($(UNIT_LOG)):"; \
	wait $$units; unit_status=$$?; trap - EXIT; cat $(UNIT_LOG); \
	first=$$SECONDS; \
	CI=$${CI:-} $(PY) -m pytest -q -m integration; status=$$?; \
	if [ $$unit_status -ne 0 ]; then \
		sed -n '/short test summary info/,$$p' $(UNIT_LOG); \
		echo "make test: the tests that need no image failed (above, and in $(UNIT_LOG))"; \
		status=$$unit_status; \
	fi; \
	echo "make test: $$SECONDS s in all: the images and tests/prepare.py done at $$built s," \
		"the tests that need no image by $$first s, then the integration tests" \
		"$$((SECONDS - first)) s"; \
	exit $$status

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean-runs:
	rm -rf $(DEMO_RUNS)
