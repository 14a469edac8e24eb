"""The merge: rows of every raw file in time order, joined, as tables of events."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from store.rundir import (
    FD_KINDS,
)
from tracing.ingest import jit, join_kernels, scan, schema
from tracing.ingest.join_kernels import (
    _A_CLOSE,
    _A_DUP,
    _A_FORK,
    _A_NONE,
    _A_OPEN,
    _A_USE,
    _MAX_PARTS,
    _O_BYTES,
    _O_COMM,
    _O_CONTAINER,
    _O_COUNT,
    _O_DEV,
    _O_FD,
    _O_LAT,
    _O_LATMAX,
    _O_OFFSET,
    _O_PATH,
    _O_PID,
    _O_RET,
    _O_TID,
    _O_TS,
    _PID_LIMIT,
    _S_USED,
    _S_WRITTEN,
)
from tracing.ingest.names import _Names
from tracing.ingest.parse import (
    _BlockParser,
    _blocks,
    _Cache,
    _count_parse,
    _Owners,
    _Parsed,
    _SyscallParser,
    parse_proc,
)
from tracing.ingest.scan import (
    _C_COMM,
    _C_DEV,
    _C_KIND,
    _C_LINE,
    _C_PATH,
    _C_TID,
    _C_TS,
    _END,
    _N_COLS,
)
from tracing.ingest.schema import (
    _WRITE_SCHEMA,
    CACHE_KINDS,
    EVENTS_SCHEMA,
    KINDS,
    PAGE_SIZE,
    READ_AHEAD,
    SYSCALL_KINDS,
)
from tracing.ingest.stats import EventTotals, ParseStats


def _frame_rows(df: pd.DataFrame, kinds: _Names, comms: _Names, devs: _Names) -> np.ndarray:
    """A frame of :func:`parse_proc` as merge rows (path numbers still to be set: -1)."""
    if not len(df):
        return np.empty((0, _N_COLS), dtype=np.int64)
    dev = df["dev"]
    return scan.merge_rows(
        len(df),
        ts=df["ts_ns"].to_numpy(),
        kind=kinds.codes_of(pa.array(df["kind"].astype(object), type=pa.string())),
        pid=df["pid"].to_numpy(),
        tid=df["tid"].to_numpy(),
        comm=comms.codes_of(pa.array(df["comm"].astype(object), type=pa.string())),
        fd=df["fd"].to_numpy(),
        bytes=df["bytes"].to_numpy(),
        ret=df["ret"].to_numpy(),
        offset=df["offset"].to_numpy(),
        lat=df["latency_ns"].to_numpy(),
        count=df["count"].to_numpy(),
        latmax=df["latency_max_ns"].to_numpy(),
        dev=devs.codes_of(pa.array(dev.astype(object), type=pa.string()))
        if dev.notna().any()
        else -1,
        inc=df["in_container"].to_numpy(dtype=bool),
    )


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
    nulls = join_kernels._validity(codes, bitmap)
    if nulls == 0:
        return pa.array(codes)
    buffers = [pa.py_buffer(bitmap), pa.py_buffer(codes)]
    return pa.Array.from_buffers(pa.int32(), len(codes), buffers, null_count=nulls)


class _Heap:
    """Strings (the paths of openat and exec rows) by number, in numpy buffers that grow; a
    round's path column is a dictionary of its distinct paths (:func:`join_kernels._distinct_paths`)."""

    def __init__(self) -> None:
        self.size = 0
        self.offsets = np.zeros(1 << 12, dtype=np.int64)
        self.data = np.zeros(1 << 16, dtype=np.uint8)
        self.local = np.full(1 << 12, -1, dtype=np.int64)  # scratch of join_kernels._number_paths

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
        picked = np.empty(len(refs), dtype=np.int64)
        k = join_kernels._number_paths(refs, self.local, picked)
        picked = picked[:k]
        table = np.full(1 << max(4, (2 * k - 1).bit_length()), -1, dtype=np.int64)
        first = np.empty(k, dtype=np.int64)
        n = join_kernels._distinct_paths(
            refs, picked, self.offsets, self.data.view(np.uint64), table, first,
            np.empty(k, dtype=np.uint64), np.empty(k, dtype=np.int64),
        )  # fmt: skip
        names = self._strings().take(pa.array(first[:n])).cast(pa.string())
        return pa.DictionaryArray.from_arrays(_indices(refs), names, safe=False)

    def keep(self, live: np.ndarray) -> None:
        """Keep only the strings ``live`` (sorted numbers), renumbered 0, 1, ... in order."""
        kept = self._strings().take(pa.array(live))
        offsets = np.zeros(max(len(live) + 1, 1 << 12), dtype=np.int64)
        offsets[: len(live) + 1] = np.frombuffer(kept.buffers()[1], dtype=np.int64)[
            kept.offset : kept.offset + len(live) + 1
        ]
        data = np.empty(len(self.data), dtype=np.uint8)
        used = int(offsets[len(live)] - offsets[0])
        data[:used] = np.frombuffer(kept.buffers()[2], dtype=np.uint8)[
            offsets[0] : offsets[0] + used
        ]
        offsets[: len(live) + 1] -= offsets[0]
        self.offsets, self.data, self.size = offsets, data, len(live)

    def _strings(self) -> pa.LargeStringArray:
        """The strings, without a copy (validated when they were added)."""
        return pa.LargeStringArray.from_buffers(
            self.size, pa.py_buffer(self.offsets[: self.size + 1]), pa.py_buffer(self.data)
        )


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
        jit.compile()
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
        codes = np.array([self.kinds.code(kind) for kind in CACHE_KINDS], dtype=np.int64)
        return scan.merge_rows(
            n,
            ts=cache.ts,
            kind=codes[cache.code],
            pid=cache.pid,
            comm=self.comms.codes_of(cache.comm) if n else -1,
            bytes=cache.pages * PAGE_SIZE,
            count=cache.pages,
        )

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
        while not join_kernels._join_round(
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
            self.fd_keys, self.fd_values = scan._rehash(self.fd_keys, self.fd_values, size)
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
        if self.heap.size < max(schema.HEAP_PATHS, 2 * self.heap_compacted):  # read now
            return
        parts = [part for pending in self.pending.values() for part in pending.parts]
        live = np.zeros(self.heap.size, dtype=np.bool_)
        for part in parts:
            join_kernels._paths_used(part.rows, part.left(), part.base, live)
        values = self.fd_values
        named = (self.fd_keys != -1) & (values >= 0)
        live[values[named]] = True
        numbers = np.cumsum(live) - 1  # of the paths kept, by their old numbers
        self.heap.keep(np.flatnonzero(live))
        self.heap_compacted = int(numbers[-1]) + 1 if len(numbers) else 0
        for part in parts:
            join_kernels._renumber_paths(part.rows, part.left(), part.base, numbers)
            part.base = 0
        values[named] = numbers[values[named]]
