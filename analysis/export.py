"""Export a run for other tools: Chrome Trace Event JSON (Perfetto UI) and CSV tables.

:func:`export_perfetto` writes the object form of the Trace Event Format
(``{"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}``), which the Perfetto UI
(https://ui.perfetto.dev, "Open trace file") and ``chrome://tracing`` open. Times (``ts``,
``dur``) are microseconds since the run's ``start_ns`` (the moment the workload was released),
written with three decimals, i.e. exact to the nanosecond; events the tracer saw before the
release have negative times. What becomes what:

- every traced process (host pid) is a process, named after its main thread's ``comm``; its
  threads are named after their latest ``comm`` (``process_name``/``thread_name`` events, ``M``);
- syscalls: complete events (``X``) on their thread, from entry (``ts_ns - latency_ns``) to
  exit, named after the call, category ``syscall``, ``args``: ``path``, ``bytes``, ``fd``,
  ``offset``, ``ret``; ``fork``/``exec``/``exit``: thread instants (``i``), category ``process``;
- block requests: ``X`` events (issue to completion), category ``block``, on a pseudo-process
  ``block device <dev>`` per device. Requests overlap (queue depth > 1) while the format allows
  only perfectly nested slices on one thread, so they are packed onto ``queue slot <k>``
  threads whose requests never overlap (:func:`pack_lanes`); ``args``: ``bytes``, ``offset``
  (on the device), ``in_container``, ``issuer`` (pid that issued it);
- application events (``phases``): intervals as ``X`` and points as thread instants (``i``),
  category ``application``, on a pseudo-process ``application`` with one thread per (rank,
  container-side pid): a rank's training loop and each of its loader workers get their own
  thread, since worker events overlap the loop's; ``args``: ``epoch``, ``step``, ``value`` (the
  event's value as JSON text);
- samples: counter events (``C``), category ``samples``, on a pseudo-process ``samples``, one
  counter per metric, named ``<metric> (<unit>)``.

A run of several containers is exported as one process group per container: its own
``application · <role>`` and ``samples · <role>`` pseudo-processes (host-wide samples go to
``samples · host``) and its real processes, labelled with the role (``process_labels``) and
sorted next to them (``process_sort_index``). Block devices are shared by all containers.

Page-cache rows (per-process 100 ms intervals) are not exported; the timeline plot shows them.
Events are written in groups (the order of the list above), each sorted by start time; the
format does not require an order (Perfetto sorts on import).

Writing is vectorised and streamed: each group is turned into JSON text in chunks of rows with
numpy (integers to decimal digits by array arithmetic, strings JSON-escaped once per distinct
value, one boolean gather to join the pieces of every line) and each chunk's bytes are written
at once, so memory stays bounded whatever the run's size (docs/analysis.md has timings).

:func:`export_csv` writes the three tables as CSV with the columns of docs/run-format.md.

Example::

    export_perfetto(load_run("runs/A"), Path("runs/A/trace.json"))
    export_csv(load_run("runs/A"), Path("runs/A/csv"))
"""

from __future__ import annotations

import dataclasses
import heapq
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from analysis.tables import (
    BLOCK_KINDS,
    PROCESS_KINDS,
    SYSCALL_KINDS,
    container_codes,
    kind_mask,
    run_roles,
)
from core import __version__ as TWINTRACE_VERSION
from core.atomic import atomic_path
from core.errors import UserError
from core.rundir import TABLES, Run

# Pseudo-process ids: above any Linux pid (pid_max is at most 2**22) and below 2**31, which
# some trace readers require. A run of several containers has an application and a samples
# pseudo-process per container, CONTAINER_PID_STRIDE apart (container i: APP_PID + i * stride).
APP_PID = 1_000_000_000
SAMPLES_PID = APP_PID + 1
BLOCK_PID_BASE = APP_PID + 2
CONTAINER_PID_STRIDE = 1_000

#: Bytes of text built per chunk before it is written (bounds the temporary memory).
CHUNK_BYTES = 32 << 20


# ---------------------------------------------------------------------------------------------
# Atomic output


# ---------------------------------------------------------------------------------------------
# Vectorised JSON text
#
# Every line of a chunk has the same width: a field (one JSON value, or a constant) is a byte
# matrix ``width x rows`` holding each row's text right-aligned after spaces, which JSON allows
# before any value. Fields are stacked in one column-major matrix (each row of it a contiguous copy)
# and one transposing copy turns it into the chunk's lines, back to back. A boolean gather that
# dropped the padding measured ten times slower; the padding costs about a fifth of the size.

SPACE = ord(" ")


@dataclasses.dataclass(frozen=True)
class _Field:
    text: np.ndarray  # uint8, (width, rows), or (width, 1) for a constant

    @property
    def width(self) -> int:
        return self.text.shape[0]


def _const(text: str) -> _Field:
    return _Field(np.frombuffer(text.encode(), dtype=np.uint8)[:, None])


_POWERS = 10 ** np.arange(20, dtype=np.uint64)  # 10**19 is the largest that fits in uint64


def _digits(magnitude: np.ndarray, negative: np.ndarray | None = None) -> _Field:
    """Decimal text of ``magnitude`` (uint64), right-aligned, with ``-`` where ``negative``."""
    n = len(magnitude)
    if n == 0:
        return _Field(np.full((1, 0), SPACE, dtype=np.uint8))
    count = 1 + np.searchsorted(_POWERS[1:], magnitude, side="right")
    length = count if negative is None else count + negative
    width = int(length.max())
    text = np.full((width, n), SPACE, dtype=np.uint8)
    # 32-bit division is several times faster, and most values (pids, sizes) fit.
    kind = np.uint32 if int(magnitude.max()) < 2**32 else np.uint64
    rest = magnitude.astype(kind)
    ten = kind(10)
    for place in range(int(count.max())):  # units first, in the last row
        digit = (rest % ten).astype(np.uint8) + np.uint8(48)
        np.copyto(text[width - 1 - place], digit, where=place < count)
        rest //= ten
    if negative is not None and negative.any():
        cols = np.flatnonzero(negative)
        text[width - 1 - count[cols], cols] = ord("-")
    return _Field(text)


def _ints(values: np.ndarray) -> _Field:
    """Integers as JSON numbers."""
    values = np.asarray(values, dtype=np.int64)
    # abs(INT64_MIN) wraps to itself, and its uint64 view is then the right magnitude, 2**63.
    return _digits(np.abs(values).astype(np.uint64), values < 0)


def _micros(ns: np.ndarray) -> list[_Field]:
    """Nanoseconds as microseconds with three decimals, exact: ``-1500`` -> ``-1.500``."""
    ns = np.asarray(ns, dtype=np.int64)
    magnitude = np.abs(ns).astype(np.uint64)
    whole = _digits(magnitude // np.uint64(1000), ns < 0)
    frac = magnitude % np.uint64(1000)
    text = np.empty((4, len(ns)), dtype=np.uint8)
    text[0] = ord(".")
    text[1] = 48 + (frac // np.uint64(100)).astype(np.uint8)
    text[2] = 48 + (frac // np.uint64(10) % np.uint64(10)).astype(np.uint8)
    text[3] = 48 + (frac % np.uint64(10)).astype(np.uint8)
    return [whole, _Field(text)]


class _Texts:
    """JSON texts of a small set of values, indexed by code (-1: ``null``)."""

    def __init__(self, texts: Sequence[str]) -> None:
        encoded = [t.encode() for t in texts] + [b"null"]
        self.width = max(len(t) for t in encoded)
        # Column per value: a field is then this table's columns taken by code.
        self.table = np.full((self.width, len(encoded)), SPACE, dtype=np.uint8)
        for col, text in enumerate(encoded):  # once per distinct value, not per event
            # Right-aligned like numbers: all padding then sits between a key's colon and its
            # value, where pretty-printed JSON has its space.
            self.table[self.width - len(text) :, col] = np.frombuffer(text, dtype=np.uint8)

    @classmethod
    def strings(cls, values: Sequence[Any]) -> _Texts:
        """JSON string literals of ``values`` (exact escaping by :func:`json.dumps`)."""
        return cls([json.dumps(str(v)) for v in values])

    def field(self, codes: np.ndarray) -> _Field:
        codes = np.where(codes < 0, self.table.shape[1] - 1, codes)
        return _Field(np.take(self.table, codes, axis=1))


def _factorize(values: pd.Series) -> tuple[np.ndarray, _Texts]:
    """Codes (-1 for missing) and the JSON string texts of the distinct values."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64), _Texts.strings(list(uniques))


def _floats(values: np.ndarray) -> _Field:
    """Finite floats as JSON numbers: the shortest text that reads back as the same double."""
    strings = pc.cast(pa.array(np.asarray(values, dtype=np.float64)), pa.string())
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)[: len(strings) + 1]
    data = np.frombuffer(strings.buffers()[2], dtype=np.uint8)
    lengths = np.diff(offsets)
    width = int(lengths.max()) if len(lengths) else 1
    pad = width - lengths  # right-aligned, as numbers
    inside = np.arange(width)[:, None] >= pad[None, :]
    positions = offsets[:-1][None, :] + np.arange(width)[:, None] - pad[None, :]
    positions = np.clip(positions, 0, len(data) - 1)
    return _Field(np.where(inside, data[positions], SPACE).astype(np.uint8))


def _join(fields: Sequence[_Field], rows: int) -> bytes:
    """The rows' lines: the fields stacked, then transposed to row-major bytes."""
    text = np.empty((sum(f.width for f in fields), rows), dtype=np.uint8)
    at = 0
    for field in fields:  # a few dozen fields, each a contiguous block copy
        text[at : at + field.width] = field.text
        at += field.width
    return text.T.tobytes()


@dataclasses.dataclass
class _Group:
    """Rows of one kind of trace event and how to turn a slice of them into fields."""

    name: str
    count: int
    fields: Callable[[np.ndarray], list[_Field]]  # row positions (sorted order) -> fields
    row_bytes: int  # about the length of a line, to size the chunks

    def write(self, handle: BinaryIO) -> None:
        step = max(1_000, CHUNK_BYTES // max(self.row_bytes, 1))
        for start in range(0, self.count, step):
            rows = np.arange(start, min(start + step, self.count))
            handle.write(_join(self.fields(rows), len(rows)))


def _row_bytes(fields: Sequence[_Field]) -> int:
    return sum(f.width for f in fields)


# ---------------------------------------------------------------------------------------------
# Lane packing


def pack_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A lane number per interval such that the intervals of one lane never overlap.

    Intervals that touch (one ends where the next starts) may share a lane. Uses the fewest
    lanes (the most intervals in flight at once) and reuses the lowest free lane, so a device
    at queue depth 1 uses lane 0 only. Intervals that overlap no other (found vectorised, with
    a running maximum of the ends) go to lane 0 directly; only clusters of overlapping ones are
    packed one by one with heaps (interval partitioning is sequential), about 1 s per million.
    """
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    n = len(start)
    lanes = np.zeros(n, dtype=np.int64)
    if n == 0:
        return lanes
    order = np.lexsort((end, start))
    s, e = start[order], end[order]
    running_end = np.maximum.accumulate(e)
    new_cluster = np.empty(n, dtype=bool)
    new_cluster[0] = True
    new_cluster[1:] = s[1:] >= running_end[:-1]
    cluster = np.cumsum(new_cluster) - 1
    crowded = np.flatnonzero(np.bincount(cluster)[cluster] > 1)
    packed = np.zeros(n, dtype=np.int64)
    free: list[int] = []  # heap of lanes free again
    busy: list[tuple[int, int]] = []  # heap of (end, lane) of intervals in flight
    next_lane = 0
    current = -1
    for i, si, ei, ci in zip(
        crowded.tolist(),
        s[crowded].tolist(),
        e[crowded].tolist(),
        cluster[crowded].tolist(),
        strict=True,
    ):
        if ci != current:  # nothing is in flight when a cluster starts
            free, busy, next_lane, current = [], [], 0, ci
        while busy and busy[0][0] <= si:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, next_lane = next_lane, next_lane + 1
        heapq.heappush(busy, (ei, lane))
        packed[i] = lane
    lanes[order] = packed
    return lanes


# ---------------------------------------------------------------------------------------------
# Event groups


def _kind_rows(events: pd.DataFrame, kinds: Sequence[str]) -> np.ndarray:
    return np.flatnonzero(kind_mask(events, kinds))


@dataclasses.dataclass(frozen=True)
class _Groups:
    """Process groups by container: a run of several containers gets, per container, its own
    application and samples pseudo-processes next to its real processes (process sort index
    ``3 i - 3`` to ``3 i - 1`` for container ``i``), and host-wide samples a group of their
    own; a run of one container is one group, laid out as before containers existed."""

    roles: tuple[str, ...]

    @property
    def several(self) -> bool:
        return len(self.roles) > 1

    def codes(self, frame: pd.DataFrame) -> np.ndarray:
        """Per row, its group: the container's position, ``len(roles)`` for host-wide rows."""
        if not self.several:
            return np.zeros(len(frame), dtype=np.int64)
        return container_codes(frame, self.roles)

    def role(self, group: int) -> str:
        """The container of a group; ``host`` for host-wide rows."""
        return self.roles[group] if group < len(self.roles) else "host"

    def label(self, base: str, group: int) -> str:
        """A pseudo-process's name: ``base``, with the container when there are several."""
        return f"{base} · {self.role(group)}" if self.several else base

    def sort_index(self, group: int, slot: int) -> int:
        """Slot 0: application, 1: samples, 2: the container's processes."""
        return 3 * group - 3 + slot


def _column(events: pd.DataFrame, name: str, rows: np.ndarray) -> np.ndarray:
    return events[name].to_numpy()[rows]


def _kinds(events: pd.DataFrame, rows: np.ndarray) -> tuple[np.ndarray, _Texts]:
    """Codes and JSON names of the rows' kinds, from the categorical's codes (no string work)."""
    kind = events["kind"].astype("category")
    codes = np.asarray(kind.cat.codes.to_numpy(), dtype=np.int64)[rows]
    return codes, _Texts.strings(list(kind.cat.categories))


def _syscall_group(events: pd.DataFrame, origin: int) -> _Group | None:
    rows = _kind_rows(events, SYSCALL_KINDS)
    if len(rows) == 0:
        return None
    end = _column(events, "ts_ns", rows).astype(np.int64) - origin
    duration = _column(events, "latency_ns", rows).astype(np.int64).clip(min=0)
    start = end - duration
    order = np.argsort(start, kind="stable")
    rows, start, duration = rows[order], start[order], duration[order]
    kind, kinds = _kinds(events, rows)
    path, paths = _factorize(events["path"])
    cols = {c: _column(events, c, rows) for c in ("pid", "tid", "bytes", "fd", "offset", "ret")}
    path = path[rows]

    def fields(at: np.ndarray) -> list[_Field]:
        return [
            _const(',\n{"ph":"X","cat":"syscall","name":'),
            kinds.field(kind[at]),
            _const(',"pid":'),
            _ints(cols["pid"][at]),
            _const(',"tid":'),
            _ints(cols["tid"][at]),
            _const(',"ts":'),
            *_micros(start[at]),
            _const(',"dur":'),
            *_micros(duration[at]),
            _const(',"args":{"path":'),
            paths.field(path[at]),
            _const(',"bytes":'),
            _ints(cols["bytes"][at]),
            _const(',"fd":'),
            _ints(cols["fd"][at]),
            _const(',"offset":'),
            _ints(cols["offset"][at]),
            _const(',"ret":'),
            _ints(cols["ret"][at]),
            _const("}}"),
        ]

    return _Group("syscall", len(rows), fields, _row_bytes(fields(np.arange(1))) + paths.width)


def _process_group(events: pd.DataFrame, origin: int) -> _Group | None:
    rows = _kind_rows(events, PROCESS_KINDS)
    if len(rows) == 0:
        return None
    ts = _column(events, "ts_ns", rows).astype(np.int64) - origin
    order = np.argsort(ts, kind="stable")
    rows, ts = rows[order], ts[order]
    kind, kinds = _kinds(events, rows)
    path, paths = _factorize(events["path"].iloc[rows])
    cols = {c: _column(events, c, rows) for c in ("pid", "tid", "ret")}

    def fields(at: np.ndarray) -> list[_Field]:
        return [
            _const(',\n{"ph":"i","s":"t","cat":"process","name":'),
            kinds.field(kind[at]),
            _const(',"pid":'),
            _ints(cols["pid"][at]),
            _const(',"tid":'),
            _ints(cols["tid"][at]),
            _const(',"ts":'),
            *_micros(ts[at]),
            _const(',"args":{"path":'),
            paths.field(path[at]),
            _const(',"ret":'),
            _ints(cols["ret"][at]),
            _const("}}"),
        ]

    return _Group("process", len(rows), fields, _row_bytes(fields(np.arange(1))) + paths.width)


def _block_group(events: pd.DataFrame, origin: int) -> tuple[_Group | None, list[dict[str, Any]]]:
    """Block requests, device by device on queue-slot threads; and those threads' names."""
    rows = _kind_rows(events, BLOCK_KINDS)
    if len(rows) == 0:
        return None, []
    end = _column(events, "ts_ns", rows).astype(np.int64) - origin
    duration = _column(events, "latency_ns", rows).astype(np.int64).clip(min=0)
    start = end - duration
    device, devices = pd.factorize(events["dev"].iloc[rows].fillna("?"), sort=True)
    lane = np.zeros(len(rows), dtype=np.int64)
    meta: list[dict[str, Any]] = []
    for index, name in enumerate(devices):  # one per device: a handful
        mine = np.flatnonzero(device == index)
        lane[mine] = pack_lanes(start[mine], end[mine])
        pid = BLOCK_PID_BASE + index
        meta += _process_meta(pid, f"block device {name}", 1_000 + index)
        meta += [
            _thread_meta(pid, int(k) + 1, f"queue slot {int(k)}") for k in np.unique(lane[mine])
        ]
    order = np.argsort(start, kind="stable")
    rows, start, duration = rows[order], start[order], duration[order]
    pid, lane = BLOCK_PID_BASE + device[order], lane[order]
    kind, kinds = _kinds(events, rows)
    flag = _Texts(["false", "true"])
    inside = _column(events, "in_container", rows).astype(np.int64)
    cols = {c: _column(events, c, rows) for c in ("bytes", "offset", "pid")}

    def fields(at: np.ndarray) -> list[_Field]:
        return [
            _const(',\n{"ph":"X","cat":"block","name":'),
            kinds.field(kind[at]),
            _const(',"pid":'),
            _ints(pid[at]),
            _const(',"tid":'),
            _ints(lane[at] + 1),
            _const(',"ts":'),
            *_micros(start[at]),
            _const(',"dur":'),
            *_micros(duration[at]),
            _const(',"args":{"bytes":'),
            _ints(cols["bytes"][at]),
            _const(',"offset":'),
            _ints(cols["offset"][at]),
            _const(',"in_container":'),
            flag.field(inside[at]),
            _const(',"issuer":'),
            _ints(cols["pid"][at]),
            _const("}}"),
        ]

    return _Group("block", len(rows), fields, _row_bytes(fields(np.arange(1)))), meta


def _phase_threads(
    phases: pd.DataFrame, group: np.ndarray
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Thread id per phase row, one per (group, rank, pid): training loops first, then
    loaders."""
    loop_keys = ["step_end", "epoch", "all_compute"]
    pairs = pd.DataFrame(
        {
            "group": group,
            "rank": phases["rank"].to_numpy(dtype=np.int64),
            "pid": phases["pid"].to_numpy(dtype=np.int64),
            "loop": phases["key"].isin(loop_keys).to_numpy(dtype=bool, na_value=False),
        }
    )
    key = ["group", "rank", "pid"]
    threads = pairs.groupby(key, sort=False)["loop"].any().reset_index()
    threads = threads.assign(loader=~threads["loop"]).sort_values(
        ["group", "rank", "loader", "pid"]
    )
    threads["tid"] = np.arange(1, len(threads) + 1)
    tid = pairs.merge(threads, on=key, how="left")["tid"].to_numpy(dtype=np.int64)
    meta = []
    for row in threads.itertuples():  # one per thread: a handful
        rank = f"rank {row.rank}" if row.rank >= 0 else "no rank"
        role = "training loop" if row.loop else "loader"
        pid = APP_PID + CONTAINER_PID_STRIDE * int(row.group)
        meta.append(_thread_meta(pid, int(row.tid), f"{rank} {role} (pid {row.pid})"))
    return tid, meta


def _phase_groups(
    phases: pd.DataFrame, origin: int, groups_of: _Groups
) -> tuple[list[_Group], list[dict[str, Any]]]:
    if len(phases) == 0:
        return [], []
    group = groups_of.codes(phases)
    pid = APP_PID + CONTAINER_PID_STRIDE * group
    thread, meta = _phase_threads(phases, group)
    start = phases["ts_ns"].to_numpy(dtype=np.int64) - origin
    duration = (phases["end_ns"].to_numpy(dtype=np.int64) - origin - start).clip(min=0)
    is_point = phases["kind"].eq("point").to_numpy(dtype=bool, na_value=False)
    key, keys = _factorize(phases["key"])
    value, values = _factorize(phases["value"])
    epoch = phases["epoch"].to_numpy(dtype=np.int64)
    step = phases["step"].to_numpy(dtype=np.int64)
    groups = []
    for point in (False, True):
        rows = np.flatnonzero(is_point == point)
        rows = rows[np.argsort(start[rows], kind="stable")]
        if len(rows) == 0:
            continue

        def fields(at: np.ndarray, rows: np.ndarray = rows, point: bool = point) -> list[_Field]:
            r = rows[at]
            head = '{"ph":"i","s":"t"' if point else '{"ph":"X"'
            return [
                _const(f',\n{head},"cat":"application","name":'),
                keys.field(key[r]),
                _const(',"pid":'),
                _ints(pid[r]),
                _const(',"tid":'),
                _ints(thread[r]),
                _const(',"ts":'),
                *_micros(start[r]),
                *([] if point else [_const(',"dur":'), *_micros(duration[r])]),
                _const(',"args":{"epoch":'),
                _ints(epoch[r]),
                _const(',"step":'),
                _ints(step[r]),
                _const(',"value":'),
                values.field(value[r]),
                _const("}}"),
            ]

        width = _row_bytes(fields(np.arange(1))) + keys.width + values.width
        groups.append(_Group("application", len(rows), fields, width))
    processes = [
        meta
        for g in np.unique(group).tolist()
        for meta in _process_meta(
            APP_PID + CONTAINER_PID_STRIDE * g,
            groups_of.label("application", g),
            groups_of.sort_index(g, 0),
        )
    ]
    return groups, processes + meta


def _counter_group(
    samples: pd.DataFrame, origin: int, groups_of: _Groups
) -> tuple[_Group | None, list[dict[str, Any]]]:
    value = samples["value"].to_numpy(dtype=np.float64)
    rows = np.flatnonzero(np.isfinite(value))  # JSON has no NaN or infinity
    if len(rows) == 0:
        return None, []
    ts = samples["ts_ns"].to_numpy(dtype=np.int64)[rows] - origin
    order = np.argsort(ts, kind="stable")
    rows, ts, value = rows[order], ts[order], value[rows[order]]
    label = samples["metric"].iloc[rows] + " (" + samples["unit"].iloc[rows].fillna("?") + ")"
    name, names = _factorize(label)
    group = groups_of.codes(samples)[rows]
    pid = SAMPLES_PID + CONTAINER_PID_STRIDE * group

    def fields(at: np.ndarray) -> list[_Field]:
        return [
            _const(',\n{"ph":"C","cat":"samples","name":'),
            names.field(name[at]),
            _const(',"pid":'),
            _ints(pid[at]),
            _const(',"tid":0,"ts":'),
            *_micros(ts[at]),
            _const(',"args":{"value":'),
            _floats(value[at]),
            _const("}}"),
        ]

    processes = [
        meta
        for g in np.unique(group).tolist()
        for meta in _process_meta(
            SAMPLES_PID + CONTAINER_PID_STRIDE * g,
            groups_of.label("samples", g),
            groups_of.sort_index(g, 1),
        )
    ]
    return _Group("counter", len(rows), fields, _row_bytes(fields(np.arange(1))) + 32), processes


# ---------------------------------------------------------------------------------------------
# Metadata events


def _process_meta(pid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
        _sort_meta(pid, sort_index),
    ]


def _sort_meta(pid: int, sort_index: int) -> dict[str, Any]:
    args = {"sort_index": sort_index}
    return {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": args}


def _labels_meta(pid: int, labels: str) -> dict[str, Any]:
    return {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": labels}}


def _thread_meta(pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def _process_names(events: pd.DataFrame, groups_of: _Groups) -> list[dict[str, Any]]:
    """``process_name`` and ``thread_name`` events for the processes with exported events;
    for a run of several containers also each process's container (``process_labels``) and a
    ``process_sort_index`` that places it with its container's pseudo-processes.

    A thread's name is its latest ``comm`` (a DataLoader worker renames itself after fork); a
    process's is its main thread's (tid == pid), else that of its thread seen last.
    """
    rows = _kind_rows(events, SYSCALL_KINDS + PROCESS_KINDS)
    if len(rows) == 0:
        return []
    seen = events[["pid", "tid", "comm"]].iloc[rows].assign(group=groups_of.codes(events)[rows])
    threads = seen.drop_duplicates(["pid", "tid"], keep="last")
    main = (threads["tid"] == threads["pid"]).to_numpy()
    procs = threads.iloc[np.argsort(main, kind="stable")].drop_duplicates("pid", keep="last")

    def label(comm: Any) -> str:
        return "?" if comm is None or comm is pd.NA else str(comm)

    meta = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label(c)}}
        for pid, c in zip(procs["pid"].tolist(), procs["comm"].tolist(), strict=True)
    ]
    meta += [
        _thread_meta(pid, tid, label(c))
        for pid, tid, c in zip(
            threads["pid"].tolist(), threads["tid"].tolist(), threads["comm"].tolist(), strict=True
        )
    ]
    if groups_of.several:
        for pid, g in zip(procs["pid"].tolist(), procs["group"].tolist(), strict=True):
            meta.append(_labels_meta(pid, groups_of.role(g)))
            meta.append(_sort_meta(pid, groups_of.sort_index(g, 2)))
    return meta


def _origin(run: Run) -> int:
    """The time origin: the manifest's ``start_ns``, else the earliest time in the tables."""
    if run.start_ns is not None:
        return run.start_ns
    lows = [int(t["ts_ns"].min()) for t in (run.events, run.samples, run.phases) if len(t)]
    return min(lows) if lows else 0


def trace_metadata(run: Run, counts: dict[str, int]) -> dict[str, Any]:
    """The ``metadata`` object of an exported trace: which run, its time origin, what is in it."""
    config = run.manifest.get("config") or {}
    return {
        "run_id": run.run_id,
        "workload": run.workload,
        "variant": run.variant,
        "status": run.status,
        "accelerators": config.get("accelerators"),
        "batch_size": config.get("batch_size"),
        "time_origin": "manifest start_ns (workload release), CLOCK_MONOTONIC; ts in µs",
        "start_ns": run.start_ns,
        "end_ns": run.end_ns,
        "containers": run_roles(run),
        "events": counts,
        "exported_by": f"twintrace {TWINTRACE_VERSION}",
    }


def export_perfetto(run: Run, out_path: Path) -> Path:
    """Write ``run`` as Chrome Trace Event Format JSON (see the module doc); return the path.

    Opens in https://ui.perfetto.dev and ``chrome://tracing``. Written atomically and streamed
    chunk by chunk. Raises :class:`UserError` when the run has nothing to export.
    """
    origin = _origin(run)
    events, samples, phases = run.events, run.samples, run.phases
    groups_of = _Groups(tuple(run_roles(run)))
    meta = _process_names(events, groups_of)
    groups = [_syscall_group(events, origin), _process_group(events, origin)]
    block, block_meta = _block_group(events, origin)
    phase_groups, phase_meta = _phase_groups(phases, origin, groups_of)
    counters, counter_meta = _counter_group(samples, origin, groups_of)
    groups = [g for g in [*groups, block, *phase_groups, counters] if g is not None]
    meta = phase_meta + counter_meta + meta + block_meta
    counts: dict[str, int] = {}
    for group in groups:
        counts[group.name] = counts.get(group.name, 0) + group.count
    if not counts:
        raise UserError(
            f"run {run.run_id} has no events, phases or samples to export "
            f"(status {run.status}); trace a run that completes"
        )
    header = {"displayTimeUnit": "ms", "metadata": trace_metadata(run, counts)}
    # The object is written around the streamed events: the header without its closing brace,
    # then the array, which starts with the metadata events so that every streamed line can
    # begin with its separator.
    head = json.dumps(header)[:-1] + ',"traceEvents":[\n'
    head += ",\n".join(json.dumps(m) for m in meta)
    with atomic_path(out_path) as tmp, open(tmp, "xb") as handle:
        handle.write(head.encode())
        for group in groups:
            group.write(handle)
        handle.write(b"\n]}\n")
    return Path(out_path)


# ---------------------------------------------------------------------------------------------
# CSV


def export_csv(
    run: Run, out_dir: Path, tables: Sequence[str] = ("events", "samples", "phases")
) -> list[Path]:
    """Write ``<table>.csv`` for each of ``tables`` into ``out_dir``; return the paths written.

    Columns and values are those of the Parquet tables (docs/run-format.md): times are
    CLOCK_MONOTONIC ns (subtract the manifest's ``start_ns`` for times since the release),
    missing strings are empty fields. Each file is written atomically by pyarrow's CSV writer.
    """
    unknown = [name for name in tables if name not in TABLES]
    if unknown:
        raise UserError(f"unknown table {unknown[0]!r}: choose from {', '.join(TABLES)}")
    written: list[Path] = []
    for name in tables:
        table = pa.Table.from_pandas(getattr(run, name), preserve_index=False)
        # The CSV writer takes no dictionary columns (events.kind): write their values.
        schema = pa.schema(
            pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type) else f
            for f in table.schema
        )
        path = Path(out_dir) / f"{name}.csv"
        with atomic_path(path) as tmp:
            pacsv.write_csv(table.cast(schema), tmp)
        written.append(path)
    return written
