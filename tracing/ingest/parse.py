"""The raw files, read in blocks and parsed: as frames (tests, small files) and as merge rows."""

from __future__ import annotations

import enum
import mmap
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from tracing import aggregates
from tracing.ingest import jit, parse_kernels, scan, schema
from tracing.ingest.join_kernels import _PID_LIMIT
from tracing.ingest.names import _Names, _NameTable
from tracing.ingest.schema import _PROC_COLUMNS, CACHE_KINDS, PAGE_SIZE, SYSCALL_KINDS
from tracing.ingest.stats import ParseStats


def _blocks(path: Path, size: int | None = None) -> Iterator[tuple[np.ndarray, int, int]]:
    """(buffer, start, end) for successive pieces of a file (about ``size`` bytes, BLOCK_BYTES
    by default), each ``buffer[start:end]`` whole lines ending with a newline (one is added to
    a last line without it), at least 16 bytes of the buffer after them, its length a multiple
    of 8. The file is mapped, not copied (but its last piece): a piece is only valid until the
    next is taken, when its pages are unmapped (the memory stays flat)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    size = size or schema.BLOCK_BYTES  # read now: a test sets it smaller
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
    """``buf``, ``start``, ``end`` as :func:`_blocks` gives them (a copy when not), the buffer
    read-only: a file's mapped pieces are, and a kernel is compiled for each type of array it
    is given (a writable copy of the last piece cost a second compile of every parser, 55 s
    on a fresh checkout)."""
    if len(buf) % 8 or len(buf) < end + 16:
        padded = np.zeros((end - start + 16 + 7) // 8 * 8, dtype=np.uint8)
        padded[: end - start] = buf[start:end]
        buf, start, end = padded, 0, end - start
    view = buf.view()
    view.flags.writeable = False
    return view, start, end


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

    rows: np.ndarray  # (n, scan._N_COLS): one-by-one lines (reader's kind and comm codes)
    row_times: np.ndarray  # their times
    aggs: np.ndarray  # (m, scan._N_COLS): aggregated rows
    agg_times: np.ndarray
    paths: pa.Array  # openat paths, numbered by the rows' path column
    new_kinds: list[str]
    new_comms: list[str]
    lost: int
    skipped: int
    examples: list[str]
    behind: int


#: int64 of working space a parsing kernel is given (it allocates nothing: tracing.ingest.jit).
SCRATCH = 32


class Status(enum.IntEnum):
    """Why a parsing kernel returned (its ``info`` array's status slot): it parsed its block, or a
    table or buffer it writes to is full (it goes on from where it stopped once that is grown)."""

    DONE = 0
    FULL_NAMES = scan._FULL_NAMES
    FULL_ROWS = scan._FULL_ROWS


def run_growing(
    run: Callable[[int], int],
    info: np.ndarray,
    start: int,
    grow: Mapping[Status, Callable[[], None]],
) -> None:
    """Run a parsing kernel over its block: ``run(pos)`` parses from ``pos`` and returns where it
    stopped; while it stopped because what it writes to is full (``info``'s :class:`Status`),
    ``grow[status]()`` enlarges that and the kernel goes on from there. A status with nothing
    in ``grow`` is a ValueError (or what ``grow``'s function for it raises)."""
    pos = start
    while True:
        pos = run(pos)
        status = Status(int(info[scan._I_STATUS]))
        if status is Status.DONE:
            return
        if status not in grow:
            raise ValueError(f"a parsing kernel stopped with {status.name}")
        grow[status]()


def _strings(n: int, offsets: np.ndarray, data: np.ndarray) -> pa.StringArray:
    """``n`` strings of a kernel's output (int32 ``offsets``, the bytes ``data``: copied), the
    bytes that are not UTF-8 replaced."""
    strings = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data.copy()))
    try:
        strings.validate(full=True)
    except pa.ArrowInvalid:
        strings = pa.array(
            [s.decode("utf-8", errors="replace") for s in strings.cast(pa.binary()).to_pylist()],
            type=pa.string(),
        )
    return strings


def _count_info(stats: ParseStats, buf: np.ndarray, info: np.ndarray) -> None:
    """Add what a parsing kernel counted in ``info`` (lost events, BEHIND marks, skipped
    lines and their first examples) to ``stats``."""
    stats.lost_events += int(info[scan._I_LOST])
    stats.behind += int(info[scan._I_BEHIND])
    examples = _skipped_examples(buf, info)
    for text in examples:
        stats.skip(text)
    stats.skipped_lines += int(info[scan._I_SKIPPED]) - len(examples)


def _skipped_examples(buf: np.ndarray, info: np.ndarray) -> list[str]:
    """The first (up to 5) lines a kernel skipped, as text."""
    return [
        bytes(buf[info[scan._I_EXAMPLES + 2 * k] : info[scan._I_EXAMPLES + 2 * k + 1]]).decode(
            "utf-8", errors="replace"
        )
        for k in range(min(int(info[scan._I_SKIPPED]), 5))
    ]


@dataclass
class _SyscallBuffers:
    """What :func:`_parse_syscall_block` writes a block's rows to, grown as it fills them."""

    rows: np.ndarray  # (n, scan._N_COLS)
    row_times: np.ndarray
    aggs: np.ndarray  # (m, scan._N_COLS)
    agg_times: np.ndarray
    offsets: np.ndarray  # of the openat paths in the block's heap

    @classmethod
    def sized(cls, rows: int, aggs: int) -> _SyscallBuffers:
        return cls(
            np.empty((rows, scan._N_COLS), dtype=np.int64),
            np.empty(rows, dtype=np.int64),
            np.empty((aggs, scan._N_COLS), dtype=np.int64),
            np.empty(aggs, dtype=np.int64),
            np.zeros(rows + 1, dtype=np.int32),
        )

    def widen(self, info: np.ndarray) -> None:
        rows, aggs = int(info[scan._I_ROWS]), int(info[scan._I_AGGS])
        self.rows, self.row_times = _widen(self.rows, rows), _widen(self.row_times, rows)
        self.aggs, self.agg_times = _widen(self.aggs, aggs), _widen(self.agg_times, aggs)
        offsets = np.zeros(self.rows.shape[0] + 1, dtype=np.int32)
        offsets[: len(self.offsets)] = self.offsets
        self.offsets = offsets


class _SyscallParser:
    """Parses raw/syscalls.txt block by block (:func:`_parse_syscall_block`)."""

    def __init__(self, seen: np.ndarray | None = None) -> None:
        jit.compile()
        self.seen = np.zeros(0, dtype=np.uint8) if seen is None else seen
        self.kinds = _NameTable(SYSCALL_KINDS)
        self.comms = _NameTable()
        self.agg_kinds = np.array(
            [SYSCALL_KINDS.index(k) for k in aggregates.KIND_CODES], dtype=np.int64
        )
        self.rows_per_byte = 1 / 48
        self.aggs_per_byte = 1 / 2000
        self.scratch = np.empty(SCRATCH, dtype=np.int64)  # the kernel's working space

    def parse(self, buf: np.ndarray, end: int, start: int = 0) -> _Parsed:
        """Parse ``buf[start:end]`` (whole lines; :func:`_blocks` leaves room after them)."""
        buf, start, end = _padded(buf, start, end)
        words = buf.view(np.uint64)
        size = end - start
        out = _SyscallBuffers.sized(
            int(size * self.rows_per_byte * 1.25) + 64, int(size * self.aggs_per_byte * 1.5) + 64
        )
        heap = np.empty(size, dtype=np.uint8)
        info = np.zeros(scan._I_EXAMPLES + 10, dtype=np.int64)

        def run(pos: int) -> int:
            return parse_kernels._parse_syscall_block(
                buf, words, pos, end, out.rows, out.row_times, out.aggs, out.agg_times,
                out.offsets, heap, *self.kinds.arrays(), *self.comms.arrays(), self.agg_kinds,
                self.seen, info, self.scratch,
            )  # fmt: skip

        run_growing(
            run,
            info,
            start,
            {
                Status.FULL_NAMES: lambda: (self.kinds.grow(), self.comms.grow()),
                Status.FULL_ROWS: lambda: out.widen(info),
            },
        )
        n, n_agg, n_paths, used = (
            int(info[i]) for i in (scan._I_ROWS, scan._I_AGGS, scan._I_PATHS, scan._I_HEAP)
        )
        self.rows_per_byte = max(n / size, 1 / 4096)
        self.aggs_per_byte = max(n_agg / size, 1 / 65536)
        paths = _strings(n_paths, out.offsets[: n_paths + 1], heap[:used])
        return _Parsed(
            out.rows[:n],
            out.row_times[:n],
            out.aggs[:n_agg],
            out.agg_times[:n_agg],
            paths,
            self.kinds.new_names(),
            self.comms.new_names(),
            int(info[scan._I_LOST]),
            int(info[scan._I_SKIPPED]),
            _skipped_examples(buf, info),
            int(info[scan._I_BEHIND]),
        )


def _widen(rows: np.ndarray, used: int) -> np.ndarray:
    bigger = np.empty((2 * rows.shape[0], *rows.shape[1:]), dtype=rows.dtype)
    bigger[:used] = rows[:used]
    return bigger


def _whole_lines(raw: bytes, stats: ParseStats) -> bytes:
    """``raw`` up to its last newline: bpftrace ends every line with one, so text after the
    last is a line cut short (bpftrace stopped mid-line), counted as skipped. (A cut line can
    look whole: "@add[7, sh]: 1" cut from "... 12".)"""
    cut = raw.rfind(b"\n") + 1
    if cut < len(raw):
        stats.skip(raw[cut:].decode("utf-8", errors="replace"))
    return raw[:cut]


def _read_tsv(path: Path, columns: dict[str, pa.DataType], stats: ParseStats) -> pd.DataFrame:
    """Read a tab-separated bpftrace output file into a DataFrame with the given columns."""
    raw = _whole_lines(path.read_bytes(), stats) if path.exists() else b""
    if not raw:
        return pd.DataFrame({c: pd.Series(dtype=t.to_pandas_dtype()) for c, t in columns.items()})
    return pacsv.read_csv(
        pa.BufferReader(raw),
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
        refs = parsed.rows[:, scan._C_PATH]
        np.add(refs, base, out=refs, where=refs >= 0)  # path numbers are per block
        base += len(parsed.paths)
        rows.append(parsed.rows)
        aggs.append(parsed.aggs)
        paths.append(parsed.paths)
    parser.kinds.new_names()
    parser.comms.new_names()
    kinds = np.array(parser.kinds.decoded, dtype=object)
    comms = np.array([*parser.comms.decoded, ""], dtype=object)
    empty = np.empty((0, scan._N_COLS), dtype=np.int64)
    aggs = np.concatenate([empty, *aggs])
    aggs[:, scan._C_COMM] = len(comms) - 1  # ""
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
    refs = rows[:, scan._C_PATH]
    path = (
        paths.take(pa.array(refs, mask=refs < 0)).to_numpy(zero_copy_only=False)
        if paths is not None
        else np.full(rows.shape[0], None, dtype=object)
    )
    n = rows.shape[0]
    return _events_frame(
        n,
        ts_ns=rows[:, scan._C_TS],
        kind=kinds[rows[:, scan._C_KIND]] if n else np.array([], dtype=object),
        pid=rows[:, scan._C_PID].astype(np.int32),
        tid=rows[:, scan._C_TID].astype(np.int32),
        comm=comms[rows[:, scan._C_COMM]] if n else np.array([], dtype=object),
        fd=rows[:, scan._C_FD].astype(np.int32),
        path=path,
        bytes=rows[:, scan._C_BYTES],
        count=rows[:, scan._C_COUNT],
        ret=rows[:, scan._C_RET],
        offset=rows[:, scan._C_OFFSET],
        latency_ns=rows[:, scan._C_LAT],
        latency_max_ns=rows[:, scan._C_LATMAX],
        in_container=rows[:, scan._C_INC] == 1,
    )


def _events_frame(n: int, **columns: Any) -> pd.DataFrame:
    """``n`` rows of the columns of events (but ``container``): those given, the others their
    defaults (no thread, descriptor, path or device; no bytes, return value or latency; no
    offset; a count of one; in a container)."""
    frame = {
        "ts_ns": None,
        "kind": None,
        "pid": None,
        "tid": np.full(n, -1, dtype=np.int32),
        "comm": None,
        "fd": np.full(n, -1, dtype=np.int32),
        "path": None,
        "bytes": np.zeros(n, dtype=np.int64),
        "count": np.ones(n, dtype=np.int64),
        "ret": np.zeros(n, dtype=np.int64),
        "offset": np.full(n, -1, dtype=np.int64),
        "latency_ns": np.zeros(n, dtype=np.int64),
        "latency_max_ns": np.zeros(n, dtype=np.int64),
        "dev": None,
        "in_container": True,
    }
    unknown = set(columns) - set(frame)
    if unknown:
        raise TypeError(f"not a column of events: {sorted(unknown)}")
    frame.update(columns)
    return pd.DataFrame(frame)


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
        jit.compile()
        self.rwbs = _NameTable()
        self.comms = _NameTable()
        self.dev_keys = np.full(64, -1, dtype=np.int64)
        self.dev_values = np.empty(64, dtype=np.int64)
        self.devs: list[int] = []  # device numbers by code
        self.rows_per_byte = 1 / 64
        self.scratch = np.empty(SCRATCH, dtype=np.int64)  # the kernel's working space

    def parse(self, buf: np.ndarray, start: int, end: int, stats: ParseStats) -> np.ndarray:
        """The rows of ``buf[start:end]`` (whole lines, see :func:`_blocks`)."""
        buf, start, end = _padded(buf, start, end)
        size = end - start
        rows = np.empty((int(size * self.rows_per_byte * 1.25) + 64, scan._N_COLS), dtype=np.int64)
        info = np.zeros(scan._I_EXAMPLES + 10, dtype=np.int64)
        info[scan._I_PATHS] = len(self.devs)
        out = [rows]  # grown by the kernel's runs

        def run(pos: int) -> int:
            return parse_kernels._parse_block_lines(
                buf, buf.view(np.uint64), pos, end, out[0], *self.rwbs.arrays(),
                *self.comms.arrays(), self.dev_keys, self.dev_values, info, self.scratch,
            )  # fmt: skip

        def grow_names() -> None:
            self.rwbs.grow()
            self.comms.grow()
            self.dev_keys, self.dev_values = scan._rehash(
                self.dev_keys, self.dev_values, 2 * len(self.dev_keys)
            )

        def grow_rows() -> None:
            out[0] = _widen(out[0], int(info[scan._I_ROWS]))

        run_growing(run, info, start, {Status.FULL_NAMES: grow_names, Status.FULL_ROWS: grow_rows})
        rows = out[0]
        n = int(info[scan._I_ROWS])
        self.rows_per_byte = max(n / size, 1 / 4096)
        for code in range(len(self.devs), int(info[scan._I_PATHS])):  # the devices added, in order
            slot = np.flatnonzero((self.dev_values == code) & (self.dev_keys != -1))
            self.devs.append(int(self.dev_keys[slot[0]]) >> 1)
        self.rwbs.new_names()
        self.comms.new_names()
        _count_info(stats, buf, info)
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
    rows = np.concatenate([np.empty((0, scan._N_COLS), dtype=np.int64), *parts])
    kinds = np.array(parser.kinds() or [""], dtype=object)
    comms = np.array(parser.comms.decoded or [""], dtype=object)
    devs = np.array(parser.dev_names() or [""], dtype=object)
    n = len(rows)
    return _events_frame(
        n,
        ts_ns=rows[:, scan._C_TS],
        kind=kinds[rows[:, scan._C_KIND]],
        pid=rows[:, scan._C_PID].astype(np.int32),
        comm=comms[rows[:, scan._C_COMM]],
        bytes=rows[:, scan._C_BYTES],
        offset=rows[:, scan._C_OFFSET],
        latency_ns=rows[:, scan._C_LAT],
        latency_max_ns=rows[:, scan._C_LAT],
        dev=devs[rows[:, scan._C_DEV]] if n else None,
        in_container=rows[:, scan._C_INC] == 1,
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
        raw = _whole_lines(path.read_bytes(), stats) if path.exists() else b""
        buf = np.zeros((len(raw) + 1 + 16 + 7) // 8 * 8, dtype=np.uint8)  # see _word
        buf[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        end = len(raw)
        jit.compile()
        n_max = raw.count(b"\n") + 1
        ints = np.empty((4, n_max), dtype=np.int64)  # ts, code, pid, pages
        comms = np.empty(n_max + 1, dtype=np.int32)
        heap = np.empty(max(end, 1), dtype=np.uint8)
        info = np.zeros(scan._I_EXAMPLES + 10, dtype=np.int64)
        n, used = parse_kernels._parse_cache_lines(
            buf, buf.view(np.uint64), end, ints, comms, heap, info
        )
        _count_info(stats, buf, info)
        comm = _strings(n, comms[: n + 1].copy(), heap[:used])
        ts, code, pid, pages = ints[:, :n]
        return cls(ts.copy(), code.astype(np.int8), pid.astype(np.int32), comm, pages.copy())


def parse_cache(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/cache.txt (tracing/bpf/cache.bt): per-process page counts per 100 ms block."""
    cache = _Cache.read(path, stats)
    return _events_frame(
        len(cache.ts),
        ts_ns=cache.ts,
        kind=np.array(CACHE_KINDS, dtype=object)[cache.code].tolist(),
        pid=cache.pid,
        comm=cache.comm.to_pylist(),
        bytes=cache.pages * PAGE_SIZE,
        count=cache.pages,
    )


def parse_proc(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/proc.txt (tracing/bpf/proc.bt). Thread creations are kept for now."""
    df = _read_tsv(path, _PROC_COLUMNS, stats)
    return _events_frame(
        len(df),
        ts_ns=df["ts_ns"],
        kind=df["kind"],
        pid=df["pid"],
        tid=df["tid"],
        comm=df["comm"],
        path=df["path"].where(df["path"] != "", None),
        ret=df["child"].astype(np.int64),
    )


_BEHIND = re.compile(rb"^BEHIND (\d+)$", re.MULTILINE)


def behind_before(raw_dir: Path, before_ns: int) -> int:
    """The "BEHIND <ns>" marks of ``raw_dir``'s scripts (:attr:`ParseStats.behind`) earlier
    than ``before_ns`` (on the same clock: the host's CLOCK_MONOTONIC, as the agent reads it).
    Once the agent has interrupted its scripts, a script's user space detaches its probes
    while its interval probe still fires, and may mark itself behind: no event of the run can
    be missing from that moment on (its containers have all ended), so such a mark is not a
    loss (what the ingest counted but for those marks)."""
    count = 0
    for path in sorted(raw_dir.glob("*.txt")):
        if path.stat().st_size == 0:
            continue
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as text:
            count += sum(int(m.group(1)) < before_ns for m in _BEHIND.finditer(text))
    return count


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
