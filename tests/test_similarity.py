"""Tests for the trace-similarity analyzer (analysis.similarity) and its report
(analysis.compare_report).

Each measure is checked on inputs with a known answer; whole comparisons on synthetic run
directories written as docs/run-format.md describes them (tests/synthetic.py), built from one model of a training run that can be made faster, shifted
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
import pytest

from analysis.compare_report import (
    REPORT_LANES,
    comparison_figure,
    lane_title,
    report_html,
    report_lanes,
    write_comparison_report,
)
from analysis.figures import PLOTLY_JS
from analysis.series import Bins, binned_sum, filled_mean
from analysis.similarity import (
    ASPECTS,
    OVERALL_FLOOR,
    Comparison,
    compare_runs,
    comparison_table,
    ecdf_points,
    in_scope,
    measures,
    reads_in_flight,
    run_span,
)
from core.errors import UserError
from store.rundir import (
    EVENT_LOG_PATH,
    EVENTS_COLUMNS,
    PHASES_COLUMNS,
    SAMPLES_COLUMNS,
    load_run,
)
from tests import synthetic
from tests.synthetic import SEC, START_NS

MIB = 2**20
KIB = 2**10


# ---------------------------------------------------------------------------------------------
# Run-directory helpers (tables in ns; the run directory from tests/synthetic.py)


# 100 ms samples and the dataset mounted read-only at /data (the file aspects' scope).
TRACE = {"enabled": True, "sample_interval_s": 0.1, "timeout_s": None, "network": "none"}
MOUNTS = [{"source": "/srv/ds", "target": "/data", "read_only": True}]


def make_run(
    root: Path,
    run_id: str,
    events: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    phases: pd.DataFrame | None = None,
    **manifest_changes: Any,
) -> Path:
    """A run directory (:func:`tests.synthetic.make_run`) with this module's trace settings."""
    return synthetic.make_run(
        root,
        run_id,
        events,
        samples,
        phases,
        **{"trace": TRACE, "mounts": MOUNTS, **manifest_changes},
    )


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
        "latency_max_ns": np.full(n, 1000),
        "dev": [None] * n,
        "in_container": np.ones(n, dtype=bool),
        "container": ["main"] * n,
        "host": ["test"] * n,
        **columns,
    }
    data.setdefault("tid", data["pid"])
    data.setdefault("ret", data["bytes"])
    frame = pd.DataFrame({c: data[c] for c in EVENTS_COLUMNS})
    return frame.sort_values("ts_ns", kind="stable").astype(dict(EVENTS_COLUMNS))


def samples_frame(rows: Iterable[tuple[int, str, float, str]]) -> pd.DataFrame:
    """Samples from (ts_ns, metric, value, unit), of the container ``main``."""
    frame = pd.DataFrame([(*row, "main", "test") for row in rows], columns=list(SAMPLES_COLUMNS))
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
            "value": json.dumps(r.get("value")),
            "container": r.get("container", "main"),
            "host": "test",
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
    jitter_s: float = 0.0,
    seed: int = 0,
    readers: int = 1,
    cold_cache: bool = False,
    foreign_block_bytes: int = 0,
    startup_s: float = 0.0,
    log_lines: int = 0,
    log_path: str = EVENT_LOG_PATH,
    accelerator: str | None = None,
    cpu_scale: float = 1.0,
    loader_cpu: float | None = None,
) -> Path:
    """Write a model run. ``burst_at``: where in each step (fraction) the read burst happens;
    ``file_order``: order of the 40 dataset files; ``extra_files``: files read outside /data;
    ``front_load``: all reads in the first 2 s (prefetching), not one burst per step;
    ``jitter_s``: each read burst and the checkpoint start up to this much later (uniform,
    from ``seed``), as in a repeat of a real run; ``readers``: threads the dataset files are dealt
    to, round robin; ``cold_cache``: every byte read is also a page-cache insert;
    ``foreign_block_bytes``: block writes by other processes (``in_container`` false);
    ``startup_s``: the container starts this long before the workload's first event;
    ``log_lines``: per step, this many 300-byte writes to ``log_path`` (by default the
    instrumentation's event log); ``accelerator``: the value of the ranks' ``accelerator``
    point; ``cpu_scale``: container CPU times this; ``loader_cpu``: the loader workers' CPU
    (percent, busy in the same 30 % of each step)."""
    origin = START_NS + round(clock_shift_s * SEC)
    rng = np.random.default_rng(seed)

    def ns(t: np.ndarray | float) -> np.ndarray:
        # Times in multiples of 2 ms so that a speed of 2 keeps every event on the same fraction.
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
        t0 += rng.uniform(0, jitter_s) if jitter_s else 0.0
        for j, path in enumerate(files[step * 4 : step * 4 + 4]):
            base = t0 + j * 0.05
            ts += [base, *(base + 0.002 * (k + 1) for k in range(4)), base + 0.011]
            kinds += ["openat", "read", "read", "read", "read", "close"]
            sizes += [0, read_size, read_size, read_size, read_size, 0]
            paths += [path, path, path, path, path, path]
            ts.append(base + 0.004)  # an even number of ms: see ns()
            kinds.append("block_read")
            sizes.append(4 * read_size)
            paths.append(None)
        ts.append(step + 0.9)
        kinds.append("write")
        sizes.append(100)
        paths.append("/twintrace/out/log.txt")
        for k in range(log_lines):
            ts.append(step + 0.92 + 0.002 * k)
            kinds.append("write")
            sizes.append(300)
            paths.append(log_path)
    for i in range(extra_files):  # library imports at start-up
        ts += [0.001 * (i + 1)]
        kinds += ["read"]
        sizes += [4 * KIB]
        paths += [f"/usr/lib/python3/mod{i}.pyc"]
    # Checkpoint at 9.2-9.6 s: 4 writes, then writeback on the device.
    ckpt_shift = rng.uniform(0, jitter_s) if jitter_s else 0.0
    for k in range(4):
        ts.append(9.2 + 0.1 * k + ckpt_shift)
        kinds.append("write")
        sizes.append(checkpoint_bytes // 4)
        paths.append("/twintrace/out/ckpt.pt")
    ts.append(9.7 + ckpt_shift)
    kinds.append("block_write")
    sizes.append(checkpoint_bytes)
    paths.append(None)
    own = [True] * len(ts)
    if cold_cache:  # one page-cache insert per 100 ms holding the bytes read in it
        read_at = np.array([t for t, k in zip(ts, kinds, strict=True) if k == "read"])
        read_bytes = np.array([b for b, k in zip(sizes, kinds, strict=True) if k == "read"])
        slot = np.floor(read_at * 10)
        for t in np.unique(slot):
            ts.append(float(t) / 10 + 0.1)
            kinds.append("cache_add")
            sizes.append(int(read_bytes[slot == t].sum()))
            paths.append(None)
            own.append(True)
    for t in np.arange(0.5, 10, 1.0)[: 1 if foreign_block_bytes else 0]:  # another job's burst
        ts.append(float(t))
        kinds.append("block_write")
        sizes.append(foreign_block_bytes)
        paths.append(None)
        own.append(False)
    is_open = np.array([k == "openat" for k in kinds])
    # Dataset files are dealt to the reader threads round robin (a DataLoader's workers).
    tid_of = {f: 200 + i % readers for i, f in enumerate(sorted(set(files)))}
    tids = np.array([tid_of.get(path, 101) if path else 101 for path in paths])
    events = events_frame(
        {
            "ts_ns": ns(np.array(ts)),
            "kind": kinds,
            "bytes": np.array(sizes, dtype=np.int64),
            "ret": np.where(is_open, 5, np.array(sizes)),
            "path": paths,
            "pid": tids,
            "in_container": np.array(own),
        }
    )
    sample_table = None
    if samples:
        t = np.arange(0, 10, 0.1)
        busy = (t % 1) < 0.3
        rows = [(int(x), "container_cpu", cpu_scale * (150.0 if b else 60.0), "percent")
                for x, b in zip(ns(t), busy, strict=True)]  # fmt: skip
        if loader_cpu is not None:
            rows += [(int(x), "container_cpu_loader", loader_cpu if b else 5.0, "percent")
                     for x, b in zip(ns(t), busy, strict=True)]  # fmt: skip
        rows += [(int(x), "container_mem_rss", 1e9 + 1e8 * v, "bytes")
                 for x, v in zip(ns(t), t, strict=True)]  # fmt: skip
        rows += [(int(x), metric, rate if b else rate / 50, "bytes/s")
                 for x, b in zip(ns(t), busy, strict=True)
                 for metric, rate in (("container_net_rx", 5e7), ("container_net_tx", 1e6))]  # fmt: skip
        sample_table = samples_frame(rows)
    phase_rows: list[dict[str, Any]] = [
        {"key": "epoch", "t0": int(ns(0.0)), "t1": int(ns(9.0))},
        {"key": "checkpoint", "t0": int(ns(9.15)), "t1": int(ns(9.65))},
        # The workload's last event: the time series cover [first event, run_stop].
        {"key": "run_stop", "t0": int(ns(10.0))},
    ]
    if accelerator is not None:
        phase_rows.append({"key": "accelerator", "t0": int(ns(0.0)), "value": accelerator})
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
        start_ns=origin - round(startup_s * SEC),
        end_ns=end_ns,
    )


REAL = "20261121-163000-unet3d-original-0001"
EMULATED = "20261121-170000-unet3d-sleep-0002"


def scores(comparison: Comparison) -> dict[str, float | None]:
    return {a.name: a.score for a in comparison.aspects}


# ---------------------------------------------------------------------------------------------
# Measures


def test_resample_sum_bins_over_the_runs_own_span() -> None:
    ts = np.array([999, 1000, 1099, 1100, 1950, 2000, 2001])
    weights = np.array([5, 1, 2, 4, 8, 16, 32])
    # 10 bins of 100 ns: the end itself goes to the last bin, values outside are dropped.
    binned = binned_sum(ts, weights, Bins.spanning(1000, 2000, 10))
    assert binned.tolist() == [3, 4, 0, 0, 0, 0, 0, 0, 0, 24]
    # A run twice as long with every time doubled gives the same bins.
    doubled = binned_sum(1000 + 2 * (ts - 1000), weights, Bins.spanning(1000, 3000, 10))
    assert doubled.tolist() == [3, 4, 0, 0, 0, 0, 0, 0, 0, 24]
    # Exact on edges whatever the span: 1/3 of a 3 s span starts bin 100 of 300.
    third = binned_sum(np.array([SEC]), np.array([1.0]), Bins.spanning(0, 3 * SEC, 300))
    assert third[100] == 1.0


def test_resample_mean_interpolates_gaps() -> None:
    ts = np.array([0, 10, 90])
    values = np.array([1.0, 3.0, 9.0])
    # 10 bins of 10 ns: bin 0 has 1, bin 1 has 3, bin 9 has 9; between, a straight line.
    out = filled_mean(ts, values, Bins.spanning(0, 100, 10))
    assert out[:2].tolist() == [1.0, 3.0] and out[9] == 9.0
    assert out[5] == pytest.approx(3.0 + (9.0 - 3.0) * 4 / 8)
    assert len(filled_mean(np.array([500]), np.array([1.0]), Bins.spanning(0, 100, 10))) == 0


def bursts(n: int = 400, at: Iterable[int] = (40, 140, 240, 340), width: int = 8) -> np.ndarray:
    series = np.zeros(n)
    for start in at:
        series[start : start + width] = 1.0
    return series


def test_dtw_identical_scaled_shifted_and_different() -> None:
    a = bursts()
    assert measures.dtw_similarity(a, a) == (1.0, 0.0)
    # Shape mode ignores absolute scale; level mode does not.
    assert measures.dtw_similarity(a, 5 * a)[0] == pytest.approx(1.0)
    flat = np.ones(400)
    assert measures.dtw_similarity(flat, 2 * flat, level=True)[0] == pytest.approx(0.5)
    # Bursts 12 points (3 % of the run) later: within the DTW band, so still ~1, whereas the
    # plain Euclidean comparison would see no overlap at all.
    shifted = bursts(at=(52, 152, 252, 352))
    assert measures.dtw_similarity(a, shifted)[0] > 0.97
    assert np.linalg.norm(a / np.linalg.norm(a) - shifted / np.linalg.norm(shifted)) > 1.4
    # Bursts against a flat line: nearly nothing in common.
    assert measures.dtw_similarity(a, flat)[0] < 0.4
    # One spike against the same spike is exact (dtaidistance's pruning would return inf).
    spike = np.zeros(400)
    spike[[0, 398, 399]] = [1.0, 3.0, 2.0]
    assert measures.dtw_similarity(spike, spike)[0] == 1.0
    assert measures.dtw_similarity(a, flat) == measures.dtw_similarity(flat, a)  # symmetric


def test_dtw_level_scale_judges_a_channel_against_the_whole() -> None:
    cache_a, cache_b = np.zeros(400), np.full(400, 0.1)
    # Against its own maximum, 0 vs 0.1 is the largest possible difference ...
    assert measures.dtw_similarity(cache_a, cache_b, level=True)[0] == pytest.approx(0.0)
    # ... against a footprint of 1.1 (1.0 of rss besides), a difference of 1/11.
    assert measures.dtw_similarity(cache_a, cache_b, level=True, scale=1.1)[0] == pytest.approx(
        1 - 1 / 11
    )


def test_timing_similarity_is_the_distance_bytes_move() -> None:
    a = bursts()
    assert measures.timing_similarity(a, a) == (1.0, 0.0)
    assert measures.timing_similarity(a, 5 * a)[0] == pytest.approx(1.0)  # amounts do not matter
    # Every burst 12 points later: the bytes move by 12 / 400 of the run.
    shifted = bursts(at=(52, 152, 252, 352))
    assert measures.timing_similarity(a, shifted)[1] == pytest.approx(12 / 400)
    # The failure of a point-by-point distance on sparse series (real writes: 0.0003 for two
    # runs writing the same bytes): one spike, one bin later, is 1/400 of the run away.
    spike, later = np.zeros(400), np.zeros(400)
    spike[300], later[301] = 3.8e6, 3.8e6
    assert measures.timing_similarity(spike, later)[0] == pytest.approx(1 - 1 / 400)
    # First bin against last bin: the whole run apart.
    first, last = np.zeros(400), np.zeros(400)
    first[0], last[-1] = 1.0, 1.0
    assert measures.timing_similarity(first, last)[0] == pytest.approx(1 / 400)
    assert measures.timing_similarity(first, last) == measures.timing_similarity(last, first)
    with pytest.raises(ValueError):
        measures.timing_similarity(np.zeros(400), a)


def test_burstiness_compares_concentration_not_position() -> None:
    steady = np.ones(400)
    tenth = np.zeros(400)
    tenth[:40] = 10.0  # active 10 % of the time
    # Steady against bursts active a fraction d of the time scores d.
    assert measures.burstiness_similarity(steady, tenth)[0] == pytest.approx(0.1)
    fifth = np.zeros(400)
    fifth[::5] = 5.0  # active 20 %: 1 - |0.1 - 0.2|
    assert measures.burstiness_similarity(tenth, fifth)[0] == pytest.approx(0.9)
    # The same bursts anywhere else (jitter, another order) are equally bursty.
    rng = np.random.default_rng(3)
    assert measures.burstiness_similarity(tenth, rng.permutation(tenth)) == (1.0, 0.0)
    # A burst split across two bins moves the curve by half a bin.
    one, split = np.zeros(400), np.zeros(400)
    one[7], split[[7, 8]] = 2.0, 1.0
    assert measures.burstiness_similarity(one, split)[0] == pytest.approx(1 - 1 / 400)
    assert measures.half_bytes_time(steady) == 0.5 and measures.half_bytes_time(one) == 1 / 400


def test_activity_is_the_mean_of_timing_volume_and_burstiness() -> None:
    a = bursts()
    shifted = bursts(at=(52, 152, 252, 352))
    score, terms = measures.activity_similarity(a, 2 * shifted, 32.0, 64.0)
    assert terms["timing"] == pytest.approx(1 - 12 / 400)
    assert terms["volume"] == 0.5 and terms["burstiness"] == pytest.approx(1.0)
    assert score == pytest.approx((1 - 12 / 400 + 0.5 + 1.0) / 3)
    # Volume on the scale of a reference: 1 MiB vs 8 MiB of device reads in a run that read
    # 215 MiB differ by 7/215 of the I/O (min/max would say 1/8).
    assert measures.volume_similarity(1.0, 8.0) == 0.125
    assert measures.volume_similarity(1.0, 8.0, reference=215.0) == pytest.approx(1 - 7 / 215)
    assert (
        measures.volume_similarity(0.0, 0.0) == 1.0
        and measures.volume_similarity(0.0, 5.0, 2.0) == 0.0
    )


def test_relative_wasserstein_on_small_samples() -> None:
    # The real case KS scored 0.8: ten steps of ~0.838 s against ten of ~0.839 s.
    rng = np.random.default_rng(0)
    a = 0.838 + rng.normal(0, 0.002, 10)
    b = a + 0.001
    score, w1 = measures.relative_wasserstein_similarity(a, b, scale=float(np.median(b)))
    assert w1 == pytest.approx(0.001) and score == pytest.approx(1 - 0.001 / np.median(b))
    assert (
        measures.ks_similarity(a, b) < 0.95
    )  # a shift of a millisecond moves KS by ten-percent steps
    # Twice as long: W1 is the mean duration, half the larger median.
    ones = np.ones(10)
    assert measures.relative_wasserstein_similarity(ones, 2 * ones, 2.0) == (0.5, 1.0)
    # Samples of different sizes: half of b is 2 s longer than all of a.
    assert measures.relative_wasserstein_similarity(np.ones(4), np.array([1.0, 3.0]), 4.0) == (
        0.75,
        1.0,
    )
    assert measures.relative_wasserstein_similarity(ones, ones, 0.0) == (1.0, 0.0)
    assert measures.relative_wasserstein_similarity(ones, 3 * ones, 1.0) == (0.0, 2.0)  # clipped


def test_readers_and_queue_depth() -> None:
    assert measures.effective_readers(np.array([5.0, 5.0, 5.0, 5.0])) == pytest.approx(4.0)
    h = -(0.99 * np.log(0.99) + 0.01 * np.log(0.01))
    assert measures.effective_readers(np.array([99.0, 1.0])) == pytest.approx(np.exp(h))
    assert measures.effective_readers(np.array([])) == 0.0
    # Reads [0, 10], [5, 15], [20, 30]: 2 in flight when the first ends, then 1 and 1.
    end = np.array([10, 15, 30])
    assert reads_in_flight(end, np.full(3, 10), np.ones(3)) == pytest.approx(4 / 3)
    assert measures.ks_noise(3000, 3000) == pytest.approx(1.358 * np.sqrt(2 / 3000))


def test_log2_buckets_are_exact_at_powers_of_two() -> None:
    sizes = np.array([0, 1, 2, 3, 4095, 4096, 8191, 8192, MIB])
    counts = measures.log2_buckets(sizes)
    assert len(counts) == measures.N_SIZE_BUCKETS and counts.sum() == len(sizes)
    assert np.flatnonzero(counts).tolist() == [0, 1, 11, 12, 13, 20]
    assert counts[[0, 1, 11, 12, 13, 20]].tolist() == [2, 2, 1, 2, 1, 1]


def test_js_similarity_known_values() -> None:
    assert measures.js_similarity([3, 1, 0], [3, 1, 0]) == 1.0
    assert measures.js_similarity([3, 1, 0], [30, 10, 0]) == pytest.approx(
        1.0
    )  # counts do not matter
    assert measures.js_similarity([1, 0], [0, 1]) == 0.0  # disjoint
    # [.5,.5,0] vs [0,.5,.5]: JS divergence 0.5 bit, distance sqrt(0.5).
    assert measures.js_similarity([1, 1, 0], [0, 1, 1]) == pytest.approx(1 - np.sqrt(0.5))
    assert (
        measures.js_similarity([0, 0], [0, 0]) == 1.0
        and measures.js_similarity([0, 0], [1, 0]) == 0.0
    )


def test_ks_similarity_known_values() -> None:
    a = np.arange(100.0)
    assert measures.ks_similarity(a, a) == 1.0
    assert measures.ks_similarity(a, a + 1000) == 0.0
    assert measures.ks_similarity(a, a + 50) == pytest.approx(
        0.5
    )  # CDFs differ by at most one half
    assert measures.ks_similarity(a, a + 50) == measures.ks_similarity(a + 50, a)


def test_order_similarity() -> None:
    files = pd.Index([f"/data/{i}" for i in range(10)], dtype="string")
    assert measures.order_similarity(files, files)[0] == pytest.approx(1.0)
    assert (
        measures.order_similarity(files, files[::-1])[0] == 0.0
    )  # reversed: tau = -1, clipped to 0
    score, details = measures.order_similarity(files[:4], files[2:6])  # 2 shared of 6, same order
    assert score == pytest.approx(1 / 3) and details["shared"] == 2
    rng = np.random.default_rng(0)
    many = pd.Index([f"/data/{i}" for i in range(2000)], dtype="string")
    shuffled, _ = measures.order_similarity(many, many[rng.permutation(2000)])
    assert shuffled < 0.05  # an independent shuffle shares no order


def test_ratio_and_scope_and_ecdf() -> None:
    assert measures.ratio_similarity(2.0, 4.0) == 0.5 and measures.ratio_similarity(0.0, 0.0) == 1.0
    assert measures.ratio_similarity(0.0, 3.0) == 0.0
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


def test_container_start_up_does_not_shift_the_timeline(tmp_path: Path) -> None:
    # A slower container start (image, interpreter, imports) before the workload's first event:
    # the time series cover the workload's own activity, so nothing moves.
    real = load_run(training_run(tmp_path, REAL))
    slow_start = load_run(training_run(tmp_path, EMULATED, startup_s=4.0))
    assert run_span(slow_start) == run_span(real)
    result = scores(compare_runs(real, slow_start))
    for name in ("read_bandwidth", "write_bandwidth", "block_io", "cpu", "memory"):
        assert result[name] == pytest.approx(1.0, abs=1e-9), name


def test_a_run_without_phases_spans_its_manifest(tmp_path: Path) -> None:
    path = training_run(tmp_path, REAL, startup_s=2.0)
    run = load_run(path)
    assert run_span(run) == (int(run.phases["ts_ns"].min()), int(run.phases["end_ns"].max()))
    assert run_span(run)[0] == run.start_ns + 2 * SEC
    (path / "phases.parquet").unlink()  # a traced user container logs no phases
    bare = load_run(path)
    assert len(bare.phases) == 0 and run_span(bare) == (run.start_ns, run.end_ns)


def test_faster_and_shifted_copy(tmp_path: Path) -> None:
    """The same run twice as fast and 1000 s later on the clock: every aspect documented as
    invariant to a time shift and a uniform speed-up stays 1; those sensitive to it drop, the
    bandwidth aspects through their rate term."""
    real = load_run(training_run(tmp_path, REAL))
    fast = load_run(training_run(tmp_path, EMULATED, speed=2.0, clock_shift_s=1000.0))
    comparison = compare_runs(real, fast)
    result = scores(comparison)
    for name in ("read_sizes", "write_sizes", "read_parallelism", "file_order", "file_bytes",
                 "open_close", "cpu", "memory"):  # fmt: skip
        assert result[name] == pytest.approx(1.0, abs=1e-9), name
    # The same bytes at twice the rate: timing, volume and burstiness 1, times the rate, 0.5.
    for name in ("read_bandwidth", "write_bandwidth", "block_io"):
        assert result[name] == pytest.approx(0.5, abs=1e-4), name
    details = comparison.aspect("read_bandwidth").details
    assert details["rate_emulated"] == pytest.approx(2 * details["rate_real"])
    # To the storage under it a run twice as fast is another workload: the overall says so.
    assert comparison.overall < 0.9
    # Steps of 1 s vs 0.5 s: W1 0.5 s, as a fraction of the larger median step (1 s).
    assert result["step_time"] == pytest.approx(0.5)
    # Batch loads of 0.2 vs 0.1 s: 0.1 s apart, a tenth of a step.
    assert result["load_time"] == pytest.approx(0.9)
    assert result["read_interarrival"] < 0.6
    # Checkpoints: same count and bytes; 0.5 vs 0.25 s, a quarter of a (1 s) step apart.
    assert result["checkpoints"] == pytest.approx((1 + 1 + 0.75) / 3)


def test_the_instrumentation_log_is_not_the_workloads_io(tmp_path: Path) -> None:
    """A sleep step logs about eight event-log lines where an original step logs one: the
    tool's own log is left out of both runs; the same writes to another file count."""
    real = load_run(training_run(tmp_path, REAL, log_lines=1))
    logged = load_run(training_run(tmp_path, EMULATED, log_lines=8))
    result = scores(compare_runs(real, logged))
    assert result["write_sizes"] == pytest.approx(1.0, abs=1e-9)
    assert result["write_bandwidth"] == pytest.approx(1.0, abs=1e-9)
    other = "20261121-180000-unet3d-sleep-0003"
    elsewhere = load_run(training_run(tmp_path, other, log_lines=8, log_path="/twintrace/out/x"))
    result = scores(compare_runs(real, elsewhere))
    assert result["write_sizes"] < 0.8


def test_repeat_with_jitter_scores_high(tmp_path: Path) -> None:
    """A repeat of a run as real traces differ: every read burst and the checkpoint moved by up
    to 60 ms (2.4 bins of 25 ms). Two real runs of one configuration differ like this."""
    real = load_run(training_run(tmp_path, REAL, jitter_s=0.06, seed=1))
    repeat = load_run(training_run(tmp_path, EMULATED, jitter_s=0.06, seed=2))
    comparison = compare_runs(real, repeat)
    result = scores(comparison)
    for name, key in (("read_bandwidth", "timing_w1"), ("write_bandwidth", "timing_w1"),
                      ("block_io", "block_read_timing_w1"), ("block_io", "block_write_timing_w1")):  # fmt: skip
        assert result[name] > 0.98, name
        assert comparison.aspect(name).details[key] < 0.006, key  # < 60 ms / 10 s
    assert comparison.overall > 0.97


def test_block_io_counts_only_the_containers_requests(tmp_path: Path) -> None:
    """Another job writing 5 GB to the shared device changes nothing but the evidence."""
    real = load_run(training_run(tmp_path, REAL))
    busy = load_run(training_run(tmp_path, EMULATED, foreign_block_bytes=5 * 2**30))
    block = compare_runs(real, busy).aspect("block_io")
    assert block.score == pytest.approx(1.0)
    assert block.details["block_write_bytes_emulated"] == 4 * MIB
    assert block.details["block_write_not_container_bytes_emulated"] == 5 * 2**30
    assert block.details["block_write_not_container_bytes_real"] == 0


def test_block_io_without_container_requests_is_skipped(tmp_path: Path) -> None:
    events = events_frame(
        {"ts_ns": START_NS + np.arange(4) * SEC, "kind": ["block_write"] * 3 + ["read"],
         "bytes": np.full(4, MIB), "in_container": np.arange(4) == 3}
    )  # fmt: skip
    run = load_run(make_run(tmp_path, REAL, events=events))
    block = compare_runs(run, run).aspect("block_io")
    assert block.score is None
    assert block.skipped == "neither run has block I/O issued by the container"


def test_page_cache_state_is_warned_about(tmp_path: Path) -> None:
    cold = load_run(training_run(tmp_path, REAL, cold_cache=True))
    warm = load_run(training_run(tmp_path, EMULATED))
    comparison = compare_runs(cold, warm)
    assert len(comparison.warnings) == 1
    assert "page-cache misses per byte read: 1.00 real, 0.00 emulated" in comparison.warnings[0]
    assert "drop_caches" in comparison.to_dict()["warnings"][0]
    assert compare_runs(cold, cold).warnings == () and compare_runs(warm, warm).warnings == ()


def test_read_parallelism(tmp_path: Path) -> None:
    """The dataset read by 1, 2 or 4 threads (DataLoader workers): the ratio of effective
    readers; library reads by the main thread are outside the file scope."""
    one = load_run(training_run(tmp_path, REAL, readers=1, extra_files=50))
    two = load_run(training_run(tmp_path, "20261121-170000-unet3d-sleep-0003", readers=2))
    four = load_run(training_run(tmp_path, EMULATED, readers=4))
    assert compare_runs(one, four).aspect("read_parallelism").score == pytest.approx(0.25)
    aspect = compare_runs(two, four).aspect("read_parallelism")
    assert aspect.score == pytest.approx(0.5)
    assert aspect.details["reader_threads_real"] == 2
    assert aspect.details["effective_readers_emulated"] == pytest.approx(4.0)
    assert compare_runs(four, four).aspect("read_parallelism").score == 1.0


def test_memory_is_judged_against_the_footprint(tmp_path: Path) -> None:
    t = START_NS + np.arange(0, 10 * SEC, SEC // 10)

    def run(run_id: str, cache: float) -> Any:
        rows = [(int(x), "container_mem_rss", 1e9, "bytes") for x in t]
        rows += [(int(x), "container_mem_cache", cache, "bytes") for x in t]
        return load_run(make_run(tmp_path, run_id, samples=samples_frame(rows)))

    memory = compare_runs(run(REAL, 0.0), run(EMULATED, 1e8)).aspect("memory")
    # rss equal; page cache 0.1 GB apart in a 1.1 GB container.
    assert memory.details["rss_score"] == pytest.approx(1.0)
    assert memory.details["page_cache_score"] == pytest.approx(1 - 1 / 11)
    assert memory.score == pytest.approx((1 + 1 - 1 / 11) / 2)


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
    # Step k's burst moved from k s to 0.2 k s: 0.8 k s, 3.6 s on average, 0.36 of the run.
    # The bursts keep their shape (burstiness ~1); 64 times fewer bytes (volume 1/64).
    bandwidth = other.aspect("read_bandwidth").details
    assert bandwidth["timing_w1"] == pytest.approx(0.36, abs=1e-9)
    assert bandwidth["volume"] == 1 / 64 and bandwidth["burstiness"] > 0.99
    assert bandwidth["rate"] == pytest.approx(1 / 64)  # the same span, 64 times fewer bytes
    assert result["read_bandwidth"] == pytest.approx(
        (0.64 + 1 / 64 + bandwidth["burstiness"]) / 3 / 64
    )
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
    scored = [a for a in one.aspects if a.score is not None]
    weights = sum(a.weight for a in scored)
    assert one.overall == pytest.approx(
        min(
            weights / sum(a.weight / max(a.score, OVERALL_FLOOR) for a in scored),
            sum(a.weight * a.score for a in scored) / weights,
        )
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
    assert set(data) == {"real", "emulated", "overall", "warnings", "aspects"}
    assert data["warnings"] == []
    assert list(data["aspects"]) == list(ASPECTS)
    sizes = data["aspects"]["read_sizes"]
    assert sizes["measure"] == "JS" and sizes["resource"] == "syscall I/O"
    assert 0.0 <= sizes["score"] < 1.0 and sizes["details"]["median_bytes_emulated"] == MIB
    assert data["aspects"]["cpu"]["skipped"] and data["aspects"]["cpu"]["score"] is None
    assert "burst timing jitter" in data["aspects"]["read_bandwidth"]["invariant_to"]
    assert "bytes read" in data["aspects"]["read_bandwidth"]["sensitive_to"]
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
    assert any(t.startswith("<b>read bandwidth — 0.50 ((W1 time + volume + burstiness) x rate)</b>")
               for t in titles)  # fmt: skip
    assert any("step time — 0.50 (W1 / step)" in t for t in titles)
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
    assert "Plotly.newPlot" in text and len(text) < 1_000_000  # plotly.js is not inside:
    # it is loaded from the one copy beside the page, never from a network
    assert re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", text) == [PLOTLY_JS]
    assert f"Overall similarity {comparison.overall:.3f}" in text
    assert "read request sizes" in text and real.run_id in text and emulated.run_id in text
    assert sorted(p.name for p in out.parent.iterdir()) == ["compare.html", PLOTLY_JS]
    # Inline when asked (a page kept on its own)
    assert len(report_html(real, emulated, comparison)) > 1_000_000


# ---------------------------------------------------------------------------------------------
# Several containers


def test_two_container_run_is_compared_as_a_whole(tmp_path: Path) -> None:
    """The two-container run of tests/synthetic.py: I/O of both containers together, CPU and
    memory summed over them, steps pooled; against itself every score is 1."""
    run = load_run(synthetic.two_container_run(tmp_path))
    comparison = compare_runs(run, run)
    assert comparison.overall == 1.0 and comparison.warnings == ()
    aspects = comparison.to_dict()["aspects"]
    read = aspects["read_bandwidth"]["details"]
    assert read["read_bytes_real"] == 15 * MIB  # 10 MiB by rank0 + 5 MiB by rank1
    assert aspects["write_bandwidth"]["details"]["write_bytes_real"] == 5 * MIB
    # The block read rank0 issued counts; the writeback of no container does not.
    block = aspects["block_io"]["details"]
    assert block["block_read_bytes_real"] == 8 * MIB
    assert block["block_write_not_container_bytes_real"] == MIB
    assert aspects["cpu"]["details"]["mean_cpu_real"] == pytest.approx(150.0)
    assert aspects["memory"]["details"]["mean_mem_rss_bytes_real"] == pytest.approx(3 * 2**30)
    # Steps of 1 s (rank0) and 0.5 s (rank1), both logged as rank 0: pooled, not interleaved.
    steps = aspects["step_time"]["details"]
    assert steps["n_real"] == 10 and steps["median_s_real"] == pytest.approx(0.75)
    # Each checkpoint counts the bytes its own container wrote.
    ckpt = aspects["checkpoints"]["details"]
    assert ckpt["count_real"] == 2 and ckpt["mean_write_bytes_real"] == pytest.approx(2.5 * MIB)
    assert aspects["file_bytes"]["details"]["files_real"] == 15


def test_one_container_of_each_run(tmp_path: Path) -> None:
    run = load_run(synthetic.two_container_run(tmp_path))
    details = compare_runs(run, run, containers=["rank1"]).to_dict()["aspects"]
    assert details["read_bandwidth"]["details"]["read_bytes_real"] == 5 * MIB
    assert details["cpu"]["details"]["mean_cpu_real"] == pytest.approx(50.0)
    assert details["step_time"]["details"]["median_s_real"] == pytest.approx(0.5)
    with pytest.raises(UserError, match="no container 'rank7'.*rank0, rank1"):
        compare_runs(run, run, containers=["rank7"])


def test_different_containers_are_warned_about(tmp_path: Path) -> None:
    """The same rows in one container ``main``: I/O, CPU and memory sums agree (scores 1), and
    the comparison warns that the runs' containers differ."""
    two = load_run(synthetic.two_container_run(tmp_path / "a"))
    merged = {name: getattr(two, name).assign(container="main") for name in ("events", "phases")}
    samples = synthetic.two_container_samples()
    totals = samples.groupby(["ts_ns", "metric", "unit"], as_index=False)["value"].sum()
    host = totals["metric"].str.startswith("host_")
    merged["samples"] = totals.assign(container=np.where(host, None, "main"), host="test")
    one = load_run(
        synthetic.make_run(
            tmp_path / "b",
            "20261121-170000-unet3d-sleep-0c0c",
            trace=TRACE,
            mounts=MOUNTS,
            **merged,
        )
    )
    comparison = compare_runs(two, one)
    assert len(comparison.warnings) == 1
    assert "different containers (real: rank0, rank1; emulated: main)" in comparison.warnings[0]
    got = scores(comparison)
    for name in ("read_bandwidth", "write_bandwidth", "read_sizes", "file_bytes", "cpu", "memory"):
        assert got[name] == 1.0, name
    assert scores(compare_runs(one, two)) == got  # symmetric


def test_a_host_cpu_accelerator_is_compared_on_its_loader_workers(tmp_path: Path) -> None:
    """The real run computes on the host CPU (container CPU 3x the emulated run's, the model's
    compute); the loader workers do the same work in both: the CPU aspect compares them."""
    real = load_run(training_run(tmp_path, REAL, accelerator="cpu", cpu_scale=3, loader_cpu=40))
    emulated = load_run(
        training_run(tmp_path, EMULATED, accelerator="emulated: V100", loader_cpu=40)
    )
    ab = next(a for a in compare_runs(real, emulated).aspects if a.name == "cpu")
    ba = next(a for a in compare_runs(emulated, real).aspects if a.name == "cpu")
    assert ab.score == pytest.approx(1.0) and ba.score == pytest.approx(1.0)
    assert ab.details["compared"].startswith("the data-loader workers' CPU")
    assert ab.details["container_cpu_score"] < 0.7
    assert ab.details["mean_cpu_loader_real"] == pytest.approx(
        ab.details["mean_cpu_loader_emulated"]
    )
    # Loader workers that differ still count.
    busy = "20261121-180000-unet3d-sleep-0003"
    other = load_run(training_run(tmp_path, busy, accelerator="emulated: V100", loader_cpu=120))
    assert next(a for a in compare_runs(real, other).aspects if a.name == "cpu").score < 0.8
    # Two real runs on the CPU: the whole container, compute included.
    twin = load_run(
        training_run(
            tmp_path, "20261121-190000-unet3d-original-0004", accelerator="cpu", loader_cpu=40
        )  # fmt: skip
    )
    whole = next(a for a in compare_runs(real, twin).aspects if a.name == "cpu")
    assert "compared" not in whole.details and whole.score < 0.7
    # Runs without loader samples: the whole container, and the note says what it includes.
    bare = load_run(
        training_run(tmp_path, "20261121-200000-unet3d-sleep-0005", accelerator="emulated: V100")
    )
    noted = next(a for a in compare_runs(real, bare).aspects if a.name == "cpu")
    assert "compute is included" in noted.details["compared"]


def test_the_event_log_path_is_where_workloads_write_it() -> None:
    from tracing.container import OUT_MOUNT

    assert f"{OUT_MOUNT}/mllog.log" == EVENT_LOG_PATH


def test_runs_of_two_datasets_are_compared_by_rank_and_sequentiality() -> None:
    """A run of our dataset against one of DLIO's copy of it: no file in common, so per-file
    shares are matched by rank and the access orders by how sequential each is."""
    from types import SimpleNamespace

    from analysis.similarity.aspects.files import (
        file_order,
        name_order_tau,
        per_file_outcome,
    )

    ours = pd.Series([4.0, 1.0, 2.0, 3.0], index=["/data/c", "/data/a", "/data/d", "/data/b"])
    theirs = pd.Series([30.0, 10.0, 40.0, 20.0], index=[f"/data/img_{i}" for i in (2, 0, 3, 1)])
    outcome = per_file_outcome(ours, theirs, "reads", {})
    assert outcome.details["by_rank"] is True
    assert outcome.score == pytest.approx(1.0)  # the same shares, largest to smallest
    uneven = pd.Series([97.0, 1.0, 1.0, 1.0], index=theirs.index)
    assert per_file_outcome(ours, uneven, "reads", {}).score < 0.8
    # name order: sequential, reversed, shuffled
    assert name_order_tau(pd.Index(["a", "b", "c", "d"])) == pytest.approx(1.0)
    assert name_order_tau(pd.Index(["d", "c", "b", "a"])) == pytest.approx(-1.0)
    shuffled = SimpleNamespace(files_read=ours, file_scope=("/data",))
    in_order = SimpleNamespace(
        files_read=pd.Series(1.0, index=[f"/data/img_{i}" for i in range(4)]), file_scope=("/data",)
    )
    same = file_order(shuffled, SimpleNamespace(files_read=theirs, file_scope=("/data",)))
    assert same.details["by_sequentiality"] is True
    tau = name_order_tau(ours.index)
    assert same.score == pytest.approx(1 - abs(tau - name_order_tau(theirs.index)) / 2)
    apart = file_order(shuffled, in_order)
    assert apart.score == pytest.approx(1 - abs(tau - 1.0) / 2) and apart.score < same.score
