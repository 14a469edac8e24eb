"""The run profile: one pass over a run, everything the aspects compare, small except the gaps.

:func:`run_profile` reduces a run (``docs/run-format.md``) to fixed-length time series over the
run's own span, histograms, per-file and per-thread tables and samples of durations
(:class:`RunProfile`). It is vectorised over the events: kind masks from category codes,
``np.bincount`` for bins and histograms (:mod:`analysis.series`), ``pd.factorize`` for paths.
A profile can be reused to compare one run with several others.

A run of several containers is profiled as a whole by default: I/O is that of all its
containers, CPU and memory are summed over them, and steps, batch loads and checkpoints are
those of each container, pooled. ``containers=`` restricts the profile to some of them.

Example::

    profile = run_profile(load_run("runs/A"), file_scope=("/data",))
    profile.series["read"]  # bytes read per bin, N_POINTS bins over the run's span
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from analysis.series import (
    Bins,
    binned_calls,
    call_completions,
    call_starts,
    filled_mean,
    first_calls,
)
from analysis.similarity.measures import log2_buckets
from analysis.tables import KindMask, is_value, run_roles, select_containers, step_intervals
from core.errors import UserError
from store.rundir import EVENT_LOG_PATH, READ_KINDS, WRITE_KINDS, Run
from workloads.events import ACCELERATOR_KEY

#: Points each time series is resampled to over its run's own [start, end].
N_POINTS = 400

#: Profile series name -> the samples metric it averages (summed over containers).
GAUGES: Mapping[str, str] = {
    "cpu": "container_cpu",
    "cpu_loader": "container_cpu_loader",
    "mem_rss": "container_mem_rss",
    "mem_cache": "container_mem_cache",
    "mem_shm": "container_mem_shm",
    "net_rx": "container_net_rx",
    "net_tx": "container_net_tx",
}


@dataclasses.dataclass(frozen=True, eq=False)
class RunProfile:
    """A run reduced to what :func:`analysis.similarity.compare_profiles` needs.

    ``series``: name -> :data:`N_POINTS`-long array over the run's [start, end] (bytes per bin
    for I/O, mean per bin for samples, summed over containers); absent when the run has no such
    data inside its span. Block series and totals (``block_read``, ``block_write``) count only
    requests the container issued (``in_container``); ``totals["block_<kind>_other_bytes"]``
    holds the rest (other processes on the device, kernel writeback), which is evidence only.
    ``read_gaps_ns``: every read inter-arrival time (between the completions of successive read
    calls of all threads, an aggregated row's calls placed by :func:`analysis.series.call_times`).
    ``files_read``: bytes read per path (non-empty reads), in order of first read (for an
    aggregated row, its first call); ``opens``: successful opens per path; ``readers``: bytes of
    those reads per thread id; all three limited to ``file_scope``. Counts (request sizes,
    ``*_count`` totals, opens) are of calls: each row weighs its ``count`` (an aggregated
    syscall row stands for ``count`` calls, docs/run-format.md); the I/O series bin each call's
    share of its row's bytes (:func:`analysis.series.binned_calls`). Durations are seconds.
    ``containers``: the roles of the containers profiled. ``accelerators``: what computed the
    steps, as the ranks logged it (``cpu``, ``cuda:0``, ``emulated: CARD``;
    ``workloads.training.accelerator_label``), distinct values in order; empty for runs that do
    not log it.
    """

    run_id: str
    span: tuple[int, int]
    points: int
    series: Mapping[str, np.ndarray]
    totals: Mapping[str, float]
    read_sizes: np.ndarray
    write_sizes: np.ndarray
    read_gaps_ns: np.ndarray
    files_read: pd.Series
    opens: pd.Series
    readers: pd.Series
    step_s: np.ndarray
    load_batch_s: np.ndarray
    checkpoints: pd.DataFrame
    file_scope: tuple[str, ...] = ()
    containers: tuple[str, ...] = ()
    accelerators: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float:
        return (self.span[1] - self.span[0]) * 1e-9


@dataclasses.dataclass(frozen=True)
class _Tables:
    """The rows of a run a profile is built from (all, or those of some containers)."""

    events: pd.DataFrame
    samples: pd.DataFrame
    phases: pd.DataFrame
    start_ns: int | None
    end_ns: int | None


def _tables(run: Run, containers: Sequence[str] | None) -> _Tables:
    if containers is None:
        return _Tables(run.events, run.samples, run.phases, run.start_ns, run.end_ns)
    roles = run_roles(run)
    unknown = [c for c in containers if c not in roles]
    if unknown or not containers:
        raise UserError(
            f"run {run.run_id} has no container {unknown[0] if unknown else '(none given)'!r}: "
            f"choose among {', '.join(roles) or 'none'}"
        )
    return _Tables(
        select_containers(run.events, containers),
        select_containers(run.samples, containers),
        select_containers(run.phases, containers),
        run.start_ns,
        run.end_ns,
    )


def _span(tables: _Tables) -> tuple[int, int]:
    phases = tables.phases
    if len(phases):
        start = int(phases["ts_ns"].min())
        return start, max(int(phases["end_ns"].max()), start + 1)
    lows: list[int] = []
    highs: list[int] = []
    for frame in (tables.events, tables.samples):
        if len(frame):
            lows.append(int(frame["ts_ns"].min()))
            highs.append(int(frame["ts_ns"].max()))
    start = tables.start_ns if tables.start_ns is not None else min(lows, default=0)
    end = tables.end_ns if tables.end_ns is not None else max(highs, default=start)
    return start, max(end, start + 1)


def run_span(run: Run, containers: Sequence[str] | None = None) -> tuple[int, int]:
    """The stretch of the run its time series cover, ``(start_ns, end_ns)``.

    The workload's own activity when it logged phases: from its first MLLOG event to the end of
    its last, so that what happens before (container start, interpreter and torch imports:
    seconds on a short run) and after (exit, teardown) does not shift one run's timeline against
    the other's. Otherwise (a traced user container) ``[start_ns, end_ns]`` from the manifest,
    else the extent of the run's data (an interrupted run ends at its last event, sample or
    phase). ``containers``: only those containers' rows (all by default).
    """
    return _span(_tables(run, containers))


def _per_path(paths: pd.Series, weights: np.ndarray | None = None) -> pd.Series:
    """Sum of ``weights`` (or count) per path, indexed by path in order of first appearance.

    ``pd.factorize`` numbers paths in order of appearance (rows are sorted by time, so this is
    first-access order) through pyarrow's hash table: no per-row Python.
    """
    codes, uniques = pd.factorize(paths, use_na_sentinel=True)
    keep = codes >= 0
    sums = np.bincount(
        codes[keep], weights=None if weights is None else weights[keep], minlength=len(uniques)
    )
    return pd.Series(sums, index=pd.Index(uniques, dtype="string", name="path"))


def _reader_bytes(tids: np.ndarray, weights: np.ndarray) -> pd.Series:
    """Bytes read per thread id (index), largest first."""
    codes, uniques = pd.factorize(tids)
    sums = np.bincount(codes, weights=weights, minlength=len(uniques))
    return pd.Series(sums, index=pd.Index(uniques, name="tid")).sort_values(ascending=False)


def reads_in_flight(end_ns: np.ndarray, latency_ns: np.ndarray, weights: np.ndarray) -> float:
    """Byte-weighted mean number of reads in flight (itself included) when each read ends.

    A read is in flight from ``end - latency`` to ``end``; the count at ``t`` is the number of
    starts at or before ``t`` minus the ends before it (two ``searchsorted``). Evidence of the
    queue depth the storage saw; 0 without reads. ``end_ns`` must be sorted.

    An aggregated row (``count`` calls of one thread, ``latency`` their sum) is one read in
    flight from ``end - latency`` to ``end``: its calls are sequential, so the thread never has
    more than one of them in flight, and that interval holds their total time in flight; its
    depth at ``end`` weighs all its bytes.
    """
    if len(end_ns) == 0 or not weights.sum() > 0:
        return 0.0
    starts = np.sort(end_ns - np.maximum(latency_ns, 0))
    depth = np.searchsorted(starts, end_ns, side="right") - np.searchsorted(
        end_ns, end_ns, side="left"
    )
    return float(np.average(depth, weights=weights))


def in_scope(paths: pd.Index, scope: Sequence[str]) -> np.ndarray:
    """Which ``paths`` lie under one of the directories ``scope`` (all when it is empty)."""
    if not scope:
        return np.ones(len(paths), dtype=bool)
    prefixes = tuple(d if d.endswith("/") else d + "/" for d in scope)
    values = pd.Series(paths, dtype="string")
    under = values.str.startswith(prefixes) | values.isin([d.rstrip("/") for d in scope])
    return under.to_numpy(dtype=bool, na_value=False)


def _by_container(container: pd.Series) -> list[np.ndarray]:
    """Row positions of each container (host-wide rows, null, form a group of their own)."""
    codes, uniques = pd.factorize(container, use_na_sentinel=False)
    return [np.flatnonzero(codes == c) for c in range(len(uniques))]


def _gauges(samples: pd.DataFrame, bins: Bins) -> dict[str, np.ndarray]:
    """Each :data:`GAUGES` metric's mean per bin, gaps interpolated, summed over containers
    (two containers at 50 % of a core are a run at 100 %); absent without samples in the span."""
    out: dict[str, np.ndarray] = {}
    for name, metric in GAUGES.items():
        rows = samples[is_value(samples["metric"], metric)]
        ts, values = rows["ts_ns"].to_numpy(), rows["value"].to_numpy()
        parts = [filled_mean(ts[at], values[at], bins) for at in _by_container(rows["container"])]
        parts = [part for part in parts if len(part)]
        if parts:
            out[name] = np.sum(parts, axis=0)
    return out


def _step_seconds(phases: pd.DataFrame) -> np.ndarray:
    """Step durations (s) of each container's lowest rank, pooled over containers."""
    durations = [np.zeros(0)]
    for at in _by_container(phases["container"]):
        steps = step_intervals(phases.iloc[at])
        ns = steps["end_ns"].to_numpy(dtype=np.int64) - steps["ts_ns"].to_numpy(dtype=np.int64)
        durations.append(ns * 1e-9)
    return np.concatenate(durations)


def _checkpoint_table(ckpt: pd.DataFrame, writes: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint interval: its duration (s) and the syscall bytes its container wrote
    during it (another container's writes at the same time are its own checkpoint's).

    Bytes written in ``[ts_ns, end_ns]`` are a difference of the cumulative sum at the two
    ``searchsorted`` positions (write times are sorted), so intervals cost O(log n) each.
    """
    codes, _ = pd.factorize(
        pd.concat([ckpt["container"], writes["container"]], ignore_index=True),
        use_na_sentinel=False,
    )
    ckpt_codes, write_codes = codes[: len(ckpt)], codes[len(ckpt) :]
    nbytes = np.zeros(len(ckpt))
    write_ts = writes["ts_ns"].to_numpy(dtype=np.int64)
    write_bytes = writes["bytes"].to_numpy()
    for code in np.unique(ckpt_codes):  # one per container with checkpoints: a handful
        mine, theirs = np.flatnonzero(ckpt_codes == code), write_codes == code
        ts = write_ts[theirs]
        cumulative = np.concatenate([[0.0], np.cumsum(write_bytes[theirs], dtype=np.float64)])
        lo = np.searchsorted(ts, ckpt["ts_ns"].to_numpy(dtype=np.int64)[mine], side="left")
        hi = np.searchsorted(ts, ckpt["end_ns"].to_numpy(dtype=np.int64)[mine], side="right")
        nbytes[mine] = cumulative[hi] - cumulative[lo]
    return pd.DataFrame(
        {"duration_s": ckpt["duration_ns"].to_numpy(dtype=np.int64) * 1e-9, "write_bytes": nbytes}
    )


def run_profile(
    run: Run,
    points: int = N_POINTS,
    file_scope: Sequence[str] = (),
    containers: Sequence[str] | None = None,
) -> RunProfile:
    """Reduce ``run`` to the summaries the comparison needs (see :class:`RunProfile`).

    ``file_scope``: directories whose files the per-file tables keep (all files when empty);
    the per-file work is done on the distinct paths, so the filter costs nothing per event.
    ``containers``: the roles of the containers to profile (all of the run's by default; an
    unknown role is a :class:`UserError`).

    Time series use only rows inside the run's span (the sampler runs a little before the
    release and after the exit); the distributions and per-file tables use every row.
    """
    if points < 2:
        raise UserError(f"a comparison needs at least 2 points per series, got {points}")
    tables = _tables(run, containers)
    span = _span(tables)
    bins = Bins.spanning(span[0], span[1], points)
    events = tables.events
    ts = events["ts_ns"].to_numpy()
    if not events["ts_ns"].is_monotonic_increasing:  # the format says sorted; do not rely on it
        order = np.argsort(ts, kind="stable")
        events = events.iloc[order].reset_index(drop=True)
        ts = events["ts_ns"].to_numpy()
    mask = KindMask(events["kind"])
    nbytes = events["bytes"].to_numpy()
    calls = events["count"].to_numpy()  # each row's weight: the calls (pages) it stands for
    starts = call_starts(events, mask(READ_KINDS + WRITE_KINDS))  # when a row's calls began
    ok = events["ret"].to_numpy() >= 0
    # The block tables cover the whole device: on a shared machine, other jobs' requests (GBs)
    # would swamp the container's. Kernel writeback of the container's own writes is not
    # attributable either (issued by kernel threads), so only the container's requests count.
    own = events["in_container"].to_numpy(dtype=bool, na_value=False)

    series: dict[str, np.ndarray] = {}
    totals: dict[str, float] = {}
    # The instrumentation's own event log is not the workload's I/O (store.rundir.EVENT_LOG_PATH).
    tool_log = events["path"].eq(EVENT_LOG_PATH).to_numpy(dtype=bool, na_value=False)
    groups = {
        "read": mask(READ_KINDS),
        "write": mask(WRITE_KINDS) & ~tool_log,
        "block_read": mask(("block_read",)),
        "block_write": mask(("block_write",)),
    }
    for name in ("block_read", "block_write"):
        totals[f"{name}_other_bytes"] = float(nbytes[groups[name] & ~own].sum())
        groups[name] &= own
    for name, rows in groups.items():
        totals[f"{name}_bytes"] = float(nbytes[rows].sum())
        totals[f"{name}_count"] = float(calls[rows].sum())
        if totals[f"{name}_bytes"] > 0:
            binned = binned_calls(ts[rows], nbytes[rows], bins, starts[rows], calls[rows])
            if binned.sum() > 0:  # not all of it outside the span
                series[name] = binned
    # Page-cache inserts (misses) in the container's context: with the bytes read, evidence
    # of the cache state the run started with (see the comparison's warnings).
    totals["cache_add_bytes"] = float(nbytes[mask(("cache_add",))].sum())
    for name, values in _gauges(tables.samples, bins).items():
        series[name] = values
        totals[f"{name}_mean"] = float(values.mean())

    reads, writes = groups["read"], groups["write"]
    has_path = events["path"].notna().to_numpy()
    data_reads = reads & ok & (nbytes > 0) & has_path
    is_open = mask(("openat",)) & ok & has_path
    totals["opens"] = float(calls[is_open].sum())
    totals["failed_opens"] = float(calls[mask(("openat",)) & ~ok].sum())
    totals["closes"] = float(calls[mask(("close",)) & ok].sum())

    phases = tables.phases
    is_interval = is_value(phases["kind"], "interval")
    loads = phases[is_interval & is_value(phases["key"], "load_batch_mem")]
    ckpt = phases[is_interval & is_value(phases["key"], "checkpoint")]
    # Paths factorised once (pyarrow hash, first-read order); the scope is decided per
    # distinct path and mapped back to the rows through the codes.
    codes, uniques = pd.factorize(events["path"][data_reads], use_na_sentinel=True)
    data_bytes = nbytes[data_reads].astype(np.float64)
    files_read = pd.Series(
        np.bincount(codes, weights=data_bytes, minlength=len(uniques)),
        index=pd.Index(uniques, dtype="string", name="path"),
    )
    scoped = in_scope(files_read.index, file_scope)
    files_read = files_read[scoped]
    rows = scoped[codes]
    if (calls[data_reads] > 1).any():  # order files by their first call, not their first row
        first_seen = np.full(len(uniques), np.iinfo(np.int64).max)
        first = first_calls(ts[data_reads], starts[data_reads], calls[data_reads])
        np.minimum.at(first_seen, codes, first)
        files_read = files_read.iloc[np.argsort(first_seen[scoped], kind="stable")]
    readers = _reader_bytes(events["tid"].to_numpy()[data_reads][rows], data_bytes[rows])
    totals["reads_in_flight"] = reads_in_flight(
        ts[data_reads][rows], events["latency_ns"].to_numpy()[data_reads][rows], data_bytes[rows]
    )
    opens = _per_path(events["path"][is_open], calls[is_open])
    opens = opens[in_scope(opens.index, file_scope)]
    return RunProfile(
        run_id=run.run_id,
        span=span,
        points=points,
        series=series,
        totals=totals,
        read_sizes=log2_buckets(nbytes[reads & ok], calls[reads & ok]),
        write_sizes=log2_buckets(nbytes[writes & ok], calls[writes & ok]),
        read_gaps_ns=np.diff(call_completions(ts, starts, calls, reads)),
        files_read=files_read,
        opens=opens,
        readers=readers,
        step_s=_step_seconds(phases),
        load_batch_s=loads["duration_ns"].to_numpy(dtype=np.int64) * 1e-9,
        checkpoints=_checkpoint_table(ckpt, events.loc[writes, ["ts_ns", "bytes", "container"]]),
        file_scope=tuple(file_scope),
        containers=tuple(containers) if containers is not None else tuple(run_roles(run)),
        accelerators=_accelerators(phases),
    )


def _accelerators(phases: pd.DataFrame) -> tuple[str, ...]:
    """The distinct values of the ranks' ``accelerator`` points (JSON strings), in order."""
    rows = phases[is_value(phases["key"], ACCELERATOR_KEY) & is_value(phases["kind"], "point")]
    values = [json.loads(v) for v in rows["value"].dropna()]
    return tuple(dict.fromkeys(str(v) for v in values))
