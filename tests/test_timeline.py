"""Tests for the run-directory loader (store.rundir), the timeline plot (analysis.timeline) and
the plain-text summary of ``./cli.py show`` (analysis.report).

Run directories are built in tmp_path exactly as docs/run-format.md describes them: a
manifest.json and three Parquet files whose columns and types are those of the document.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.figures import PLOTLY_JS
from analysis.processes import classify_processes
from analysis.report import run_summary_lines
from analysis.series import Bins, binned_rate, default_bin_s
from analysis.timeline import (
    LANES,
    MAX_SEGMENTS,
    merge_segments,
    timeline_figure,
    write_timeline,
)
from core.errors import UserError
from store.rundir import (
    EVENTS_COLUMNS,
    PHASES_COLUMNS,
    SAMPLES_COLUMNS,
    SCHEMA_VERSION,
    arrow_schema,
    conform,
    empty_frame,
    load_run,
    resolve_run,
)
from tests.synthetic import (
    MIB,
    SEC,
    START_NS,
    events_frame,
    make_run,
    phases_frame,
    samples_frame,
    two_container_run,
)


def lane_rows(fig: Any, lane: str) -> list[int]:
    return [entry["row"] for entry in fig.layout.meta["lanes"] if entry["lane"] == lane]


def traces_in_row(fig: Any, row: int) -> list[Any]:
    """Traces drawn in subplot ``row`` (primary and secondary y axes)."""
    x_ref = fig.layout.meta["lanes"][row - 1]["xaxis"]
    return [t for t in fig.data if t.xaxis == x_ref]


def yaxis(fig: Any, row: int) -> Any:
    """The primary y axis of subplot ``row``."""
    ref = fig.layout.meta["lanes"][row - 1]["yaxis"]
    return fig.layout[ref.replace("y", "yaxis", 1)]


def subplot_rows(fig: Any) -> int:
    return sum(1 for key in fig.layout.to_plotly_json() if re.fullmatch(r"xaxis\d*", key))


@pytest.fixture
def busy_run(tmp_path: Path) -> Path:
    """A small complete run: phases, emulated accelerator, I/O of a main and two workers."""
    events = events_frame(
        [
            {"t": 0.0, "kind": "fork", "pid": 100, "ret": 101, "fd": -1, "latency_ns": 0},
            {"t": 0.0, "kind": "fork", "pid": 100, "ret": 102, "fd": -1, "latency_ns": 0},
            *[
                {"t": 1 + i / 10, "pid": 101, "comm": "pt_data_worker", "bytes": MIB}
                for i in range(10)
            ],
            *[
                {"t": 3 + i / 10, "pid": 102, "comm": "pt_data_worker", "bytes": MIB}
                for i in range(5)
            ],
            {"t": 8.5, "kind": "write", "pid": 100, "bytes": 4 * MIB},
            {"t": 2.0, "kind": "block_read", "pid": 101, "bytes": 8 * MIB, "latency_ns": 10**6},
            {"t": 9.0, "kind": "block_write", "pid": 0, "comm": "kworker/u8:1", "bytes": MIB},
            {"t": 1.05, "kind": "cache_add", "pid": 101, "count": 256, "bytes": 256 * 4096},
            {"t": 9.05, "kind": "cache_delete", "pid": 100, "count": 10, "bytes": 40960},
        ]
    )
    samples = samples_frame(
        [
            (t, m, v, u)
            for t in range(11)
            for m, v, u in (
                ("container_cpu", 150.0, "percent"),
                ("host_cpu_user", 40.0, "percent"),
                ("host_cpu_idle", 55.0, "percent"),
                ("container_mem_rss", 2 * 2**30, "bytes"),
                ("container_mem_cache", 2**30, "bytes"),
                ("container_net_rx", 2 * MIB, "bytes/s"),
                ("container_net_tx", MIB / 2, "bytes/s"),
            )
        ]
    )
    phases = phases_frame(
        [
            {"key": "init", "t0": 0, "t1": 1},
            {"key": "epoch", "t0": 1, "t1": 8, "epoch": 0},
            {"key": "checkpoint", "t0": 8, "t1": 9, "epoch": 0},
            *[{"key": "accelerator_busy", "t0": 1 + s, "t1": 1.5 + s, "rank": 0} for s in range(7)],
            *[{"key": "step_end", "t0": 2 + s, "rank": 0, "epoch": 0, "step": s} for s in range(6)],
        ]
    )
    return make_run(tmp_path, events=events, samples=samples, phases=phases)


# ---------------------------------------------------------------------------------------------
# Loader


def test_load_run_reads_tables_with_documented_dtypes(busy_run: Path) -> None:
    run = load_run(busy_run)
    assert run.run_id == busy_run.name
    assert (run.workload, run.variant, run.status) == ("unet3d", "sleep", "completed")
    assert run.missing == frozenset() and not run.incomplete
    for frame, columns in (
        (run.events, EVENTS_COLUMNS),
        (run.samples, SAMPLES_COLUMNS),
        (run.phases, PHASES_COLUMNS),
    ):
        assert list(frame.columns) == list(columns)
        assert {c: str(t) for c, t in frame.dtypes.items()} == dict(columns)
    assert len(run.events) == 22
    assert run.events is run.events  # read once, then kept


def test_run_is_frozen(busy_run: Path) -> None:
    run = load_run(busy_run)
    with pytest.raises(AttributeError):
        run.path = Path("elsewhere")  # type: ignore[misc]


def test_loader_conforms_plain_arrow_types(tmp_path: Path) -> None:
    """A writer that used plain types (string kind, int64 pid) still reads as documented."""
    run_dir = make_run(tmp_path, skip=("events",))
    plain = pa.table(
        {
            "ts_ns": pa.array([START_NS + 1], pa.int64()),
            "kind": pa.array(["read"], pa.large_string()),
            "pid": pa.array([5], pa.int64()),
            "tid": pa.array([5], pa.int64()),
            "comm": pa.array(["python"]),
            "fd": pa.array([3], pa.int64()),
            "path": pa.array([None], pa.string()),
            "bytes": pa.array([10], pa.int64()),
            "count": pa.array([1], pa.int64()),
            "ret": pa.array([10], pa.int64()),
            "offset": pa.array([-1], pa.int64()),
            "latency_ns": pa.array([7], pa.int64()),
            "latency_max_ns": pa.array([7], pa.int64()),
            "dev": pa.array([None], pa.string()),
            "in_container": pa.array([True]),
            "container": pa.array(["main"], pa.large_string()),
            "host": pa.array(["test"], pa.large_string()),
            "extra": pa.array([1.5]),
        }
    )
    pq.write_table(plain, run_dir / "events.parquet")
    events = load_run(run_dir).events
    assert str(events["kind"].dtype) == "category" and str(events["pid"].dtype) == "int32"
    assert list(events.columns)[-1] == "extra"  # unknown columns are kept, after ours


def test_missing_column_is_a_user_error(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, skip=("samples",))
    pq.write_table(
        pa.table({"ts_ns": [1], "metric": ["x"], "value": [1.0]}), run_dir / "samples.parquet"
    )
    with pytest.raises(UserError, match=r"samples\.parquet lacks column 'unit'"):
        _ = load_run(run_dir).samples


def test_null_in_integer_column_is_a_user_error() -> None:
    frame = empty_frame(SAMPLES_COLUMNS).astype({"ts_ns": "float64"})
    frame.loc[0] = [np.nan, "container_cpu", 1.0, "percent", "main", "test"]
    with pytest.raises(UserError, match=r"samples: column 'ts_ns' cannot be read as int64"):
        conform(frame, SAMPLES_COLUMNS, "samples")


def test_unknown_schema_version_names_the_version_to_use(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, schema_version=SCHEMA_VERSION + 1, twintrace_version="0.7.0")
    with pytest.raises(UserError) as info:
        load_run(run_dir)
    message = str(info.value)
    assert f"schema_version {SCHEMA_VERSION + 1}" in message
    assert f"reads schema_version 3 or {SCHEMA_VERSION}" in message
    assert "use twintrace 0.7.0" in message


def test_missing_schema_version_is_rejected(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    data = json.loads((run_dir / "manifest.json").read_text())
    del data["schema_version"]
    (run_dir / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="schema_version None"):
        load_run(run_dir)


def test_not_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    with pytest.raises(UserError, match=r"notes is not a run directory.*\./cli\.py runs"):
        load_run(tmp_path / "notes")
    with pytest.raises(UserError, match=r"no run 'nope'.*\./cli\.py runs"):
        load_run("nope", runs_root=tmp_path)


def test_damaged_manifest(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_run(run_dir)


def test_resolve_run_by_id_and_unique_prefix(tmp_path: Path) -> None:
    a = make_run(tmp_path, "20261121-163005-unet3d-sleep-3f2a")
    b = make_run(tmp_path, "20261121-170000-unet3d-original-0001")
    assert resolve_run(a.name, runs_root=tmp_path) == a
    assert resolve_run("20261121-17", runs_root=tmp_path) == b
    assert load_run(b.name, runs_root=tmp_path).variant == "original"
    with pytest.raises(UserError, match="ambiguous"):
        resolve_run("20261121", runs_root=tmp_path)


def test_missing_tables_read_empty_and_are_flagged(tmp_path: Path) -> None:
    run_dir = make_run(
        tmp_path, skip=("events", "samples", "phases"), status="interrupted", end_ns=None
    )
    run = load_run(run_dir)
    assert run.missing == {"events", "samples", "phases"}
    assert run.incomplete
    assert len(run.events) == 0
    assert dict(run.events.dtypes.astype(str)) == dict(EVENTS_COLUMNS)


def test_arrow_schema_round_trips_through_parquet(tmp_path: Path) -> None:
    schema = arrow_schema(EVENTS_COLUMNS)
    assert schema.names == list(EVENTS_COLUMNS)
    assert schema.field("kind").type == pa.dictionary(pa.int8(), pa.string())
    assert not schema.field("ts_ns").nullable and schema.field("path").nullable


# ---------------------------------------------------------------------------------------------
# Binning and segments


@pytest.mark.parametrize("duration", [0.05, 1.0, 7.3, 60.0, 3600.0, 86400.0 * 3])
def test_default_bin_gives_500_to_2000_bins(duration: float) -> None:
    bin_s = default_bin_s(duration)
    assert 500 <= duration / bin_s <= 2000
    mantissa = bin_s / 10 ** np.floor(np.log10(bin_s))
    assert round(mantissa, 6) in (1, 2, 5)


def test_binned_rate_known_input() -> None:
    bins = Bins.covering(START_NS, 0.0, 3.0, 1.0)
    assert bins.count == 4 and list(bins.edges_s(START_NS)) == [0, 1, 2, 3, 4]
    # Ten in bin 0, one in bin 2 (times in ns, as in the tables).
    t = START_NS + np.array([50_000_000 * i for i in range(10)] + [SEC * 5 // 2])
    rate = binned_rate(t, np.full(len(t), MIB), bins) / MIB
    assert rate.tolist() == [10.0, 0.0, 1.0, 0.0]
    half = Bins.covering(START_NS, 0.0, 1.0, 0.5)  # the same ten reads: 20 MiB/s for 0.5 s
    assert (binned_rate(t[:10], np.full(10, MIB), half) / MIB).tolist()[:2] == [20.0, 0.0]
    # Bins are aligned on multiples of the width since the origin, also before it.
    early = Bins.covering(START_NS, -1.5, 0.2, 1.0)
    assert (early.start_ns, early.count) == (START_NS - 2 * SEC, 3)
    # A time on an edge belongs to the bin that starts there, exactly.
    edges = START_NS + np.arange(1, 4) * SEC // 10
    assert binned_rate(edges, np.ones(3), Bins.covering(START_NS, 0.0, 0.35, 0.1)).tolist() == [
        0.0,
        10.0,
        10.0,
        10.0,
    ]


def test_tiny_bin_is_refused() -> None:
    with pytest.raises(UserError, match="use a bin of at least"):
        Bins.covering(START_NS, 0.0, 3600.0, 1e-6)


def test_merge_segments_per_key() -> None:
    key = np.array([0, 0, 0, 1, 1])
    start = np.array([0.0, 0.5, 5.0, 0.2, 0.3])
    end = np.array([1.0, 2.0, 6.0, 0.25, 0.4])
    k, s, e = merge_segments(key, start, end, gap=0.1)
    assert k.tolist() == [0, 0, 1]
    assert s.tolist() == [0.0, 5.0, 0.2]
    assert e.tolist() == [2.0, 6.0, 0.4]


# ---------------------------------------------------------------------------------------------
# Process classification


def test_classify_processes_on_fork_tree() -> None:
    """torchrun (10) -> rank 100 -> workers 101 (named), 102 (named), 103 (unnamed reader);
    rank 200 forked by the launcher too, with its own worker 201; 300 is a helper."""
    events = events_frame(
        [
            {"t": 0.0, "kind": "fork", "pid": 10, "ret": 100, "fd": -1},
            {"t": 0.0, "kind": "fork", "pid": 10, "ret": 200, "fd": -1},
            {"t": 0.1, "kind": "fork", "pid": 100, "ret": 101, "fd": -1},
            {"t": 0.1, "kind": "fork", "pid": 100, "ret": 102, "fd": -1},
            {"t": 0.1, "kind": "fork", "pid": 100, "ret": 103, "fd": -1},
            {"t": 0.1, "kind": "fork", "pid": 200, "ret": 201, "fd": -1},
            {"t": 0.2, "kind": "read", "pid": 10, "bytes": 100},
            {"t": 1.0, "kind": "read", "pid": 101, "comm": "pt_data_worker", "bytes": MIB},
            {"t": 1.1, "kind": "read", "pid": 102, "comm": "pt_data_worker", "bytes": MIB},
            {"t": 1.2, "kind": "read", "pid": 103, "bytes": MIB},
            {"t": 1.3, "kind": "read", "pid": 201, "comm": "pt_data_worker", "bytes": MIB},
            # A thread of the main process with its own name must not rename the process.
            {
                "t": 1.4,
                "kind": "write",
                "pid": 100,
                "tid": 105,
                "comm": "pt_autograd_0",
                "bytes": 1,
            },
            {"t": 2.0, "kind": "write", "pid": 100, "bytes": 10 * MIB},
            {"t": 2.1, "kind": "read", "pid": 300, "comm": "nvidia-smi", "bytes": 10},
            {"t": 3.0, "kind": "block_read", "pid": 999, "comm": "kworker", "bytes": MIB},
        ]
    )
    procs = classify_processes(events).set_index("pid")
    assert procs.loc[[100, 200], "group"].tolist() == ["main", "main"]
    assert procs.loc[[101, 102, 103, 201], "group"].tolist() == ["loader worker"] * 4
    assert procs.loc[[10, 300], "group"].tolist() == ["other", "other"]
    assert 999 not in procs.index  # block rows are device-wide, not a process's I/O
    assert procs.at[100, "comm"] == "python" and procs.at[101, "parent"] == 100
    assert procs.at[100, "write_bytes"] == 10 * MIB + 1
    # Sorted main, then workers, then others.
    assert list(classify_processes(events)["group"].cat.codes) == sorted(
        classify_processes(events)["group"].cat.codes
    )


def test_classify_processes_without_named_workers() -> None:
    """No pt_data_worker: main is the biggest writer; its reading children are workers."""
    events = events_frame(
        [
            {"t": 0.0, "kind": "fork", "pid": 100, "ret": 101, "fd": -1},
            {"t": 0.0, "kind": "fork", "pid": 100, "ret": 102, "fd": -1},
            {"t": 1.0, "kind": "read", "pid": 101, "bytes": 5 * MIB},
            {"t": 1.0, "kind": "write", "pid": 102, "bytes": 10},  # a logger child: writes only
            {"t": 2.0, "kind": "write", "pid": 100, "bytes": MIB},
        ]
    )
    groups = classify_processes(events).set_index("pid")["group"].to_dict()
    assert groups == {100: "main", 101: "loader worker", 102: "other"}


def test_classify_processes_empty() -> None:
    procs = classify_processes(empty_frame(EVENTS_COLUMNS))
    assert len(procs) == 0 and "group" in procs.columns


# ---------------------------------------------------------------------------------------------
# Figure


def test_one_run_has_nine_lanes(busy_run: Path) -> None:
    run = load_run(busy_run)
    fig = timeline_figure([run], bin_s=1.0)
    assert subplot_rows(fig) == len(LANES) == 9
    assert [e["lane"] for e in fig.layout.meta["lanes"]] == list(LANES)
    assert fig.layout.meta["bin_s"] == 1.0
    title = fig.layout.annotations[0].text
    assert run.run_id in title and "unet3d" in title and "sleep" in title

    names = {lane: {t.name for t in traces_in_row(fig, lane_rows(fig, lane)[0])} for lane in LANES}
    assert names["phases"] == {"init", "training", "checkpoint", "steps"}
    assert names["accelerator"] == {"busy"}
    assert names["syscall I/O"] == {"read", "write"}
    assert names["processes"] == {"read", "write"}
    assert names["block I/O"] == {"block read", "block write", "mean latency (ms)"}
    assert names["page cache"] == {"misses (cache_add)", "evictions (cache_delete)"}
    assert names["CPU"] == {"container (% of one core)", "host user", "host idle"}
    assert names["memory"] == {"rss (anon)", "page cache (file)"}
    assert names["network"] == {"received", "sent"}
    net = {t.name: t for t in traces_in_row(fig, lane_rows(fig, "network")[0])}
    assert set(net["received"].y) == {2.0} and set(net["sent"].y) == {0.5}  # MiB/s

    # Emulated accelerator: 7 x 0.5 s busy in a 10 s run.
    accel = yaxis(fig, lane_rows(fig, "accelerator")[0])
    assert list(accel.ticktext) == ["rank 0 (35% busy)"]
    # Processes: main first, then the two workers.
    procs = yaxis(fig, lane_rows(fig, "processes")[0])
    assert list(procs.ticktext) == [
        "main 100 python",
        "loader worker 101 pt_data_worker",
        "loader worker 102 pt_data_worker",
    ]
    # Six step_end points: the first step starts at the epoch start (1 s).
    steps = next(t for t in fig.data if t.name == "steps")
    assert len(steps.base) == 6 and steps.base[0] == pytest.approx(1.0)
    assert steps.base[1] == pytest.approx(2.0) and steps.x[1] == pytest.approx(1.0)


def test_bandwidth_numbers(busy_run: Path) -> None:
    """Ten 1 MiB reads by worker 101 between 1.0 and 1.9 s -> 10 MiB/s in the 1 s bin at 1 s;
    five by 102 at 3.0-3.4 s -> 5 MiB/s; one 4 MiB write at 8.5 s -> 4 MiB/s."""
    fig = timeline_figure([load_run(busy_run)], bin_s=1.0)
    row = lane_rows(fig, "syscall I/O")[0]
    traces = {t.name: t for t in traces_in_row(fig, row)}
    read, write = traces["read"], traces["write"]
    assert read.x[:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert read.y[:4].tolist() == [0.0, 10.0, 0.0, 5.0]
    assert write.y[8] == pytest.approx(4.0) and write.y.sum() - write.y[-1] == pytest.approx(4.0)
    block = {t.name: t for t in traces_in_row(fig, lane_rows(fig, "block I/O")[0])}
    assert block["block read"].y[2] == pytest.approx(8.0)
    assert block["mean latency (ms)"].y[2] == pytest.approx(1.0)
    cache = {t.name: t for t in traces_in_row(fig, lane_rows(fig, "page cache")[0])}
    assert cache["misses (cache_add)"].y[1] == pytest.approx(256.0)  # pages/s, 1 s bins
    memory = {t.name: t for t in traces_in_row(fig, lane_rows(fig, "memory")[0])}
    assert memory["rss (anon)"].y[0] == pytest.approx(2.0)  # GiB


def test_process_segments_end_at_completion(busy_run: Path) -> None:
    fig = timeline_figure([load_run(busy_run)], bin_s=1.0)
    row = lane_rows(fig, "processes")[0]
    write = next(t for t in traces_in_row(fig, row) if t.name == "write")
    # One write by the main process (row 0): from ts - latency to ts, then a NaN gap.
    assert write.x[0] == pytest.approx(8.5 - 1e-6) and write.x[1] == pytest.approx(8.5)
    assert np.isnan(write.x[2]) and write.y[:2].tolist() == [0.0, 0.0]


def test_two_runs_are_stacked(tmp_path: Path, busy_run: Path) -> None:
    other = make_run(tmp_path, "20261121-170000-unet3d-original-0001", start_ns=START_NS - 3 * SEC)
    runs = [load_run(busy_run), load_run(other)]
    fig = timeline_figure(runs)
    n = len(LANES)
    assert subplot_rows(fig) == 2 * n
    assert [e["run"] for e in fig.layout.meta["lanes"]] == [runs[0].run_id] * n + [
        runs[1].run_id
    ] * n
    titles = [a.text for a in fig.layout.annotations]
    second = titles[n]
    assert runs[1].run_id in second and "(unet3d, original)" in second and "phases" in second
    # The empty second run still labels its lanes.
    assert "no accelerator data" in titles and "no CPU samples" in titles
    # Default bin: one round size for both runs, ~1000 bins over the longer one (13 s).
    assert fig.layout.meta["bin_s"] == pytest.approx(0.01)
    # One shared time axis.
    axes = list(fig.select_xaxes())
    assert len(axes) == 2 * len(LANES) and all(ax.matches == "x" for ax in axes[1:])


def test_gpu_utilisation_is_preferred_to_busy_intervals(tmp_path: Path) -> None:
    samples = samples_frame(
        [(t, f"gpu{g}_util", 50.0 + g, "percent") for t in range(5) for g in (0, 1)]
        + [(t, "gpu0_mem_util", 10.0, "percent") for t in range(5)]
    )
    phases = phases_frame([{"key": "all_compute", "t0": 1, "t1": 2, "rank": 0}])
    run = load_run(make_run(tmp_path, samples=samples, phases=phases))
    fig = timeline_figure([run])
    names = {t.name for t in traces_in_row(fig, lane_rows(fig, "accelerator")[0])}
    assert names == {"gpu0_util %", "gpu1_util %", "gpu0_mem_util %"}


def test_all_compute_is_the_fallback(tmp_path: Path) -> None:
    phases = phases_frame(
        [
            {"key": "all_compute", "t0": 1 + s, "t1": 2 + s, "rank": r}
            for s in range(2)
            for r in (0, 1)
        ]
    )
    fig = timeline_figure([load_run(make_run(tmp_path, phases=phases))])
    accel = traces_in_row(fig, lane_rows(fig, "accelerator")[0])
    assert [t.name for t in accel] == ["all_compute (busy)"]
    ticks = yaxis(fig, lane_rows(fig, "accelerator")[0]).ticktext
    assert list(ticks) == ["rank 0 (20% busy)", "rank 1 (20% busy)"]


def test_empty_run_still_makes_a_figure(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path, skip=("events", "samples", "phases"), status="failed"))
    fig = timeline_figure([run])
    # every lane kept in place by a trace with no points, and nothing else drawn
    assert subplot_rows(fig) == 9 and len(fig.data) == 9
    assert all(t.name == "placeholder" and len(t.x) == 0 for t in fig.data)
    texts = [a.text for a in fig.layout.annotations]
    assert "no accelerator data" in texts and "no read/write syscalls" in texts
    assert "status failed" in texts[0] and "missing events, phases, samples" in texts[0]
    assert len(timeline_figure([]).data) == 0


def test_html_opens_offline_and_is_written_atomically(tmp_path: Path, busy_run: Path) -> None:
    out = write_timeline([load_run(busy_run)], tmp_path / "plots" / "timeline.html")
    html = out.read_text(encoding="utf-8")
    assert out.name == "timeline.html"
    assert "Plotly.newPlot" in html and len(html) < 1_000_000  # the library is not inside:
    # the page loads the one copy beside it, nothing from a network
    assert re.findall(r'<script[^>]*\bsrc="([^"]+)"', html) == [PLOTLY_JS]
    assert (out.parent / PLOTLY_JS).read_text().startswith("/**")  # plotly.js, whole
    assert sorted(p.name for p in out.parent.iterdir()) == [PLOTLY_JS, "timeline.html"]


def test_the_pages_of_a_runs_root_share_one_plotly_js(tmp_path: Path, busy_run: Path) -> None:
    # A page in a run directory loads the copy of its runs root: a hundred runs, one copy.
    run = load_run(busy_run)
    pages = [write_timeline([run], busy_run / "timeline.html")]
    other = busy_run.parent / "20261121-170000-unet3d-sleep-0000"
    other.mkdir()
    (other / "manifest.json").write_text("{}")
    pages.append(write_timeline([run], other / "timeline.html"))
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert re.findall(r'<script[^>]*\bsrc="([^"]+)"', html) == [f"../{PLOTLY_JS}"]
    assert list(busy_run.parent.rglob("plotly-*.js")) == [busy_run.parent / PLOTLY_JS]


def test_two_million_events_are_merged_not_dropped(tmp_path: Path) -> None:
    """2 M reads/writes over 60 s in 8 processes, through Parquet and load_run: vectorised
    binning counts every byte, and the interval lane merges segments instead of dropping any."""
    n = 2_000_000
    rng = np.random.default_rng(0)
    pid = rng.integers(1000, 1008, n).astype(np.int32)
    is_write = rng.random(n) < 0.1
    nbytes = np.full(n, 4096, dtype=np.int64)

    def names(codes: np.ndarray, values: list[str]) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int8)), values)

    columns = {
        "ts_ns": np.sort(rng.integers(0, 60 * SEC, n)) + START_NS,
        "kind": names(is_write, ["read", "write"]),
        "pid": pid,
        "tid": pid,
        "comm": names(pid != 1000, ["python", "pt_data_worker"]).cast(pa.string()),
        "fd": np.full(n, 5, dtype=np.int32),
        "path": pa.nulls(n, pa.string()),
        "bytes": nbytes,
        "count": np.ones(n, dtype=np.int64),
        "ret": nbytes,
        "offset": np.full(n, -1, dtype=np.int64),
        "latency_ns": (latency := rng.integers(1_000, 200_000, n)),
        "latency_max_ns": latency,
        "dev": pa.nulls(n, pa.string()),
        "in_container": np.ones(n, dtype=bool),
        "container": pa.array(["main"] * n, pa.string()),
        "host": pa.array(["test"] * n, pa.string()),
    }
    run_dir = make_run(tmp_path, skip=("events",), end_ns=START_NS + 60 * SEC)
    table = pa.table(columns, schema=arrow_schema(EVENTS_COLUMNS))
    pq.write_table(table, run_dir / "events.parquet")

    fig = timeline_figure([load_run(run_dir)])
    row = lane_rows(fig, "processes")[0]
    traces = {t.name.split(" (")[0]: t for t in traces_in_row(fig, row)}
    assert set(traces) == {"read", "write"}
    read = traces["read"]
    assert "merged within" in read.name and f"{int((~is_write).sum()):,} →" in read.name
    assert len(read.x) <= 3 * MAX_SEGMENTS
    ticks = list(yaxis(fig, row).ticktext)
    assert ticks[0] == "main 1000 python" and len(ticks) == 8
    # The bandwidth lane still counts every byte: merging only affects the interval lane.
    bw = {t.name: t for t in traces_in_row(fig, lane_rows(fig, "syscall I/O")[0])}
    total_mib = float((bw["read"].y[:-1] * fig.layout.meta["bin_s"]).sum())
    assert total_mib == pytest.approx((~is_write).sum() * 4096 / MIB)


# ---------------------------------------------------------------------------------------------
# Several containers


def test_two_containers_get_a_lane_group_each_on_one_axis(tmp_path: Path) -> None:
    """tests/synthetic.py's two-container run: rank0's worker reads 10 x 1 MiB from 1.0 s,
    rank1's 5 x 1 MiB from 3.0 s; CPU 100 % and 50 %; host CPU in both groups."""
    run = load_run(two_container_run(tmp_path))
    fig = timeline_figure([run], bin_s=1.0)
    lanes = fig.layout.meta["lanes"]
    assert subplot_rows(fig) == 2 * len(LANES)
    assert [e["container"] for e in lanes] == ["rank0"] * len(LANES) + ["rank1"] * len(LANES)
    assert [e["lane"] for e in lanes] == list(LANES) * 2
    titles = [a.text for a in fig.layout.annotations]
    assert "container <b>rank0</b>" in titles[0] and run.run_id in titles[0]
    assert any("container <b>rank1</b>" in t and "phases" in t for t in titles)
    axes = list(fig.select_xaxes())
    assert len(axes) == 2 * len(LANES) and all(ax.matches == "x" for ax in axes[1:])

    def traces(lane: str, group: int) -> dict[str, Any]:
        return {t.name: t for t in traces_in_row(fig, lane_rows(fig, lane)[group])}

    read0, read1 = traces("syscall I/O", 0)["read"], traces("syscall I/O", 1)["read"]
    assert read0.y[:5].tolist() == [0.0, 10.0, 0.0, 0.0, 0.0]  # MiB/s
    assert read1.y[:5].tolist() == [0.0, 0.0, 0.0, 5.0, 0.0]
    assert traces("syscall I/O", 0)["write"].y[8] == pytest.approx(4.0)
    assert traces("syscall I/O", 1)["write"].y[8] == pytest.approx(1.0)
    # Block: rank0's own read, and the writeback of no container in both groups.
    assert traces("block I/O", 0)["block read"].y[2] == pytest.approx(8.0)
    assert traces("block I/O", 1)["block read"].y.sum() == 0.0
    assert traces("block I/O", 1)["block write"].y[9] == pytest.approx(1.0)
    cpu0, cpu1 = traces("CPU", 0), traces("CPU", 1)
    assert set(cpu0["container (% of one core)"].y) == {100.0}
    assert set(cpu1["container (% of one core)"].y) == {50.0}
    assert set(cpu1["host user"].y) == {40.0}
    assert traces("memory", 1)["rss (anon)"].y[0] == pytest.approx(1.0)  # GiB
    procs = [list(yaxis(fig, row).ticktext) for row in lane_rows(fig, "processes")]
    assert procs == [
        ["main 100 python", "loader worker 101 pt_data_worker"],
        ["main 200 python", "loader worker 201 pt_data_worker"],
    ]
    # Each container's steps: 1 s in rank0, 0.5 s in rank1.
    steps = [t for t in fig.data if t.name == "steps"]
    assert [len(s.base) for s in steps] == [5, 5]
    assert steps[0].x.tolist() == pytest.approx([1.0] * 5)
    assert steps[1].x.tolist() == pytest.approx([0.5] * 5)


def test_one_container_has_no_container_groups(busy_run: Path) -> None:
    fig = timeline_figure([load_run(busy_run)], bin_s=1.0)
    assert {e["container"] for e in fig.layout.meta["lanes"]} == {None}
    assert "container" not in fig.layout.annotations[0].text


def test_show_prints_counts_per_container(tmp_path: Path, busy_run: Path) -> None:
    """``./cli.py show``'s lines (analysis.report): a line per container of a run of several,
    with the counts and bytes the synthetic run wrote; nothing more for one container."""
    lines = run_summary_lines(two_container_run(tmp_path / "two"))
    # then the step split and the data rate of the sleep run (tests/test_breakdown.py)
    assert lines[4].startswith("  steps: 8 measured") and lines[5].startswith("  data: read at")
    assert lines[1:4] == [
        "  container rank0 · syscalls: openat 10, read 10 (10.0 MiB), write 1 (4.0 MiB); "
        "block: block_read 1 (8.0 MiB); steps 5",
        "  container rank1 · syscalls: openat 5, read 5 (5.0 MiB), write 1 (1.0 MiB); steps 5",
        "  container (no container) · block: block_write 1 (1.0 MiB)",
    ]
    assert not any("container" in line for line in run_summary_lines(busy_run))


def test_a_lane_with_nothing_to_show_says_so_in_its_own_place(tmp_path: Path) -> None:
    """A run of one container has no network samples: the network lane is still drawn in
    Chromium (a subplot per lane, the time axis under the last), with its note inside it, not
    over the first lane (plotly draws no axes that no trace refers to)."""
    from tests.browser import dom, subplot_count

    run_dir = make_run(tmp_path, phases=phases_frame([{"key": "init", "t0": 0.0, "t1": 1.0}]))
    run = load_run(run_dir)
    fig = timeline_figure([run])
    network = [lane for lane in fig.layout.meta["lanes"] if lane["lane"] == "network"][0]
    (note,) = [a for a in fig.layout.annotations if a.text.startswith("no network samples")]
    assert (note.xref, note.yref) == (f"{network['xaxis']} domain", f"{network['yaxis']} domain")
    assert any(t.xaxis == network["xaxis"] for t in fig.data)  # its axes are drawn
    html = dom(write_timeline([run], run_dir / "timeline.html"))
    assert subplot_count(html) == len(LANES)
    assert "seconds since workload release" in html
