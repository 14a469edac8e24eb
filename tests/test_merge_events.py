"""``tracing.ingest.merge_events``: the hosts' events of a run across nodes merged by time,
streamed a batch at a time, exactly as one stable sort of every part would order them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracing import ingest


def _part(path: Path, host: str, ts: list[int]) -> Path:
    """An events file of ``host`` with rows at ``ts`` (sorted), ``pid`` numbering them."""
    columns = {}
    for field in ingest.EVENTS_SCHEMA:
        if field.name == "ts_ns":
            columns[field.name] = pa.array(ts, field.type)
        elif field.name == "host":
            columns[field.name] = pa.array([host] * len(ts), field.type)
        elif field.name == "pid":
            columns[field.name] = pa.array(range(len(ts)), field.type)
        elif field.nullable:
            columns[field.name] = pa.nulls(len(ts), field.type)
        elif pa.types.is_dictionary(field.type) or pa.types.is_string(field.type):
            columns[field.name] = pa.array(["read"] * len(ts)).cast(field.type)
        else:
            columns[field.name] = pa.array(np.zeros(len(ts), dtype=np.int64)).cast(field.type)
    pq.write_table(pa.table(columns, schema=ingest.EVENTS_SCHEMA), path)
    return path


@pytest.mark.parametrize("batch_rows", [1, 2, 7, 1000])
def test_the_streamed_merge_is_one_stable_sort_of_the_parts(tmp_path: Path, batch_rows: int):
    rng = np.random.default_rng(3)
    parts = []
    for i in range(4):
        ts = np.sort(rng.integers(0, 50, size=40 + 10 * i)).tolist()  # many ties, within and across
        parts.append(_part(tmp_path / f"node-{i}.parquet", f"node-{i}", ts))
    parts.append(_part(tmp_path / "empty.parquet", "node-9", []))
    ingest.merge_events(parts, tmp_path / "events.parquet", batch_rows=batch_rows)
    merged = pq.read_table(tmp_path / "events.parquet")
    whole = pa.concat_tables(pq.read_table(p, schema=ingest.EVENTS_SCHEMA) for p in parts)
    expected = whole.take(pa.compute.sort_indices(whole, sort_keys=[("ts_ns", "ascending")]))
    key = ("ts_ns", "host", "pid")
    assert merged.select(key).to_pylist() == expected.select(key).to_pylist()
    assert merged.schema == ingest.EVENTS_SCHEMA


def test_no_parts_merge_to_an_empty_events_file(tmp_path: Path) -> None:
    ingest.merge_events([], tmp_path / "events.parquet")
    table = pq.read_table(tmp_path / "events.parquet")
    assert table.num_rows == 0 and table.schema == ingest.EVENTS_SCHEMA
