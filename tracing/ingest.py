"""Turn a run's raw tracer output into events.parquet, samples.parquet and phases.parquet.

The events are streamed: :func:`write_events` never holds a whole trace in memory, so an hour of
a busy container ingests in a few hundred MiB. Its stages, each on the time order of the trace:

1. **Parse** (a reader thread, started first). ``raw/syscalls.txt`` is read in ~8 MB blocks cut
   at line ends and each block is parsed by one compiled pass (numba,
   :func:`_parse_syscall_block`; names and paths scanned 8 bytes at a time): the numeric
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
   one of the round's distinct paths, :func:`_path_dictionary`), times and latencies are
   delta-encoded, the rest LZ4-compressed, in version 2 data pages.

:func:`build_events` runs the same stages into one in-memory table (tests, small traces).
bench/trace_ingest.py measures the whole against a bare ``pandas.read_csv`` of the same file.
"""

from __future__ import annotations

import contextlib
import mmap
import queue
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from core.atomic import atomic_path
from core.rundir import (
    EVENTS_COLUMNS,
    FD_KINDS,
    PHASES_COLUMNS,
    READ_KINDS,
    SAMPLES_COLUMNS,
    WRITE_KINDS,
    arrow_schema,
    conform,
    empty_frame,
)
from tracing import aggregates

PAGE_SIZE = 4096

# Column order and Arrow types of events.parquet: the single definition lives in core.rundir.
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


@dataclass
class ParseStats:
    """What the parser skipped, for the summary and for honesty about a trace's completeness."""

    lost_events: int = 0
    skipped_lines: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    #: Rows that came later than the reorder window (put in place by a second pass).
    late_rows: int = 0
    #: Times a script found bpftrace's user space 300 ms behind its kernel side ("BEHIND"
    #: lines): a map was being written again before its clear, so events may be missing.
    behind: int = 0

    def merge(self, other: ParseStats) -> None:
        """Add ``other``'s counts (another host's)."""
        self.lost_events += other.lost_events
        self.late_rows += other.late_rows
        self.behind += other.behind
        self.skipped_lines += other.skipped_lines
        self.skipped_examples = (self.skipped_examples + other.skipped_examples)[:5]

    def skip(self, text: str) -> None:
        """Count one line that is no event (and keep the first few)."""
        self.skipped_lines += 1
        if len(self.skipped_examples) < 5:
            self.skipped_examples.append(text[:200])

    def handler(self, row: pacsv.InvalidRow) -> str:
        text = row.text or ""
        match = _LOST_RE.match(text)
        if match:
            self.lost_events += int(match.group(1))
        elif not (text.startswith(("READY ", "Attaching ")) or text.strip() == ""):
            self.skip(text)
        return "skip"


@dataclass
class EventTotals:
    """Rows, counts and bytes of events.parquet per (container, kind): what the summary needs,
    added up while the table is written."""

    #: (container role or None, kind) -> [rows, count, bytes]
    by_key: dict[tuple[str | None, str], list[int]] = field(default_factory=dict)

    def add(self, container: str | None, kind: str, rows: int, count: int, nbytes: int) -> None:
        entry = self.by_key.setdefault((container, kind), [0, 0, 0])
        entry[0] += rows
        entry[1] += count
        entry[2] += nbytes

    @property
    def containers(self) -> set[str]:
        return {c for c, _ in self.by_key if c is not None}

    def merge(self, other: EventTotals) -> None:
        """Add ``other``'s rows (another host's)."""
        for (container, kind), (rows, count, nbytes) in other.by_key.items():
            self.add(container, kind, rows, count, nbytes)

    def per_kind(self, container: str | None = ..., /) -> dict[str, tuple[int, int]]:  # type: ignore[assignment]
        """kind -> (count, bytes), over every row (no argument) or the rows of one container."""
        out: dict[str, list[int]] = {}
        for (role, kind), (rows, count, nbytes) in self.by_key.items():
            if rows == 0 or (container is not ... and role != container):
                continue
            entry = out.setdefault(kind, [0, 0])
            entry[0] += count
            entry[1] += nbytes
        return {kind: (c, b) for kind, (c, b) in out.items()}

    @classmethod
    def of_table(cls, events: pa.Table) -> EventTotals:
        """The totals of an events table (as :func:`build_events` returns it)."""
        totals = cls()
        df = events.select(["kind", "bytes", "count", "container"]).to_pandas()
        df["kind"] = df["kind"].astype(str)
        df["container"] = df["container"].astype(object).where(df["container"].notna(), None)
        grouped = df.groupby(["container", "kind"], dropna=False, observed=True).agg(
            rows=("count", "size"), count=("count", "sum"), bytes=("bytes", "sum")
        )
        for (role, kind), row in grouped.iterrows():
            role = None if role is None or pd.isna(role) else str(role)
            totals.add(role, str(kind), int(row["rows"]), int(row["count"]), int(row["bytes"]))
        return totals


# ---------------------------------------------------------------------------------------------
# Compiled kernels (numba, imported and loaded on first use: the CLI does not pay for it)

_KERNELS: dict[str, Callable[..., Any]] = {}
_COMPILED = False
_COMPILE_LOCK = threading.Lock()


_INLINED: set[str] = set()


def _kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """Register a numba kernel; :func:`_compile` replaces the module global by the compiled one
    (kernels call each other by their global names)."""
    _KERNELS[function.__name__] = function
    return function


def _inline(function: Callable[..., Any]) -> Callable[..., Any]:
    """Register a numba kernel that other kernels call: inlined in them (numba's calls pass
    arrays with reference counting, atomic operations, a cost on every call)."""
    _INLINED.add(function.__name__)
    return _kernel(function)


def _compile() -> None:
    """Compile (or load from numba's on-disk cache) every kernel, once per process."""
    global _COMPILED
    with _COMPILE_LOCK:
        if _COMPILED:
            return
        import numba

        for name, function in _KERNELS.items():
            options = {"nogil": True, "inline": "always" if name in _INLINED else "never"}
            try:
                jitted = numba.njit(cache=True, **options)(function)
            except RuntimeError as exc:  # no writable cache directory: compile in memory
                if "no locator available" not in str(exc):
                    raise
                jitted = numba.njit(**options)(function)
            globals()[name] = jitted
        _COMPILED = True


_U64_GOLDEN = 0x9E3779B97F4A7C15
_U64_MIX = 0xBF58476D1CE4E5B9


@_inline
def _name_slot(table: np.ndarray, names: np.ndarray, w0: Any, w1: Any, length: int) -> int:
    """The slot of an interned name of at most 16 bytes (packed little-endian in w0, w1) in an
    open-addressing table of codes (-1: empty): where it is, or the empty slot to put it in."""
    h = (w0 ^ (w1 * np.uint64(_U64_GOLDEN)) ^ np.uint64(length)) * np.uint64(_U64_MIX)
    mask = np.uint64(len(table) - 1)
    slot = (h >> np.uint64(32)) & mask
    while True:
        code = table[slot]
        if code < 0:
            return np.int64(slot)
        if names[code, 0] == w0 and names[code, 1] == w1 and names[code, 2] == length:
            return np.int64(slot)
        slot = (slot + np.uint64(1)) & mask


@_inline
def _intern(table: np.ndarray, names: np.ndarray, count: np.ndarray, w0: Any, w1: Any, n: int):
    """The code of a name (see :func:`_name_slot`), added when new; -1 when the table is full."""
    slot = _name_slot(table, names, w0, w1, n)
    code = table[slot]
    if code >= 0:
        return code
    code = count[0]
    if code >= len(names) or 2 * code >= len(table):
        return -1
    names[code, 0] = w0
    names[code, 1] = w1
    names[code, 2] = np.uint64(n)
    table[slot] = code
    count[0] = code + 1
    return code


# Names and paths are scanned 8 bytes at a time (one load, a few arithmetic steps, no branch per
# byte; numbers are short, their digits read one by one): a text block is also read as
# little-endian words (``words``, the same memory), with at least 16 bytes after its last line.
_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_TABS = np.uint64(0x0909090909090909)
_ASCII_ZEROS = np.uint64(0x3030303030303030)
_NOT_DIGIT = np.uint64(0x7676767676767676)  # + a byte of 0-9: no high bit
_NEWLINES = np.uint64(0x0A0A0A0A0A0A0A0A)
_BRACKETS = np.uint64(0x5D5D5D5D5D5D5D5D)  # closing square brackets


@_inline
def _word(words: np.ndarray, at: int) -> Any:
    """The 8 bytes at byte ``at`` of ``words`` (little-endian; any alignment)."""
    q = at >> 3
    shift = np.uint64((at & 7) * 8)
    return (words[q] >> shift) | ((words[q + 1] << np.uint64(1)) << (np.uint64(63) - shift))


@_inline
def _low_bytes(k: int) -> Any:
    """A mask of the ``k`` (0 to 7) low bytes of a word."""
    return (np.uint64(1) << np.uint64(8 * k)) - np.uint64(1)


@_inline
def _first_flagged(flags: Any) -> int:
    """The index of the lowest byte of ``flags`` (not 0) with its high bit set."""
    low = flags & (~flags + np.uint64(1))
    return np.int64(((low >> np.uint64(7)) * np.uint64(0x0001020304050607)) >> np.uint64(56))


@_inline
def _zero_bytes(x: Any) -> Any:
    """The high bit set in the zero bytes of ``x`` (exactly up to its first zero byte)."""
    return (x - _ONES) & ~x & _HIGHS


@_inline
def _field_end(words: np.ndarray, p: int) -> int:
    """The position of the first tab or newline at or after ``p``."""
    while True:
        x = _word(words, p)
        flags = _zero_bytes(x ^ _TABS) | _zero_bytes(x ^ _NEWLINES)
        if flags:
            return p + _first_flagged(flags)
        p += 8


@_inline
def _line_end(words: np.ndarray, p: int) -> int:
    """The position of the first newline at or after ``p``."""
    while True:
        flags = _zero_bytes(_word(words, p) ^ _NEWLINES)
        if flags:
            return p + _first_flagged(flags)
        p += 8


@_inline
def _read_name(words: np.ndarray, p: int) -> tuple[int, Any, Any]:
    """Scan a field up to the next tab or newline: (end, first 8 bytes, next 8 bytes), the
    bytes after the field zero (the words mean nothing for a field of more than 16 bytes)."""
    x = _word(words, p)
    flags = _zero_bytes(x ^ _TABS) | _zero_bytes(x ^ _NEWLINES)
    if flags:
        k = _first_flagged(flags)
        return p + k, x & _low_bytes(k), np.uint64(0)
    y = _word(words, p + 8)
    flags = _zero_bytes(y ^ _TABS) | _zero_bytes(y ^ _NEWLINES)
    if flags:
        k = _first_flagged(flags)
        return p + 8 + k, x, y & _low_bytes(k)
    return _field_end(words, p + 16), x, y


@_inline
def _read_int(buf: np.ndarray, p: int, signed: bool) -> tuple[int, int, bool]:
    """An integer at ``p``: (value, position after it, whether there were digits)."""
    negative = False
    if signed and buf[p] == 45:  # '-'
        negative = True
        p += 1
    start = p
    value = 0
    c = buf[p]
    while c >= 48 and c <= 57:
        value = value * 10 + (c - 48)
        p += 1
        c = buf[p]
    if negative:
        value = -value
    return value, p, p > start


@_inline
def _read_time(buf: np.ndarray, words: np.ndarray, p: int) -> tuple[int, int, bool]:
    """The unsigned integer at ``p`` (:func:`_read_int`), its first 8 digits read at once when
    there are (times have 13 or more)."""
    t = _word(words, p) ^ _ASCII_ZEROS  # digits: 0-9
    if ((t + _NOT_DIGIT) | t) & _HIGHS:
        return _read_int(buf, p, False)
    t = t * np.uint64(10) + (t >> np.uint64(8))  # 8 digits at once, the first the lowest byte
    t = (
        (t & np.uint64(0x000000FF000000FF)) * np.uint64(0x000F424000000064)
        + ((t >> np.uint64(16)) & np.uint64(0x000000FF000000FF)) * np.uint64(0x0000271000000001)
    ) >> np.uint64(32)
    value = np.int64(t)
    p += 8
    c = buf[p]
    while c >= 48 and c <= 57:
        value = value * 10 + (c - 48)
        p += 1
        c = buf[p]
    return value, p, True


@_inline
def _expect(buf: np.ndarray, p: int, text: np.ndarray) -> int:
    """The position after ``text`` when the bytes at ``p`` are ``text``, else -1."""
    for i in range(len(text)):
        if buf[p + i] != text[i]:
            return -1
    return p + len(text)


# The rows of events while they are merged: int64 arrays of _N_COLS columns, a row per event.
# kind, comm and dev are codes (global tables of names), path the number of a path in the
# round's path heap (-1: none), line 1 for a one-by-one syscall line, 2 for an aggregated row.
_C_TS, _C_KIND, _C_PID, _C_TID, _C_COMM, _C_FD, _C_PATH, _C_BYTES = 0, 1, 2, 3, 4, 5, 6, 7
_C_RET, _C_OFFSET, _C_LAT, _C_COUNT, _C_LATMAX, _C_DEV, _C_INC, _C_LINE = range(8, 16)
_N_COLS = 16
_END = np.iinfo(np.int64).max
# info slots of the parser
_I_ROWS, _I_AGGS, _I_PATHS, _I_HEAP, _I_LOST, _I_SKIPPED, _I_STATUS, _I_BAD_KIND = range(8)
_I_BEHIND = 8  # "BEHIND <ns>" lines
_FULL_NAMES, _BAD_AGG_KIND, _FULL_ROWS = 1, 2, 3
_I_EXAMPLES = 9  # then (start, end) of up to 5 skipped lines
_AGG_SEP = np.frombuffer(b", ", dtype=np.uint8)
_AGG_OPEN = np.frombuffer(b"]: (", dtype=np.uint8)
_WORD_LOST = np.frombuffer(b"Lost ", dtype=np.uint8)
_WORD_EVENTS = np.frombuffer(b" events", dtype=np.uint8)
_WORD_READY = np.frombuffer(b"READY ", dtype=np.uint8)
_WORD_BEHIND = np.frombuffer(b"BEHIND ", dtype=np.uint8)
_WORD_ATTACHING = np.frombuffer(b"Attaching ", dtype=np.uint8)
_WORD_AGG = np.frombuffer(b"@agg", dtype=np.uint8)
_WORD_BLK = np.frombuffer(b"@blk", dtype=np.uint8)
_WORD_EV = np.frombuffer(b"@ev", dtype=np.uint8)
_WORD_OP = np.frombuffer(b"@op", dtype=np.uint8)
_KEY_END = np.frombuffer(b"]: (", dtype=np.uint8)
_WORD_WARNING = np.frombuffer(b": WARNING: ", dtype=np.uint8)[2:]
_WORD_MAP_UPDATE = np.frombuffer(b"Failed to map_update_elem", dtype=np.uint8)
# Kind codes (fixed in the parser's kind table, see SYSCALL_KINDS)
_K_RW_END, _K_PREAD, _K_PWRITE, _K_OPENAT, _K_LSEEK, _K_MMAP = 6, 1, 4, 6, 8, 11


@_inline
def _parse_agg(
    buf: np.ndarray,
    p: int,
    aggs: np.ndarray,
    agg_times: np.ndarray,
    j: int,
    agg_kinds: np.ndarray,
    fields: np.ndarray,
) -> int:
    """Parse the aggregated row at ``p`` (just after "@agg") into ``aggs[j]``, its time into
    ``agg_times[j]`` (grammar of tracing.aggregates; ``fields``: room for its 14 numbers);
    returns 1, 0 when the line is not one, -1 - code for an unknown kind."""
    value, p, ok = _read_int(buf, p, False)
    if not ok or buf[p] != 91:  # '['
        return 0
    p += 1
    for f in range(14):
        if f == 8:
            p = _expect(buf, p, _AGG_OPEN)
            if p < 0:
                return 0
        elif f > 0:
            p = _expect(buf, p, _AGG_SEP)
            if p < 0:
                return 0
        value, p, ok = _read_int(buf, p, f == 2 or f == 9 or f == 13)
        if not ok:
            return 0
        fields[f] = value
    if buf[p] != 41 or buf[p + 1] != 10:  # ')' and the end of the line
        return 0
    code = fields[3]
    if code >= len(agg_kinds):
        return -1 - code
    aggs[j, _C_TS] = fields[12]
    agg_times[j] = fields[12]
    aggs[j, _C_KIND] = agg_kinds[code]
    aggs[j, _C_PID] = fields[0]
    aggs[j, _C_TID] = fields[1]
    aggs[j, _C_COMM] = -1
    aggs[j, _C_FD] = fields[2]
    aggs[j, _C_PATH] = -1
    aggs[j, _C_BYTES] = fields[9]
    aggs[j, _C_RET] = fields[9]
    aggs[j, _C_OFFSET] = fields[13]
    aggs[j, _C_LAT] = fields[10]
    aggs[j, _C_COUNT] = fields[8]
    aggs[j, _C_LATMAX] = fields[11]
    aggs[j, _C_DEV] = -1
    aggs[j, _C_INC] = 1
    aggs[j, _C_LINE] = 2
    return 1


@_inline
def _noise_line(buf: np.ndarray, p: int, info: np.ndarray) -> int:
    """Whether the line at ``p`` is bpftrace's own: 0 when not; 1 when it is ("Lost N
    events" counted as lost; "BEHIND <ns>", the script's mark of its user space falling
    behind, counted in ``info[_I_BEHIND]``); 2 for a warning of bpftrace's ``-k`` (a helper
    call failed), which bpftrace follows with two lines (the script's line and a mark under
    the call): a failed map update (a full map) is one event lost."""
    q = _expect(buf, p, _WORD_LOST)
    if q >= 0:
        value, q, ok = _read_int(buf, q, False)
        if ok and _expect(buf, q, _WORD_EVENTS) >= 0:
            info[_I_LOST] += value
            return 1
    if _expect(buf, p, _WORD_READY) >= 0 or _expect(buf, p, _WORD_ATTACHING) >= 0:
        return 1
    if _expect(buf, p, _WORD_BEHIND) >= 0:
        info[_I_BEHIND] += 1
        return 1
    start = p
    blank = True
    while buf[p] != 10:
        c = buf[p]
        if c != 32 and c != 9 and c != 13 and c != 11 and c != 12:
            blank = False
            if c == 87 and _expect(buf, p, _WORD_WARNING) >= 0 and p > start:  # 'W'
                if _has(buf, p, _WORD_MAP_UPDATE):
                    info[_I_LOST] += 1
                return 2
        p += 1
    return 1 if blank else 0


@_inline
def _has(buf: np.ndarray, p: int, text: np.ndarray) -> bool:
    """Whether ``text`` occurs in the line from ``p`` on."""
    while buf[p] != 10:
        if buf[p] == text[0] and _expect(buf, p, text) >= 0:
            return True
        p += 1
    return False


@_inline
def _skip_echo(words: np.ndarray, p: int, end: int) -> int:
    """The end of the two lines after a warning's line (ending at ``p``), as far as ``end``."""
    for _ in range(2):
        if p + 1 < end:
            p = _line_end(words, p + 1)
    return p


@_inline
def _parse_ev_map(buf: np.ndarray, words: np.ndarray, p: int, is_open: bool, ev: np.ndarray) -> int:
    """Parse a call printed from syscalls.bt's maps, from ``p`` (just after "@ev" or "@op")::

        @evQ[ts, tid, comm]: (kind, pid, fd, ret, arg, latency)
        @opQ[ts, tid, comm]: (pid, ret, latency, path)        (openat)

    ``ev``: ts, tid, kind code, pid, fd, ret, arg, latency, then the start and end of the comm
    and of the path (empty but for openat). The comm ends at the first "]: (" (a thread name
    may hold commas); the path is the rest of the line but its closing parenthesis. Returns the
    position of the line's newline, or -1 when the line is not one of these."""
    value, p, ok = _read_int(buf, p, False)
    if not ok or buf[p] != 91:  # '['
        return -1
    value, p, ok = _read_time(buf, words, p + 1)
    if not ok:
        return -1
    ev[0] = value
    p = _expect(buf, p, _AGG_SEP)
    if p < 0:
        return -1
    value, p, ok = _read_int(buf, p, False)
    if not ok:
        return -1
    ev[1] = value
    p = _expect(buf, p, _AGG_SEP)
    if p < 0:
        return -1
    ev[8] = p
    while buf[p] != 93 or _expect(buf, p, _KEY_END) < 0:  # "]: ("
        if buf[p] == 10:
            return -1
        p += 1
    if p - ev[8] > 16:
        return -1
    ev[9] = p
    p += len(_KEY_END)
    if is_open:
        ev[2] = _K_OPENAT
        ev[4] = -1
        ev[6] = -1
        for f in (3, 5, 7):
            if f > 3:
                p = _expect(buf, p, _AGG_SEP)
                if p < 0:
                    return -1
            value, p, ok = _read_int(buf, p, True)
            if not ok:
                return -1
            ev[f] = value
        p = _expect(buf, p, _AGG_SEP)
        if p < 0:
            return -1
        stop = _line_end(words, p)
        if buf[stop - 1] != 41:  # ')'
            return -1
        ev[10] = p
        ev[11] = stop - 1
        return stop
    for f in range(2, 8):
        if f > 2:
            p = _expect(buf, p, _AGG_SEP)
            if p < 0:
                return -1
        value, p, ok = _read_int(buf, p, True)
        if not ok:
            return -1
        ev[f] = value
    ev[10] = p
    ev[11] = p
    return p + 1 if buf[p] == 41 and buf[p + 1] == 10 else -1  # ')' and the newline


@_kernel
def _parse_syscall_block(
    buf: np.ndarray,
    words: np.ndarray,
    pos: int,
    end: int,
    rows: np.ndarray,
    row_times: np.ndarray,
    aggs: np.ndarray,
    agg_times: np.ndarray,
    offsets: np.ndarray,
    heap: np.ndarray,
    kind_table: np.ndarray,
    kind_names: np.ndarray,
    kind_count: np.ndarray,
    comm_table: np.ndarray,
    comm_names: np.ndarray,
    comm_count: np.ndarray,
    agg_kinds: np.ndarray,
    seen: np.ndarray,
    info: np.ndarray,
) -> int:
    """Parse the lines of ``buf[pos:end]`` (``buf[end - 1]`` is a newline; ``words``: the same
    bytes as words, see :func:`_word`) of raw/syscalls.txt.

    One-by-one lines become columns of ``rows`` (see ``_C_*``; their times also in
    ``row_times``, an aggregated row's in ``agg_times``), with the derived values of
    events.parquet: an openat's fd is its return value (-1 when it failed), bytes are a read's
    or write's return value (0 on error) or an mmap's length, offset a pread64/pwrite64's
    argument or an lseek's result (-1 else); an openat's path is copied to ``heap`` (its end
    in ``offsets``, its number in the path column). Aggregated rows go to ``aggs``. The pid
    of every row is marked in ``seen`` (the thread-group leaders, by pid). Returns
    the position reached: ``end``, or the start of a line with ``info[_I_STATUS]``
    ``_FULL_NAMES`` or ``_FULL_ROWS`` when a name table or the output is full (grow it and
    call again from there), ``_BAD_AGG_KIND`` for an aggregated row of an unknown kind code
    (``info[_I_BAD_KIND]``)."""
    n = info[_I_ROWS]
    n_agg = info[_I_AGGS]
    fields = np.empty(14, dtype=np.int64)  # of an aggregated row
    ev = np.empty(12, dtype=np.int64)  # of a call printed from a map
    n_paths = info[_I_PATHS]
    hp = info[_I_HEAP]
    info[_I_STATUS] = 0
    while pos < end:
        if n >= rows.shape[0] or n_agg >= aggs.shape[0]:
            info[_I_STATUS] = _FULL_ROWS
            break
        ok = False
        path_start = path_end = 0
        q = _expect(buf, pos, _WORD_EV)
        is_open = False
        if q < 0:
            q = _expect(buf, pos, _WORD_OP)
            is_open = q >= 0
        if q >= 0:  # a call printed from syscalls.bt's maps
            p = _parse_ev_map(buf, words, q, is_open, ev)
            ok = p >= 0
            if not ok:
                p = _line_end(words, pos)
            if ok:
                ts, tid, kind, pid = ev[0], ev[1], ev[2], ev[3]
                fd, ret, arg, lat = ev[4], ev[5], ev[6], ev[7]
                ok = 0 <= kind < _N_FIXED_KINDS
            if ok:
                w0, w1 = _name_words(words, ev[8], ev[9] - ev[8])
                comm = _intern(comm_table, comm_names, comm_count, w0, w1, ev[9] - ev[8])
                if comm < 0:
                    info[_I_STATUS] = _FULL_NAMES
                    break
                path_start, path_end = ev[10], ev[11]
            digits = False
        else:  # a tab-separated line (syscalls.bt before its calls were batched in maps)
            ts, p, digits = _read_time(buf, words, pos)
        if digits and buf[p] == 9:
            kind_start = p + 1
            p, w0, w1 = _read_name(words, kind_start)
            ok = buf[p] == 9 and p - kind_start <= 16
            if ok:
                kind = _intern(kind_table, kind_names, kind_count, w0, w1, p - kind_start)
                if kind < 0:
                    info[_I_STATUS] = _FULL_NAMES
                    break
                pid, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                tid, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                fd, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                ret, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                arg, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                lat, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                comm_start = p + 1
                p, w0, w1 = _read_name(words, comm_start)
                ok = buf[p] == 9 and p - comm_start <= 16
            if ok:
                comm = _intern(comm_table, comm_names, comm_count, w0, w1, p - comm_start)
                if comm < 0:
                    info[_I_STATUS] = _FULL_NAMES
                    break
                path_start = p + 1
                p = _field_end(words, path_start)
                path_end = p
                ok = buf[p] == 10
        if ok:
            rows[n, _C_TS] = ts
            row_times[n] = ts
            rows[n, _C_KIND] = kind
            rows[n, _C_PID] = pid
            rows[n, _C_TID] = tid
            rows[n, _C_COMM] = comm
            rows[n, _C_RET] = ret
            rows[n, _C_LAT] = lat
            rows[n, _C_COUNT] = 1
            rows[n, _C_LATMAX] = lat
            rows[n, _C_DEV] = -1
            rows[n, _C_INC] = 1
            rows[n, _C_LINE] = 1
            if kind == _K_OPENAT:
                rows[n, _C_FD] = ret if ret >= 0 else -1
            else:
                rows[n, _C_FD] = fd
            if kind < _K_RW_END:
                rows[n, _C_BYTES] = ret if ret > 0 else 0
            elif kind == _K_MMAP:
                rows[n, _C_BYTES] = arg
            else:
                rows[n, _C_BYTES] = 0
            if kind in (_K_PREAD, _K_PWRITE):
                rows[n, _C_OFFSET] = arg
            elif kind == _K_LSEEK and ret >= 0:
                rows[n, _C_OFFSET] = ret
            else:
                rows[n, _C_OFFSET] = -1
            if path_end > path_start:
                heap[hp : hp + path_end - path_start] = buf[path_start:path_end]
                hp += path_end - path_start
                n_paths += 1
                offsets[n_paths] = hp
                rows[n, _C_PATH] = n_paths - 1
            else:
                rows[n, _C_PATH] = -1
            if 0 <= pid < len(seen):
                seen[pid] = 1
            n += 1
        if not ok:
            found = 0
            if _expect(buf, pos, _WORD_AGG) >= 0:
                found = _parse_agg(buf, pos + 4, aggs, agg_times, n_agg, agg_kinds, fields)
                if found < 0:
                    info[_I_STATUS] = _BAD_AGG_KIND
                    info[_I_BAD_KIND] = -1 - found
                    break
                if found == 1:
                    pid = aggs[n_agg, _C_PID]
                    if 0 <= pid < len(seen):
                        seen[pid] = 1
                n_agg += found
            p = _line_end(words, pos)
            noise = _noise_line(buf, pos, info) if found == 0 else 1
            if noise == 0:
                k = info[_I_SKIPPED]
                if k < 5:
                    info[_I_EXAMPLES + 2 * k] = pos
                    info[_I_EXAMPLES + 2 * k + 1] = p
                info[_I_SKIPPED] = k + 1
            elif noise == 2:
                p = _skip_echo(words, p, end)
        pos = p + 1
    info[_I_ROWS] = n
    info[_I_AGGS] = n_agg
    info[_I_PATHS] = n_paths
    info[_I_HEAP] = hp
    return pos


_WORD_ADD = np.frombuffer(b"@add", dtype=np.uint8)
_WORD_DEL = np.frombuffer(b"@del", dtype=np.uint8)
_WORD_SHM_ADD = np.frombuffer(b"@shm_add", dtype=np.uint8)
_WORD_SHM_DEL = np.frombuffer(b"@shm_del", dtype=np.uint8)
_WORD_TICK = np.frombuffer(b"T ", dtype=np.uint8)
_CACHE_CLOSE = np.frombuffer(b"]: ", dtype=np.uint8)


@_kernel
def _parse_cache_lines(
    buf: np.ndarray,
    words: np.ndarray,
    end: int,
    ints: np.ndarray,
    comms: np.ndarray,
    heap: np.ndarray,
) -> tuple[int, int, int]:
    """Parse raw/cache.txt (``buf[:end]``, whole lines): "T <ns>" starts a block of counts,
    "@addQ[<pid>, <comm>]: <pages>" (or @del, @shm_add, @shm_del; Q the map's digit, absent
    before the maps rotated) is one (``ints``: time, the map's code in :data:`CACHE_KINDS`,
    pid, pages by row; the comm's bytes to ``heap``, their ends in ``comms[1:]``), "Lost <n>
    events" adds n lost events, "BEHIND <ns>" one to the count of the tracer falling behind;
    other lines are skipped. Returns (rows, bytes of comms, lost events, behind)."""
    n = 0
    used = 0
    lost = 0
    behind = 0
    ts = 0
    comms[0] = 0
    pos = 0
    while pos < end:
        line_end = _line_end(words, pos)
        stop = line_end - 1 if line_end > pos and buf[line_end - 1] == 13 else line_end  # \r\n
        code = -1
        start = pos + 4
        if _expect(buf, pos, _WORD_ADD) >= 0:
            code = 1
        elif _expect(buf, pos, _WORD_DEL) >= 0:
            code = 0
        elif _expect(buf, pos, _WORD_SHM_ADD) >= 0:
            code, start = 3, pos + 8
        elif _expect(buf, pos, _WORD_SHM_DEL) >= 0:
            code, start = 2, pos + 8
        if code >= 0:
            if 48 <= buf[start] <= 57:  # the map's digit
                start += 1
            if buf[start] != 91:  # "[": another map's name
                code = -1
            start += 1
        if code >= 0:
            pid, p, ok = _read_int(buf, start, False)
            ok = ok and p + 1 < stop and buf[p] == 44 and buf[p + 1] == 32  # ", "
            q = stop  # the pages: the digits at the end, after the last "]: "
            while q > p and 48 <= buf[q - 1] <= 57:
                q -= 1
            if ok and q < stop and q - 3 >= p + 2 and _expect(buf, q - 3, _CACHE_CLOSE) == q:
                pages, _, _ = _read_int(buf, q, False)
                ints[0, n] = ts
                ints[1, n] = code
                ints[2, n] = pid
                ints[3, n] = pages
                length = q - 3 - (p + 2)
                heap[used : used + length] = buf[p + 2 : q - 3]
                used += length
                n += 1
                comms[n] = used
        elif _expect(buf, pos, _WORD_TICK) >= 0:
            value, p, ok = _read_int(buf, pos + 2, True)
            if ok and p == stop:
                ts = value
        elif _expect(buf, pos, _WORD_BEHIND) >= 0:
            behind += 1
        else:
            q = _expect(buf, pos, _WORD_LOST)
            if q >= 0:
                value, q, ok = _read_int(buf, q, False)
                if ok and _expect(buf, q, _WORD_EVENTS) >= 0:
                    lost += value
            elif _has(buf, pos, _WORD_MAP_UPDATE):  # a full map (bpftrace -k): a lost update
                lost += 1
        pos = line_end + 1
    return n, used, lost, behind


@_inline
def _name_words(words: np.ndarray, p: int, n: int) -> tuple[Any, Any]:
    """The first 8 and next 8 bytes of the ``n``-byte name at ``p``, as :func:`_read_name`
    gives them (the bytes after the name zero; meaningless beyond 16 bytes)."""
    x = _word(words, p)
    if n < 8:
        return x & _low_bytes(n), np.uint64(0)
    y = _word(words, p + 8)
    if n < 16:
        return x, y & _low_bytes(n - 8)
    return x, y


@_inline
def _parse_blk_map(buf: np.ndarray, p: int, stop: int, fields: np.ndarray) -> bool:
    """Parse a request printed from block.bt's maps, from ``p`` (just after "@blk") to the
    line's end at ``stop``: ``Q[ts, dev, sector]: (rwbs, bytes, latency, pid, in container,
    comm)``. ``fields``: ts, dev, sector, bytes, latency, pid, in container, then the start and
    end of the rwbs and of the comm. The comm is the rest of the line but its closing
    parenthesis (a thread name may hold commas)."""
    value, p, ok = _read_int(buf, p, False)
    if not ok or buf[p] != 91:  # '['
        return False
    p += 1
    for f in range(3):
        if f > 0:
            p = _expect(buf, p, _AGG_SEP)
            if p < 0:
                return False
        value, p, ok = _read_int(buf, p, False)
        if not ok:
            return False
        fields[f] = value
    p = _expect(buf, p, _AGG_OPEN)
    if p < 0:
        return False
    fields[7] = p
    while p < stop and buf[p] != 44:  # ','
        p += 1
    if p - fields[7] > 16:
        return False
    fields[8] = p
    for f in range(3, 7):
        p = _expect(buf, p, _AGG_SEP)
        if p < 0:
            return False
        value, p, ok = _read_int(buf, p, f == 5)
        if not ok:
            return False
        fields[f] = value
    p = _expect(buf, p, _AGG_SEP)
    if p < 0 or buf[stop - 1] != 41 or stop - 1 - p > 16:  # ')'
        return False
    fields[9] = p
    fields[10] = stop - 1
    return True


@_kernel
def _parse_block_lines(
    buf: np.ndarray,
    words: np.ndarray,
    pos: int,
    end: int,
    rows: np.ndarray,
    rw_table: np.ndarray,
    rw_names: np.ndarray,
    rw_count: np.ndarray,
    comm_table: np.ndarray,
    comm_names: np.ndarray,
    comm_count: np.ndarray,
    dev_keys: np.ndarray,
    dev_values: np.ndarray,
    info: np.ndarray,
) -> int:
    """Parse the lines of ``buf[pos:end]`` of raw/block.txt (tracing/bpf/block.bt: time, rwbs,
    dev, sector, bytes, latency, pid, in container, comm) into merge rows: the kind column has
    the code of the rwbs (``rw_*`` name table), the comm column the parser's code of the
    thread name, the dev column the code of the device (``dev_keys``/``dev_values``, codes in
    order, their count in ``info[_I_PATHS]``). A request is a line of either form block.bt has
    had: ``@blkQ[...]: (...)`` printed from its maps (:func:`_parse_blk_map`) or, before, a
    tab-separated line. Other lines are counted as in :func:`_parse_syscall_block` (its
    ``info`` slots, the same statuses but _BAD_AGG_KIND)."""
    fields = np.empty(11, dtype=np.int64)  # of a request printed from a map
    n = info[_I_ROWS]
    info[_I_STATUS] = 0
    while pos < end:
        if n >= rows.shape[0]:
            info[_I_STATUS] = _FULL_ROWS
            break
        rw = comm_len = 0
        ts = dev = sector = nbytes = lat = pid = inside = 0
        w0 = w1 = np.uint64(0)
        q = _expect(buf, pos, _WORD_BLK)
        if q >= 0:  # a request printed from block.bt's maps
            p = _line_end(words, pos)
            ok = _parse_blk_map(buf, q, p, fields)
            if ok:
                ts, dev, sector = fields[0], fields[1], fields[2]
                nbytes, lat, pid, inside = fields[3], fields[4], fields[5], fields[6]
                start, stop = fields[7], fields[8]
                w0, w1 = _name_words(words, start, stop - start)
                rw = _intern(rw_table, rw_names, rw_count, w0, w1, stop - start)
                if rw < 0:
                    info[_I_STATUS] = _FULL_NAMES
                    break
                comm_len = fields[10] - fields[9]
                w0, w1 = _name_words(words, fields[9], comm_len)
        else:  # a tab-separated line (block.bt before its requests were batched in maps)
            ts, p, ok = _read_int(buf, pos, True)
            ok = ok and buf[p] == 9
            if ok:
                start = p + 1
                p, w0, w1 = _read_name(words, start)
                ok = buf[p] == 9 and p - start <= 16
                if ok:
                    rw = _intern(rw_table, rw_names, rw_count, w0, w1, p - start)
                    if rw < 0:
                        info[_I_STATUS] = _FULL_NAMES
                        break
            if ok:
                dev, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                sector, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                nbytes, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                lat, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                pid, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                inside, p, ok = _read_int(buf, p + 1, True)
                ok = ok and buf[p] == 9
            if ok:
                start = p + 1
                p, w0, w1 = _read_name(words, start)
                comm_len = p - start
                ok = buf[p] == 10 and comm_len <= 16
        if ok:
            comm = _intern(comm_table, comm_names, comm_count, w0, w1, comm_len)
            if comm < 0:
                info[_I_STATUS] = _FULL_NAMES
                break
            if 2 * (info[_I_PATHS] + 1) > len(dev_keys):
                info[_I_STATUS] = _FULL_NAMES
                break
            code = _get(dev_keys, dev_values, dev << 1)  # keys: never -1, the empty slot
            if code < 0:
                code = info[_I_PATHS]
                used = np.zeros(1, dtype=np.int64)
                _put(dev_keys, dev_values, used, dev << 1, code)
                info[_I_PATHS] = code + 1
            rows[n, _C_TS] = ts
            rows[n, _C_KIND] = rw
            rows[n, _C_PID] = pid
            rows[n, _C_TID] = -1
            rows[n, _C_COMM] = comm
            rows[n, _C_FD] = -1
            rows[n, _C_PATH] = -1
            rows[n, _C_BYTES] = nbytes
            rows[n, _C_RET] = 0
            rows[n, _C_OFFSET] = sector * 512
            rows[n, _C_LAT] = lat
            rows[n, _C_COUNT] = 1
            rows[n, _C_LATMAX] = lat
            rows[n, _C_DEV] = code
            rows[n, _C_INC] = 1 if inside == 1 else 0
            rows[n, _C_LINE] = 0
            n += 1
        else:
            p = _line_end(words, pos)
            noise = _noise_line(buf, pos, info)
            if noise == 0:
                k = info[_I_SKIPPED]
                if k < 5:
                    info[_I_EXAMPLES + 2 * k] = pos
                    info[_I_EXAMPLES + 2 * k + 1] = p
                info[_I_SKIPPED] = k + 1
            elif noise == 2:
                p = _skip_echo(words, p, end)
        pos = p + 1
    info[_I_ROWS] = n
    return pos


@_inline
def _slot(keys: np.ndarray, key: int) -> int:
    """The slot of ``key`` in an open-addressing table of int64 keys (-1: empty), or the empty
    slot where it would go."""
    mask = np.uint64(len(keys) - 1)
    slot = ((np.uint64(key) * np.uint64(_U64_GOLDEN)) >> np.uint64(29)) & mask
    while True:
        k = keys[slot]
        if k == key or k == -1:
            return np.int64(slot)
        slot = (slot + np.uint64(1)) & mask


@_inline
def _put(keys: np.ndarray, values: np.ndarray, used: np.ndarray, key: int, value: int) -> None:
    """Set ``key`` to ``value`` (the table must have room: see :func:`_rehash`)."""
    slot = _slot(keys, key)
    if keys[slot] == -1:
        keys[slot] = key
        used[0] += 1
    values[slot] = value


@_inline
def _get(keys: np.ndarray, values: np.ndarray, key: int) -> int:
    slot = _slot(keys, key)
    return values[slot] if keys[slot] == key else -1


@_kernel
def _rehash(keys: np.ndarray, values: np.ndarray, size: int):
    """The table with ``size`` slots (a power of two)."""
    new_keys = np.full(size, -1, dtype=np.int64)
    new_values = np.empty(size, dtype=np.int64)
    for s in range(len(keys)):
        if keys[s] != -1:
            t = _slot(new_keys, keys[s])
            new_keys[t] = keys[s]
            new_values[t] = values[s]
    return new_keys, new_values


# What the descriptor join does with a row (by its kind), see _join_round.
_A_NONE, _A_OPEN, _A_CLOSE, _A_DUP, _A_USE, _A_FORK = 0, 1, 2, 3, 4, 5
# Rows of the join's int64 and int32 outputs (the columns of events.parquet; path: a number).
_O_TS, _O_BYTES, _O_COUNT, _O_RET, _O_OFFSET, _O_LAT, _O_LATMAX = range(7)
_O_PID, _O_TID, _O_FD, _O_COMM, _O_DEV, _O_CONTAINER, _O_PATH = range(7)
#: Task ids are below this (the kernel's PID_MAX_LIMIT): dense tables are indexed by them.
_PID_LIMIT = 1 << 22
# join state slots: rows written, descriptor table entries
_S_WRITTEN, _S_USED = 1, 2


@_kernel
def _join_round(
    parts: tuple,
    times: tuple,
    orders: tuple,
    at: np.ndarray,
    end: np.ndarray,
    bases: np.ndarray,
    parsed: np.ndarray,
    comm_map: np.ndarray,
    kind_map: np.ndarray,
    action: np.ndarray,
    leaders: np.ndarray,
    owners: np.ndarray,
    fd_keys: np.ndarray,
    fd_values: np.ndarray,
    tid_comms: np.ndarray,
    state: np.ndarray,
    out64: np.ndarray,
    out32: np.ndarray,
    out_kind: np.ndarray,
    out_inside: np.ndarray,
    totals: np.ndarray,
) -> bool:
    """Join one round of merge rows into the output columns (from ``state[_S_WRITTEN]`` on):
    the rows ``orders[p][at[p]:end[p]]`` of each part ``p`` (in time order, at ``times[p]``),
    merged in time order (ties: the row of the lower part first); returns False when the
    descriptor table is half full (grow it and call again: ``at`` says where it stopped),
    True when done. The rows of a part with ``parsed`` set have the parser's codes of kinds
    and thread names (``kind_map``, ``comm_map``: ours), and paths numbered from
    ``bases[part]``.

    The path of an fd-based call is looked up in the (pid, fd) -> path table (``fd_keys``,
    ``fd_values``), which the calls update as they go: ``action[kind]`` says whether a row
    opens (an openat names its descriptor), closes (a successful close unnames it; the close
    itself still resolves to the file), copies (a dup resolves the old descriptor and gives the
    new one the same name, or none), uses (resolved) or forks (the child, ``ret``, gets a copy
    of its parent's table). A fork whose child is no thread-group leader (``leaders[child]``
    0: a thread) is left out. An aggregated row takes the comm of the latest one-by-one line
    of its thread (``tid_comms``: comm + 1 by tid), -1 when there was none. ``owners``: the
    container (code + 1) of an in-container pid, 0 for none; ``owners[_PID_LIMIT]`` applies
    to every pid (one container). ``totals[container + 1, kind]`` adds up rows, count, bytes."""
    every_pid = owners[len(owners) - 1]
    m = state[_S_WRITTEN]
    room = len(fd_keys) // 2
    while True:
        best = second = -1  # the parts with the earliest next rows
        best_ts = second_ts = 0
        for p in range(len(at)):
            if at[p] < end[p]:
                t = times[p][at[p]]
                if best < 0 or t < best_ts:
                    second, second_ts = best, best_ts
                    best, best_ts = p, t
                elif second < 0 or t < second_ts:
                    second, second_ts = p, t
        if best < 0:
            break
        rows, order, ts, a, e = parts[best], orders[best], times[best], at[best], end[best]
        base, coded = bases[best], parsed[best]
        # the best part's rows up to the second's next row
        while a < e and (second < 0 or ts[a] < second_ts or (ts[a] == second_ts and best < second)):
            if state[_S_USED] + 2 > room:
                at[best] = a
                state[_S_WRITTEN] = m
                return False
            i = order[a]
            a += 1
            kind = rows[i, _C_KIND]
            comm = rows[i, _C_COMM]
            path = rows[i, _C_PATH]
            if coded:
                kind = kind_map[kind]
                if comm >= 0:
                    comm = comm_map[comm]
            if path >= 0:
                path += base
            what = action[kind]
            pid = rows[i, _C_PID]
            tid = rows[i, _C_TID]
            line = rows[i, _C_LINE]
            if line == 1:
                if 0 <= tid < len(tid_comms):
                    tid_comms[tid] = comm + 1
            elif line == 2:
                comm = tid_comms[tid] - 1 if 0 <= tid < len(tid_comms) else -1
            if what == _A_FORK:
                child = rows[i, _C_RET]
                if 0 <= child < len(leaders) and leaders[child] == 0:
                    continue  # a thread
                if child != pid and child >= 0:
                    copies = 0
                    for s in range(len(fd_keys)):
                        k = fd_keys[s]
                        if k != -1 and (k >> 32) == pid:
                            copies += 1
                    if state[_S_USED] + copies + 2 > room:
                        at[best] = a - 1
                        state[_S_WRITTEN] = m
                        return False
                    for s in range(len(fd_keys)):
                        k = fd_keys[s]
                        if k != -1 and (k >> 32) == child:
                            fd_values[s] = -1
                    for s in range(len(fd_keys)):
                        k = fd_keys[s]
                        if k != -1 and (k >> 32) == pid:
                            _put(
                                fd_keys,
                                fd_values,
                                state[_S_USED:],
                                (child << 32) | (k & 0xFFFFFFFF),
                                fd_values[s],
                            )
            elif what != _A_NONE:
                fd = rows[i, _C_FD]
                if fd >= 0:
                    key = (pid << 32) | fd
                    if what == _A_OPEN:
                        _put(fd_keys, fd_values, state[_S_USED:], key, path)
                    else:
                        path = _get(fd_keys, fd_values, key)
                        if what == _A_CLOSE:
                            if rows[i, _C_RET] == 0 and path != -1:
                                _put(fd_keys, fd_values, state[_S_USED:], key, -1)
                        elif what == _A_DUP:
                            new_fd = rows[i, _C_RET]
                            if new_fd >= 0:
                                new_key = (pid << 32) | new_fd
                                if path != -1 or _get(fd_keys, fd_values, new_key) != -1:
                                    _put(fd_keys, fd_values, state[_S_USED:], new_key, path)
            inside = rows[i, _C_INC] != 0
            container = -1
            if inside:
                if every_pid:
                    container = every_pid - 1
                elif 0 <= pid < _PID_LIMIT:
                    container = owners[pid] - 1
            nbytes = rows[i, _C_BYTES]
            count = rows[i, _C_COUNT]
            totals[container + 1, kind, 0] += 1
            totals[container + 1, kind, 1] += count
            totals[container + 1, kind, 2] += nbytes
            out64[_O_TS, m] = rows[i, _C_TS]
            out64[_O_BYTES, m] = nbytes
            out64[_O_COUNT, m] = count
            out64[_O_RET, m] = rows[i, _C_RET]
            out64[_O_OFFSET, m] = rows[i, _C_OFFSET]
            out64[_O_LAT, m] = rows[i, _C_LAT]
            out64[_O_LATMAX, m] = rows[i, _C_LATMAX]
            out32[_O_PID, m] = pid
            out32[_O_TID, m] = tid
            out32[_O_FD, m] = rows[i, _C_FD]
            out32[_O_COMM, m] = comm
            out32[_O_DEV, m] = rows[i, _C_DEV]
            out32[_O_CONTAINER, m] = container
            out32[_O_PATH, m] = path
            out_kind[m] = kind
            out_inside[m] = inside
            m += 1
        at[best] = a
    state[_S_WRITTEN] = m
    return True


@_inline
def _tail(words: np.ndarray, at: int, end: int) -> Any:
    """The bytes ``at`` to ``end`` (at most 8) of ``words``, the rest zero."""
    word = _word(words, at)
    if end - at < 8:
        word &= (np.uint64(1) << np.uint64(8 * (end - at))) - np.uint64(1)
    return word


@_inline
def _hash_bytes(words: np.ndarray, start: int, end: int) -> Any:
    h = np.uint64(end - start) * np.uint64(_U64_GOLDEN)
    for at in range(start, end, 8):
        h = (h ^ _tail(words, at, end)) * np.uint64(_U64_MIX)
        h ^= h >> np.uint64(31)
    return h


@_inline
def _same_bytes(words: np.ndarray, a: int, a_end: int, b: int, b_end: int) -> bool:
    if a_end - a != b_end - b:
        return False
    for k in range(0, a_end - a, 8):
        if _tail(words, a + k, a_end) != _tail(words, b + k, b_end):
            return False
    return True


@_kernel
def _path_dictionary(
    refs: np.ndarray, offsets: np.ndarray, data: np.ndarray, local: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct paths that ``refs`` refers to (heap numbers: ``offsets``, ``data``; -1:
    none) as the offsets and bytes of a string array, in the order of their first row;
    ``refs`` becomes their codes in it, in place. ``local`` (-1 everywhere, as it is left)
    maps heap numbers to codes meanwhile."""
    words = data.view(np.uint64)
    picked = np.empty(len(refs), dtype=np.int64)
    k = 0
    for i in range(len(refs)):  # the heap numbers used, numbered
        r = refs[i]
        if r >= 0:
            c = local[r]
            if c < 0:
                c = k
                local[r] = k
                picked[k] = r
                k += 1
            refs[i] = c
    for j in range(k):
        local[picked[j]] = -1
    size = 16
    while size < 2 * k:
        size *= 2
    mask = np.uint64(size - 1)
    table = np.full(size, -1, dtype=np.int64)
    codes = np.empty(k, dtype=np.int64)
    first = np.empty(k, dtype=np.int64)  # heap number of each distinct path
    hashes = np.empty(k, dtype=np.uint64)
    n = 0
    nbytes = 0
    for j in range(k):  # the same path under several numbers: one code
        r = picked[j]
        start, end = offsets[r], offsets[r + 1]
        h = _hash_bytes(words, start, end)
        slot = (h >> np.uint64(20)) & mask
        while True:
            c = table[slot]
            if c < 0:
                table[slot] = n
                first[n] = r
                hashes[n] = h
                codes[j] = n
                n += 1
                nbytes += end - start
                break
            other = first[c]
            if hashes[c] == h and _same_bytes(
                words, offsets[other], offsets[other + 1], start, end
            ):
                codes[j] = c
                break
            slot = (slot + np.uint64(1)) & mask
    if n < k:
        for i in range(len(refs)):
            if refs[i] >= 0:
                refs[i] = codes[refs[i]]
    out_offsets = np.empty(n + 1, dtype=np.int32)
    out_data = np.empty(nbytes, dtype=np.uint8)
    out_offsets[0] = 0
    at = 0
    for c in range(n):
        r = first[c]
        start, end = offsets[r], offsets[r + 1]
        out_data[at : at + end - start] = data[start:end]
        at += end - start
        out_offsets[c + 1] = at
    return out_offsets, out_data


@_kernel
def _validity(codes: np.ndarray, bitmap: np.ndarray) -> int:
    """Arrow's validity bitmap of ``codes`` (bit set: code >= 0); returns the nulls."""
    n = len(codes)
    nulls = 0
    for b in range((n + 7) // 8):
        byte = 0
        for k in range(min(8, n - 8 * b)):
            if codes[8 * b + k] >= 0:
                byte |= 1 << k
            else:
                nulls += 1
        bitmap[b] = byte
    return nulls


@_kernel
def _gather_strings(
    offsets: np.ndarray,
    data: np.ndarray,
    keep: np.ndarray,
    out_offsets: np.ndarray,
    out_data: np.ndarray,
) -> int:
    """Copy the strings ``keep`` (numbers) of ``offsets``, ``data`` to ``out_offsets[1:]``,
    ``out_data`` (appended after ``out_offsets[0]`` bytes); returns the end of the bytes."""
    at = out_offsets[0]
    for j in range(len(keep)):
        start, end = offsets[keep[j]], offsets[keep[j] + 1]
        out_data[at : at + end - start] = data[start:end]
        at += end - start
        out_offsets[j + 1] = at
    return at


@_kernel
def _paths_used(rows: np.ndarray, which: np.ndarray, base: int, used: np.ndarray) -> None:
    """Mark the paths (heap numbers: ``base`` + theirs) of ``rows[which]`` in ``used``."""
    for i in which:
        path = rows[i, _C_PATH]
        if path >= 0:
            used[base + path] = True


@_kernel
def _renumber_paths(rows: np.ndarray, which: np.ndarray, base: int, numbers: np.ndarray) -> None:
    """Give the paths of ``rows[which]`` (``base`` + theirs) their new numbers (by old)."""
    for i in which:
        path = rows[i, _C_PATH]
        if path >= 0:
            rows[i, _C_PATH] = numbers[base + path]


#: The most parts a round's rows are taken from without a copy (see :func:`_join_round`).
_MAX_PARTS = 8


# ---------------------------------------------------------------------------------------------
# Names (kinds, thread names, devices, roles) as codes


class _Names:
    """A growing list of names and their codes (for dictionary-encoded output columns)."""

    def __init__(self, initial: Sequence[str] = ()) -> None:
        self.names: list[str] = []
        self.codes: dict[str, int] = {}
        self._array: pa.Array | None = None
        for name in initial:
            self.code(name)

    def code(self, name: str) -> int:
        code = self.codes.get(name)
        if code is None:
            code = self.codes[name] = len(self.names)
            self.names.append(name)
            self._array = None
        return code

    def codes_of(self, values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The codes of an array of strings (nulls: -1)."""
        encoded = pc.dictionary_encode(values)
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        mapping = np.array([self.code(s) for s in encoded.dictionary.to_pylist()] + [-1])
        indices = encoded.indices.to_numpy(zero_copy_only=False)
        if encoded.indices.null_count:
            indices = np.where(
                encoded.indices.is_null().to_numpy(zero_copy_only=False), -1, indices
            )
        return mapping[indices].astype(np.int64)

    def array(self) -> pa.Array:
        if self._array is None:
            self._array = pa.array(self.names, type=pa.string())
        return self._array

    def take(self, codes: np.ndarray) -> pa.Array:
        """The names of ``codes`` (-1: null)."""
        return self.array().take(pa.array(codes, mask=codes < 0))


class _NameTable:
    """The parser's table of names of at most 16 bytes (numba arrays) and their codes."""

    def __init__(self, initial: Sequence[str] = (), capacity: int = 1024) -> None:
        self.table = np.full(2 * capacity, -1, dtype=np.int64)
        self.names = np.zeros((capacity, 3), dtype=np.uint64)
        self.count = np.zeros(1, dtype=np.int64)
        for name in initial:
            w0, w1, n = self._words(name.encode())
            _intern(self.table, self.names, self.count, w0, w1, n)
        self.decoded: list[str] = list(initial)

    @staticmethod
    def _words(raw: bytes) -> tuple[np.uint64, np.uint64, int]:
        padded = raw.ljust(16, b"\0")
        return (
            np.uint64(int.from_bytes(padded[:8], "little")),
            np.uint64(int.from_bytes(padded[8:16], "little")),
            len(raw),
        )

    def grow(self) -> None:
        capacity = 2 * len(self.names)
        names = np.zeros((capacity, 3), dtype=np.uint64)
        names[: len(self.names)] = self.names
        table = np.full(2 * capacity, -1, dtype=np.int64)
        for code in range(int(self.count[0])):
            w0, w1, n = names[code]
            table[_name_slot(table, names, w0, w1, int(n))] = code
        self.table, self.names = table, names

    def new_names(self) -> list[str]:
        """Names added since the last call, in code order."""
        added = []
        for code in range(len(self.decoded), int(self.count[0])):
            w0, w1, n = (int(v) for v in self.names[code])
            raw = (w0.to_bytes(8, "little") + w1.to_bytes(8, "little"))[:n]
            added.append(raw.decode("utf-8", errors="replace"))
        self.decoded += added
        return added


# ---------------------------------------------------------------------------------------------
# Reading raw files in blocks


def _blocks(path: Path, size: int | None = None) -> Iterator[tuple[np.ndarray, int, int]]:
    """(buffer, start, end) for successive pieces of a file (about ``size`` bytes, BLOCK_BYTES
    by default), each ``buffer[start:end]`` whole lines ending with a newline (one is added to
    a last line without it), at least 16 bytes of the buffer after them, its length a multiple
    of 8. The file is mapped, not copied (but its last piece): a piece is only valid until the
    next is taken, when its pages are unmapped (the memory stays flat)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    size = size or BLOCK_BYTES
    with open(path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    data = np.frombuffer(mapped, dtype=np.uint8)
    whole = len(data) // 8 * 8  # words: see _word
    start = read = done = 0  # a piece goes to the last newline of the next ``size`` bytes
    while True:
        if read == len(data):  # the rest, a line without its newline: copied, one added
            if start < len(data):
                buffer = np.zeros((len(data) - start + 1 + 16 + 7) // 8 * 8, dtype=np.uint8)
                buffer[: len(data) - start] = data[start:]
                buffer[len(data) - start] = 10
                yield buffer, 0, len(data) - start + 1
            return
        cut = _last_newline(data, read, min(read + size, len(data)))
        read = min(read + size, len(data))
        if cut < 0:
            continue  # a line longer than a piece
        if cut + 1 + 16 <= whole:
            base = start & ~7
            yield data[base:whole], start - base, cut + 1 - base
        else:  # too near the end of the file
            yield _padded(data[start : cut + 1], 0, cut + 1 - start)
        start = cut + 1
        if start - done >= mmap.PAGESIZE:  # the pages read
            length = (start - done) // mmap.PAGESIZE * mmap.PAGESIZE
            mapped.madvise(mmap.MADV_DONTNEED, done, length)
            done += length


def _padded(buf: np.ndarray, start: int, end: int) -> tuple[np.ndarray, int, int]:
    """``buf``, ``start``, ``end`` as :func:`_blocks` gives them (a copy when not)."""
    if len(buf) % 8 or len(buf) < end + 16:
        padded = np.zeros((end - start + 16 + 7) // 8 * 8, dtype=np.uint8)
        padded[: end - start] = buf[start:end]
        return padded, 0, end - start
    return buf, start, end


def _last_newline(buffer: np.ndarray, start: int, end: int) -> int:
    """The position of the last newline of ``buffer[start:end]``, -1 if none."""
    step = 4096
    hi = end
    while hi > start:
        lo = max(start, hi - step)
        found = np.flatnonzero(buffer[lo:hi] == 10)
        if len(found):
            return lo + int(found[-1])
        hi = lo
        step *= 4
    return -1


@dataclass
class _Parsed:
    """One parsed block of raw/syscalls.txt."""

    rows: np.ndarray  # (n, _N_COLS): one-by-one lines (reader's kind and comm codes)
    row_times: np.ndarray  # their times
    aggs: np.ndarray  # (m, _N_COLS): aggregated rows
    agg_times: np.ndarray
    paths: pa.Array  # openat paths, numbered by the rows' path column
    new_kinds: list[str]
    new_comms: list[str]
    lost: int
    skipped: int
    examples: list[str]
    behind: int


class _SyscallParser:
    """Parses raw/syscalls.txt block by block (:func:`_parse_syscall_block`)."""

    def __init__(self, seen: np.ndarray | None = None) -> None:
        _compile()
        self.seen = np.zeros(0, dtype=np.uint8) if seen is None else seen
        self.kinds = _NameTable(SYSCALL_KINDS)
        self.comms = _NameTable()
        self.agg_kinds = np.array(
            [SYSCALL_KINDS.index(k) for k in aggregates.KIND_CODES], dtype=np.int64
        )
        self.rows_per_byte = 1 / 48
        self.aggs_per_byte = 1 / 2000

    def parse(self, buf: np.ndarray, end: int, start: int = 0) -> _Parsed:
        """Parse ``buf[start:end]`` (whole lines; :func:`_blocks` leaves room after them)."""
        buf, start, end = _padded(buf, start, end)
        words = buf.view(np.uint64)
        size = end - start
        rows = np.empty((int(size * self.rows_per_byte * 1.25) + 64, _N_COLS), dtype=np.int64)
        aggs = np.empty((int(size * self.aggs_per_byte * 1.5) + 64, _N_COLS), dtype=np.int64)
        row_times = np.empty(rows.shape[0], dtype=np.int64)
        agg_times = np.empty(aggs.shape[0], dtype=np.int64)
        offsets = np.zeros(rows.shape[0] + 1, dtype=np.int32)
        heap = np.empty(size, dtype=np.uint8)
        info = np.zeros(_I_EXAMPLES + 10, dtype=np.int64)
        pos = start
        while True:
            pos = _parse_syscall_block(
                buf,
                words,
                pos,
                end,
                rows,
                row_times,
                aggs,
                agg_times,
                offsets,
                heap,
                self.kinds.table,
                self.kinds.names,
                self.kinds.count,
                self.comms.table,
                self.comms.names,
                self.comms.count,
                self.agg_kinds,
                self.seen,
                info,
            )
            status = info[_I_STATUS]
            if status == 0:
                break
            if status == _FULL_NAMES:
                self.kinds.grow()
                self.comms.grow()
            elif status == _FULL_ROWS:
                rows, row_times = _widen(rows, info[_I_ROWS]), _widen(row_times, info[_I_ROWS])
                aggs, agg_times = _widen(aggs, info[_I_AGGS]), _widen(agg_times, info[_I_AGGS])
                bigger = np.zeros(rows.shape[0] + 1, dtype=np.int32)
                bigger[: len(offsets)] = offsets
                offsets = bigger
            else:
                code = int(info[_I_BAD_KIND])
                raise ValueError(f"aggregated row with an unknown kind code {code}")
        n, n_agg, n_paths, used = (int(info[i]) for i in (_I_ROWS, _I_AGGS, _I_PATHS, _I_HEAP))
        self.rows_per_byte = max(n / size, 1 / 4096)
        self.aggs_per_byte = max(n_agg / size, 1 / 65536)
        paths = pa.StringArray.from_buffers(
            n_paths, pa.py_buffer(offsets[: n_paths + 1]), pa.py_buffer(heap[:used].copy())
        )
        try:
            paths.validate(full=True)
        except pa.ArrowInvalid:  # not UTF-8: replace the bytes that are not
            paths = pa.array(
                [p.decode("utf-8", errors="replace") for p in paths.cast(pa.binary()).to_pylist()],
                type=pa.string(),
            )
        skipped = int(info[_I_SKIPPED])
        examples = [
            bytes(buf[info[_I_EXAMPLES + 2 * k] : info[_I_EXAMPLES + 2 * k + 1]]).decode(
                "utf-8", errors="replace"
            )
            for k in range(min(skipped, 5))
        ]
        return _Parsed(
            rows[:n],
            row_times[:n],
            aggs[:n_agg],
            agg_times[:n_agg],
            paths,
            self.kinds.new_names(),
            self.comms.new_names(),
            int(info[_I_LOST]),
            skipped,
            examples,
            int(info[_I_BEHIND]),
        )


def _widen(rows: np.ndarray, used: int) -> np.ndarray:
    bigger = np.empty((2 * rows.shape[0], *rows.shape[1:]), dtype=rows.dtype)
    bigger[:used] = rows[:used]
    return bigger


def _read_tsv(path: Path, columns: dict[str, pa.DataType], stats: ParseStats) -> pd.DataFrame:
    """Read a tab-separated bpftrace output file into a DataFrame with the given columns."""
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame({c: pd.Series(dtype=t.to_pandas_dtype()) for c, t in columns.items()})
    return pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=list(columns), block_size=16 << 20),
        parse_options=pacsv.ParseOptions(
            delimiter="\t", quote_char=False, escape_char=False, invalid_row_handler=stats.handler
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=columns, strings_can_be_null=False, quoted_strings_can_be_null=False
        ),
    ).to_pandas()


# ---------------------------------------------------------------------------------------------
# The raw files of one kind each, as frames (tests, small files) and as merge rows


def parse_syscalls(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/syscalls.txt (tracing/bpf/syscalls.bt) into event rows (path unresolved):
    the one-by-one lines in file order, then the aggregated rows (comm empty)."""
    parser = _SyscallParser()
    rows, aggs, paths = [], [], []
    base = 0
    for buf, start, end in _blocks(path):
        parsed = parser.parse(buf, end, start)
        _count_parse(stats, parsed)
        refs = parsed.rows[:, _C_PATH]
        np.add(refs, base, out=refs, where=refs >= 0)  # path numbers are per block
        base += len(parsed.paths)
        rows.append(parsed.rows)
        aggs.append(parsed.aggs)
        paths.append(parsed.paths)
    parser.kinds.new_names()
    parser.comms.new_names()
    kinds = np.array(parser.kinds.decoded, dtype=object)
    comms = np.array([*parser.comms.decoded, ""], dtype=object)
    empty = np.empty((0, _N_COLS), dtype=np.int64)
    aggs = np.concatenate([empty, *aggs])
    aggs[:, _C_COMM] = len(comms) - 1  # ""
    return pd.concat(
        [
            _frame(
                np.concatenate([empty, *rows]),
                kinds,
                comms,
                pa.concat_arrays(paths or [pa.array([], pa.string())]),
            ),
            _frame(aggs, kinds, comms),
        ],
        ignore_index=True,
    )


def _frame(
    rows: np.ndarray, kinds: np.ndarray, comms: np.ndarray, paths: pa.Array | None = None
) -> pd.DataFrame:
    """Merge rows as a DataFrame with the columns of events (but ``container``)."""
    refs = rows[:, _C_PATH]
    path = (
        paths.take(pa.array(refs, mask=refs < 0)).to_numpy(zero_copy_only=False)
        if paths is not None
        else np.full(rows.shape[0], None, dtype=object)
    )
    return pd.DataFrame(
        {
            "ts_ns": rows[:, _C_TS],
            "kind": kinds[rows[:, _C_KIND]] if rows.shape[0] else np.array([], dtype=object),
            "pid": rows[:, _C_PID].astype(np.int32),
            "tid": rows[:, _C_TID].astype(np.int32),
            "comm": comms[rows[:, _C_COMM]] if rows.shape[0] else np.array([], dtype=object),
            "fd": rows[:, _C_FD].astype(np.int32),
            "path": path,
            "bytes": rows[:, _C_BYTES],
            "count": rows[:, _C_COUNT],
            "ret": rows[:, _C_RET],
            "offset": rows[:, _C_OFFSET],
            "latency_ns": rows[:, _C_LAT],
            "latency_max_ns": rows[:, _C_LATMAX],
            "dev": None,
            "in_container": rows[:, _C_INC] == 1,
        }
    )


def _count_parse(stats: ParseStats, parsed: _Parsed) -> None:
    stats.lost_events += parsed.lost
    stats.behind += parsed.behind
    for text in parsed.examples:
        stats.skip(text)
    stats.skipped_lines += parsed.skipped - len(parsed.examples)


class _BlockParser:
    """Parses raw/block.txt block by block (:func:`_parse_block_lines`): merge rows with the
    parser's codes of rwbs (kind), thread names and devices, and their names."""

    def __init__(self) -> None:
        _compile()
        self.rwbs = _NameTable()
        self.comms = _NameTable()
        self.dev_keys = np.full(64, -1, dtype=np.int64)
        self.dev_values = np.empty(64, dtype=np.int64)
        self.devs: list[int] = []  # device numbers by code
        self.rows_per_byte = 1 / 64

    def parse(self, buf: np.ndarray, start: int, end: int, stats: ParseStats) -> np.ndarray:
        """The rows of ``buf[start:end]`` (whole lines, see :func:`_blocks`)."""
        buf, start, end = _padded(buf, start, end)
        size = end - start
        rows = np.empty((int(size * self.rows_per_byte * 1.25) + 64, _N_COLS), dtype=np.int64)
        info = np.zeros(_I_EXAMPLES + 10, dtype=np.int64)
        info[_I_PATHS] = len(self.devs)
        pos = start
        while True:
            pos = _parse_block_lines(
                buf,
                buf.view(np.uint64),
                pos,
                end,
                rows,
                self.rwbs.table,
                self.rwbs.names,
                self.rwbs.count,
                self.comms.table,
                self.comms.names,
                self.comms.count,
                self.dev_keys,
                self.dev_values,
                info,
            )
            status = info[_I_STATUS]
            if status == 0:
                break
            if status == _FULL_NAMES:
                self.rwbs.grow()
                self.comms.grow()
                size = 2 * len(self.dev_keys)
                self.dev_keys, self.dev_values = _rehash(self.dev_keys, self.dev_values, size)
            else:
                rows = _widen(rows, info[_I_ROWS])
        n = int(info[_I_ROWS])
        self.rows_per_byte = max(n / size, 1 / 4096)
        for code in range(len(self.devs), int(info[_I_PATHS])):  # the devices added, in order
            slot = np.flatnonzero((self.dev_values == code) & (self.dev_keys != -1))
            self.devs.append(int(self.dev_keys[slot[0]]) >> 1)
        self.rwbs.new_names()
        self.comms.new_names()
        stats.lost_events += int(info[_I_LOST])
        stats.behind += int(info[_I_BEHIND])
        skipped = int(info[_I_SKIPPED])
        for k in range(min(skipped, 5)):
            line = bytes(buf[info[_I_EXAMPLES + 2 * k] : info[_I_EXAMPLES + 2 * k + 1]])
            stats.skip(line.decode("utf-8", errors="replace"))
        stats.skipped_lines += skipped - min(skipped, 5)
        return rows[:n]

    def kinds(self) -> list[str]:
        """The kind of each rwbs code."""
        return [
            "block_read" if "R" in r else "block_write" if "W" in r else "block_other"
            for r in self.rwbs.decoded
        ]

    def dev_names(self) -> list[str]:
        """The name (major:minor) of each device code."""
        return [f"{d >> 20}:{d & 0xFFFFF}" for d in self.devs]


def parse_block(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/block.txt (tracing/bpf/block.bt)."""
    parser = _BlockParser()
    parts = [parser.parse(buf, start, end, stats) for buf, start, end in _blocks(path)]
    rows = np.concatenate([np.empty((0, _N_COLS), dtype=np.int64), *parts])
    kinds = np.array(parser.kinds() or [""], dtype=object)
    comms = np.array(parser.comms.decoded or [""], dtype=object)
    devs = np.array(parser.dev_names() or [""], dtype=object)
    n = len(rows)
    return pd.DataFrame(
        {
            "ts_ns": rows[:, _C_TS],
            "kind": kinds[rows[:, _C_KIND]],
            "pid": rows[:, _C_PID].astype(np.int32),
            "tid": np.full(n, -1, dtype=np.int32),
            "comm": comms[rows[:, _C_COMM]],
            "fd": np.full(n, -1, dtype=np.int32),
            "path": None,
            "bytes": rows[:, _C_BYTES],
            "count": np.ones(n, dtype=np.int64),
            "ret": np.zeros(n, dtype=np.int64),
            "offset": rows[:, _C_OFFSET],
            "latency_ns": rows[:, _C_LAT],
            "latency_max_ns": rows[:, _C_LAT],
            "dev": devs[rows[:, _C_DEV]] if n else None,
            "in_container": rows[:, _C_INC] == 1,
        }
    )


@dataclass
class _Cache:
    """The rows of raw/cache.txt (:func:`_parse_cache_lines`), in file order."""

    ts: np.ndarray
    code: np.ndarray  # the map: its index in CACHE_KINDS
    pid: np.ndarray
    comm: pa.Array
    pages: np.ndarray

    @classmethod
    def read(cls, path: Path, stats: ParseStats) -> _Cache:
        raw = path.read_bytes() if path.exists() else b""
        buf = np.zeros((len(raw) + 1 + 16 + 7) // 8 * 8, dtype=np.uint8)  # see _word
        buf[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        end = len(raw)
        if end and buf[end - 1] != 10:
            buf[end] = 10
            end += 1
        _compile()
        n_max = raw.count(b"\n") + 1
        ints = np.empty((4, n_max), dtype=np.int64)  # ts, code, pid, pages
        comms = np.empty(n_max + 1, dtype=np.int32)
        heap = np.empty(max(end, 1), dtype=np.uint8)
        n, used, lost, behind = _parse_cache_lines(buf, buf.view(np.uint64), end, ints, comms, heap)
        stats.lost_events += int(lost)
        stats.behind += int(behind)
        comm = pa.StringArray.from_buffers(
            n, pa.py_buffer(comms[: n + 1].copy()), pa.py_buffer(heap[:used].copy())
        )
        try:
            comm.validate(full=True)
        except pa.ArrowInvalid:  # not UTF-8: replace the bytes that are not
            comm = pa.array(
                [c.decode("utf-8", errors="replace") for c in comm.cast(pa.binary()).to_pylist()],
                type=pa.string(),
            )
        ts, code, pid, pages = ints[:, :n]
        return cls(ts.copy(), code.astype(np.int8), pid.astype(np.int32), comm, pages.copy())


def parse_cache(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/cache.txt (tracing/bpf/cache.bt): per-process page counts per 100 ms block."""
    cache = _Cache.read(path, stats)
    n = len(cache.ts)
    return pd.DataFrame(
        {
            "ts_ns": cache.ts,
            "kind": np.array(CACHE_KINDS, dtype=object)[cache.code].tolist(),
            "pid": cache.pid,
            "tid": np.full(n, -1, dtype=np.int32),
            "comm": cache.comm.to_pylist(),
            "fd": np.full(n, -1, dtype=np.int32),
            "path": None,
            "bytes": cache.pages * PAGE_SIZE,
            "count": cache.pages,
            "ret": np.zeros(n, dtype=np.int64),
            "offset": np.full(n, -1, dtype=np.int64),
            "latency_ns": np.zeros(n, dtype=np.int64),
            "latency_max_ns": np.zeros(n, dtype=np.int64),
            "dev": None,
            "in_container": True,
        }
    )


def parse_proc(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/proc.txt (tracing/bpf/proc.bt). Thread creations are kept for now."""
    df = _read_tsv(path, _PROC_COLUMNS, stats)
    n = len(df)
    return pd.DataFrame(
        {
            "ts_ns": df["ts_ns"],
            "kind": df["kind"],
            "pid": df["pid"],
            "tid": df["tid"],
            "comm": df["comm"],
            "fd": np.full(n, -1, dtype=np.int32),
            "path": df["path"].where(df["path"] != "", None),
            "bytes": np.zeros(n, dtype=np.int64),
            "count": np.ones(n, dtype=np.int64),
            "ret": df["child"].astype(np.int64),
            "offset": np.full(n, -1, dtype=np.int64),
            "latency_ns": np.zeros(n, dtype=np.int64),
            "latency_max_ns": np.zeros(n, dtype=np.int64),
            "dev": None,
            "in_container": True,
        }
    )


def container_owners(proc: pd.DataFrame, roots: Mapping[int, str]) -> dict[int, str]:
    """Which container each process belongs to: a container's first process (``roots``: host
    pid -> role) and, following the traced forks in time order, everything it started."""
    owner = {int(pid): role for pid, role in roots.items()}
    forks = proc[(proc["kind"] == "fork").to_numpy()].sort_values("ts_ns", kind="stable")
    for parent, child in zip(forks["pid"].to_numpy(), forks["ret"].to_numpy(), strict=True):
        role = owner.get(int(parent))
        if role is not None:
            owner[int(child)] = role
    return owner


def attribute_containers(
    events: pd.DataFrame, proc: pd.DataFrame, roots: Mapping[int, str]
) -> pd.Series:
    """The ``container`` column: the role whose process made each in-container event; null for
    events outside the run's containers (block completions of other processes, say). With a
    single container every in-container event is its own, whatever its pid."""
    owners = _Owners(proc, roots)
    codes = owners.codes(
        events["pid"].to_numpy(dtype=np.int64), events["in_container"].to_numpy(dtype=bool)
    )
    return pd.Series(owners.roles.take(codes).to_pandas(), index=events.index, dtype="string")


class _Owners:
    """The ``container`` column as codes of ``roles`` (see :func:`attribute_containers`)."""

    def __init__(self, proc: pd.DataFrame, roots: Mapping[int, str] | None) -> None:
        roots = roots or {}
        self.roles = _Names(sorted(set(roots.values())))
        owner = container_owners(proc, roots) if len(self.roles.names) > 1 else {}
        pids = np.array(sorted(owner), dtype=np.int64)
        self.pids = pids
        self.pid_roles = np.array([self.roles.codes[owner[p]] for p in pids], dtype=np.int64)

    def dense(self) -> np.ndarray:
        """Role code + 1 by pid (0: none); the last entry applies to every pid when set."""
        owners = np.zeros(_PID_LIMIT + 1, dtype=np.int16)  # pages are mapped when used
        if len(self.roles.names) == 1:
            owners[_PID_LIMIT] = 1
        keep = self.pids < _PID_LIMIT
        owners[self.pids[keep]] = self.pid_roles[keep] + 1
        return owners

    def codes(self, pid: np.ndarray, inside: np.ndarray) -> np.ndarray:
        n_roles = len(self.roles.names)
        if n_roles == 0:
            return np.full(len(pid), -1, dtype=np.int64)
        if n_roles == 1:
            return np.where(inside, 0, -1)
        at = np.minimum(np.searchsorted(self.pids, pid), max(len(self.pids) - 1, 0))
        found = (self.pids[at] == pid) & inside if len(self.pids) else np.zeros(len(pid), bool)
        return np.where(found, self.pid_roles[at] if len(self.pids) else -1, -1)


# ---------------------------------------------------------------------------------------------
# The merge: rows of every raw file in time order, joined, as tables of events


def _frame_rows(df: pd.DataFrame, kinds: _Names, comms: _Names, devs: _Names) -> np.ndarray:
    """A frame of :func:`parse_proc` as merge rows (path numbers still to be set: -1)."""
    rows = np.empty((len(df), _N_COLS), dtype=np.int64)
    if not len(df):
        return rows
    rows[:, _C_TS] = df["ts_ns"].to_numpy()
    rows[:, _C_KIND] = kinds.codes_of(pa.array(df["kind"].astype(object), type=pa.string()))
    rows[:, _C_PID] = df["pid"].to_numpy()
    rows[:, _C_TID] = df["tid"].to_numpy()
    rows[:, _C_COMM] = comms.codes_of(pa.array(df["comm"].astype(object), type=pa.string()))
    rows[:, _C_FD] = df["fd"].to_numpy()
    rows[:, _C_PATH] = -1
    rows[:, _C_BYTES] = df["bytes"].to_numpy()
    rows[:, _C_RET] = df["ret"].to_numpy()
    rows[:, _C_OFFSET] = df["offset"].to_numpy()
    rows[:, _C_LAT] = df["latency_ns"].to_numpy()
    rows[:, _C_COUNT] = df["count"].to_numpy()
    rows[:, _C_LATMAX] = df["latency_max_ns"].to_numpy()
    dev = df["dev"]
    rows[:, _C_DEV] = (
        devs.codes_of(pa.array(dev.astype(object), type=pa.string())) if dev.notna().any() else -1
    )
    rows[:, _C_INC] = df["in_container"].to_numpy(dtype=bool)
    rows[:, _C_LINE] = 0
    return rows


class _Part:
    """Rows of one source (a parsed block, a whole small file), their order by time (stable:
    ties keep the file's order) and how many of them, in that order, were released. The rows
    of raw/syscalls.txt keep the parser's codes of kinds and thread names (``parsed``) and
    their paths' numbers in the block: ``base`` is added (see :func:`_join_round`)."""

    def __init__(self, rows: np.ndarray, ts: np.ndarray | None = None, parsed: bool = False):
        self.rows = rows
        self.parsed = parsed
        self.base = 0
        if ts is None:
            ts = np.ascontiguousarray(rows[:, _C_TS])
        if len(ts) < 2 or bool((ts[1:] >= ts[:-1]).all()):
            self.order = np.arange(len(ts), dtype=np.int64)
        else:
            self.order = np.argsort(ts, kind="stable")
        self.times = ts[self.order]
        self.at = 0

    def left(self) -> np.ndarray:
        """The numbers of the rows not released yet, in time order."""
        return self.order[self.at :]


def _joined(
    ranges: list[tuple[_Part, int, int]], comm_map: np.ndarray, kind_map: np.ndarray
) -> tuple[_Part, int, int]:
    """Ranges of parts (in time order each) as one range of one part: their rows copied, in
    time order (ties: the row of the earlier range first), with our codes and path numbers."""
    pieces = []
    for part, a, b in ranges:
        rows = part.rows[part.order[a:b]]
        if part.parsed:
            rows[:, _C_KIND] = kind_map[rows[:, _C_KIND]]
            comm = rows[:, _C_COMM]
            rows[:, _C_COMM] = np.where(comm >= 0, comm_map[np.maximum(comm, 0)], comm)
        path = rows[:, _C_PATH]
        rows[:, _C_PATH] = np.where(path >= 0, path + part.base, path)
        pieces.append(rows)
    rows = np.concatenate(pieces)
    part = _Part(rows)
    part.at = len(rows)
    return part, 0, len(rows)


_NO_PART = _Part(np.empty((0, _N_COLS), dtype=np.int64))


class _Pending:
    """The parts of one source with rows not yet released, in arrival order."""

    def __init__(self) -> None:
        self.parts: list[_Part] = []

    def add(self, part: _Part) -> None:
        if part.rows.shape[0]:
            self.parts.append(part)

    def release(self, before: int) -> list[tuple[_Part, int, int]]:
        """Release the rows with ``ts_ns < before`` (every row for _END): (part, first, end)
        ranges of the parts' time orders."""
        out = []
        for part in self.parts:
            end = len(part.times)
            if before != _END:
                end = int(np.searchsorted(part.times, before, side="left"))
            if end > part.at:
                out.append((part, part.at, end))
                part.at = end
        self.parts = [part for part in self.parts if part.at < len(part.times)]
        return out


class _Background:
    """Iterate ``items`` on a thread started at once, ``depth`` items ahead (their memory
    stays bounded); :meth:`close` stops it."""

    _DONE = object()

    def __init__(self, items: Iterator[Any], depth: int | None = None) -> None:
        self.channel: queue.Queue = queue.Queue(maxsize=depth or READ_AHEAD)
        self.stop = threading.Event()
        self.items = items
        self.finished = False
        self.thread = threading.Thread(target=self._run, name="twintrace-ingest-reader")
        self.thread.daemon = True
        self.thread.start()

    def _run(self) -> None:
        try:
            for item in self.items:
                while not self.stop.is_set():
                    try:
                        self.channel.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self.stop.is_set():
                    return
            self.channel.put((self._DONE, None))
        except BaseException as exc:  # handed to the consumer
            self.channel.put((self._DONE, exc))

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        item, exc = self.channel.get()
        if item is self._DONE:
            self.finished = True
            if exc is not None:
                raise exc
            raise StopIteration
        return item

    def close(self) -> None:
        self.stop.set()
        while self.thread.is_alive():
            try:
                self.channel.get(timeout=0.1)
            except queue.Empty:
                pass
        self.thread.join()


def _indices(codes: np.ndarray) -> pa.Array:
    """int32 codes (-1: null) as an Arrow array (no copy of the codes)."""
    bitmap = np.empty((len(codes) + 7) // 8 + 1, dtype=np.uint8)
    nulls = _validity(codes, bitmap)
    if nulls == 0:
        return pa.array(codes)
    buffers = [pa.py_buffer(bitmap), pa.py_buffer(codes)]
    return pa.Array.from_buffers(pa.int32(), len(codes), buffers, null_count=nulls)


class _Heap:
    """Strings (the paths of openat and exec rows) by number, in numpy buffers that grow; a
    round's path column is a dictionary of its distinct paths (:func:`_path_dictionary`)."""

    def __init__(self) -> None:
        self.size = 0
        self.offsets = np.zeros(1 << 12, dtype=np.int64)
        self.data = np.zeros(1 << 16, dtype=np.uint8)
        self.local = np.full(1 << 12, -1, dtype=np.int64)  # scratch of _path_dictionary

    def add(self, strings: pa.Array) -> np.ndarray:
        """Append ``strings`` (UTF-8, validated); their numbers (-1 for nulls)."""
        numbers = np.arange(self.size, self.size + len(strings), dtype=np.int64)
        if strings.null_count:
            valid = strings.is_valid().to_numpy(zero_copy_only=False)
            numbers[~valid] = -1
            numbers[valid] = np.arange(self.size, self.size + int(valid.sum()))
            strings = strings.filter(pa.array(valid))
        if not len(strings):
            return numbers
        _, offsets_buffer, data_buffer = strings.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[
            strings.offset : strings.offset + len(strings) + 1
        ]
        data = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[-1]]
        self._reserve(self.size + len(strings), len(data))
        used = int(self.offsets[self.size])
        self.data[used : used + len(data)] = data
        self.offsets[self.size + 1 : self.size + len(strings) + 1] = offsets[1:] - offsets[0] + used
        self.size += len(strings)
        return numbers

    def _reserve(self, count: int, more_bytes: int) -> None:
        if count + 1 > len(self.offsets):
            bigger = np.zeros(2 * (count + 1), dtype=np.int64)
            bigger[: self.size + 1] = self.offsets[: self.size + 1]
            self.offsets = bigger
        need = int(self.offsets[self.size]) + more_bytes + 16  # slack: 8-byte reads at the end
        if need > len(self.data):
            bigger = np.empty((2 * need + 7) // 8 * 8, dtype=np.uint8)
            bigger[: self.offsets[self.size]] = self.data[: self.offsets[self.size]]
            self.data = bigger

    def dictionary(self, refs: np.ndarray) -> pa.DictionaryArray:
        """A dictionary array of the strings ``refs`` refers to (-1: null; ``refs`` becomes the
        codes, in place)."""
        if len(self.local) < self.size:
            self.local = np.full(2 * self.size, -1, dtype=np.int64)
        offsets, data = _path_dictionary(refs, self.offsets, self.data, self.local)
        names = pa.StringArray.from_buffers(
            len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data)
        )
        return pa.DictionaryArray.from_arrays(_indices(refs), names, safe=False)

    def keep(self, live: np.ndarray) -> None:
        """Keep only the strings ``live`` (sorted numbers), renumbered 0, 1, ... in order."""
        offsets = np.zeros(max(len(live) + 1, 1 << 12), dtype=np.int64)
        data = np.empty(len(self.data), dtype=np.uint8)
        _gather_strings(self.offsets, self.data, live, offsets, data)
        self.offsets, self.data, self.size = offsets, data, len(live)


class _Merge:
    """The events of a raw directory as tables in time order (see the module doc)."""

    def __init__(
        self,
        raw_dir: Path,
        roots: Mapping[int, str] | None,
        stats: ParseStats,
        window: int,
        host: str | None = None,
        shift_ns: int = 0,
    ) -> None:
        self.raw_dir = raw_dir
        self.stats = stats
        self.window = window
        # the ``host`` column's one value, and what is added to every time on output (a host's
        # clock brought onto the coordinator's: tracing/clock.py)
        self.host = pa.array([] if host is None else [host], type=pa.string())
        self.shift_ns = shift_ns
        self.kinds = _Names(KINDS)
        self.comms = _Names()
        self.devs = _Names()
        # the join's (pid, fd) -> path table, comm + 1 by tid, thread-group leaders by pid
        self.fd_keys = np.full(1 << 12, -1, dtype=np.int64)
        self.fd_values = np.empty(1 << 12, dtype=np.int64)
        self.join_state = np.zeros(3, dtype=np.int64)
        self.tid_comms = np.zeros(_PID_LIMIT, dtype=np.int32)  # pages are mapped when used
        self.leaders = np.zeros(_PID_LIMIT, dtype=np.uint8)
        # raw/syscalls.txt is parsed on a thread from now on
        _compile()
        self.syscalls = _Background(self._syscall_blocks())
        try:
            self._read_small_files(roots)
        except BaseException:
            self.syscalls.close()
            raise
        self.sys_comms = np.empty(0, dtype=np.int64)  # the parser's comm codes -> ours
        self.sys_kinds = np.arange(len(SYSCALL_KINDS), dtype=np.int64)
        self.released = -(2**63)  # every row before this time was released
        self.last_ts = -(2**63)  # the time of the last row written in order
        self.late: list[pa.Table] = []

    def _read_small_files(self, roots: Mapping[int, str] | None) -> None:
        """raw/proc.txt and raw/cache.txt, whole and in time order; the containers."""
        # paths: every path a pending row or the descriptor table refers to, by number
        self.heap = _Heap()
        self.heap_compacted = 0
        proc = parse_proc(self.raw_dir / "proc.txt", self.stats)
        self.owners = _Owners(proc, roots)
        self.pid_owners = self.owners.dense()
        # rows, count, bytes by (container + 1, kind); kinds are int8 codes
        self.sums = np.zeros((len(self.owners.roles.names) + 1, 128, 3), dtype=np.int64)
        leaders = proc.loc[(proc["kind"] != "fork").to_numpy(), "pid"].to_numpy(dtype=np.int64)
        self.leaders[leaders[(leaders >= 0) & (leaders < _PID_LIMIT)]] = 1
        proc_rows = _frame_rows(proc, self.kinds, self.comms, self.devs)
        exec_paths = pa.array(proc["path"].astype(object), type=pa.string())
        proc_rows[:, _C_PATH] = self.heap.add(exec_paths)
        cache_rows = self._cache_rows(_Cache.read(self.raw_dir / "cache.txt", self.stats))
        self.pending = {name: _Pending() for name in ("sys", "agg", "block", "cache", "proc")}
        self.pending["cache"].add(_Part(cache_rows))
        self.pending["proc"].add(_Part(proc_rows))

    def _cache_rows(self, cache: _Cache) -> np.ndarray:
        """raw/cache.txt as merge rows (what :func:`parse_cache` makes of it)."""
        n = len(cache.ts)
        rows = np.empty((n, _N_COLS), dtype=np.int64)
        rows[:, _C_TS] = cache.ts
        codes = np.array([self.kinds.code(kind) for kind in CACHE_KINDS], dtype=np.int64)
        rows[:, _C_KIND] = codes[cache.code]
        rows[:, _C_PID] = cache.pid
        rows[:, _C_TID] = -1
        rows[:, _C_COMM] = self.comms.codes_of(cache.comm) if n else -1
        rows[:, _C_FD] = -1
        rows[:, _C_PATH] = -1
        rows[:, _C_BYTES] = cache.pages * PAGE_SIZE
        rows[:, _C_RET] = 0
        rows[:, _C_OFFSET] = -1
        rows[:, _C_LAT] = rows[:, _C_LATMAX] = 0
        rows[:, _C_COUNT] = cache.pages
        rows[:, _C_DEV] = -1
        rows[:, _C_INC] = 1
        rows[:, _C_LINE] = 0
        return rows

    # -- sources -------------------------------------------------------------------------------

    def _syscall_blocks(self) -> Iterator[tuple[_Parsed, _Part, _Part]]:
        parser = _SyscallParser(self.leaders)
        for buf, start, end in _blocks(self.raw_dir / "syscalls.txt"):
            parsed = parser.parse(buf, end, start)
            lines = _Part(parsed.rows, parsed.row_times, parsed=True)
            yield parsed, lines, _Part(parsed.aggs, parsed.agg_times, parsed=True)

    def _block_blocks(self) -> Iterator[np.ndarray]:
        parser = _BlockParser()
        for buf, start, end in _blocks(self.raw_dir / "block.txt"):
            rows = parser.parse(buf, start, end, self.stats)
            kinds = np.array([self.kinds.code(k) for k in parser.kinds()] + [-1])
            comms = np.array([self.comms.code(c) for c in parser.comms.decoded] + [-1])
            devs = np.array([self.devs.code(d) for d in parser.dev_names()] + [-1])
            rows[:, _C_KIND] = kinds[rows[:, _C_KIND]]
            rows[:, _C_COMM] = comms[rows[:, _C_COMM]]
            rows[:, _C_DEV] = devs[rows[:, _C_DEV]]
            yield rows

    def _take_syscalls(self, item: tuple[_Parsed, _Part, _Part]) -> int:
        parsed, lines, aggs = item
        _count_parse(self.stats, parsed)
        for name in parsed.new_kinds:
            self.sys_kinds = np.append(self.sys_kinds, self.kinds.code(name))
        if parsed.new_comms:
            codes = [self.comms.code(name) for name in parsed.new_comms]
            self.sys_comms = np.append(self.sys_comms, np.array(codes, dtype=np.int64))
        lines.base = self.heap.size  # the block's paths are numbered after those in the heap
        self.heap.add(parsed.paths)
        self.pending["sys"].add(lines)
        self.pending["agg"].add(aggs)
        return max([-(2**63)] + [int(part.times[-1]) for part in (lines, aggs) if len(part.times)])

    def _take_block(self, rows: np.ndarray) -> int:
        part = _Part(rows)
        self.pending["block"].add(part)
        return int(part.times[-1]) if len(part.times) else -(2**63)

    # -- rounds --------------------------------------------------------------------------------

    def tables(self) -> Iterator[pa.Table]:
        """The events in time order, a table per round (rows later than the window are kept in
        :attr:`late`)."""
        sources: dict[str, tuple[Iterator[Any], Callable[[Any], int]]] = {
            "sys": (self.syscalls, self._take_syscalls),
            "block": (iter(self._block_blocks()), self._take_block),
        }
        reached = {name: -(2**63) for name in sources}
        try:
            while sources:
                name = min(sources, key=reached.__getitem__)
                items, take = sources[name]
                item = next(items, None)
                if item is None:
                    del sources[name]
                else:
                    reached[name] = max(reached[name], take(item))
                if sources:
                    until = min(reached[n] for n in sources) - self.window
                    if until > self.released:
                        yield from self._round(until)
            yield from self._round(None)
        finally:
            self.syscalls.close()

    def _round(self, before: int | None) -> Iterator[pa.Table]:
        """Release, join and tabulate the rows before ``before`` (None: every row left)."""
        limit = _END if before is None else before
        ranges = [r for name in self.pending for r in self.pending[name].release(limit)]
        if before is not None:
            self.released = max(self.released, before)
        if not ranges:
            return
        if len(ranges) > _MAX_PARTS:  # many parts (never seen): one, copied
            ranges = [_joined(ranges, self.sys_comms, self.sys_kinds)]
        ranges += [(_NO_PART, 0, 0)] * (_MAX_PARTS - len(ranges))
        at = np.array([r[1] for r in ranges], dtype=np.int64)
        end = np.array([r[2] for r in ranges], dtype=np.int64)
        n = int((end - at).sum())
        out64 = np.empty((7, n), dtype=np.int64)
        out32 = np.empty((7, n), dtype=np.int32)
        kind = np.empty(n, dtype=np.int8)
        inside = np.empty(n, dtype=np.bool_)
        state = self.join_state
        state[_S_WRITTEN] = 0
        action = self._actions()
        while not _join_round(
            tuple(part.rows for part, _, _ in ranges),
            tuple(part.times for part, _, _ in ranges),
            tuple(part.order for part, _, _ in ranges),
            at,
            end,
            np.array([part.base for part, _, _ in ranges], dtype=np.int64),
            np.array([part.parsed for part, _, _ in ranges], dtype=np.bool_),
            self.sys_comms,
            self.sys_kinds,
            action,
            self.leaders,
            self.pid_owners,
            self.fd_keys,
            self.fd_values,
            self.tid_comms,
            state,
            out64,
            out32,
            kind,
            inside,
            self.sums,
        ):
            size = 2 * len(self.fd_keys)
            while 4 * (state[_S_USED] + 2) > size:
                size *= 2
            self.fd_keys, self.fd_values = _rehash(self.fd_keys, self.fd_values, size)
        m = int(state[_S_WRITTEN])
        comm = out32[_O_COMM, :m]
        if (comm < 0).any():
            self._comms_of_lone_aggregates(ranges, out64[_O_TS, :m], out32[_O_TID, :m], comm)
        late = int(np.searchsorted(out64[_O_TS, :m], self.last_ts, side="left"))
        if late:
            self.stats.late_rows += late
            self.late.append(
                self._table(out64[:, :late], out32[:, :late], kind[:late], inside[:late]).cast(
                    EVENTS_SCHEMA
                )
            )
        if m > late:
            self.last_ts = int(out64[_O_TS, m - 1])
            yield self._table(out64[:, late:m], out32[:, late:m], kind[late:m], inside[late:m])
        self._compact_paths()

    def _actions(self) -> np.ndarray:
        what = {"openat": _A_OPEN, "close": _A_CLOSE, "dup": _A_DUP, "fork": _A_FORK}
        return np.array(
            [what.get(kind, _A_USE if kind in FD_KINDS else _A_NONE) for kind in self.kinds.names],
            dtype=np.int64,
        )

    def _comms_of_lone_aggregates(
        self, ranges: list, ts: np.ndarray, tid: np.ndarray, comm: np.ndarray
    ) -> None:
        """An aggregated row whose thread had no line before it takes the comm of the thread's
        next line (in this round, else still pending), else ""."""

        def comms(part: _Part, which: np.ndarray) -> np.ndarray:
            """Time, thread and our comm code of the one-by-one lines ``which`` of ``part``."""
            rows = part.rows[which]
            rows = rows[rows[:, _C_LINE] == 1][:, [_C_TS, _C_TID, _C_COMM]]
            if part.parsed:
                rows[:, 2] = self.sys_comms[rows[:, 2]]
            return rows

        empty = np.empty((0, 3), dtype=np.int64)
        lines = np.concatenate([empty] + [comms(p, p.order[a:b]) for p, a, b in ranges])
        later = np.concatenate([empty] + [comms(p, p.left()) for p in self.pending["sys"].parts])
        for i in np.flatnonzero(comm < 0):
            for source in (lines, later):
                same = np.flatnonzero(source[:, 1] == tid[i])
                if len(same):
                    after = same[source[same, 0] >= ts[i]]
                    pick = after if len(after) else same
                    comm[i] = source[pick[np.argmin(source[pick, 0])], 2]
                    break
            else:
                comm[i] = self.comms.code("")

    def _table(
        self, out64: np.ndarray, out32: np.ndarray, kind: np.ndarray, inside: np.ndarray
    ) -> pa.Table:
        """Joined output columns as a table of events (_WRITE_SCHEMA: the strings as
        dictionaries of their few values, none built row by row)."""
        kinds, comms, devs, roles = (
            self.kinds.array(),
            self.comms.array(),
            self.devs.array(),
            self.owners.roles.array(),
        )

        def encoded(codes: np.ndarray, names: pa.Array) -> pa.DictionaryArray:
            return pa.DictionaryArray.from_arrays(_indices(codes), names, safe=False)

        # the kind column: its dictionary the kinds present (readers get no empty category)
        kind = kind.view(np.uint8)
        present = np.flatnonzero(np.bincount(kind, minlength=128))
        codes = np.zeros(128, dtype=np.int8)
        codes[present] = np.arange(len(present))
        ts = out64[_O_TS] + self.shift_ns if self.shift_ns else out64[_O_TS]
        host = np.full(len(ts), 0 if len(self.host) else -1, dtype=np.int32)
        columns = [
            pa.array(ts),
            pa.DictionaryArray.from_arrays(
                pa.array(codes[kind]), kinds.take(pa.array(present)), safe=False
            ),
            pa.array(out32[_O_PID]),
            pa.array(out32[_O_TID]),
            encoded(out32[_O_COMM], comms),
            pa.array(out32[_O_FD]),
            self.heap.dictionary(out32[_O_PATH]),
            pa.array(out64[_O_BYTES]),
            pa.array(out64[_O_COUNT]),
            pa.array(out64[_O_RET]),
            pa.array(out64[_O_OFFSET]),
            pa.array(out64[_O_LAT]),
            pa.array(out64[_O_LATMAX]),
            encoded(out32[_O_DEV], devs),
            pa.array(inside),
            encoded(out32[_O_CONTAINER], roles),
            encoded(host, self.host),
        ]
        return pa.Table.from_arrays(columns, schema=_WRITE_SCHEMA)

    def event_totals(self) -> EventTotals:
        """The totals of every row tabulated so far."""
        totals = EventTotals()
        roles = [None, *self.owners.roles.names]
        for c, k in zip(*np.nonzero(self.sums[:, :, 0]), strict=True):
            rows, count, nbytes = (int(v) for v in self.sums[c, k])
            totals.add(roles[c], self.kinds.names[k], rows, count, nbytes)
        return totals

    def _compact_paths(self) -> None:
        """Keep in the heap only the paths still referred to (pending rows, descriptors)."""
        if self.heap.size < max(HEAP_PATHS, 2 * self.heap_compacted):
            return
        parts = [part for pending in self.pending.values() for part in pending.parts]
        live = np.zeros(self.heap.size, dtype=np.bool_)
        for part in parts:
            _paths_used(part.rows, part.left(), part.base, live)
        values = self.fd_values
        named = (self.fd_keys != -1) & (values >= 0)
        live[values[named]] = True
        numbers = np.cumsum(live) - 1  # of the paths kept, by their old numbers
        self.heap.keep(np.flatnonzero(live))
        self.heap_compacted = int(numbers[-1]) + 1 if len(numbers) else 0
        for part in parts:
            _renumber_paths(part.rows, part.left(), part.base, numbers)
            part.base = 0
        values[named] = numbers[values[named]]


# ---------------------------------------------------------------------------------------------
# Writing events.parquet


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
) -> tuple[EventTotals, ParseStats]:
    """Parse every raw tracer file of a run into ``path`` (events.parquet, sorted by time),
    streaming: memory stays bounded whatever the trace's length. Returns what the summary
    needs (:func:`summarize`) and what the parser skipped.

    ``roots`` maps each container's first process (host pid) to its role, for the
    ``container`` column; None (raw files without a manifest) leaves the column null.
    ``host``: the ``host`` column; ``shift_ns``: added to every time (the host's clock offset
    to the coordinator's, negated)."""
    stats = ParseStats()
    merge = _Merge(Path(raw_dir), roots, stats, window_ns, host, shift_ns)
    with atomic_path(path) as tmp:
        sink = _ParquetSink(tmp)
        try:
            for table in merge.tables():
                sink.put(table)
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


# ---------------------------------------------------------------------------------------------
# Samples, phases, summary


def build_samples(raw_dir: Path, host: str | None = None, shift_ns: int = 0) -> pd.DataFrame:
    """Read raw/samples.csv (long format) written by tracing.samplers. ``container`` is the
    role of a container's metric, null for host-wide metrics; ``host`` the host column;
    ``shift_ns`` is added to every time (as :func:`write_events`)."""
    path = raw_dir / "samples.csv"
    columns = SAMPLES_COLUMNS
    if not path.exists() or path.stat().st_size == 0:
        return empty_frame(columns)
    # The sampler may have been stopped mid-line: on_bad_lines drops a cut-off last line.
    df = pd.read_csv(
        path,
        dtype={"ts_ns": "Int64", "metric": "string", "unit": "string", "container": "string"},
        keep_default_na=False,
        na_values={"ts_ns": [""], "value": [""]},
        on_bad_lines="skip",
    )
    if "container" not in df.columns:
        df["container"] = pd.Series(pd.NA, index=df.index, dtype="string")
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    df = df.dropna(subset=["ts_ns", "metric", "value", "unit"])
    df["container"] = df["container"].where(df["container"] != "", pd.NA)
    df["host"] = pd.Series(host, index=df.index, dtype="string")
    if shift_ns:
        df["ts_ns"] = df["ts_ns"] + shift_ns
    return df.astype(columns)


def build_phases(
    raw_dir: Path,
    roles: Sequence[str] = (),
    realtime_offset_ns: int | None = None,
    peer: Mapping[str, Any] | None = None,
    host: str | None = None,
    placement: Mapping[str, tuple[str, int]] | None = None,
) -> pd.DataFrame:
    """Parse each container's MLLOG events (``raw/<role>/mllog.log``), or ``raw/mllog.log``
    when no roles are given, into one phases table with the ``container`` column and the
    ``host`` column (``host``, or a role's host from ``placement``: role -> (host, ns added to
    its times, as :func:`write_events`)). A container
    that ran DLIO has its outputs in ``raw/<role>/dlio/`` instead (:mod:`tracing.dlio`: its
    wall-clock times placed with ``realtime_offset_ns``, CLOCK_REALTIME - CLOCK_MONOTONIC;
    ``peer``: the manifest's record of the DLIO run)."""
    from tracing.dlio import parse_dlio
    from tracing.mllog import parse_mllog

    sources = [(raw_dir / role / "mllog.log", role) for role in roles] or [
        (raw_dir / "mllog.log", None)
    ]
    frames = []
    for path, role in sources:
        outputs = path.parent / "dlio"
        if not path.exists() and realtime_offset_ns is not None and outputs.is_dir():
            scale = int((peer or {}).get("samples_per_dlio_sample") or 1)
            frame = parse_dlio(outputs, realtime_offset_ns, scale)
            path = outputs / "dlio.log"
        else:
            frame = parse_mllog(path)
        frame["container"] = pd.Series(role, index=frame.index, dtype="string")
        where, shift = (placement or {}).get(role or "", (host, 0))
        frame["host"] = pd.Series(where, index=frame.index, dtype="string")
        if shift:
            frame[["ts_ns", "end_ns"]] += shift
        frames.append(conform(frame, PHASES_COLUMNS, str(path.relative_to(raw_dir.parent))))
    phases = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return phases.sort_values("ts_ns", kind="stable", ignore_index=True)


def summarize(events: EventTotals | pa.Table, phases: pd.DataFrame, stats: ParseStats) -> dict:
    """Counts and bytes per kind, grouped as in summary.json (docs/run-format.md); with
    several containers also per container (``containers``). ``events``: the totals
    :func:`write_events` returns (or an events table)."""
    totals = events if isinstance(events, EventTotals) else EventTotals.of_table(events)
    result = {
        "steps": _steps(phases),
        "lost_events": stats.lost_events,
        "tracer_behind": stats.behind,
        "skipped_lines": stats.skipped_lines,
        **_kind_groups(totals.per_kind()),
    }
    roles = sorted(totals.containers | set(phases["container"].dropna()))
    if len(roles) > 1:
        result["containers"] = {
            role: {
                "steps": _steps(phases[(phases["container"] == role).fillna(False).to_numpy()]),
                **_kind_groups(totals.per_kind(role)),
            }
            for role in roles
        }
    return result


def _steps(phases: pd.DataFrame) -> int:
    """Training steps: ``step_end`` events of rank 0 (or of a run without ranks)."""
    if not len(phases):
        return 0
    return int(((phases["key"] == "step_end") & phases["rank"].isin([0, -1])).sum())


def _kind_groups(per_kind: Mapping[str, tuple[int, int]]) -> dict[str, dict]:
    groups: dict[str, dict] = {"syscalls": {}, "block": {}, "page_cache": {}, "processes": {}}
    for kind in sorted(per_kind):
        count, nbytes = per_kind[kind]
        entry = {"count": int(count), "bytes": int(nbytes)}
        if kind.startswith("block_"):
            groups["block"][kind] = entry
        elif kind.startswith(("cache_", "shm_")):
            groups["page_cache"][kind] = entry
        elif kind in ("fork", "exec", "exit"):
            groups["processes"][kind] = int(count)
        else:
            groups["syscalls"][kind] = entry
    return groups
