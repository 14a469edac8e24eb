"""Tests for analysis.export: Chrome Trace Event JSON (Perfetto) and CSV export.

Run directories are built in tmp_path as docs/run-format.md describes them (helpers copied
from tests/test_timeline.py); every expected number below follows from the rows written.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis import export, jsontext
from analysis.export import (
    APP_PID,
    BLOCK_PID_BASE,
    SAMPLES_PID,
    export_csv,
    export_perfetto,
    pack_lanes,
)
from core.errors import UserError
from store.rundir import (
    EVENTS_COLUMNS,
    PHASES_COLUMNS,
    load_run,
)
from tests.synthetic import (
    MIB,
    SEC,
    START_NS,
    TWO,
    TWO_ROLES,
    TWO_STEPS,
    events_frame,
    make_run,
    phases_frame,
    samples_frame,
    two_container_run,
)

US = 1_000


def export_json(run_dir: Path, out: Path) -> dict[str, Any]:
    path = export_perfetto(load_run(run_dir), out)
    assert path == out
    return json.loads(out.read_text())


WEIRD_PATH = '/data/we"ird\\näme\tx.npy'


@pytest.fixture
def small_run(tmp_path: Path) -> Path:
    """Known events of every exported kind."""
    events = events_frame(
        [
            # Before the release: negative times.
            {"ts_ns": START_NS - 500, "kind": "openat", "latency_ns": 1000, "path": WEIRD_PATH},
            {"t": 1.0, "bytes": 4096, "latency_ns": 250_000, "path": WEIRD_PATH, "ret": 4096},
            {"t": 2.0, "tid": 101, "comm": "pt_autograd_0", "bytes": 10, "latency_ns": 1_234_567},
            {"t": 3.0, "kind": "pread64", "pid": 200, "comm": "pt_data_worker", "offset": 8192},
            {"t": 0.5, "kind": "fork", "ret": 200, "fd": -1, "latency_ns": 0},
            {"t": 4.0, "kind": "cache_add", "count": 3, "bytes": 3 * 4096, "latency_ns": 0},
            # Block: two overlapping requests, then one after both.
            *[
                {"t": t, "kind": k, "pid": 0, "tid": -1, "comm": "kworker", "fd": -1,
                 "bytes": 4096, "offset": 512 * i, "latency_ns": lat, "dev": "259:0",
                 "in_container": i == 1}
                for i, (t, k, lat) in enumerate(
                    [(5.0, "block_read", 2 * SEC), (5.5, "block_write", 2 * SEC),
                     (9.0, "block_read", SEC)]
                )
            ],
        ]
    )  # fmt: skip
    samples = samples_frame(
        [
            (0.0, "container_cpu", 50.0, "percent"),
            (1.0, "container_cpu", 75.5, "percent"),
            (2.0, "container_cpu", float("inf"), "percent"),
            (0.0, "container_mem_rss", 2.0**30, "bytes"),
            (1.0, "container_mem_rss", 1.5e9, "bytes"),
        ]
    )
    phases = phases_frame(
        [
            {"key": "epoch", "t0": 1, "t1": 8, "epoch": 1, "value": {"steps": 1}, "rank": 0},
            {"key": "load_batch_mem", "t0": 1, "t1": 1.5, "epoch": 1, "step": 0, "rank": 0},
            {"key": "sample_load", "t0": 1.1, "t1": 1.4, "epoch": 1, "pid": 9, "rank": 0},
            {"key": "step_end", "t0": 3, "epoch": 1, "step": 0, "value": 2, "rank": 0},
        ]
    )
    return make_run(tmp_path, events=events, samples=samples, phases=phases)


# ---------------------------------------------------------------------------------------------
# Perfetto JSON


def test_export_is_trace_event_json_with_known_events(tmp_path: Path, small_run: Path) -> None:
    trace = export_json(small_run, tmp_path / "out" / "trace.json")
    assert trace["displayTimeUnit"] == "ms"
    assert trace["metadata"]["run_id"] == small_run.name
    assert trace["metadata"]["start_ns"] == START_NS
    assert trace["metadata"]["events"] == {
        "syscall": 4, "process": 1, "block": 3, "application": 4, "counter": 4
    }  # fmt: skip
    events = trace["traceEvents"]
    phases = Counter(e["ph"] for e in events)
    # X: 4 syscalls + 3 block requests + 3 application intervals; i: fork + step_end.
    assert (
        phases["X"] == 10 and phases["i"] == 2 and phases["C"] == 4
    )  # the infinite sample is dropped
    assert {e["cat"] for e in events if e["ph"] != "M"} == {
        "syscall", "process", "block", "application", "samples"
    }  # fmt: skip
    assert not any(e.get("name") == "cache_add" for e in events)  # page cache: not exported


def test_syscall_times_are_exact_microseconds_since_start(tmp_path: Path, small_run: Path) -> None:
    events = export_json(small_run, tmp_path / "t.json")["traceEvents"]
    calls = [e for e in events if e.get("cat") == "syscall"]
    # Entry = completion - latency, relative to start_ns, in µs with ns precision.
    assert [(e["name"], e["ts"], e["dur"]) for e in calls] == [
        ("openat", -1.5, 1.0),
        ("read", 1_000_000 - 250.0, 250.0),
        ("read", 2_000_000 - 1234.567, 1234.567),
        ("pread64", 3_000_000 - 1.0, 1.0),
    ]
    read = calls[1]
    assert (read["pid"], read["tid"]) == (100, 100)
    assert read["args"] == {"path": WEIRD_PATH, "bytes": 4096, "fd": 3, "offset": -1, "ret": 4096}
    assert calls[3]["args"]["offset"] == 8192 and calls[0]["args"]["path"] == WEIRD_PATH
    ts = [e["ts"] for e in calls]
    assert ts == sorted(ts)


def test_the_text_is_exact_not_rounded(tmp_path: Path, small_run: Path) -> None:
    text = export_perfetto(load_run(small_run), tmp_path / "t.json").read_text()
    assert '"ts":' in text and "1998765.433" in text  # 2 s - 1234.567 µs, three decimals
    assert '"ts":' in text and "-1.500" in text


def test_process_and_thread_names(tmp_path: Path, small_run: Path) -> None:
    events = export_json(small_run, tmp_path / "t.json")["traceEvents"]
    meta = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 100, 0)] == {"name": "python"}  # main thread's comm
    assert meta[("thread_name", 100, 101)] == {"name": "pt_autograd_0"}
    assert meta[("process_name", 200, 0)] == {"name": "pt_data_worker"}
    assert meta[("process_name", APP_PID, 0)] == {"name": "application"}
    assert meta[("process_name", SAMPLES_PID, 0)] == {"name": "samples"}
    assert meta[("process_name", BLOCK_PID_BASE, 0)] == {"name": "block device 259:0"}
    fork = next(e for e in events if e.get("name") == "fork")
    assert (fork["ph"], fork["s"], fork["args"]["ret"]) == ("i", "t", 200)


def test_block_requests_are_packed_on_non_overlapping_slots(
    tmp_path: Path, small_run: Path
) -> None:
    events = export_json(small_run, tmp_path / "t.json")["traceEvents"]
    block = [e for e in events if e.get("cat") == "block"]
    assert [(e["name"], e["tid"], e["ts"], e["dur"]) for e in block] == [
        ("block_read", 1, 3_000_000.0, 2_000_000.0),  # 5 s - 2 s
        ("block_write", 2, 3_500_000.0, 2_000_000.0),  # overlaps the first: next slot
        ("block_read", 1, 8_000_000.0, 1_000_000.0),  # both done: slot 0 again
    ]
    assert all(e["pid"] == BLOCK_PID_BASE for e in block)
    assert [e["args"]["in_container"] for e in block] == [False, True, False]
    assert block[1]["args"] == {"bytes": 4096, "offset": 512, "in_container": True, "issuer": 0}
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["pid"] == BLOCK_PID_BASE and e["name"] == "thread_name"}  # fmt: skip
    assert names == {1: "queue slot 0", 2: "queue slot 1"}


def test_phases_become_slices_and_instants(tmp_path: Path, small_run: Path) -> None:
    events = export_json(small_run, tmp_path / "t.json")["traceEvents"]
    app = [e for e in events if e.get("cat") == "application"]
    by_name = {e["name"]: e for e in app}
    assert by_name["epoch"]["ph"] == "X"
    assert (by_name["epoch"]["ts"], by_name["epoch"]["dur"]) == (1_000_000.0, 7_000_000.0)
    assert json.loads(by_name["epoch"]["args"]["value"]) == {"steps": 1}
    assert by_name["step_end"]["ph"] == "i" and by_name["step_end"]["args"]["step"] == 0
    # The training loop (pid 7) and the loader worker (pid 9) have their own threads.
    loop, loader = by_name["load_batch_mem"]["tid"], by_name["sample_load"]["tid"]
    assert loop != loader and by_name["epoch"]["tid"] == loop
    threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["pid"] == APP_PID and e["name"] == "thread_name"}  # fmt: skip
    assert threads == {1: "rank 0 training loop (pid 7)", 2: "rank 0 loader (pid 9)"}


def test_samples_become_one_counter_per_metric(tmp_path: Path, small_run: Path) -> None:
    events = export_json(small_run, tmp_path / "t.json")["traceEvents"]
    counters = [(e["name"], e["ts"], e["args"]["value"]) for e in events if e["ph"] == "C"]
    assert counters == [
        ("container_cpu (percent)", 0.0, 50.0),
        ("container_mem_rss (bytes)", 0.0, 2.0**30),
        ("container_cpu (percent)", 1_000_000.0, 75.5),
        ("container_mem_rss (bytes)", 1_000_000.0, 1.5e9),
    ]
    assert all(e["pid"] == SAMPLES_PID for e in events if e["ph"] == "C")


def test_many_events_in_many_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """30 000 random events written 1 000 rows per chunk: every one is there, exact, ordered."""
    monkeypatch.setattr(export, "CHUNK_BYTES", 1)
    n = 30_000
    rng = np.random.default_rng(1)
    kinds = np.array(["read", "write", "lseek", "block_read"])[rng.integers(0, 4, n)]
    is_block = kinds == "block_read"
    frame = pd.DataFrame(
        {
            "ts_ns": np.sort(START_NS + rng.integers(-SEC, 100 * SEC, n)),
            "kind": kinds,
            "pid": rng.integers(1, 5_000_000, n),
            "tid": rng.integers(1, 5_000_000, n),
            "comm": rng.choice(["python", "pt_data_worker", 'we"ird'], n),
            "fd": np.where(is_block, -1, rng.integers(0, 1000, n)),
            "path": pd.array(np.where(is_block, None, rng.choice(["/a", "/b/ü", None], n)), dtype="string"),
            "bytes": rng.integers(0, 2**40, n),
            "count": 1,
            "ret": rng.integers(-(2**62), 2**62, n),
            "offset": rng.integers(-1, 2**62, n),
            "latency_ns": rng.integers(0, 10**10, n),
            "latency_max_ns": 0,
            "dev": pd.array(np.where(is_block, "8:0", None), dtype="string"),
            "in_container": rng.random(n) < 0.5,
            "container": "main",
            "host": "test",
        }
    ).astype(dict(EVENTS_COLUMNS))  # fmt: skip
    run_dir = make_run(tmp_path, events=frame)
    events = export_json(run_dir, tmp_path / "t.json")["traceEvents"]
    calls = [e for e in events if e.get("cat") == "syscall"]
    rows = frame[~is_block]
    start = rows["ts_ns"].to_numpy() - rows["latency_ns"].to_numpy() - START_NS
    order = np.argsort(start, kind="stable")
    assert len(calls) == len(rows)
    got = np.array([round(e["ts"] * US) for e in calls])
    np.testing.assert_array_equal(got, start[order])
    np.testing.assert_array_equal([e["args"]["ret"] for e in calls], rows["ret"].to_numpy()[order])
    np.testing.assert_array_equal(
        [e["args"]["offset"] for e in calls], rows["offset"].to_numpy()[order]
    )
    assert [e["args"]["path"] for e in calls] == rows["path"].astype(object).where(
        rows["path"].notna(), None
    ).to_numpy()[order].tolist()
    block = [e for e in events if e.get("cat") == "block"]
    assert len(block) == int(is_block.sum())
    for slot in {e["tid"] for e in block}:  # the format's rule: no overlap on one thread
        spans = sorted((round(e["ts"] * US), round((e["ts"] + e["dur"]) * US)) for e in block if e["tid"] == slot)  # fmt: skip
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def rows_text(fields: list[Any], rows: int) -> list[Any]:
    """Rows built from ``fields`` as JSON arrays, parsed."""
    text = jsontext.join([jsontext.const("["), *fields, jsontext.const("],")], rows).decode()
    return json.loads("[" + text[:-1] + "]")


def test_number_text_edge_cases() -> None:
    values = np.array([0, 7, 10, -1, -10, 99, 4_294_967_296, 2**63 - 1, -(2**63)], dtype=np.int64)
    assert [row[0] for row in rows_text([jsontext.ints(values)], len(values))] == values.tolist()
    ns = np.array([0, 1, -1, 999, -1500, 1_234_567, -(10**15) - 1], dtype=np.int64)
    text = jsontext.join([*jsontext.micros(ns), jsontext.const("\n")], len(ns)).decode()
    assert [line.strip() for line in text.splitlines()] == [
        "0.000", "0.001", "-0.001", "0.999", "-1.500", "1234.567", "-1000000000000.001"
    ]  # fmt: skip
    floats = np.array([0.0, -2.5, 1e300, 0.1 + 0.2, 5e-324])
    assert [row[0] for row in rows_text([jsontext.floats(floats)], len(floats))] == floats.tolist()


def test_pack_lanes_uses_the_fewest_lanes() -> None:
    # [0,10) [2,4) [4,6) touch; [5,12) overlaps both [0,10) and [4,6): three lanes at t=5.
    start = np.array([0, 2, 4, 5, 20])
    end = np.array([10, 4, 6, 12, 21])
    assert pack_lanes(start, end).tolist() == [0, 1, 1, 2, 0]
    rng = np.random.default_rng(2)
    start = rng.integers(0, 10_000, 5_000)
    end = start + rng.integers(0, 50, 5_000)
    lanes = pack_lanes(start, end)
    # Fewest possible = the most intervals in flight at one instant.
    points = np.concatenate(
        [np.stack([start, np.ones_like(start)], 1), np.stack([end, -np.ones_like(end)], 1)]
    )
    points = points[np.lexsort((points[:, 1], points[:, 0]))]  # ends before starts at a tie
    assert lanes.max() + 1 == np.cumsum(points[:, 1]).max()
    for lane in np.unique(lanes):
        s, e = start[lanes == lane], end[lanes == lane]
        order = np.lexsort((e, s))  # a zero-length interval first at a tie
        assert np.all(s[order][1:] >= e[order][:-1])
    assert pack_lanes(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).tolist() == []


def test_empty_run_is_a_user_error_and_leaves_no_file(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    out = tmp_path / "out" / "trace.json"
    with pytest.raises(UserError, match="no events, phases or samples to export"):
        export_perfetto(load_run(run_dir), out)
    assert not out.exists() and not list(tmp_path.glob("**/*.tmp"))


def test_export_replaces_atomically(tmp_path: Path, small_run: Path) -> None:
    out = tmp_path / "out" / "trace.json"
    out.parent.mkdir()
    out.write_text("old")
    export_perfetto(load_run(small_run), out)
    assert json.loads(out.read_text())["metadata"]["run_id"] == small_run.name
    assert [p.name for p in out.parent.iterdir()] == ["trace.json"]  # no temporary left


# ---------------------------------------------------------------------------------------------
# CSV


def test_csv_round_trips_the_tables(tmp_path: Path, small_run: Path) -> None:
    run = load_run(small_run)
    paths = export_csv(run, tmp_path / "csv")
    assert [p.name for p in paths] == ["events.csv", "samples.csv", "phases.csv"]
    events = pd.read_csv(paths[0])
    assert list(events.columns) == list(EVENTS_COLUMNS)
    assert len(events) == len(run.events) == 9
    assert events["kind"].tolist() == run.events["kind"].astype(str).tolist()
    assert events["path"].iloc[0] == WEIRD_PATH  # quoted and escaped by the CSV writer
    assert events["ts_ns"].tolist() == run.events["ts_ns"].tolist()
    phases = pd.read_csv(paths[2])
    assert list(phases.columns) == list(PHASES_COLUMNS) and len(phases) == 4
    samples = pd.read_csv(paths[1])
    assert len(samples) == 5 and np.isinf(samples["value"]).sum() == 1
    assert sorted(p.name for p in (tmp_path / "csv").iterdir()) == sorted(p.name for p in paths)


def test_csv_unknown_table_is_a_user_error(tmp_path: Path, small_run: Path) -> None:
    with pytest.raises(UserError, match="unknown table 'event'"):
        export_csv(load_run(small_run), tmp_path, tables=["event"])


# ---------------------------------------------------------------------------------------------
# Several containers


def test_csv_carries_the_container(tmp_path: Path) -> None:
    """Per-container read bytes in the exported CSV are what the two-container run wrote."""
    run = load_run(two_container_run(tmp_path))
    paths = export_csv(run, tmp_path / "csv")
    events = pd.read_csv(paths[0])
    assert list(events.columns) == list(EVENTS_COLUMNS)
    reads = events[events["kind"] == "read"].groupby("container")["bytes"].sum().to_dict()
    assert reads == {role: TWO[role]["reads"] * MIB for role in TWO_ROLES}
    writeback = events[events["kind"] == "block_write"]
    assert writeback["container"].isna().all()  # no container: an empty field
    samples = pd.read_csv(paths[1])
    cpu = samples[samples["metric"] == "container_cpu"].groupby("container")["value"].mean()
    assert cpu.to_dict() == {role: TWO[role]["cpu"] for role in TWO_ROLES}
    phases = pd.read_csv(paths[2])
    per_container = 2 + 3 * TWO_STEPS  # epoch, checkpoint, and three rows per step
    assert phases.groupby("container").size().to_dict() == dict.fromkeys(TWO_ROLES, per_container)


def test_perfetto_has_a_process_group_per_container(tmp_path: Path) -> None:
    trace = export_json(two_container_run(tmp_path), tmp_path / "t.json")
    assert trace["metadata"]["containers"] == list(TWO_ROLES)
    events = trace["traceEvents"]
    meta = {(e["name"], e["pid"]): e["args"] for e in events if e["ph"] == "M" and e["tid"] == 0}
    stride = export.CONTAINER_PID_STRIDE
    for i, role in enumerate(TWO_ROLES):
        assert meta[("process_name", APP_PID + i * stride)] == {"name": f"application · {role}"}
        assert meta[("process_name", SAMPLES_PID + i * stride)] == {"name": f"samples · {role}"}
        # The container's real processes: labelled, sorted after its pseudo-processes.
        for pid in (100 + 100 * i, 101 + 100 * i):
            assert meta[("process_labels", pid)] == {"labels": role}
            assert meta[("process_sort_index", pid)] == {"sort_index": 3 * i - 1}
        assert meta[("process_sort_index", APP_PID + i * stride)] == {"sort_index": 3 * i - 3}
    assert meta[("process_name", SAMPLES_PID + 2 * stride)] == {"name": "samples · host"}
    # Each container's counters and phases are on its own pseudo-processes.
    cpu = [e for e in events if e["ph"] == "C" and e["name"] == "container_cpu (percent)"]
    by_pid = {pid: {e["args"]["value"] for e in cpu if e["pid"] == pid} for pid in {e["pid"] for e in cpu}}  # fmt: skip
    assert by_pid == {SAMPLES_PID: {100.0}, SAMPLES_PID + stride: {50.0}}
    host = [e for e in events if e["ph"] == "C" and e["name"].startswith("host_cpu_user")]
    assert len(host) == 11 and {e["pid"] for e in host} == {SAMPLES_PID + 2 * stride}
    steps = Counter(e["pid"] for e in events if e.get("name") == "step_end")
    assert steps == {APP_PID: 5, APP_PID + stride: 5}
    reads = [e for e in events if e.get("cat") == "syscall" and e["name"] == "read"]
    assert sum(e["args"]["bytes"] for e in reads if e["pid"] == 201) == 5 * MIB


def test_hosts_pid_namespaces_stay_apart(tmp_path: Path) -> None:
    """A run across two hosts whose processes have the same pids (each host its own pid
    namespace): two processes and two threads each, named with their real pid and host; a run
    of one host keeps its pids."""
    rows = [
        {"t": 1.0 + i, "pid": 100, "tid": tid, "comm": comm, "container": role, "host": host,
         "bytes": 1000 * (i + 1)}
        for i, (role, host, comm) in enumerate([("rank0", "node-1", "a"), ("rank1", "node-2", "b")])
        for tid in (100, 101)
    ]  # fmt: skip
    run_dir = make_run(
        tmp_path,
        events=events_frame(rows),
        containers=("rank0", "rank1"),
        hosts={"node-1": {"containers": ["rank0"]}, "node-2": {"containers": ["rank1"]}},
        cluster={"name": "c", "nodes": ["node-1", "node-2"]},
    )
    manifest_path = run_dir / "manifest.json"
    data = json.loads(manifest_path.read_text())
    for record, host in zip(data["containers"], ("node-1", "node-2"), strict=True):
        record["host"] = host
    manifest_path.write_text(json.dumps(data))
    trace = export_json(run_dir, tmp_path / "t.json")
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    stride = export.HOST_PID_STRIDE
    assert names[100] == "a (pid 100 on node-1)"
    assert names[100 + stride] == "b (pid 100 on node-2)"
    threads = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name"}
    assert threads == {
        (100, 100),
        (100, 101),
        (100 + stride, 100 + stride),
        (100 + stride, 101 + stride),
    }
    reads = [e for e in events if e.get("cat") == "syscall" and e["name"] == "read"]
    assert {e["pid"]: e["args"]["bytes"] for e in reads} == {100: 1000, 100 + stride: 2000}
    # One host: the pids as they are.
    one = events_frame([{**r, "host": "node-1"} for r in rows])
    shifted, hosts = export.host_pids(one)
    assert hosts == {} and shifted["pid"].tolist() == one["pid"].tolist()
