"""A long traced run at a high event rate, in its reduced (2-minute) CI form: the tool's memory
stays flat, the raw files grow within their budget and the counts stay exact. The full form
(an hour) is bench/long_run.py, whose pieces these tests use; the budget is in
docs/run-format.md ("Budget of a long run").

Also, without Docker: the sampler's memory rows themselves (``sampler_rss``,
``tracer_rss_<script>``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.long_run import (
    BLOCK_LINE_BUDGET,
    OTHER_RAW_BUDGET,
    RSS_GROWTH_BOUND,
    SYSCALLS_BUDGET,
    LongRun,
    block_line_bytes,
    raw_rates,
    raw_sizes,
    rss_growth,
    rss_samples,
    run_long,
    traced_counts,
)
from store.rundir import SAMPLES_COLUMNS
from tracing.ingest import build_samples
from tracing.samplers import SAMPLER_RSS, Sampler, process_rss

#: Job time of the CI form.
SECONDS = 120
#: The scripts whose bpftrace process must show a flat resident set.
SCRIPTS = ("syscalls", "block", "cache", "proc")


def _long(test):  # noqa: ANN001, ANN202
    """The marks of a test of the traced run (never skipped with CI=true)."""
    for mark in (pytest.mark.integration, pytest.mark.docker, pytest.mark.bpftrace):
        test = mark(test)
    return test


def test_the_sampler_records_its_own_and_watched_processes_rss(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    child = subprocess.Popen(["sleep", "30"])
    try:
        sampler = Sampler(raw / "samples.csv", {}, interval=0.02)
        sampler.start()
        time.sleep(0.1)
        sampler.watch({"tracer_rss_sleep": child.pid})
        time.sleep(0.15)
        child.kill()
        child.wait()
        time.sleep(0.1)  # samples after the watched process exited
        sampler.stop()
    finally:
        child.kill()
    assert sampler.error is None
    samples = build_samples(raw)
    assert dict(samples.dtypes.astype(str)) == dict(SAMPLES_COLUMNS)
    own = samples[samples["metric"] == SAMPLER_RSS]
    watched = samples[samples["metric"] == "tracer_rss_sleep"]
    # Every sample has the sampling process's RSS; the watched one only from watch() on, and
    # no row once it has exited. Host-wide rows (no container), in bytes.
    assert len(own) == sampler.samples >= 10
    assert 3 <= len(watched) < len(own)
    assert watched["ts_ns"].min() > own["ts_ns"].min()
    assert watched["ts_ns"].max() < own["ts_ns"].max()
    assert own["container"].isna().all() and watched["container"].isna().all()
    assert set(own["unit"]) == set(watched["unit"]) == {"bytes"}
    # Plausible sizes: this Python process holds tens of MiB, sleep well under that.
    assert own["value"].min() > 10 * 2**20
    assert 0 < watched["value"].max() < own["value"].min()


def test_the_sampler_records_watched_processes_cpu(tmp_path: Path) -> None:
    """A watched process that spins shows most of a core; one that sleeps, none of it."""
    raw = tmp_path / "raw"
    raw.mkdir()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen(["sleep", "30"])
    try:
        sampler = Sampler(raw / "samples.csv", {}, interval=0.05)
        sampler.watch({"tracer_rss_busy": busy.pid, "tracer_rss_idle": idle.pid})
        sampler.start()
        time.sleep(1.5)
        sampler.stop()
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
    assert sampler.error is None
    samples = build_samples(raw)
    metric = samples["metric"]
    cpu = samples[(metric == "sampler_cpu") | metric.str.startswith("tracer_cpu_")]
    means = cpu.groupby("metric")["value"].mean()
    assert set(means.index) == {"sampler_cpu", "tracer_cpu_busy", "tracer_cpu_idle"}
    assert set(cpu["unit"]) == {"percent"} and cpu["container"].isna().all()
    assert means["tracer_cpu_busy"] > 40 and means["tracer_cpu_idle"] == 0


def test_process_rss_reads_statm_in_pages(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "statm").write_text("1000 300 50 10 0 200 0\n")
    assert process_rss(42, tmp_path) == 300 * os.sysconf("SC_PAGE_SIZE")
    assert process_rss(43, tmp_path) is None  # exited
    assert process_rss(os.getpid()) > 0  # the real file


@pytest.fixture(scope="module")
def long_run(images, tmp_path_factory: pytest.TempPathFactory) -> LongRun:
    """One 2-minute traced storm (bench/long_run.py's job): one busy thread of 4 KiB preads of
    a page-cached file, and open/pread/close rounds of 3 small files every 0.1 s."""
    return run_long(tmp_path_factory.mktemp("long") / "runs", SECONDS, progress=lambda m: None)


@_long
def test_the_long_run_completes_without_loss(long_run: LongRun) -> None:
    assert long_run.status == "completed"  # not lossy: the tracer lost nothing
    assert long_run.duration_s >= SECONDS
    # A storm indeed: far more calls than the tracer prints one by one (400 a second).
    assert long_run.preads / long_run.duration_s > 20_000


@_long
def test_tracer_and_sampler_memory_stay_flat(long_run: LongRun) -> None:
    """The max over the run's last half minus the median of its second quarter: within
    RSS_GROWTH_BOUND (bench/long_run.py says why that bound) for each bpftrace process and the
    sampling process, sampled all along (10 a second)."""
    growth = {g.metric: g for g in rss_growth(long_run, rss_samples(long_run))}
    assert set(growth) == {SAMPLER_RSS, *(f"tracer_rss_{s}" for s in SCRIPTS)}
    for g in growth.values():
        assert g.samples >= 5 * SECONDS, g  # sampled all along
        assert g.growth <= RSS_GROWTH_BOUND, (
            f"{g.metric} grew from {g.first_median / 2**20:.1f} MiB (median, second quarter) to "
            f"{g.last_max / 2**20:.1f} MiB (max, last half)"
        )


@_long
def test_raw_files_grow_within_the_budget(long_run: LongRun) -> None:
    sizes = raw_sizes(long_run)
    per_thread, rest = raw_rates(long_run, sizes)
    assert per_thread <= SYSCALLS_BUDGET, (
        f"raw/syscalls.txt grew {per_thread:,.0f} B/s per busy thread: over the budget of "
        f"{SYSCALLS_BUDGET:,} B/s ({sizes})"
    )
    assert rest <= OTHER_RAW_BUDGET, (
        f"raw/ without syscalls.txt and block.txt grew {rest:,.0f} B/s: over the budget of "
        f"{OTHER_RAW_BUDGET:,} B/s ({sizes})"
    )
    # block.txt follows the whole device's requests (not the job's calls): bounded per request.
    assert block_line_bytes(long_run, sizes) <= BLOCK_LINE_BUDGET


@_long
def test_the_long_run_counts_are_exact(long_run: LongRun) -> None:
    """Every call the job made, in the trace with its bytes: the big file's preads (almost all
    of them aggregated) and the small files' opens, preads and closes."""
    assert traced_counts(long_run) == long_run.expected()
