"""Aggregated syscall rows (schema version 3): every consumer weights rows by ``count``.

One model of a run is written twice from the same calls: (a) one row per call, (b) as the
tracer records it once a thread's rate is high (:func:`tests.synthetic.fold_calls`: per thread
and 10 ms bin, the first 4 reads and writes one row each, the rest folded into aggregated rows
per file, kind, size bucket and latency bucket). Same calls, same per-file bytes, counts and
request sizes: every consumer must give the same answer for both, exactly for counts, bytes,
request sizes and inter-arrival times; where an aggregated row's time (its last call's exit)
legitimately differs from its calls' times, within the bound stated at the assertion. Row
counting (the code before aggregated rows existed) fails these tests: the fold turns 17,650
reads into far fewer rows.

The model: two loader workers read the dataset (/data) back to back, worker A 64 KiB every
100 µs, 40 reads a file, worker B 4 KiB every 130 µs, 100 reads a file, from 1 s to 2 s; the
main process reads a few small config files (slowly: never folded), fails one read, and writes
a 50 MiB checkpoint in 1 MiB writes every ms from 2.5 s (folded: 10 a bin). Each thread's calls
are evenly spaced, and stay in one size and one latency bucket, and step boundaries and bins
fall on 10 ms edges, which is what makes the two forms comparable exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from analysis.breakdown import step_values, storage_demand
from analysis.export import export_perfetto
from analysis.processes import classify_processes
from analysis.report import container_counts
from analysis.series import (
    Bins,
    binned_calls,
    binned_mean,
    binned_sum,
    call_completions,
    call_starts,
    call_times,
)
from analysis.similarity import compare_profiles, order_similarity, run_profile
from analysis.timeline import timeline_figure
from store.rundir import EVENTS_COLUMNS, arrow_schema, load_run
from tests.synthetic import (
    MIB,
    SEC,
    START_NS,
    events_frame,
    fold_calls,
    make_run,
    phases_frame,
)

KIB = 2**10
MS = 1_000_000
US = 1_000
RUN_ID = "20261121-163005-unet3d-sleep"
MOUNTS = [{"source": "/srv/data", "target": "/data", "read_only": True}]

#: Loader workers: pid, first read (ns after START_NS, never on a 10 ms edge), period, bytes
#: per read, reads per file, reads, latency range (one power-of-two bucket).
WORKERS: dict[str, dict[str, Any]] = {
    "a": {"pid": 101, "t0": SEC + 50 * US, "period": 100 * US, "bytes": 64 * KIB,
          "per_file": 40, "n": 9_990, "latency": (40 * US, 20 * US)},
    "b": {"pid": 102, "t0": SEC + 300 * US + 7, "period": 130 * US, "bytes": 4 * KIB,
          "per_file": 100, "n": 7_600, "latency": (17 * US, 13 * US)},
}  # fmt: skip
CONFIG_READS = 5  # 100 bytes each, 50 ms apart: never folded
CKPT_WRITES = 50  # 1 MiB each, every ms from 2.5 s
DATA_READS = sum(w["n"] for w in WORKERS.values())
DATA_BYTES = sum(w["n"] * w["bytes"] for w in WORKERS.values())


def model_calls() -> pd.DataFrame:
    """The model run's events, one row per call (module doc)."""
    rows: list[dict[str, Any]] = [
        {"ts_ns": START_NS + SEC // 2, "kind": "fork", "ret": w["pid"], "fd": -1}
        for w in WORKERS.values()
    ]
    for i in range(CONFIG_READS):
        t = START_NS + 200 * MS + 50 * MS * i
        rows.append({"ts_ns": t, "path": f"/etc/conf{i}", "bytes": 100, "ret": 100})
    rows.append({"ts_ns": START_NS + 450 * MS, "fd": 0, "ret": -11, "latency_ns": 2 * US})
    for name, w in WORKERS.items():
        low, width = w["latency"]
        worker = {"pid": w["pid"], "comm": "pt_data_worker", "fd": 5}
        for k in range(w["n"]):
            t = START_NS + w["t0"] + k * w["period"]
            path = f"/data/{name}{k // w['per_file']}.bin"
            if k % w["per_file"] == 0:  # open the next file in the gap before its first read
                if k:
                    rows.append({**worker, "ts_ns": t - 9 * w["period"] // 10, "kind": "close"})
                rows.append({**worker, "ts_ns": t - 7 * w["period"] // 10, "kind": "openat",
                             "path": path, "ret": 5})  # fmt: skip
            latency = low + (k * 7919) % width
            rows.append({**worker, "ts_ns": t, "path": path, "bytes": w["bytes"],
                         "ret": w["bytes"], "latency_ns": latency})  # fmt: skip
    ckpt = "/twintrace/out/ckpt.pt"
    rows.append({"ts_ns": START_NS + 2490 * MS, "kind": "openat", "path": ckpt, "fd": 7, "ret": 7})
    for k in range(CKPT_WRITES):
        rows.append({"ts_ns": START_NS + 2500 * MS + 123 + k * MS, "kind": "write", "fd": 7,
                     "path": ckpt, "bytes": MIB, "ret": MIB,
                     "latency_ns": 600 * US + (k * 3001) % (300 * US)})  # fmt: skip
    for k in range(4):
        rows.append({"ts_ns": START_NS + 1500 * MS + k * 7 * MS, "kind": "block_read", "fd": -1,
                     "bytes": MIB, "latency_ns": 300 * US, "dev": "259:0",
                     "offset": k * MIB})  # fmt: skip
    rows.append({"ts_ns": START_NS + 1100 * MS, "kind": "cache_add", "fd": -1, "count": 3,
                 "bytes": 3 * 4096, "latency_ns": 0})  # fmt: skip
    return events_frame(rows)


def model_phases() -> pd.DataFrame:
    """One epoch from 1 s of ten 100 ms steps (load 20 ms, compute 70 ms, step_end 10 ms
    later), a checkpoint around the writes, and a last event at 3 s: the span is [1 s, 3 s]."""
    rows: list[dict[str, Any]] = [{"key": "epoch", "t0": 1.0, "t1": 2.0, "epoch": 0}]
    for step in range(10):
        t = 1.0 + step / 10
        on = {"rank": 0, "epoch": 0, "step": step}
        rows.append({"key": "load_batch_mem", "t0": t, "t1": t + 0.02, **on})
        rows.append({"key": "all_compute", "t0": t + 0.02, "t1": t + 0.09, **on})
        rows.append({"key": "step_end", "t0": t + 0.1, "value": 4, **on})
    rows.append({"key": "checkpoint", "t0": 2.49, "t1": 2.56})
    rows.append({"key": "run_stop", "t0": 3.0})
    return phases_frame(rows)


@pytest.fixture(scope="module")
def calls() -> pd.DataFrame:
    return model_calls()


@pytest.fixture(scope="module")
def folded(calls: pd.DataFrame) -> pd.DataFrame:
    return fold_calls(calls)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, calls: pd.DataFrame, folded: pd.DataFrame):
    """(one row per call, folded) run directories of the model."""
    root = tmp_path_factory.mktemp("aggregated")
    phases = model_phases()
    return tuple(
        make_run(root, f"{RUN_ID}-{tag}", events=events, phases=phases, mounts=MOUNTS)
        for tag, events in (("ca11", calls), ("f01d", folded))
    )


def test_the_model_has_both_kinds_of_rows(calls: pd.DataFrame, folded: pd.DataFrame) -> None:
    """The fold is real (most calls are in aggregated rows) and loses no call or byte."""
    aggregated = folded["count"].to_numpy() > 1
    assert aggregated.any() and (~aggregated).any()
    assert len(folded) < len(calls) / 5
    is_read = folded["kind"].eq("read").to_numpy()
    assert folded["count"][is_read].sum() == DATA_READS + CONFIG_READS + 1
    assert folded["bytes"][is_read].sum() == DATA_BYTES + 100 * CONFIG_READS
    # Aggregated rows are as the run format says: offset -1, ret = bytes, max <= sum.
    rows = folded[aggregated & ~folded["kind"].eq("cache_add").to_numpy()]
    assert set(rows["kind"].astype(str)) == {"read", "write"}
    assert (rows["offset"] == -1).all() and (rows["ret"] == rows["bytes"]).all()
    assert (rows["latency_max_ns"] < rows["latency_ns"]).all()


# ---------------------------------------------------------------------------------------------
# Summary (tracing.ingest.summarize)


def _summary(events: pd.DataFrame) -> dict[str, Any]:
    from tracing.ingest import ParseStats, summarize  # here: the other tests need no tracing

    table = pa.Table.from_pandas(events, schema=arrow_schema(EVENTS_COLUMNS), preserve_index=False)
    return summarize(table, model_phases(), ParseStats())


def test_summary_counts_calls_not_rows(calls: pd.DataFrame, folded: pd.DataFrame) -> None:
    assert _summary(folded) == _summary(calls)
    syscalls = _summary(folded)["syscalls"]
    assert syscalls["read"] == {
        "count": DATA_READS + CONFIG_READS + 1,
        "bytes": DATA_BYTES + 100 * CONFIG_READS,
    }
    assert syscalls["write"] == {"count": CKPT_WRITES, "bytes": CKPT_WRITES * MIB}
    assert _summary(folded)["page_cache"]["cache_add"] == {"count": 3, "bytes": 3 * 4096}
    # And `show`'s per-container lines.
    counts = [container_counts(e, model_phases(), ["main"]) for e in (calls, folded)]
    pd.testing.assert_frame_equal(counts[1], counts[0])


# ---------------------------------------------------------------------------------------------
# Timeline


def _lane_traces(fig: Any, lane: str) -> dict[str, Any]:
    """The traces of ``lane`` (primary axis) by name."""
    (meta,) = [m for m in fig.layout.meta["lanes"] if m["lane"] == lane]
    return {t.name: t for t in fig.data if t.yaxis == meta["yaxis"]}


def test_timeline_draws_calls_not_rows(runs: tuple[Path, Path]) -> None:
    """Bandwidth in 2 ms bins, finer than the tracer's 10 ms: an aggregated row's bytes are
    spread over its calls, which here come back exactly (each thread's calls are evenly
    spaced), so every bin is as with one row per call (not a comb of 4 calls and a spike). The
    process lane has each process's calls (``io_events``) and its time in them (the summed
    length of its intervals) whichever the form."""
    figures = [timeline_figure([load_run(r)], bin_s=0.002) for r in runs]
    lanes = [_lane_traces(fig, "syscall I/O") for fig in figures]
    assert set(lanes[0]) == set(lanes[1]) == {"read", "write"}
    for name in ("read", "write"):
        np.testing.assert_allclose(lanes[1][name].y, lanes[0][name].y, rtol=1e-12, atol=1e-9)
    # MiB/s per 2 ms bin (the last value repeats to close the step line): all the bytes.
    read_bytes = np.sum(lanes[1]["read"].y[:-1]) * 0.002 * MIB
    assert read_bytes == pytest.approx(DATA_BYTES + 100 * CONFIG_READS, rel=1e-12)
    busy = []
    for fig in figures:
        traces = _lane_traces(fig, "processes")
        busy.append({n: np.nansum(t.x[1::3] - t.x[0::3]) for n, t in traces.items()})
    assert busy[1] == pytest.approx(busy[0], rel=1e-9)
    procs = [classify_processes(load_run(r).events).set_index("pid") for r in runs]
    pd.testing.assert_series_equal(procs[1]["io_events"], procs[0]["io_events"])
    assert procs[1].loc[101, "io_events"] == WORKERS["a"]["n"]
    assert procs[1].loc[101, "group"] == "loader worker"
    # A mean latency per bin is per call: a row of 3 calls of 300 ns in all weighs 3.
    bins = Bins.spanning(0, 10, 1)
    assert binned_mean(np.array([1, 2]), np.array([300.0, 100.0]), bins, [3, 1])[0] == 100.0


# ---------------------------------------------------------------------------------------------
# Similarity


def test_call_completions_spread_each_row_over_its_interval() -> None:
    """Ground truth by hand: a thread's calls every 10 ns from 10 to 100, the first two traced
    one by one, then file f's calls 30..60 split into two rows by size (interleaved), then
    file g's calls 70..100 in one row; another thread's row without a call before it."""
    rows = pd.DataFrame(
        {
            "ts_ns": [10, 20, 50, 60, 65, 100],
            "tid": [1, 1, 1, 1, 2, 1],
            "fd": [3, 3, 3, 3, 3, 3],
            "path": ["/f", "/f", "/f", "/f", "/h", "/g"],
            "count": [1, 1, 2, 2, 3, 4],
            "latency_ns": [1, 1, 2, 2, 30, 4],
        }
    )
    everything = np.ones(len(rows), dtype=bool)
    starts = call_starts(rows, everything)
    # f's rows share the start 20 (their calls interleave); g's row follows f's last row;
    # thread 2's row has no earlier call: it ends at 65 and took 30 ns.
    np.testing.assert_array_equal(starts, [10, 20, 20, 20, 35, 60])
    ts, count = rows["ts_ns"].to_numpy(), rows["count"].to_numpy()
    times = call_completions(ts, starts, count, everything)
    expected = [10, 20, 35, 40, 45, 50, 55, 60, 65, 70, 80, 90, 100]
    np.testing.assert_array_equal(times, expected)
    # Only the kept rows' calls, but the others still anchor them.
    keep = np.array([False, False, False, False, False, True])
    np.testing.assert_array_equal(call_completions(ts, starts, count, keep), [70, 80, 90, 100])
    # Binned: each call's share of its row's bytes in the bin of its completion, exactly.
    nbytes = count * 8.0
    bins = Bins.spanning(0, 100, 7)  # edges off the calls' grid
    np.testing.assert_allclose(
        binned_calls(ts, nbytes, bins, starts, count),
        binned_sum(np.array(expected), np.full(len(expected), 8.0), bins),
        rtol=1e-12,
    )


def test_binned_calls_equals_binning_every_call() -> None:
    """On random rows (calls spread over up to 30 ms, bins of 1 to 7 ms, some rows outside the
    bins): binning without a row per call equals binning the calls one by one."""
    rng = np.random.default_rng(7)
    n = 2_000
    ts = np.sort(rng.integers(0, 10**9, n))
    start = ts - rng.integers(0, 30 * MS, n)
    count = rng.integers(1, 50, n)
    nbytes = count * rng.integers(1, 4096, n).astype(np.float64)
    for width_ms in (1, 3, 7):
        bins = Bins.covering(0, 0.2, 0.8, width_ms / 1e3)
        calls = call_times(ts, start, count)
        each = binned_sum(calls, np.repeat(nbytes / count, count), bins)
        np.testing.assert_allclose(binned_calls(ts, nbytes, bins, start, count), each)


def test_similarity_profile_of_calls_not_rows(runs: tuple[Path, Path]) -> None:
    """Exact: request sizes, inter-arrival times, the I/O series (400 points over the 2 s span:
    5 ms bins, finer than the tracer's, which an aggregated row's calls spread over), per-file
    and per-thread bytes, opens and counts."""
    real, folded = (run_profile(load_run(r)) for r in runs)
    np.testing.assert_array_equal(folded.read_sizes, real.read_sizes)
    np.testing.assert_array_equal(folded.write_sizes, real.write_sizes)
    expected = np.zeros_like(real.read_sizes)
    expected[[6, 12, 16]] = [CONFIG_READS, WORKERS["b"]["n"], WORKERS["a"]["n"]]
    np.testing.assert_array_equal(folded.read_sizes, expected)  # the failed read has no size
    assert folded.write_sizes[20] == CKPT_WRITES
    np.testing.assert_array_equal(folded.read_gaps_ns, real.read_gaps_ns)
    assert len(folded.read_gaps_ns) == DATA_READS + CONFIG_READS  # every read call, less one
    assert set(folded.series) == set(real.series)
    for name, values in real.series.items():
        np.testing.assert_allclose(folded.series[name], values, rtol=1e-12, err_msg=name)
    exact = {k: v for k, v in real.totals.items() if k != "reads_in_flight"}
    assert {k: folded.totals[k] for k in exact} == exact
    assert folded.totals["read_count"] == DATA_READS + CONFIG_READS + 1
    assert folded.totals["write_count"] == CKPT_WRITES
    # In order of first read: a file first read inside an aggregated row counts from the
    # row's first call, not from the row (its last call).
    pd.testing.assert_series_equal(folded.files_read, real.files_read)
    pd.testing.assert_series_equal(folded.readers.sort_index(), real.readers.sort_index())
    pd.testing.assert_series_equal(folded.opens, real.opens)
    first_rows = folded_events_order(runs[1])
    assert order_similarity(real.files_read.index, first_rows)[0] < 1.0  # rows would not do
    # Reads in flight (evidence, not scored): an aggregated row is one read in flight for its
    # summed latency before its end, so its time in flight moves within its bin: 1.227 here
    # against 1.221 from the calls.
    assert folded.totals["reads_in_flight"] == pytest.approx(
        real.totals["reads_in_flight"], abs=0.05
    )


def folded_events_order(run_dir: Path) -> pd.Index:
    """The dataset files in the order of their first row (what counting rows would give)."""
    events = load_run(run_dir).events
    reads = events[events["kind"].eq("read").to_numpy() & (events["bytes"] > 0).to_numpy()]
    return pd.Index(reads["path"].drop_duplicates().dropna(), dtype="string")


def test_comparing_the_two_forms_finds_them_alike(runs: tuple[Path, Path]) -> None:
    """The whole comparison: every aspect that has data scores exactly 1."""
    real, folded = (run_profile(load_run(r)) for r in runs)
    comparison = compare_profiles(real, folded)
    scores = {a.name: a.score for a in comparison.aspects if a.score is not None}
    assert len(scores) >= 12
    assert scores == dict.fromkeys(scores, 1.0)
    assert comparison.overall == 1.0


# ---------------------------------------------------------------------------------------------
# Breakdown


def test_breakdown_reads_are_the_calls_bytes_and_time(runs: tuple[Path, Path]) -> None:
    """Steps start and end on 10 ms edges, so each aggregated row lies in the step of its
    calls: the per-step file-read throughput (bytes over summed latency) and the storage demand
    are the same for both forms."""
    real, folded = (load_run(r) for r in runs)
    a, b = step_values(real), step_values(folded)
    pd.testing.assert_frame_equal(b.reset_index(drop=True), a.reset_index(drop=True))
    assert "read_throughput" in set(a["metric"])
    demand = storage_demand(folded)
    assert demand == storage_demand(real)
    # Ground truth: the dataset bytes read during the measured steps (1.1 s to 2.0 s).
    calls = real.events
    t = calls["ts_ns"].to_numpy() - START_NS
    data = calls["path"].str.startswith("/data/").to_numpy(dtype=bool, na_value=False)
    inside = (t > 1.1 * SEC) & (t <= 2.0 * SEC) & data
    assert demand["read_bytes"] == calls.loc[inside, "bytes"].sum()


# ---------------------------------------------------------------------------------------------
# Export


def _syscalls(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("cat") == "syscall"]


def _per_thread(events: list[dict[str, Any]], value: Any) -> dict[tuple[int, int], float]:
    totals: dict[tuple[int, int], float] = {}
    for e in events:
        key = (e["pid"], e["tid"])
        totals[key] = totals.get(key, 0) + value(e)
    return totals


def _assert_nested(events: list[dict[str, Any]]) -> None:
    """Slices of one thread never overlap (Perfetto draws only nested slices)."""
    for key in {(e["pid"], e["tid"]) for e in events}:
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if (e["pid"], e["tid"]) == key)
        starts, ends = np.array(mine).T
        assert (starts[1:] >= ends[:-1] - 1e-6).all(), key


def test_export_has_one_event_per_row_with_its_count(runs: tuple[Path, Path], tmp_path: Path):
    traces = []
    for run_dir in runs:
        out = tmp_path / f"{run_dir.name}.json"
        export_perfetto(load_run(run_dir), out)
        traces.append(json.loads(out.read_text()))
    calls, rows = (_syscalls(t) for t in traces)
    aggregated = [e for e in rows if "count" in e["args"]]
    folded = load_run(runs[1]).events
    n_aggregated = int((folded["count"] > 1).sum()) - 1  # less the page-cache row
    assert len(aggregated) == n_aggregated
    assert traces[1]["metadata"]["events"]["aggregated syscall"] == n_aggregated
    assert traces[1]["metadata"]["events"]["syscall"] == len(rows) - n_aggregated
    assert all(e["ph"] == "X" and e["name"] in ("read", "write") for e in aggregated)
    assert all(e["args"]["count"] > 1 and e["args"]["offset"] == -1 for e in aggregated)
    # Per thread: the same calls, bytes and time in calls as one event per call.
    assert sum(e["args"].get("count", 1) for e in rows) == len(calls)
    by_bytes = [_per_thread(events, lambda e: e["args"]["bytes"]) for events in (calls, rows)]
    assert by_bytes[1] == by_bytes[0]
    busy = _per_thread(rows, lambda e: e["args"].get("latency_ns", e["dur"] * US))
    assert busy == pytest.approx(_per_thread(calls, lambda e: e["dur"] * US), rel=1e-9)
    # Here each row's calls follow the thread's previous call: drawn as long as their sum.
    assert all(e["dur"] * US == pytest.approx(e["args"]["latency_ns"]) for e in aggregated)
    assert all(e["args"]["latency_max_ns"] < e["args"]["latency_ns"] for e in aggregated)
    _assert_nested(rows)


def test_export_keeps_interleaved_rows_of_a_thread_nested(tmp_path: Path) -> None:
    """A thread alternating small and large reads in one bin gives two aggregated rows whose
    calls interleave: drawn as their summed latency they would overlap, so the later one starts
    at the earlier one's end; its ``latency_ns`` still holds the sum."""
    rows = []
    for k in range(60):
        small = k % 2 == 0
        rows.append({"ts_ns": START_NS + SEC + k * 100 * US + 1, "path": "/data/x",
                     "bytes": 4 * KIB if small else 64 * KIB, "ret": 4 * KIB if small else 64 * KIB,
                     "latency_ns": 20 * US if small else 80 * US})  # fmt: skip
    events = fold_calls(events_frame(rows))
    assert (events["count"] > 1).sum() == 2
    run_dir = make_run(tmp_path, events=events)
    out = export_perfetto(load_run(run_dir), tmp_path / "trace.json")
    syscalls = _syscalls(json.loads(out.read_text()))
    _assert_nested(syscalls)
    aggregated = sorted((e for e in syscalls if "count" in e["args"]), key=lambda e: e["ts"])
    assert [e["args"]["count"] for e in aggregated] == [28, 28]
    first, second = aggregated
    assert first["dur"] * US == pytest.approx(first["args"]["latency_ns"])
    assert second["ts"] == pytest.approx(first["ts"] + first["dur"])
    assert second["dur"] * US < second["args"]["latency_ns"] == 28 * 80 * US
