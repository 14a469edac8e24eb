"""Turn a run's raw tracer output into events.parquet, samples.parquet and phases.parquet.

The events are streamed: :func:`write_events` never holds a whole trace in memory, so an hour of
a busy container ingests in a few hundred MiB. Its stages, each on the time order of the trace:

1. **Parse** (a reader thread, started first). ``raw/syscalls.txt`` is read in ~8 MB blocks cut
   at line ends and each block is parsed by one compiled pass (numba,
   :func:`~tracing.ingest.parse_kernels._parse_syscall_block`; names and paths scanned 8 bytes at a time): the numeric
   fields, the derived columns (an openat's descriptor, bytes, offset), the call kind and
   thread name as small integer codes, an openat's path copied aside, the aggregated rows
   (``@agg`` lines, :mod:`tracing.aggregates`), "Lost N events" lines, and the lines that are
   no events (bpftrace's "Attaching N probes", "READY", blank lines, a line cut short when
   bpftrace was stopped). The block's rows are then ordered by time there (a stable sort of a
   nearly sorted column). ``raw/block.txt`` is parsed in blocks too and ``raw/cache.txt``
   whole, by compiled passes of their own; ``raw/proc.txt`` (a few lines) by pyarrow's CSV
   reader.
2. **Merge** in time order, in rounds. bpftrace's per-CPU buffers deliver lines slightly out of
   order and the aggregated rows are printed up to ~300 ms after their last call, so a row is
   released once every streamed file has reached a time :data:`REORDER_NS` later. The rows
   stay where they were parsed (:class:`_Part`, in time order each): a round is a range of
   each part, merged by the join as it goes (ties keep the file order, syscalls before
   aggregated rows, block, cache and process rows). A line later than the window (never seen
   in real traces) is still kept: it is put in its place by a final pass over the written file.
3. **Join** each fd-based call to the path of its descriptor (:func:`_join_round`, one compiled
   pass in time order over a (pid, fd) -> path table carried from round to round): an openat
   names the descriptor it returns, a successful close unnames it, a dup (dup, dup2, dup3,
   fcntl F_DUPFD) makes the new descriptor a copy of the old one, and a fork gives the child a
   copy of its parent's table (descriptors are inherited). An aggregated row is resolved like
   a call traced one by one at its ``ts_ns``; its ``comm`` is that of the latest line of its
   thread. The join writes the columns of events.parquet and adds each round to the
   :class:`EventTotals` the summary needs.
4. **Write** a row group per round (a writer thread) from the joined columns, no copy: the
   strings are dictionaries of codes (thread names, devices, containers; a path is the code of
   one of the round's distinct paths, ``join_kernels._distinct_paths``), times and latencies are
   delta-encoded, the rest LZ4-compressed, in version 2 data pages.

:func:`build_events` runs the same stages into one in-memory table (tests, small traces).
bench/trace_ingest.py measures the whole against a bare ``pandas.read_csv`` of the same file.

The package, by stage (each module's doc says more):

- :mod:`~tracing.ingest.schema`: the layout of events.parquet and the raw files' kinds;
  :mod:`~tracing.ingest.stats`: what an ingest counts besides rows (:class:`ParseStats`,
  :class:`EventTotals`);
- the compiled kernels, together: :mod:`~tracing.ingest.jit` (compiled on first use, swapped
  into their modules' globals), :mod:`~tracing.ingest.scan` (bytes, numbers, names, a hash table,
  the merge rows' columns), :mod:`~tracing.ingest.parse_kernels` (the three parsers),
  :mod:`~tracing.ingest.join_kernels` (the descriptor join, the path dictionary);
- :mod:`~tracing.ingest.names` (names as codes), :mod:`~tracing.ingest.parse` (the raw files read
  in blocks and parsed, each kernel run and grown by :func:`~tracing.ingest.parse.run_growing`),
  :mod:`~tracing.ingest.merge` (rounds in time order, joined),
  :mod:`~tracing.ingest.events` (the Parquet sink, :func:`write_events`, :func:`merge_events`,
  :func:`build_events`), :mod:`~tracing.ingest.tables` (samples, phases, the summary).
"""

from __future__ import annotations

from tracing.ingest.events import build_events, merge_events, write_events
from tracing.ingest.parse import (
    attribute_containers,
    behind_before,
    container_owners,
    parse_block,
    parse_cache,
    parse_proc,
    parse_syscalls,
)
from tracing.ingest.schema import (
    BLOCK_BYTES,
    CACHE_KINDS,
    COMPRESSION,
    EVENTS_SCHEMA,
    HEAP_PATHS,
    KINDS,
    REORDER_NS,
    ROW_GROUP_ROWS,
    SYSCALL_FIELDS,
    SYSCALL_KINDS,
)
from tracing.ingest.stats import EventTotals, ParseStats
from tracing.ingest.tables import build_phases, build_samples, summarize

__all__ = [
    "BLOCK_BYTES",
    "CACHE_KINDS",
    "COMPRESSION",
    "EVENTS_SCHEMA",
    "HEAP_PATHS",
    "KINDS",
    "REORDER_NS",
    "ROW_GROUP_ROWS",
    "SYSCALL_FIELDS",
    "SYSCALL_KINDS",
    "EventTotals",
    "ParseStats",
    "attribute_containers",
    "build_events",
    "build_phases",
    "build_samples",
    "behind_before",
    "container_owners",
    "merge_events",
    "parse_block",
    "parse_cache",
    "parse_proc",
    "parse_syscalls",
    "summarize",
    "write_events",
]
