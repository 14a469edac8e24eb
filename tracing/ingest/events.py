"""Writing events.parquet: the sink, :func:`write_events`, :func:`merge_events` (hosts) and
:func:`build_events` (in memory)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.atomic import atomic_path
from tracing.ingest.merge import _Merge
from tracing.ingest.schema import (
    _COMPRESSION,
    _DELTA_ENCODED,
    _ENCODED,
    _WRITE_SCHEMA,
    COMPRESSION,
    EVENTS_SCHEMA,
    REORDER_NS,
    ROW_GROUP_ROWS,
    WRITE_AHEAD,
)
from tracing.ingest.stats import EventTotals, ParseStats


class _ParquetSink:
    """Writes tables of events (_WRITE_SCHEMA) to a Parquet file, a row group each, on a thread
    (the writer releases the GIL). The string columns go in as dictionaries (written as they
    are, no string hashed), and the file's Arrow schema is EVENTS_SCHEMA, so that readers get
    strings."""

    def __init__(self, path: Path) -> None:
        self.writer = pq.ParquetWriter(
            path,
            _WRITE_SCHEMA,
            compression={name: _COMPRESSION.get(name, COMPRESSION) for name in _WRITE_SCHEMA.names},
            use_dictionary=["kind", *_ENCODED],
            column_encoding=_DELTA_ENCODED,
            write_statistics=["ts_ns", "pid"],
            dictionary_pagesize_limit=1 << 30,
            write_batch_size=1 << 16,
            data_page_version="2.0",  # levels not compressed: a few percent faster
            store_schema=False,
        )
        self.channel: queue.Queue = queue.Queue(maxsize=WRITE_AHEAD)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="twintrace-ingest-writer")
        self.thread.start()

    def _run(self) -> None:
        while True:
            table = self.channel.get()
            if self.error is not None:
                if table is None:
                    return
                continue  # drain after a failure
            try:
                if table is None:
                    self.writer.add_key_value_metadata({"ARROW:schema": _ARROW_SCHEMA})
                    self.writer.close()
                    return
                self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
            except BaseException as exc:
                self.error = exc
                if table is None:
                    return

    def put(self, table: pa.Table) -> None:
        if self.error is not None:
            raise self.error
        if table.schema != _WRITE_SCHEMA:
            # rows of a written file (late rows put in place)
            for name in _ENCODED:
                at = table.schema.get_field_index(name)
                column = pc.dictionary_encode(table.column(name)).cast(
                    _WRITE_SCHEMA.field(name).type
                )
                table = table.set_column(at, _WRITE_SCHEMA.field(name), column)
            table = table.combine_chunks()
        self.channel.put(table)

    def close(self) -> None:
        self.channel.put(None)
        self.thread.join()
        if self.error is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
            raise self.error


def _arrow_schema_metadata(schema: pa.Schema) -> bytes:
    """The ``ARROW:schema`` key of a Parquet file written by pyarrow with ``schema``."""
    import base64

    return base64.b64encode(schema.serialize().to_pybytes())


_ARROW_SCHEMA = _arrow_schema_metadata(EVENTS_SCHEMA)


def _merged(sorted_batches: Iterator[pa.RecordBatch], late: pa.Table) -> Iterator[pa.Table]:
    """Tables of ``sorted_batches`` (in time order) with the rows of ``late`` (sorted) put in
    their place; ties: the rows in order first."""
    late_ts = late.column("ts_ns").to_numpy()
    at = 0
    for batch in sorted_batches:
        table = pa.Table.from_batches([batch])
        if at < len(late_ts) and len(table):
            upto = int(np.searchsorted(late_ts, table.column("ts_ns")[-1].as_py(), side="left"))
            if upto > at:
                both = pa.concat_tables([table, late.slice(at, upto - at)])
                order = np.argsort(both.column("ts_ns").to_numpy(), kind="stable")
                table = both.take(pa.array(order))
                at = upto
        yield table
    if at < len(late_ts):
        yield late.slice(at)


def _late_table(merge: _Merge) -> pa.Table:
    late = pa.concat_tables(merge.late)
    order = np.argsort(late.column("ts_ns").to_numpy(), kind="stable")
    return late.take(pa.array(order))


def write_events(
    raw_dir: Path,
    path: Path,
    roots: Mapping[int, str] | None = None,
    window_ns: int = REORDER_NS,
    host: str | None = None,
    shift_ns: int = 0,
    progress: Callable[[int], None] | None = None,
) -> tuple[EventTotals, ParseStats]:
    """Parse every raw tracer file of a run into ``path`` (events.parquet, sorted by time),
    streaming: memory stays bounded whatever the trace's length. Returns what the summary
    needs (:func:`summarize`) and what the parser skipped. ``progress`` hears the rows written
    so far after each round.

    ``roots`` maps each container's first process (host pid) to its role, for the
    ``container`` column; None (raw files without a manifest) leaves the column null.
    ``host``: the ``host`` column; ``shift_ns``: added to every time (the host's clock offset
    to the coordinator's, negated)."""
    stats = ParseStats()
    merge = _Merge(Path(raw_dir), roots, stats, window_ns, host, shift_ns)
    with atomic_path(path) as tmp:
        sink = _ParquetSink(tmp)
        try:
            written = 0
            for table in merge.tables():
                sink.put(table)
                written += table.num_rows
                if progress is not None:
                    progress(written)
        finally:
            sink.close()
        if merge.late:  # rows later than the window: a second pass puts them in their place
            with atomic_path(tmp) as fixed:
                sink = _ParquetSink(fixed)
                try:
                    source = pq.ParquetFile(tmp)
                    for table in _merged(source.iter_batches(ROW_GROUP_ROWS), _late_table(merge)):
                        sink.put(table)
                finally:
                    sink.close()
    return merge.event_totals(), stats


#: Rows read from each host's events file at a time by :func:`merge_events`.
MERGE_BATCH_ROWS = 32 * 1024


def merge_events(parts: Sequence[Path], path: Path, batch_rows: int = MERGE_BATCH_ROWS) -> None:
    """Several hosts' events files (each sorted by time, on one clock) as one ``path``, sorted
    by time (ties: in the parts' order, as one stable sort of them all), row groups of about
    :data:`ROW_GROUP_ROWS`. Streamed: each part is read ``batch_rows`` rows at a time, and the
    rows before the earliest last time among the parts still being read are final (no part
    has an earlier row to come), so memory grows with the number of parts, not with their
    rows (bench/cluster_merge.py)."""
    readers = [pq.ParquetFile(part).iter_batches(batch_rows) for part in parts]
    pending = [EVENTS_SCHEMA.empty_table() for _ in parts]  # read, not yet written, per part
    live = list(range(len(parts)))

    def read_on(i: int) -> None:
        batch = next(readers[i], None)
        if batch is None:
            live.remove(i)
        else:
            more = pa.Table.from_batches([batch]).cast(EVENTS_SCHEMA)
            pending[i] = pa.concat_tables([pending[i], more]) if pending[i].num_rows else more

    def last(i: int) -> int:
        return pending[i]["ts_ns"][-1].as_py()

    with atomic_path(path) as tmp:
        sink = _ParquetSink(tmp)
        try:
            out: list[pa.Table] = []
            while True:
                for i in list(live):  # every part being read has rows in hand
                    while i in live and not pending[i].num_rows:
                        read_on(i)
                if not live and not any(t.num_rows for t in pending):
                    break
                bound = min((last(i) for i in live), default=None)
                taken = []
                for i, table in enumerate(pending):
                    n = table.num_rows
                    if bound is not None and n:
                        n = pc.sum(pc.less(table["ts_ns"], bound)).as_py() or 0
                    if n:
                        taken.append(table.slice(0, n))
                        pending[i] = table.slice(n)
                if taken:
                    chunk = pa.concat_tables(taken)
                    out.append(chunk.take(pc.sort_indices(chunk, [("ts_ns", "ascending")])))
                    if sum(t.num_rows for t in out) >= ROW_GROUP_ROWS:
                        sink.put(pa.concat_tables(out))
                        out = []
                for i in list(live):  # the parts at the bound read on
                    if pending[i].num_rows and last(i) == bound:
                        read_on(i)
            if out:
                sink.put(pa.concat_tables(out))
        finally:
            sink.close()


def build_events(
    raw_dir: Path,
    roots: Mapping[int, str] | None = None,
    window_ns: int = REORDER_NS,
) -> tuple[pa.Table, ParseStats]:
    """Parse every raw tracer file of a run into one events table sorted by time, in memory
    (:func:`write_events` writes the same rows to a file, streaming)."""
    stats = ParseStats()
    merge = _Merge(Path(raw_dir), roots, stats, window_ns)
    tables = [table.cast(EVENTS_SCHEMA) for table in merge.tables()]
    if merge.late:
        batches = (b for t in tables for b in t.to_batches())
        tables = list(_merged(batches, _late_table(merge)))
    if not tables:
        return EVENTS_SCHEMA.empty_table(), stats
    return pa.concat_tables(tables).combine_chunks(), stats
