"""Read a BERT TFRecord directory with TensorFlow itself and print a JSON summary.

Run by ``.venv-tf/bin/python`` (see setup.sh), never by the main venv: it imports tensorflow
and nothing of twintrace. tests/test_tfrecord_reference.py compares its output with the same
summary computed by our reader, which proves our files are what TensorFlow reads.

    read_tfrecords.py DIR [--seq-length 512] [--max-predictions 76] [--cycle-length 3]

Files are ``DIR/part-*`` in name order, read with ``tf.data.TFRecordDataset`` (TensorFlow checks
both CRCs) and parsed with ``tf.io.parse_single_example`` and the MLPerf BERT reference's
FixedLenFeature spec. Output: TensorFlow's version; records per shard; per feature, the sum of
all values (exact: math.fsum for floats) and the values of the first record; and the
fingerprints (first 16 hex digits of sha256 of input_ids as little-endian int64) of every
record in the order of ``interleave(TFRecordDataset, cycle_length, block_length=1)``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # keep TensorFlow's start-up chatter off stderr

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def feature_spec(seq_length: int, max_predictions: int) -> dict[str, tf.io.FixedLenFeature]:
    """The reference's ``name_to_features`` (MLCommons training, language_model/tensorflow/bert)."""
    return {
        "input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def fingerprint(input_ids: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(input_ids, dtype="<i8").tobytes()).hexdigest()[:16]


def summarize(data_dir: Path, seq_length: int, max_predictions: int, cycle_length: int) -> dict:
    files = sorted(str(p) for p in data_dir.glob("part-*"))
    if not files:
        raise SystemExit(f"{data_dir} has no part-* files")
    spec = feature_spec(seq_length, max_predictions)

    def parse(record: tf.Tensor) -> dict[str, tf.Tensor]:
        return tf.io.parse_single_example(record, spec)

    shards: dict[str, int] = {}
    sums: dict[str, list] = {name: [] for name in spec}
    first: dict[str, list] | None = None
    for path in files:
        count = 0
        for example in tf.data.TFRecordDataset(path).map(parse).as_numpy_iterator():
            if first is None:
                first = {name: example[name].tolist() for name in spec}
            for name in spec:
                sums[name].append(example[name])
            count += 1
        shards[Path(path).name] = count
    totals = {
        name: math.fsum(np.concatenate(v).astype(float))
        if spec[name].dtype == tf.float32
        else int(np.concatenate(v).sum())
        for name, v in sums.items()
    }
    interleaved = (
        tf.data.Dataset.from_tensor_slices(files)
        .interleave(tf.data.TFRecordDataset, cycle_length=cycle_length, block_length=1)
        .map(parse)
    )
    order = [fingerprint(e["input_ids"]) for e in interleaved.as_numpy_iterator()]
    return {
        "tensorflow": tf.__version__,
        "shards": shards,
        "sums": totals,
        "first": first,
        "interleave": order,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--max-predictions", type=int, default=76)
    parser.add_argument("--cycle-length", type=int, default=3)
    args = parser.parse_args()
    summary = summarize(args.data_dir, args.seq_length, args.max_predictions, args.cycle_length)
    json.dump(summary, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
