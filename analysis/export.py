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
- aggregated syscall rows (``count`` > 1: that many reads or writes of one thread in one row,
  docs/run-format.md): one complete event each, not one per call, named after the call,
  category ``syscall``, ending at the row's ``ts_ns`` (its last call's exit) and lasting its
  summed latency, the thread's time in those calls drawn back to back; it starts no earlier
  than the thread's previous syscall's exit, since slices on one thread must nest (so a row
  whose calls interleaved with other calls is drawn shorter: ``args.latency_ns`` keeps the
  sum). ``args``: ``path``, ``bytes`` (total), ``fd``, ``offset`` (-1), ``ret``, ``count``,
  ``latency_ns`` and ``latency_max_ns``; the metadata counts them as ``aggregated syscall``;
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

A run across hosts has one pid namespace per host: two hosts' processes may have the same pid.
Each host's pids and tids are exported in a range of their own, ``pid + i * HOST_PID_STRIDE``
for the i-th host (by name; :func:`host_pids`), so that no two hosts' processes or threads
merge; the processes' names say their real pid and host (``python3 (pid 41 on node-2)``).

Page-cache rows (per-process 100 ms intervals) are not exported; the timeline plot shows them.
Events are written in groups (the order of the list above), each sorted by start time; the
format does not require an order (Perfetto sorts on import).

Writing is vectorised and streamed: each group is turned into JSON text in chunks of rows with
numpy (:mod:`analysis.jsontext`: integers to decimal digits by array arithmetic, strings
JSON-escaped once per distinct value, one transposing copy to lay out the lines) and each
chunk's bytes are written at once, so memory stays bounded whatever the run's size
(docs/analysis.md has timings).

:func:`export_csv` writes the three tables as CSV with the columns of docs/run-format.md.

Example::

    export_perfetto(load_run("runs/A"), Path("runs/A/trace.json"))
    export_csv(load_run("runs/A"), Path("runs/A/csv"))
"""

from __future__ import annotations

import dataclasses
import heapq
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from analysis.jsontext import Field, Texts, const, floats, ints, join, micros, row_bytes, texts_of
from analysis.tables import (
    BLOCK_KINDS,
    SYSCALL_KINDS,
    container_codes,
    kind_mask,
    roles_by_host,
    run_roles,
)
from core import __version__ as TWINTRACE_VERSION
from core.atomic import atomic_path
from core.errors import UserError
from store.rundir import PROCESS_KINDS, TABLES, Run

# Pseudo-process ids: above any Linux pid (pid_max is at most 2**22) and below 2**31, which
# some trace readers require. A run of several containers has an application and a samples
# pseudo-process per container, CONTAINER_PID_STRIDE apart (container i: APP_PID + i * stride).
APP_PID = 1_000_000_000
SAMPLES_PID = APP_PID + 1
BLOCK_PID_BASE = APP_PID + 2
CONTAINER_PID_STRIDE = 1_000
#: A run across hosts: host i's pids and tids are exported as ``pid + i * HOST_PID_STRIDE``
#: (Linux's pid_max is at most 2**22), below APP_PID for up to 238 hosts.
HOST_PID_STRIDE = 1 << 22
MAX_HOSTS = APP_PID // HOST_PID_STRIDE

#: Bytes of text built per chunk before it is written (bounds the temporary memory).
CHUNK_BYTES = 32 << 20


# ---------------------------------------------------------------------------------------------
# Chunked writing


@dataclasses.dataclass
class _Group:
    """Rows of one kind of trace event and how to turn a slice of them into fields."""

    name: str
    count: int
    fields: Callable[[np.ndarray], list[Field]]  # row positions (sorted order) -> fields
    row_bytes: int  # about the length of a line, to size the chunks

    def write(self, handle: BinaryIO) -> None:
        step = max(1_000, CHUNK_BYTES // max(self.row_bytes, 1))
        for start in range(0, self.count, step):
            rows = np.arange(start, min(start + step, self.count))
            handle.write(join(self.fields(rows), len(rows)))


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
    own; a run of one container is one group, laid out as before containers existed. A run
    across hosts names each group after its host and container (``node-2/rank1``), the
    containers ordered by host, so that a host's groups sit together."""

    roles: tuple[str, ...]
    placement: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, run: Run) -> _Groups:
        return cls(tuple(roles_by_host(run)), run.placement)

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
        if group >= len(self.roles):
            return "hosts" if self.placement else "host"
        role = self.roles[group]
        return f"{self.placement[role]}/{role}" if role in self.placement else role

    def label(self, base: str, group: int) -> str:
        """A pseudo-process's name: ``base``, with the container when there are several."""
        return f"{base} · {self.role(group)}" if self.several else base

    def sort_index(self, group: int, slot: int) -> int:
        """Slot 0: application, 1: samples, 2: the container's processes."""
        return 3 * group - 3 + slot

    def processes(
        self, group: np.ndarray, base_pid: int, base: str, slot: int
    ) -> list[dict[str, Any]]:
        """The names and sort indexes of the pseudo-processes ``base`` (pid ``base_pid`` in
        the first group, sort slot ``slot``) of the groups in ``group``."""
        return [
            meta
            for g in np.unique(group).tolist()
            for meta in _process_meta(
                base_pid + CONTAINER_PID_STRIDE * g, self.label(base, g), self.sort_index(g, slot)
            )
        ]


def _column(events: pd.DataFrame, name: str, rows: np.ndarray) -> np.ndarray:
    return events[name].to_numpy()[rows]


def _kinds(events: pd.DataFrame, rows: np.ndarray) -> tuple[np.ndarray, Texts]:
    """Codes and JSON names of the rows' kinds, from the categorical's codes (no string work)."""
    kind = events["kind"].astype("category")
    codes = np.asarray(kind.cat.codes.to_numpy(), dtype=np.int64)[rows]
    return codes, Texts.strings(list(kind.cat.categories))


def _head(what: str, name: Field, pid: np.ndarray) -> list[Field]:
    """The start of an event's line: its phase and category (``what``), name and process."""
    return [const(f',\n{{{what},"name":'), name, const(',"pid":'), ints(pid)]


def _times(tid: np.ndarray, ts: np.ndarray, dur: np.ndarray | None = None) -> list[Field]:
    """An event's thread, start and (for complete events) duration, ns since the origin."""
    fields = [const(',"tid":'), ints(tid), const(',"ts":'), *micros(ts)]
    return fields if dur is None else [*fields, const(',"dur":'), *micros(dur)]


def _args(*values: tuple[str, Field]) -> list[Field]:
    """An event's ``"args"`` (``(name, value)`` in order) and the event's closing braces."""
    fields: list[Field] = []
    for i, (name, value) in enumerate(values):
        fields += [const(f',"{name}":' if i else f',"args":{{"{name}":'), value]
    return [*fields, const("}}")]


def _after_previous(
    start: np.ndarray, end: np.ndarray, pid: np.ndarray, tid: np.ndarray
) -> np.ndarray:
    """``start``, moved to no earlier than the end of the previous interval (by end) of the same
    thread ``(pid, tid)``: then no two intervals of a thread overlap without nesting."""
    order = np.lexsort((end, tid, pid))
    earliest = np.full(len(end), np.iinfo(np.int64).min)
    same = (pid[order][1:] == pid[order][:-1]) & (tid[order][1:] == tid[order][:-1])
    earliest[order[1:]] = np.where(same, end[order][:-1], earliest[0])
    return np.maximum(start, earliest)


def _syscall_groups(events: pd.DataFrame, origin: int) -> list[_Group]:
    """Syscalls traced one by one, then aggregated rows (``count`` > 1), each with its count."""
    rows = _kind_rows(events, SYSCALL_KINDS)
    if len(rows) == 0:
        return []
    end = _column(events, "ts_ns", rows).astype(np.int64) - origin
    duration = _column(events, "latency_ns", rows).astype(np.int64).clip(min=0)
    start = end - duration
    folded = _column(events, "count", rows) > 1
    if folded.any():  # slices on a thread must nest: no earlier than the thread's last exit
        pid, tid = _column(events, "pid", rows), _column(events, "tid", rows)
        start = np.where(folded, _after_previous(start, end, pid, tid), start)
        duration = end - start
    path, paths = texts_of(events["path"])
    extra = ("count", "latency_ns", "latency_max_ns")
    return [
        _syscall_group(events, rows[mine], start[mine], duration[mine], path, paths, more)
        for mine, more in ((~folded, ()), (folded, extra))
        if mine.any()
    ]


def _syscall_group(
    events: pd.DataFrame,
    rows: np.ndarray,
    start: np.ndarray,
    duration: np.ndarray,
    path: np.ndarray,
    paths: Texts,
    extra: Sequence[str],
) -> _Group:
    """Complete events of the syscall ``rows`` (``args`` with the ``extra`` columns too)."""
    order = np.argsort(start, kind="stable")
    rows, start, duration = rows[order], start[order], duration[order]
    kind, kinds = _kinds(events, rows)
    names = ("pid", "tid", "bytes", "fd", "offset", "ret", *extra)
    cols = {c: _column(events, c, rows) for c in names}
    path = path[rows]

    def fields(at: np.ndarray) -> list[Field]:
        numbers = [(c, ints(cols[c][at])) for c in ("bytes", "fd", "offset", "ret", *extra)]
        return [
            *_head('"ph":"X","cat":"syscall"', kinds.field(kind[at]), cols["pid"][at]),
            *_times(cols["tid"][at], start[at], duration[at]),
            *_args(("path", paths.field(path[at])), *numbers),
        ]

    name = "aggregated syscall" if extra else "syscall"
    return _Group(name, len(rows), fields, row_bytes(fields(np.arange(1))) + paths.width)


def _process_group(events: pd.DataFrame, origin: int) -> _Group | None:
    rows = _kind_rows(events, PROCESS_KINDS)
    if len(rows) == 0:
        return None
    ts = _column(events, "ts_ns", rows).astype(np.int64) - origin
    order = np.argsort(ts, kind="stable")
    rows, ts = rows[order], ts[order]
    kind, kinds = _kinds(events, rows)
    path, paths = texts_of(events["path"].iloc[rows])
    cols = {c: _column(events, c, rows) for c in ("pid", "tid", "ret")}

    def fields(at: np.ndarray) -> list[Field]:
        return [
            *_head('"ph":"i","s":"t","cat":"process"', kinds.field(kind[at]), cols["pid"][at]),
            *_times(cols["tid"][at], ts[at]),
            *_args(("path", paths.field(path[at])), ("ret", ints(cols["ret"][at]))),
        ]

    return _Group("process", len(rows), fields, row_bytes(fields(np.arange(1))) + paths.width)


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
    flag = Texts(["false", "true"])
    inside = _column(events, "in_container", rows).astype(np.int64)
    cols = {c: _column(events, c, rows) for c in ("bytes", "offset", "pid")}

    def fields(at: np.ndarray) -> list[Field]:
        return [
            *_head('"ph":"X","cat":"block"', kinds.field(kind[at]), pid[at]),
            *_times(lane[at] + 1, start[at], duration[at]),
            *_args(
                ("bytes", ints(cols["bytes"][at])),
                ("offset", ints(cols["offset"][at])),
                ("in_container", flag.field(inside[at])),
                ("issuer", ints(cols["pid"][at])),
            ),
        ]

    return _Group("block", len(rows), fields, row_bytes(fields(np.arange(1)))), meta


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
    key, keys = texts_of(phases["key"])
    value, values = texts_of(phases["value"])
    epoch = phases["epoch"].to_numpy(dtype=np.int64)
    step = phases["step"].to_numpy(dtype=np.int64)
    groups = []
    for point in (False, True):
        rows = np.flatnonzero(is_point == point)
        rows = rows[np.argsort(start[rows], kind="stable")]
        if len(rows) == 0:
            continue

        def fields(at: np.ndarray, rows: np.ndarray = rows, point: bool = point) -> list[Field]:
            r = rows[at]
            what = '"ph":"i","s":"t"' if point else '"ph":"X"'
            return [
                *_head(f'{what},"cat":"application"', keys.field(key[r]), pid[r]),
                *_times(thread[r], start[r], None if point else duration[r]),
                *_args(
                    ("epoch", ints(epoch[r])),
                    ("step", ints(step[r])),
                    ("value", values.field(value[r])),
                ),
            ]

        width = row_bytes(fields(np.arange(1))) + keys.width + values.width
        groups.append(_Group("application", len(rows), fields, width))
    return groups, groups_of.processes(group, APP_PID, "application", 0) + meta


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
    name, names = texts_of(label)
    group = groups_of.codes(samples)[rows]
    pid = SAMPLES_PID + CONTAINER_PID_STRIDE * group

    def fields(at: np.ndarray) -> list[Field]:
        return [
            *_head('"ph":"C","cat":"samples"', names.field(name[at]), pid[at]),
            *_times(np.zeros(len(at), dtype=np.int64), ts[at]),
            *_args(("value", floats(value[at]))),
        ]

    processes = groups_of.processes(group, SAMPLES_PID, "samples", 1)
    return _Group("counter", len(rows), fields, row_bytes(fields(np.arange(1))) + 32), processes


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


def _process_names(
    events: pd.DataFrame, groups_of: _Groups, hosts: Mapping[int, tuple[int, str]] | None = None
) -> list[dict[str, Any]]:
    """``process_name`` and ``thread_name`` events for the processes with exported events;
    for a run of several containers also each process's container (``process_labels``) and a
    ``process_sort_index`` that places it with its container's pseudo-processes. ``hosts``:
    a run across hosts' exported pid -> (real pid, host) (:func:`host_pids`), named in the
    process's name.

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

    hosts = hosts or {}

    def named(pid: int, comm: Any) -> str:
        if pid not in hosts:
            return label(comm)
        real, host = hosts[pid]
        return f"{label(comm)} (pid {real} on {host})"

    meta = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": named(pid, c)}}
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


def host_pids(events: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, tuple[int, str]]]:
    """``events`` with each host's pids and tids in a range of their own (the module doc) when
    it spans several hosts, and the exported pid -> (real pid, host) of those processes; the
    events as they are (and no map) for a run of one host."""
    if "host" not in events.columns:
        return events, {}
    hosts = sorted(str(h) for h in events["host"].dropna().unique())
    if len(hosts) < 2:
        return events, {}
    if len(hosts) > MAX_HOSTS:
        raise UserError(
            f"the run spans {len(hosts)} hosts: its Perfetto export holds at most {MAX_HOSTS} "
            "(each host's pids in a range of their own); export it as CSV (--format csv)"
        )
    index = events["host"].astype("string").map({h: i for i, h in enumerate(hosts)})
    offset = index.fillna(0).to_numpy(dtype=np.int64) * HOST_PID_STRIDE
    shifted = events.assign(
        pid=events["pid"].to_numpy(dtype=np.int64) + offset,
        tid=events["tid"].to_numpy(dtype=np.int64) + offset,
    )
    real = (
        pd.DataFrame({"pid": shifted["pid"], "real": events["pid"], "host": events["host"]})
        .dropna(subset=["host"])
        .drop_duplicates("pid")
    )
    return shifted, {
        int(p): (int(r), str(h))
        for p, r, h in zip(
            real["pid"].tolist(), real["real"].tolist(), real["host"].tolist(), strict=True
        )
    }


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
    events, hosts = host_pids(events)
    groups_of = _Groups.of(run)
    meta = _process_names(events, groups_of, hosts)
    groups = [*_syscall_groups(events, origin), _process_group(events, origin)]
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
