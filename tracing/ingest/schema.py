"""The layout of events.parquet as the ingest writes it, and the raw files' kinds and fields."""

from __future__ import annotations

import re

import pyarrow as pa

from store.rundir import (
    EVENTS_COLUMNS,
    READ_KINDS,
    WRITE_KINDS,
    arrow_schema,
)

PAGE_SIZE = 4096

# Column order and Arrow types of events.parquet: the single definition lives in store.rundir.
EVENTS_SCHEMA = arrow_schema(EVENTS_COLUMNS)
#: The string columns written as dictionaries (the file's Arrow schema still says string:
#: readers get EVENTS_SCHEMA), and the schema of the tables written: thread names, devices and
#: containers are codes of their few names, a path the code of its round's distinct paths.
_ENCODED = ("comm", "path", "dev", "container", "host")
_WRITE_SCHEMA = pa.schema(
    [
        pa.field(f.name, pa.dictionary(pa.int32(), pa.string()), nullable=f.nullable)
        if f.name in _ENCODED
        else f
        for f in EVENTS_SCHEMA
    ]
)

#: Rows per batch when events.parquet is read back to put late rows in place (a row group is
#: written per round).
ROW_GROUP_ROWS = 256 * 1024
#: Bytes of raw text parsed at a time.
BLOCK_BYTES = 8 << 20
#: Parsed blocks of raw/syscalls.txt the reader's thread may be ahead by, and tables of rounds
#: waiting for the writer's thread: the threads keep working while another is slower a while.
READ_AHEAD, WRITE_AHEAD = 2, 3
#: Paths kept before the heap is compacted to those still referred to (then twice as many).
HEAP_PATHS = 1 << 16
#: How far behind the latest line of every streamed file a row must be before it is released:
#: bpftrace's per-CPU buffers reorder lines by a few ms, aggregated rows come up to ~300 ms late.
REORDER_NS = 1_000_000_000
#: Compression of events.parquet (LZ4: a third of the size of plain, several times faster to
#: write than zstd for a few percent more bytes), but for the columns of :data:`_DELTA_ENCODED`.
COMPRESSION = "lz4"
#: Columns written with the delta encoding (of every Parquet reader), not compressed: the
#: times (in order) and the latencies are half the size of LZ4's plain pages, in half the time.
_DELTA_ENCODED = {name: "DELTA_BINARY_PACKED" for name in ("ts_ns", "latency_ns", "latency_max_ns")}
_COMPRESSION = {name: "none" for name in _DELTA_ENCODED}

#: The fields of one raw/syscalls.txt line (tracing/bpf/syscalls.bt).
SYSCALL_FIELDS = ("ts_ns", "kind", "pid", "tid", "fd", "ret", "arg", "latency_ns", "comm", "path")
#: Syscall kinds with fixed codes 0..12 in the parser (any other kind is interned after them).
SYSCALL_KINDS: tuple[str, ...] = (*READ_KINDS, *WRITE_KINDS, "openat", "close", "lseek")
SYSCALL_KINDS += ("fsync", "fdatasync", "mmap", "dup")
_N_FIXED_KINDS = len(SYSCALL_KINDS)
#: Every kind the tracer writes, in the order of events.parquet's ``kind`` dictionary.
KINDS: tuple[str, ...] = (
    *SYSCALL_KINDS,
    "block_read",
    "block_write",
    "block_other",
    "cache_add",
    "cache_delete",
    "fork",
    "exec",
    "exit",
    # pages of memory file systems (tmpfs: /dev/shm; shmem: memfd), apart from file data
    "shm_add",
    "shm_delete",
    "oom_kill",  # a process chosen to be killed for memory (proc.bt); last: older runs' codes
)
#: raw/cache.txt's maps, by the code its parser gives them (0..3).
CACHE_KINDS: tuple[str, ...] = ("cache_delete", "cache_add", "shm_delete", "shm_add")

_PROC_COLUMNS = {
    "ts_ns": pa.int64(),
    "kind": pa.string(),
    "pid": pa.int32(),
    "tid": pa.int32(),
    "child": pa.int32(),
    "comm": pa.string(),
    "path": pa.string(),
}
_LOST_RE = re.compile(r"^Lost (\d+) events")
