"""A run's I/O as a job summary reads it (Darshan's, ``darshan-util``): who moved how many
bytes when, what the calls cost, their sizes, access patterns, files, mount points, and who
did much more or less than their peers. The run report (``analysis/run_report.py``) draws
these; each is a plain function of a run's events, so tests check it against known numbers.

Every figure counts calls, not rows: an aggregated row (``count`` n, docs/run-format.md) is n
calls, its ``bytes`` and ``latency_ns`` their totals. What the aggregation loses is said where
a figure needs it: the exact size of each aggregated call (its mean, inside the row's
power-of-two bucket, stands for it) and the offsets of aggregated positional calls.

Definitions follow Darshan's POSIX module:

- **kinds of call**: reads (``read``, ``pread64``, ``readv``), writes (``write``,
  ``pwrite64``, ``writev``), metadata (``openat``, ``close``, ``lseek``, ``fsync``,
  ``fdatasync``, ``dup``); Darshan's "I/O cost" is the time spent in each, per process.
- **request sizes**: Darshan's ten buckets (up to 100 B, 1 KiB, 10 KiB ... 1 GiB, then more;
  each holds its top), and the four most common exact sizes.
- **consecutive / sequential**: an access of a process to a file that starts exactly where its
  previous access of the same kind (read or write) to that file ended is consecutive; one that
  starts at or after that end is sequential (so consecutive ones are sequential too); the
  first access counts as if the previous had ended at byte 1 (Darshan's ``last_byte`` starts at
  0: a first read at offset 0 is neither, one further in is sequential). A
  ``read`` or ``write`` has no offset in the trace: it is where the file position is, which
  ``openat`` sets to 0, ``lseek`` to its result, and each ``read``/``write`` advances by its
  bytes (descriptors a ``dup`` made share it, as they share the open file). The calls of an
  aggregated ``read``/``write`` row follow each other (one thread, one file, in order); those
  of an aggregated ``pread64``/``pwrite64`` row have unknown offsets and are left out of both
  counts (:attr:`AccessPattern.unknown`).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import pandas as pd

from analysis.processes import classify_processes
from analysis.series import Bins, binned_calls, call_starts
from analysis.tables import BLOCK_KINDS, kind_mask
from store.rundir import READ_KINDS, WRITE_KINDS, Run

METADATA_KINDS: tuple[str, ...] = ("openat", "close", "lseek", "fsync", "fdatasync", "dup")
POSITIONAL_KINDS: tuple[str, ...] = ("pread64", "pwrite64")
#: Darshan's request-size buckets (``DARSHAN_BUCKET_INC``): (label, largest size in the
#: bucket, inclusive; the last has none).
SIZE_BUCKETS: tuple[tuple[str, int | None], ...] = (
    ("0-100", 100),
    ("100-1K", 2**10),
    ("1K-10K", 10 * 2**10),
    ("10K-100K", 100 * 2**10),
    ("100K-1M", 2**20),
    ("1M-4M", 4 * 2**20),
    ("4M-10M", 10 * 2**20),
    ("10M-100M", 100 * 2**20),
    ("100M-1G", 2**30),
    ("1G+", None),
)
#: A member of a group whose figure differs from the median of the others by more than this
#: factor (either way) is flagged as imbalanced.
IMBALANCE_FACTOR = 2.0

_IO_KINDS = (*READ_KINDS, *WRITE_KINDS)
T = TypeVar("T")


def _per_run(compute: Callable[[Run], T]) -> Callable[[Run], T]:
    """``compute`` once per run: kept while the run is, not after (an lru_cache would hold
    the last runs' tables, millions of rows, for as long as the process lives)."""
    found: weakref.WeakKeyDictionary[Run, T] = weakref.WeakKeyDictionary()

    @functools.wraps(compute)
    def cached(run: Run) -> T:
        if run not in found:
            found[run] = compute(run)
        return found[run]

    return cached


def process_keys(run: Run, rows: np.ndarray) -> np.ndarray:
    """Per row of ``run.events`` selected by the mask ``rows``, the process it came from as an
    integer: the host's place among the run's hosts (sorted), times 2**32, plus the pid (pids
    are per host)."""
    return _all_process_keys(run)[rows]


@_per_run
def _all_process_keys(run: Run) -> np.ndarray:
    events = run.events
    code = pd.Index(_hosts(run), dtype="string").get_indexer(events["host"].fillna(""))
    return code.astype(np.int64) << 32 | events["pid"].to_numpy().astype(np.int64)


def _hosts(run: Run) -> list[str]:
    return sorted(str(h) for h in run.events["host"].fillna("").unique())


@_per_run
def process_labels(run: Run) -> pd.DataFrame:
    """One row per traced process that made a system call: ``process`` (:func:`process_keys`),
    ``label`` (``rank0 · pt_data_worker 41``, led by the host on a run of several),
    ``container``, ``host``, ``group`` (main, loader worker, other: :func:`classify_processes`,
    per container)."""
    events = run.events
    calls = events[~kind_mask(events, BLOCK_KINDS)]
    hosts = _hosts(run)
    rows = []
    for (host, role), mine in calls.groupby(
        [calls["host"].fillna(""), calls["container"].fillna("")], sort=False, observed=True
    ):
        procs = classify_processes(mine)
        for p in procs.itertuples():
            label = f"{role or 'host'} · {p.comm} {p.pid}"
            rows.append(
                {
                    "process": hosts.index(str(host)) << 32 | int(p.pid),
                    "label": f"{host}: {label}" if len(hosts) > 1 else label,
                    "container": role,
                    "host": host,
                    "group": str(p.group),
                }
            )
    return pd.DataFrame(rows, columns=["process", "label", "container", "host", "group"])


# ---------------------------------------------------------------------------------------------
# The heat map


@dataclasses.dataclass(frozen=True)
class HeatMap:
    """Bytes read and written per time slice (columns) and process (rows)."""

    labels: list[str]
    edges_s: np.ndarray  # the slices' edges, seconds since the run's start
    cells: np.ndarray  # bytes, (rows, slices)

    @property
    def row_totals(self) -> np.ndarray:
        return self.cells.sum(axis=1)

    @property
    def slice_totals(self) -> np.ndarray:
        return self.cells.sum(axis=0)


def heat_map(run: Run, slices: int = 120, rows: int = 40) -> HeatMap:
    """Bytes of read and write calls per process and time slice over the run: ``slices``
    equal slices from its start to its end, the ``rows`` processes that moved the most bytes
    (the others summed in one last row, ``N other processes``). An aggregated row's bytes are
    shared by its calls, each in the slice where it completed (``analysis.series``)."""
    events = run.events
    io = kind_mask(events, _IO_KINDS)
    start, end = _span(run)
    bins = Bins.spanning(start, end, slices)
    origin = run.start_ns if run.start_ns is not None else start
    edges = bins.edges_s(origin)
    if not io.any():
        return HeatMap([], edges, np.zeros((0, slices)))
    begun = call_starts(events, io)[io]
    ts = events["ts_ns"].to_numpy()[io]
    nbytes = events["bytes"].to_numpy(dtype=np.float64)[io]
    count = events["count"].to_numpy()[io]
    codes, processes = pd.factorize(process_keys(run, io))
    totals = np.bincount(codes, weights=nbytes)
    order = np.argsort(-totals, kind="stable")
    kept = order[:rows] if len(order) <= rows + 1 else order[: rows - 1]  # "others": 2 or more
    row = np.full(len(processes), len(kept), dtype=np.int64)
    row[kept] = np.arange(len(kept))
    at = row[codes]
    lanes = len(kept) + (len(kept) < len(processes))
    # A call traced one by one goes to its slice; an aggregated row's calls are spread.
    alone = (count <= 1) | (begun >= ts)
    slot = bins.index(ts[alone])
    inside = slot >= 0
    flat = at[alone][inside] * slices + slot[inside]
    cells = np.bincount(flat, weights=nbytes[alone][inside], minlength=lanes * slices)
    cells = cells.reshape(lanes, slices)
    for lane in np.unique(at[~alone]):
        mine = ~alone & (at == lane)
        cells[lane] += binned_calls(ts[mine], nbytes[mine], bins, begun[mine], count[mine])
    labels = process_labels(run).set_index("process")["label"]
    names = [str(labels.get(processes[k], processes[k])) for k in kept]
    if lanes > len(kept):
        names.append(f"{len(processes) - len(kept)} other processes")
    return HeatMap(names, edges, cells)


def _span(run: Run) -> tuple[int, int]:
    """The run's start and end (ns): the manifest's, else its events' extent."""
    ts = run.events["ts_ns"]
    start = run.start_ns if run.start_ns is not None else int(ts.min()) if len(ts) else 0
    end = run.end_ns if run.end_ns is not None else int(ts.max()) if len(ts) else start + 1
    return start, max(end, start + 1)


# ---------------------------------------------------------------------------------------------
# Costs, sizes, counts


def io_cost(run: Run) -> pd.DataFrame:
    """Seconds spent in read, write and metadata calls, per process (``label``, ``read_s``,
    ``write_s``, ``metadata_s``), the costliest first; processes that spent none left out."""
    events = run.events
    kinds = {"read_s": READ_KINDS, "write_s": WRITE_KINDS, "metadata_s": METADATA_KINDS}
    frame = pd.DataFrame(index=pd.Index([], dtype="int64"))
    for column, these in kinds.items():
        mask = kind_mask(events, these)
        seconds = events.loc[mask, "latency_ns"].groupby(process_keys(run, mask)).sum() * 1e-9
        frame = frame.join(seconds.rename(column), how="outer")
    frame = frame.fillna(0.0)
    frame = frame[frame.sum(axis=1) > 0]
    labels = process_labels(run).set_index("process")["label"]
    frame.insert(0, "label", [str(labels.get(p, p)) for p in frame.index])
    order = frame[list(kinds)].sum(axis=1).sort_values(ascending=False).index
    return frame.loc[order].reset_index(drop=True)


def size_histogram(run: Run, kinds: Sequence[str]) -> pd.Series:
    """Calls of ``kinds`` per Darshan size bucket (:data:`SIZE_BUCKETS`), by each call's size
    (an aggregated row's calls by their mean)."""
    events = run.events
    mask = kind_mask(events, kinds)
    count = events.loc[mask, "count"].to_numpy(dtype=np.int64)
    size = events.loc[mask, "bytes"].to_numpy(dtype=np.int64) // np.maximum(count, 1)
    highs = np.array([high for _, high in SIZE_BUCKETS[:-1]])
    bucket = np.searchsorted(highs, size, side="left")  # the first bucket whose top holds it
    counts = np.bincount(bucket, weights=count, minlength=len(SIZE_BUCKETS))
    return pd.Series(counts.astype(np.int64), index=[label for label, _ in SIZE_BUCKETS])


def common_sizes(run: Run, kinds: Sequence[str], top: int = 4) -> list[tuple[int, int]]:
    """The ``top`` most common sizes of the calls of ``kinds`` that were traced one by one (an
    aggregated call's exact size is not known), as (bytes, calls), the most common first."""
    events = run.events
    mask = kind_mask(events, kinds) & (events["count"].to_numpy() == 1)
    sizes = events.loc[mask, "bytes"].value_counts()
    sizes = sizes.sort_index().sort_values(ascending=False, kind="stable")  # ties: smaller first
    return [(int(s), int(n)) for s, n in sizes.head(top).items()]


def operation_counts(run: Run) -> pd.Series:
    """Calls per kind of system call (each row weighted by its ``count``), block and page-cache
    rows and process events left out; the most frequent first."""
    events = run.events
    mask = kind_mask(events, (*_IO_KINDS, *METADATA_KINDS, "mmap"))
    counts = events.loc[mask].groupby("kind", observed=True)["count"].sum()
    return counts[counts > 0].astype(np.int64).sort_values(ascending=False)


# ---------------------------------------------------------------------------------------------
# Access patterns


@dataclasses.dataclass(frozen=True)
class AccessPattern:
    """Of a kind of access (reads or writes): calls, and how many were consecutive or
    sequential (module doc); ``unknown``: calls whose offset the trace does not have."""

    calls: int
    consecutive: int
    sequential: int
    unknown: int


def access_patterns(run: Run) -> dict[str, AccessPattern]:
    """``{"read": ..., "write": ...}``: consecutive and sequential accesses (module doc)."""
    events = run.events
    moves = kind_mask(events, (*_IO_KINDS, "openat", "lseek")) & events["path"].notna().to_numpy()
    process = process_keys(run, moves)
    file = pd.factorize(events["path"].to_numpy()[moves])[0]
    order = np.lexsort((events["ts_ns"].to_numpy()[moves], file, process))  # stable
    rows = events.loc[moves, ["kind", "bytes", "count", "offset"]].iloc[order]
    process, file = process[order], file[order]
    kind = rows["kind"]  # categorical: its comparisons work on the codes
    nbytes = rows["bytes"].to_numpy(dtype=np.int64)
    count = rows["count"].to_numpy(dtype=np.int64)
    positional = kind.isin(POSITIONAL_KINDS).to_numpy()
    is_read = kind.isin(READ_KINDS).to_numpy()
    is_io = kind.isin(_IO_KINDS).to_numpy()
    # The file position: segments start at each openat (0) and lseek (its result), and at
    # each new (process, file), whose position before the trace saw it open is taken as 0.
    new_key = np.append(True, (process[1:] != process[:-1]) | (file[1:] != file[:-1]))
    sets = new_key | ~is_io
    base = np.where(kind.eq("lseek").to_numpy(), rows["offset"].to_numpy(dtype=np.int64), 0)
    segment = np.cumsum(sets) - 1
    advance = np.where(is_io & ~positional, nbytes, 0)
    within = np.cumsum(advance) - advance
    within -= (np.cumsum(advance) - advance)[np.flatnonzero(sets)][segment]
    offset = np.where(
        positional, rows["offset"].to_numpy(dtype=np.int64), base[sets][segment] + within
    )
    found: dict[str, AccessPattern] = {}
    for name, mine in (("read", is_io & is_read), ("write", is_io & ~is_read)):
        idx = np.flatnonzero(mine)
        known = ~(positional[idx] & (count[idx] > 1))
        idx_known = idx[known]
        first = offset[idx_known]
        end = first + nbytes[idx_known]
        p, f = process[idx_known], file[idx_known]
        same = np.append(False, (p[1:] == p[:-1]) & (f[1:] == f[:-1]))
        prev_end = np.where(same, np.append(0, end[:-1]), 1)
        consec = first == prev_end
        seq = first >= prev_end
        inner = np.where(positional[idx_known], 0, count[idx_known] - 1)  # aggregated: in order
        found[name] = AccessPattern(
            calls=int(count[idx].sum()),
            consecutive=int(consec.sum() + inner.sum()),
            sequential=int(seq.sum() + inner.sum()),
            unknown=int(count[idx][~known].sum()),
        )
    return found


# ---------------------------------------------------------------------------------------------
# Files and mount points

FILE_COLUMNS = ("path", "opens", "reads", "writes", "read_bytes", "write_bytes", "io_s")


def file_table(run: Run) -> pd.DataFrame:
    """One row per file a traced call named (:data:`FILE_COLUMNS`): its opens, read and write
    calls and bytes, and the seconds spent in its calls (reads, writes and metadata)."""
    events = run.events
    mask = kind_mask(events, (*_IO_KINDS, *METADATA_KINDS)) & events["path"].notna().to_numpy()
    kind = events["kind"][mask]
    codes, paths = pd.factorize(events["path"].to_numpy()[mask])
    count = events["count"].to_numpy()[mask]
    nbytes = events["bytes"].to_numpy()[mask]
    read = kind.isin(READ_KINDS).to_numpy()
    write = kind.isin(WRITE_KINDS).to_numpy()

    def total(weights: np.ndarray) -> np.ndarray:
        return np.bincount(codes, weights=weights, minlength=len(paths))

    table = pd.DataFrame(
        {
            "path": pd.array(paths, dtype="string"),
            "opens": total(np.where(kind.eq("openat").to_numpy(), count, 0)).astype(np.int64),
            "reads": total(np.where(read, count, 0)).astype(np.int64),
            "writes": total(np.where(write, count, 0)).astype(np.int64),
            "read_bytes": total(np.where(read, nbytes, 0)).astype(np.int64),
            "write_bytes": total(np.where(write, nbytes, 0)).astype(np.int64),
            "io_s": total(events["latency_ns"].to_numpy(dtype=np.float64)[mask]) * 1e-9,
        }
    )
    return table[list(FILE_COLUMNS)]


def file_kinds(files: pd.DataFrame) -> pd.DataFrame:
    """Files read only, written only, both, and neither (opened, no data moved), with how
    many and their bytes (read and written)."""
    reads, writes = files["reads"] > 0, files["writes"] > 0
    groups = {
        "read only": reads & ~writes,
        "write only": writes & ~reads,
        "read and written": reads & writes,
        "opened only": ~reads & ~writes,
    }
    return pd.DataFrame(
        [
            {
                "files": name,
                "count": int(mask.sum()),
                "read_bytes": int(files.loc[mask, "read_bytes"].sum()),
                "write_bytes": int(files.loc[mask, "write_bytes"].sum()),
            }
            for name, mask in groups.items()
        ]
    )


def mount_points(run: Run) -> list[str]:
    """The containers' mount points (their mounts' targets, ``/dev/shm``), the longest first:
    a path belongs to the first that holds it, else to the container's own file system."""
    targets = {
        str(m["target"]).rstrip("/")
        for c in run.manifest.get("containers") or []
        for m in c.get("mounts") or []
        if m.get("target")
    }
    return sorted(targets | {"/dev/shm", "/proc", "/sys", "/dev"}, key=len, reverse=True)


def volume_by_mount(run: Run, files: pd.DataFrame) -> pd.DataFrame:
    """Bytes read and written per mount point (:func:`mount_points`; ``/`` for the rest)."""
    mounts = mount_points(run)
    path = files["path"].astype("string")
    where = pd.Series("/", index=files.index, dtype="string")
    for mount in reversed(mounts):  # the longest last, so it wins
        inside = path.eq(mount) | path.str.startswith(mount + "/")
        where[inside.to_numpy(dtype=bool)] = mount
    table = (
        files.assign(mount=where.to_numpy())
        .groupby("mount", sort=False)[["read_bytes", "write_bytes", "reads", "writes"]]
        .sum()
    )
    table = table[
        (table["read_bytes"] + table["write_bytes"] + table["reads"] + table["writes"]) > 0
    ]
    return table.sort_values("read_bytes", ascending=False).reset_index()


# ---------------------------------------------------------------------------------------------
# Imbalance


def imbalance(run: Run, factor: float = IMBALANCE_FACTOR) -> pd.DataFrame:
    """Hosts, containers (ranks) and each container's loader workers, by the bytes they read
    and wrote and the seconds their I/O calls took; a member is ``flagged`` where either figure
    differs from the median of the others of its group by more than ``factor`` (groups of two
    or more). Columns: ``group``, ``member``, ``bytes``, ``io_s``, ``flagged``, ``why``."""
    events = run.events
    io = kind_mask(events, _IO_KINDS)
    rows = events.loc[io, ["bytes", "latency_ns"]].assign(
        process=process_keys(run, io),
        host=events.loc[io, "host"].fillna("").to_numpy(),
        container=events.loc[io, "container"].fillna("").to_numpy(),
    )
    found = []
    if rows["host"].nunique() > 1:
        found.append(_members(rows, "host", "hosts"))
    if rows["container"].nunique() > 1:
        found.append(_members(rows, "container", "ranks (containers)"))
    procs = process_labels(run)
    workers = procs[procs["group"] == "loader worker"]
    for role, mine in workers.groupby("container", sort=False):
        part = rows[rows["process"].isin(mine["process"])]
        labels = dict(zip(mine["process"], mine["label"], strict=True))
        members = _members(part.assign(label=part["process"].map(labels)), "label", "")
        members["group"] = f"loader workers of {role or 'the host'}"
        found.append(members)
    columns = ["group", "member", "bytes", "io_s", "flagged", "why"]
    if not found:
        return pd.DataFrame(columns=columns)
    table = pd.concat(found, ignore_index=True)
    flags = [_flag(table[table["group"] == g], factor) for g in table["group"].unique()]
    table = table.join(pd.concat(flags))
    return table[columns]


def _members(rows: pd.DataFrame, by: str, group: str) -> pd.DataFrame:
    sums = rows.groupby(by, sort=True)[["bytes", "latency_ns"]].sum()
    return pd.DataFrame(
        {
            "group": group,
            "member": sums.index.astype(str),
            "bytes": sums["bytes"].to_numpy(dtype=np.int64),
            "io_s": sums["latency_ns"].to_numpy(dtype=np.float64) * 1e-9,
        }
    )


def _flag(members: pd.DataFrame, factor: float) -> pd.DataFrame:
    flagged, why = [], []
    for i in range(len(members)):
        reasons = []
        for column, what in (("bytes", "bytes"), ("io_s", "I/O time")):
            values = members[column].to_numpy(dtype=np.float64)
            others = np.delete(values, i)
            if len(others) == 0:
                continue
            median = float(np.median(others))
            mine = values[i]
            if median > 0 and (mine > factor * median or mine * factor < median):
                reasons.append(f"{what} {mine / median:.2g}x the others' median")
            elif median == 0 and mine > 0:
                reasons.append(f"{what}: the others have none")
        flagged.append(bool(reasons))
        why.append("; ".join(reasons))
    return pd.DataFrame({"flagged": flagged, "why": why}, index=members.index)
