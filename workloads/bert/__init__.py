"""BERT pre-training (MLPerf): TFRecord shards of tf.train.Example, transformer encoder."""
