"""Tests for the trace-similarity analyzer (analysis.similarity) and its report
(analysis.compare_report).

Each measure is checked on inputs with a known answer; whole comparisons on synthetic run
directories written as docs/run-format.md describes them (helpers copied from
tests/test_timeline.py), built from one model of a training run that can be made faster, shifted
on the clock, given other request sizes or another file order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.compare_report import (
    REPORT_LANES,
    comparison_figure,
    lane_title,
    report_lanes,
    write_comparison_report,
)
from analysis.rundir import (
    EVENTS_COLUMNS,
    PHASES_COLUMNS,
    SAMPLES_COLUMNS,
    arrow_schema,
    empty_frame,
    load_run,
)
from analysis.similarity import (
    ASPECTS,
    N_SIZE_BUCKETS,
    Comparison,
    compare_runs,
    comparison_table,
    dtw_similarity,
    ecdf_points,
    in_scope,
    js_similarity,
    ks_similarity,
    log2_buckets,
    order_similarity,
    ratio_similarity,
    resample_mean,
    resample_sum,
)
from workloads.errors import UserError

START_NS = 5_000_000_000_000
SEC = 1_000_000_000
MIB = 2**20
KIB = 2**10


# ---------------------------------------------------------------------------------------------
# Run-directory helpers (as in tests/test_timeline.py)


def manifest(run_id: str, **changes: Any) -> dict[str, Any]:
    """A complete schema-1 manifest (docs/run-format.md), 10 s long, /data mounted read-only."""
    workload, variant = run_id.split("-")[2:4]
    data: dict[str, Any] = {
        "schema_version": 1,
        "twintrace_version": "0.1.0",
        "run_id": run_id,
        "status": "completed",
        "error": None,
        "git_revision": "0" * 40,
        "image": {"tag": f"twintrace/{workload}:latest", "id": "sha256:" + "1" * 64},
        "command": ["python", "-m", f"workloads.{workload}"],
        "config": {"workload": workload, "variant": variant, "epochs": 1, "batch_size": 2},
        "trace": {
            "sample_interval_s": 0.1,
            "memory_limit": None,
            "cpus": None,
            "mounts": [{"source": "/srv/ds", "target": "/data", "read_only": True}],
        },
        "host": {"hostname": "test", "kernel": "6.8.0", "cpus": 2},
        "container_id": "c" * 64,
        "cgroup_id": 1234,
        "started_at": "2026-11-21T16:30:05Z",
        "ended_at": "2026-11-21T16:30:15Z",
        "start_ns": START_NS,
        "end_ns": START_NS + 10 * SEC,
        "exit_code": 0,
        "lost_events": 0,
    }
    data.update(changes)
    return data


def make_run(
    root: Path,
    run_id: str,
    events: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    phases: pd.DataFrame | None = None,
    **manifest_changes: Any,
) -> Path:
    """Write a run directory under ``root``; tables not given are written empty."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps(manifest(run_id, **manifest_changes)))
    for name, frame, columns in (
        ("events", events, EVENTS_COLUMNS),
        ("samples", samples, SAMPLES_COLUMNS),
        ("phases", phases, PHASES_COLUMNS),
    ):
        frame = empty_frame(columns) if frame is None else frame
        table = pa.Table.from_pandas(frame, schema=arrow_schema(columns), preserve_index=False)
        pq.write_table(table, run_dir / f"{name}.parquet")
    return run_dir


def events_frame(columns: Mapping[str, Any]) -> pd.DataFrame:
    """Events from column arrays (``ts_ns``, ``kind``, ``bytes``, ``path``...), with defaults."""
    n = len(columns["ts_ns"])
    data = {
        "pid": np.full(n, 101),
        "comm": ["pt_data_worker"] * n,
        "fd": np.full(n, 5),
        "path": [None] * n,
        "bytes": np.zeros(n, dtype=np.int64),
        "count": np.ones(n, dtype=np.int64),
        "offset": np.full(n, -1),
        "latency_ns": np.full(n, 1000),
        "dev": [None] * n,
        "in_container": np.ones(n, dtype=bool),
        **columns,
    }
    data.setdefault("tid", data["pid"])
    data.setdefault("ret", data["bytes"])
    frame = pd.DataFrame({c: data[c] for c in EVENTS_COLUMNS})
    return frame.sort_values("ts_ns", kind="stable").astype(dict(EVENTS_COLUMNS))


def samples_frame(rows: Iterable[tuple[int, str, float, str]]) -> pd.DataFrame:
    """Samples from (ts_ns, metric, value, unit)."""
    frame = pd.DataFrame(list(rows), columns=list(SAMPLES_COLUMNS))
    return frame.astype(dict(SAMPLES_COLUMNS))


def phases_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Phases from dicts with ``key``, ``t0``, ``t1`` (ns), optional kind/rank/epoch/step."""
    records = [
        {
            "ts_ns": r["t0"],
            "end_ns": r.get("t1", r["t0"]),
            "duration_ns": r.get("t1", r["t0"]) - r["t0"],
            "key": r["key"],
            "kind": r.get("kind", "interval" if r.get("t1", r["t0"]) > r["t0"] else "point"),
            "rank": r.get("rank", 0),
            "pid": 7,
            "epoch": r.get("epoch", 0),
            "step": r.get("step", -1),
            "value": "null",
        }
        for r in rows
    ]
    return pd.DataFrame(records, columns=list(PHASES_COLUMNS)).astype(dict(PHASES_COLUMNS))


# ---------------------------------------------------------------------------------------------
# A model training run: 10 steps of 1 s (divided by ``speed``); each step reads 4 dataset files
# (4 reads each, opened and closed) in a burst at its start, logs a line; a checkpoint at the end.


def training_run(
    root: Path,
    run_id: str,
    speed: float = 1.0,
    clock_shift_s: float = 0.0,
    read_size: int = 256 * KIB,
    burst_at: float = 0.0,
    file_order: Iterable[int] | None = None,
    checkpoint_bytes: int = 4 * MIB,
    samples: bool = True,
    load_phases: bool = True,
    extra_files: int = 0,
    front_load: bool = False,
) -> Path:
    """Write a model run. ``burst_at``: where in each step (fraction) the read burst happens;
    ``file_order``: order of the 40 dataset files; ``extra_files``: files read outside /data;
    ``front_load``: all reads in the first 2 s (prefetching), not one burst per step."""
    origin = START_NS + round(clock_shift_s * SEC)

    def ns(t: np.ndarray | float) -> np.ndarray:
        # Times in ms multiples so that a speed of 2 keeps every event on the same fraction.
        return origin + np.round(np.asarray(t, dtype=np.float64) / speed * 1e3).astype(np.int64) * (
            SEC // 1000
        )

    order = list(file_order) if file_order is not None else list(range(40))
    files = [f"/data/case_{i:03d}.npy" for i in order]
    ts: list[float] = []
    kinds: list[str] = []
    sizes: list[int] = []
    paths: list[str | None] = []
    for step in range(10):
        # The burst lasts 0.2 s and ends inside its step (or inside the first 2 s).
        t0 = (0.2 * step if front_load else step) + burst_at * 0.7
        for j, path in enumerate(files[step * 4 : step * 4 + 4]):
            base = t0 + j * 0.05
            ts += [base, *(base + 0.002 * (k + 1) for k in range(4)), base + 0.011]
            kinds += ["openat", "read", "read", "read", "read", "close"]
            sizes += [0, read_size, read_size, read_size, read_size, 0]
            paths += [path, path, path, path, path, path]
            ts.append(base + 0.003)
            kinds.append("block_read")
            sizes.append(4 * read_size)
            paths.append(None)
        ts.append(step + 0.9)
        kinds.append("write")
        sizes.append(100)
        paths.append("/twintrace/out/log.txt")
    for i in range(extra_files):  # library imports at start-up
        ts += [0.001 * (i + 1)]
        kinds += ["read"]
        sizes += [4 * KIB]
        paths += [f"/usr/lib/python3/mod{i}.pyc"]
    # Checkpoint at 9.2-9.6 s: 4 writes, then writeback on the device.
    for k in range(4):
        ts.append(9.2 + 0.1 * k)
        kinds.append("write")
        sizes.append(checkpoint_bytes // 4)
        paths.append("/twintrace/out/ckpt.pt")
    ts.append(9.7)
    kinds.append("block_write")
    sizes.append(checkpoint_bytes)
    paths.append(None)
    is_open = np.array([k == "openat" for k in kinds])
    events = events_frame(
        {
            "ts_ns": ns(np.array(ts)),
            "kind": kinds,
            "bytes": np.array(sizes, dtype=np.int64),
            "ret": np.where(is_open, 5, np.array(sizes)),
            "path": paths,
        }
    )
    sample_table = None
    if samples:
        t = np.arange(0, 10, 0.1)
        busy = (t % 1) < 0.3
        rows = [(int(x), "container_cpu", 150.0 if b else 60.0, "percent")
                for x, b in zip(ns(t), busy, strict=True)]  # fmt: skip
        rows += [(int(x), "container_mem_rss", 1e9 + 1e8 * v, "bytes")
                 for x, v in zip(ns(t), t, strict=True)]  # fmt: skip
        sample_table = samples_frame(rows)
    phase_rows: list[dict[str, Any]] = [
        {"key": "epoch", "t0": int(ns(0.0)), "t1": int(ns(9.0))},
        {"key": "checkpoint", "t0": int(ns(9.15)), "t1": int(ns(9.65))},
    ]
    for step in range(9):
        phase_rows.append({"key": "step_end", "t0": int(ns(step + 1.0)), "step": step})
        if load_phases:
            phase_rows.append(
                {"key": "load_batch_mem", "t0": int(ns(step + 0.0)), "t1": int(ns(step + 0.2))}
            )
    end_ns = int(ns(10.0))
    return make_run(
        root,
        run_id,
        events=events,
        samples=sample_table,
        phases=phases_frame(phase_rows),
        start_ns=origin,
        end_ns=end_ns,
    )


REAL = "20261121-163000-unet3d-original-0001"
EMULATED = "20261121-170000-unet3d-sleep-0002"


def scores(comparison: Comparison) -> dict[str, float | None]:
    return {a.name: a.score for a in comparison.aspects}


# ---------------------------------------------------------------------------------------------
# Measures


def test_resample_sum_bins_over_the_runs_own_span() -> None:
    span = (1000, 2000)
    ts = np.array([999, 1000, 1099, 1100, 1950, 2000, 2001])
    weights = np.array([5, 1, 2, 4, 8, 16, 32])
    # 10 bins of 100 ns: the end itself goes to the last bin, values outside are dropped.
    assert resample_sum(ts, weights, span, 10).tolist() == [3, 4, 0, 0, 0, 0, 0, 0, 0, 24]
    # A run twice as long with every time doubled gives the same bins.
    doubled = resample_sum(1000 + 2 * (ts - 1000), weights, (1000, 3000), 10)
    assert doubled.tolist() == [3, 4, 0, 0, 0, 0, 0, 0, 0, 24]


def test_resample_mean_interpolates_gaps() -> None:
    ts = np.array([0, 10, 90])
    values = np.array([1.0, 3.0, 9.0])
    # 10 bins of 10 ns: bin 0 has 1, bin 1 has 3, bin 9 has 9; between, a straight line.
    out = resample_mean(ts, values, (0, 100), 10)
    assert out[:2].tolist() == [1.0, 3.0] and out[9] == 9.0
    assert out[5] == pytest.approx(3.0 + (9.0 - 3.0) * 4 / 8)
    assert len(resample_mean(np.array([500]), np.array([1.0]), (0, 100), 10)) == 0


def bursts(n: int = 400, at: Iterable[int] = (40, 140, 240, 340), width: int = 8) -> np.ndarray:
    series = np.zeros(n)
    for start in at:
        series[start : start + width] = 1.0
    return series


def test_dtw_identical_scaled_shifted_and_different() -> None:
    a = bursts()
    assert dtw_similarity(a, a) == (1.0, 0.0)
    # Shape mode ignores absolute scale; level mode does not.
    assert dtw_similarity(a, 5 * a)[0] == pytest.approx(1.0)
    flat = np.ones(400)
    assert dtw_similarity(flat, 2 * flat, level=True)[0] == pytest.approx(0.5)
    # Bursts 12 points (3 % of the run) later: within the DTW band, so still ~1, whereas the
    # plain Euclidean comparison would see no overlap at all.
    shifted = bursts(at=(52, 152, 252, 352))
    assert dtw_similarity(a, shifted)[0] > 0.97
    assert np.linalg.norm(a / np.linalg.norm(a) - shifted / np.linalg.norm(shifted)) > 1.4
    # Bursts against a flat line: nearly nothing in common.
    assert dtw_similarity(a, flat)[0] < 0.4
    # One spike against the same spike is exact (dtaidistance's pruning would return inf).
    spike = np.zeros(400)
    spike[[0, 398, 399]] = [1.0, 3.0, 2.0]
    assert dtw_similarity(spike, spike)[0] == 1.0
    assert dtw_similarity(a, flat) == dtw_similarity(flat, a)  # symmetric


def test_log2_buckets_are_exact_at_powers_of_two() -> None:
    sizes = np.array([0, 1, 2, 3, 4095, 4096, 8191, 8192, MIB])
    counts = log2_buckets(sizes)
    assert len(counts) == N_SIZE_BUCKETS and counts.sum() == len(sizes)
    assert np.flatnonzero(counts).tolist() == [0, 1, 11, 12, 13, 20]
    assert counts[[0, 1, 11, 12, 13, 20]].tolist() == [2, 2, 1, 2, 1, 1]


def test_js_similarity_known_values() -> None:
    assert js_similarity([3, 1, 0], [3, 1, 0]) == 1.0
    assert js_similarity([3, 1, 0], [30, 10, 0]) == pytest.approx(1.0)  # counts do not matter
    assert js_similarity([1, 0], [0, 1]) == 0.0  # disjoint
    # [.5,.5,0] vs [0,.5,.5]: JS divergence 0.5 bit, distance sqrt(0.5).
    assert js_similarity([1, 1, 0], [0, 1, 1]) == pytest.approx(1 - np.sqrt(0.5))
    assert js_similarity([0, 0], [0, 0]) == 1.0 and js_similarity([0, 0], [1, 0]) == 0.0


def test_ks_similarity_known_values() -> None:
    a = np.arange(100.0)
    assert ks_similarity(a, a) == 1.0
    assert ks_similarity(a, a + 1000) == 0.0
    assert ks_similarity(a, a + 50) == pytest.approx(0.5)  # CDFs differ by at most one half
    assert ks_similarity(a, a + 50) == ks_similarity(a + 50, a)


def test_order_similarity() -> None:
    files = pd.Index([f"/data/{i}" for i in range(10)], dtype="string")
    assert order_similarity(files, files)[0] == pytest.approx(1.0)
    assert order_similarity(files, files[::-1])[0] == 0.0  # reversed: tau = -1, clipped to 0
    score, details = order_similarity(files[:4], files[2:6])  # 2 shared of 6, same order
    assert score == pytest.approx(1 / 3) and details["shared"] == 2
    rng = np.random.default_rng(0)
    many = pd.Index([f"/data/{i}" for i in range(2000)], dtype="string")
    shuffled, _ = order_similarity(many, many[rng.permutation(2000)])
    assert shuffled < 0.05  # an independent shuffle shares no order


def test_ratio_and_scope_and_ecdf() -> None:
    assert ratio_similarity(2.0, 4.0) == 0.5 and ratio_similarity(0.0, 0.0) == 1.0
    assert ratio_similarity(0.0, 3.0) == 0.0
    paths = pd.Index(["/data/a", "/data", "/database/x", "/usr/lib/y"], dtype="string")
    assert in_scope(paths, ["/data"]).tolist() == [True, True, False, False]
    assert in_scope(paths, []).all()
    x, f = ecdf_points(np.array([3.0, 1.0, 2.0]))
    assert x.tolist() == [1.0, 1.0, 2.0, 3.0] and f.tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1])


# ---------------------------------------------------------------------------------------------
# Whole comparisons


def test_run_against_itself_scores_one(tmp_path: Path) -> None:
    run = load_run(training_run(tmp_path, REAL))
    comparison = compare_runs(run, run)
    assert comparison.overall == pytest.approx(1.0, abs=1e-12)
    assert [a.name for a in comparison.aspects] == list(ASPECTS)
    for aspect in comparison.aspects:
        assert aspect.skipped is None, aspect.name
        assert aspect.score == pytest.approx(1.0, abs=1e-12), aspect.name


def test_faster_and_shifted_copy(tmp_path: Path) -> None:
    """The same run twice as fast and 1000 s later on the clock: every aspect documented as
    invariant to a time shift and a uniform speed-up stays 1; those sensitive to it drop."""
    real = load_run(training_run(tmp_path, REAL))
    fast = load_run(training_run(tmp_path, EMULATED, speed=2.0, clock_shift_s=1000.0))
    result = scores(compare_runs(real, fast))
    for name in ("read_bandwidth", "write_bandwidth", "block_io", "read_sizes", "write_sizes",
                 "file_order", "file_bytes", "open_close", "cpu", "memory"):  # fmt: skip
        assert result[name] == pytest.approx(1.0, abs=1e-9), name
    # Steps (1 s vs 0.5 s) and batch loads (0.2 vs 0.1 s) no longer overlap at all.
    assert result["step_time"] == 0.0 and result["load_time"] == 0.0
    assert result["read_interarrival"] < 0.6
    # Checkpoints: same count and bytes, half the duration.
    assert result["checkpoints"] == pytest.approx((1 + 1 + 0.5) / 3)


def test_comparison_is_symmetric(tmp_path: Path) -> None:
    a = load_run(training_run(tmp_path, REAL))
    b = load_run(training_run(tmp_path, EMULATED, read_size=64 * KIB, burst_at=0.5, speed=1.5))
    ab, ba = compare_runs(a, b), compare_runs(b, a)
    assert scores(ab) == pytest.approx(scores(ba))
    assert ab.overall == pytest.approx(ba.overall)
    assert (ab.real, ab.emulated) == (a.run_id, b.run_id)


def test_other_sizes_and_bandwidth_shape_score_clearly_lower(tmp_path: Path) -> None:
    real = load_run(training_run(tmp_path, REAL))
    same = compare_runs(real, load_run(training_run(tmp_path / "same", EMULATED)))
    other_run = training_run(
        tmp_path / "other",
        EMULATED,
        read_size=4 * KIB,  # 6 octaves smaller: no shared size bucket
        front_load=True,  # all reads in the first 2 s, not one burst per step
        file_order=np.random.default_rng(1).permutation(40),
    )
    other = compare_runs(real, load_run(other_run))
    result = scores(other)
    assert same.overall == pytest.approx(1.0)
    assert result["read_sizes"] == pytest.approx(0.0, abs=1e-9)
    assert other.aspect("read_sizes").details["wasserstein_octaves"] == pytest.approx(6.0)
    assert result["read_bandwidth"] < 0.5
    assert result["file_order"] < 0.5
    assert result["file_bytes"] == pytest.approx(1.0)  # same bytes per file, other order
    assert other.overall < 0.8 < same.overall


def test_missing_data_is_skipped_or_zero(tmp_path: Path) -> None:
    bare = load_run(training_run(tmp_path, REAL, samples=False, load_phases=False))
    full = load_run(training_run(tmp_path, EMULATED))
    both_bare = compare_runs(bare, bare)
    cpu = both_bare.aspect("cpu")
    assert cpu.score is None and cpu.skipped == "neither run has cpu data"
    assert both_bare.aspect("load_time").skipped == "neither run has load_batch_mem phases"
    one = compare_runs(bare, full)
    # Samples only in one run: 0, and which run lacks them is in the evidence.
    assert one.aspect("cpu").score == 0.0
    assert one.aspect("cpu").details["cpu_missing_in"] == "real"
    # Phases need both: load_batch_mem is instrumentation, so its absence is not scored.
    load = one.aspect("load_time")
    assert load.score is None and "the real lacks it" in (load.skipped or "")
    assert one.overall == pytest.approx(
        sum(a.weight * a.score for a in one.aspects if a.score is not None)
        / sum(a.weight for a in one.aspects if a.score is not None)
    )


def test_checkpoint_bytes_ratio(tmp_path: Path) -> None:
    real = load_run(training_run(tmp_path, REAL))
    half = load_run(training_run(tmp_path, EMULATED, checkpoint_bytes=2 * MIB))
    aspect = compare_runs(real, half).aspect("checkpoints")
    assert aspect.details["mean_write_bytes_real"] == 4 * MIB
    assert aspect.details["mean_write_bytes_emulated"] == 2 * MIB
    assert aspect.score == pytest.approx((1 + 0.5 + 1) / 3)


def test_file_scope_defaults_to_read_only_mounts(tmp_path: Path) -> None:
    """Library imports outside /data change the file aspects only when asked to count them."""
    real = load_run(training_run(tmp_path, REAL, extra_files=200))
    emulated = load_run(training_run(tmp_path, EMULATED))
    scoped = compare_runs(real, emulated)
    assert scoped.aspect("file_order").score == pytest.approx(1.0)
    assert scoped.aspect("file_order").details["file_scope"] == ["/data"]
    everything = compare_runs(real, emulated, file_scope=())
    order = everything.aspect("file_order")
    assert order.details["only_real"] == 200
    assert order.score == pytest.approx(40 / 240)  # 40 shared of 240 (the log is not read)


def test_to_dict_is_json(tmp_path: Path) -> None:
    a = load_run(training_run(tmp_path, REAL, samples=False))
    b = load_run(training_run(tmp_path, EMULATED, read_size=MIB, samples=False))
    data = json.loads(json.dumps(compare_runs(a, b).to_dict()))
    assert set(data) == {"real", "emulated", "overall", "aspects"}
    assert list(data["aspects"]) == list(ASPECTS)
    sizes = data["aspects"]["read_sizes"]
    assert sizes["measure"] == "JS" and sizes["resource"] == "syscall I/O"
    assert 0.0 <= sizes["score"] < 1.0 and sizes["details"]["median_bytes_emulated"] == MIB
    assert data["aspects"]["cpu"]["skipped"] and data["aspects"]["cpu"]["score"] is None
    assert "absolute scale" in data["aspects"]["read_bandwidth"]["invariant_to"]
    table = comparison_table(compare_runs(a, b))
    assert list(table["aspect"])[:2] == ["read bandwidth", "write bandwidth"]


def test_weights(tmp_path: Path) -> None:
    a = load_run(training_run(tmp_path, REAL))
    b = load_run(training_run(tmp_path, EMULATED, read_size=4 * KIB))
    only_sizes = {name: 0.0 for name in ASPECTS} | {"read_sizes": 1.0}
    assert compare_runs(a, b, weights=only_sizes).overall == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(UserError, match="unknown similarity aspect 'bandwidth'"):
        compare_runs(a, b, weights={"bandwidth": 1.0})


def test_empty_runs_are_a_user_error(tmp_path: Path) -> None:
    empty = load_run(make_run(tmp_path, REAL))
    with pytest.raises(UserError, match="no events, samples or phases to compare"):
        compare_runs(empty, empty)


# ---------------------------------------------------------------------------------------------
# Report


def test_report_has_one_lane_per_aspect_with_scores(tmp_path: Path) -> None:
    real = load_run(training_run(tmp_path, REAL, load_phases=False))
    emulated = load_run(training_run(tmp_path, EMULATED, speed=2.0))
    comparison = compare_runs(real, emulated)
    fig = comparison_figure(real, emulated, comparison)
    axes = [k for k in fig.layout.to_plotly_json() if re.fullmatch(r"xaxis\d*", k)]
    assert len(axes) == REPORT_LANES == report_lanes(comparison) == len(ASPECTS)
    assert [lane["aspect"] for lane in fig.layout.meta["lanes"]] == list(ASPECTS)
    titles = [a.text for a in fig.layout.annotations]
    assert any(t.startswith("<b>read bandwidth — 1.00 (DTW)</b>") for t in titles)
    assert any("step time — 0.00 (KS)" in t for t in titles)
    assert lane_title(comparison.aspect("load_time")).startswith(
        "data-loading time (load_batch_mem) — skipped (only one run"
    )
    # The skipped lane says why in its middle; scored lanes draw both runs.
    assert any(t.startswith("skipped: only one run has load_batch_mem") for t in titles)
    names = {t.name for t in fig.data}
    assert {"real", "emulated", "real block read", "emulated block write"} <= names


def test_report_html_is_self_contained(tmp_path: Path) -> None:
    real = load_run(training_run(tmp_path, REAL))
    emulated = load_run(training_run(tmp_path, EMULATED, read_size=MIB))
    comparison = compare_runs(real, emulated)
    out = write_comparison_report(real, emulated, comparison, tmp_path / "out" / "compare.html")
    text = out.read_text(encoding="utf-8")
    assert len(text) > 1_000_000 and "Plotly.newPlot" in text  # plotly.js is inside
    assert not re.search(r"<script[^>]*\bsrc=", text)  # nothing fetched: opens offline
    assert f"Overall similarity {comparison.overall:.3f}" in text
    assert "read request sizes" in text and real.run_id in text and emulated.run_id in text
    assert [p.name for p in out.parent.iterdir()] == ["compare.html"]  # no temporary left
