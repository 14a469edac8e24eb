#!/usr/bin/env bash
# Create <repo>/.venv-tf: a virtual environment holding TensorFlow (CPU) and nothing of ours, for
# tests/test_tfrecord_reference.py, which checks our BERT TFRecords with TensorFlow's own reader.
# TensorFlow stays out of the main .venv on purpose: it is ~275 MB of download, pins its own numpy
# and protobuf, and no workload may depend on it.
#
# Idempotent: does nothing when .venv-tf already imports tensorflow. Quiet on success; on failure
# prints one line saying what to do, then the tail of pip's log, and exits 1.
# Usage: tests/tfref/setup.sh   (PYTHON=/path/to/python3 to choose the interpreter)
set -euo pipefail

TF_VERSION=2.21.0
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$repo/.venv-tf"
python="${PYTHON:-python3}"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import tensorflow" >/dev/null 2>&1; then
  exit 0
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! {
  "$python" -m venv "$venv" &&
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      "tensorflow-cpu==$TF_VERSION" &&
    "$venv/bin/python" -c "import tensorflow"
} >"$log" 2>&1; then
  echo "tests/tfref/setup.sh: could not install tensorflow-cpu==$TF_VERSION into $venv:" \
    "check that '$python -m venv' works and PyPI is reachable, then rerun it" \
    "(delete $venv first if it is broken)" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
