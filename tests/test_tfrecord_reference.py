"""TensorFlow itself reads our BERT TFRecords: the proof that the format is right.

``tests/tfref/setup.sh`` installs tensorflow-cpu into its own ``.venv-tf`` (the first run
downloads ~275 MB); ``tests/tfref/read_tfrecords.py`` reads a generated dataset there with
``tf.data.TFRecordDataset`` (which checks both CRCs), parses every record with
``tf.io.parse_single_example`` and the MLPerf reference's FixedLenFeature spec, and prints a
summary that must equal ours: records per shard, every feature's sum, the first record, and the
record order of tf.data's interleave against :func:`workloads.bert.dataset.interleave`.

Without network access to install TensorFlow the test is skipped, except with CI=true, where it
fails (see tests/conftest.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from core.errors import UserError
from datagen.bert import BertGenParams, generate_bert
from tests.conftest import REPO, require
from workloads.bert.dataset import interleave
from workloads.bert.files import FEATURES, list_shards
from workloads.bert.records import iter_records, parse_example

pytestmark = pytest.mark.integration

TFREF = REPO / "tests" / "tfref"
PARAMS = BertGenParams(seq_length=128, max_predictions=20, records_per_file=25)
CYCLE = 3


@pytest.fixture(scope="module")
def tf_python() -> Path:
    """The python of .venv-tf, created by setup.sh if needed."""
    result = subprocess.run(
        ["bash", str(TFREF / "setup.sh")], capture_output=True, text=True, timeout=1800
    )
    require(result.returncode == 0, f"tests/tfref/setup.sh failed: {result.stderr.strip()[-2000:]}")
    return REPO / ".venv-tf" / "bin" / "python"


def fingerprint(input_ids: np.ndarray) -> str:
    """As read_tfrecords.py computes it."""
    return hashlib.sha256(np.asarray(input_ids, dtype="<i8").tobytes()).hexdigest()[:16]


def our_summary(data_dir: Path) -> dict:
    """The summary read_tfrecords.py prints, computed with our reader."""
    shards: dict[str, int] = {}
    values: dict[str, list[np.ndarray]] = {name: [] for name in FEATURES}
    first = None
    for path in list_shards(data_dir):
        count = 0
        for data in iter_records(path):
            example = parse_example(data, path.name, list(FEATURES))
            if first is None:
                first = {name: example[name].tolist() for name in FEATURES}
            for name in FEATURES:
                values[name].append(example[name])
            count += 1
        shards[path.name] = count
    sums = {
        name: math.fsum(np.concatenate(v).astype(float))
        if FEATURES[name][0] == "float"
        else int(np.concatenate(v).sum())
        for name, v in values.items()
    }
    order = [
        fingerprint(parse_example(data, path.name)["input_ids"])
        for path, _, data in interleave(list_shards(data_dir), CYCLE)
    ]
    return {"shards": shards, "sums": sums, "first": first, "interleave": order}


def test_tensorflow_reads_and_parses_generated_records(tf_python: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "bert"
    manifest = generate_bert(data_dir, 200_000, seed=11, workers=2, params=PARAMS)
    assert manifest["params"]["shards"] >= 4  # several shards, the last one shorter
    result = subprocess.run(
        [
            str(tf_python),
            str(TFREF / "read_tfrecords.py"),
            str(data_dir),
            "--seq-length",
            str(PARAMS.seq_length),
            "--max-predictions",
            str(PARAMS.max_predictions),
            "--cycle-length",
            str(CYCLE),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = json.loads(result.stdout)
    assert theirs["tensorflow"].startswith("2.")
    ours = our_summary(data_dir)
    assert theirs["shards"] == ours["shards"]
    assert sum(theirs["shards"].values()) == manifest["params"]["records"]
    assert theirs["sums"] == ours["sums"]
    assert theirs["first"] == ours["first"]
    assert len(theirs["interleave"]) == manifest["params"]["records"]
    assert theirs["interleave"] == ours["interleave"]


def test_tensorflow_rejects_what_we_reject(tf_python: Path, tmp_path: Path) -> None:
    # A flipped data byte: our reader names the file and offset; TensorFlow refuses it too,
    # so the CRCs we write are the ones TensorFlow checks.
    data_dir = tmp_path / "bert"
    generate_bert(data_dir, 30_000, seed=3, workers=1, params=PARAMS)
    path = list_shards(data_dir)[0]
    data = bytearray(path.read_bytes())
    data[40] ^= 0x01
    path.write_bytes(bytes(data))
    script = (
        "import os, sys; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
        "import tensorflow as tf\n"
        "try:\n"
        "    sum(1 for _ in tf.data.TFRecordDataset(sys.argv[1]))\n"
        "except tf.errors.DataLossError:\n"
        "    print('DataLossError')\n"
    )
    result = subprocess.run(
        [str(tf_python), "-c", script, str(path)], capture_output=True, text=True, timeout=600
    )
    assert result.stdout.strip() == "DataLossError", result.stderr[-3000:]
    with pytest.raises(
        UserError, match=rf"{path} is corrupt at byte 0 \(bad CRC of the record data\)"
    ):
        list(iter_records(path))
