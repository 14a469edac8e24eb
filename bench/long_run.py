#!/usr/bin/env python3
"""Benchmark: a long traced run at a high event rate keeps the tool's memory and raw files bounded.

Method: one container (the base image) runs a storm for ``--minutes``: each of ``--threads``
threads ``pread``s the 64 MiB page-cached file of bench/tracer_storm.py in ``--size`` requests as
fast as it can, and every 0.1 s the first thread also opens, reads once and closes each of 3
small files, so per-call lines (openat, close, their preads) keep coming between the aggregated
reads. The job counts its own calls and prints them when it ends. The run is traced like any
other (``tracing.runner.trace``: the bpftrace scripts and the samplers); then, from its
directory:

- memory: the samples ``tracer_rss_<script>`` (each bpftrace process) and ``sampler_rss`` (the
  twintrace process, whose thread samples), printed per ``--every`` minutes (or a quarter of a
  shorter run; max in each window); their growth, the max over the run's last half minus the
  median of its second quarter (the first is warm-up), against :data:`RSS_GROWTH_BOUND`;
- raw files: the size of each file of ``raw/`` and its growth rate over the run, bytes per second
  (per busy thread for ``syscalls.txt``), against the budget of docs/run-format.md ("Budget of
  a long run"): :data:`SYSCALLS_BUDGET` and :data:`OTHER_RAW_BUDGET`;
- ingest: the processing time inside the run (raw files to tables and summary), and the time and
  peak memory (``ru_maxrss``) of ``tracing.ingest`` on the same raw files in a fresh process;
- counts: the traced preads of the big file, opens, closes and preads of the small files
  (events weighted by ``count``) against the job's own: exact or not.

    python bench/long_run.py                  # the full form: 60 minutes
    python bench/long_run.py --minutes 2      # the CI form (tests/test_long_run.py asserts it)

Run as root with the images built. The run directory is written under ``--out`` (default: a
temporary directory, removed at the end).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from bench.tracer_storm import FILE, FILE_BYTES  # noqa: E402
from core.units import parse_size  # noqa: E402
from tracing.samplers import SAMPLER_RSS  # noqa: E402
from workloads.config import BASE_TAG  # noqa: E402

#: raw/syscalls.txt growth allowed per second per busy thread (docs/run-format.md). The tracer
#: prints at most 4 reads/writes of a thread per 10 ms bin one by one (400 lines/s of ~62 B:
#: 24 KiB/s) and folds the rest into aggregated rows (~90 B), one per file, request-size and
#: latency bucket of each bin: a storm on one file spreads over ~5 latency buckets (~45 KiB/s).
#: That is ~70 KiB/s; the budget leaves a third more for a wider spread of latencies, and fails
#: a tracer that prints its aggregates twice as often.
SYSCALLS_BUDGET = 96 * 1024
#: Growth of the rest of raw/ but block.txt (samples.csv at the default 0.1 s interval,
#: cache.txt, proc.txt, logs, scripts) allowed per second, for one container without GPUs.
OTHER_RAW_BUDGET = 12 * 1024
#: raw/block.txt bytes allowed per block request (one line per request of the whole device:
#: its size follows the device's activity, not the job's calls).
BLOCK_LINE_BUDGET = 128
#: How much the resident set of a bpftrace process or of the sampling process may grow from the
#: second quarter of a run to its second half (max of the second half minus median of the second
#: quarter). Flat measures 0.0 MiB for bpftrace and 0.1 MiB for the sampler over 2 minutes (the Python process
#: takes up to ~1 MiB of arenas in its first seconds). 2 MiB still catches, in the 2-minute
#: form, a bpftrace leaking 40 B per line it prints (~1000 a second: 2.3 MiB in the last minute)
#: and, in the hour, a sampler leaking 120 B per sample (18 000 in the last half-hour).
RSS_GROWTH_BOUND = 2 << 20
#: Small files the job opens, reads once and closes every OPEN_EVERY_S seconds.
SMALL_FILES = tuple(f"/tmp/small{i}.bin" for i in range(3))
OPEN_EVERY_S = 0.1

#: The job: argv seconds, request size, threads. Prints "LONGRUN <preads of FILE> <rounds>"
#: where a round opens, preads once and closes every small file.
JOB = f"""
import os, sys, threading, time
seconds, size, threads = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with open({FILE!r}, "wb") as f:
    f.write(os.urandom({FILE_BYTES}))
for name in {SMALL_FILES!r}:
    with open(name, "wb") as f:
        f.write(os.urandom(size))
span = {FILE_BYTES} // size
preads, rounds = [0] * threads, [0]
end = time.monotonic() + seconds

def storm(k):
    fd = os.open({FILE!r}, os.O_RDONLY)
    i, next_round = k * 997, 0.0
    while True:
        for _ in range(1000):
            os.pread(fd, size, (i % span) * size)
            i += 1
        preads[k] += 1000
        now = time.monotonic()
        if k == 0 and now >= next_round:
            next_round = now + {OPEN_EVERY_S}
            for name in {SMALL_FILES!r}:
                small = os.open(name, os.O_RDONLY)
                os.pread(small, size, 0)
                os.close(small)
            rounds[0] += 1
        if now >= end:
            break
    os.close(fd)

workers = [threading.Thread(target=storm, args=(k,)) for k in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
print("LONGRUN", sum(preads), rounds[0], flush=True)
"""
_LONGRUN_RE = re.compile(r"LONGRUN (\d+) (\d+)")


@dataclasses.dataclass(frozen=True)
class LongRun:
    """One traced run of the job and what the job said it did."""

    run_dir: Path
    status: str
    size: int
    threads: int
    preads: int  # of FILE, by all threads
    rounds: int  # each opens, preads once and closes every small file
    start_ns: int
    end_ns: int
    processing_s: float  # raw files to tables and summary, inside the run
    error: str | None  # the manifest's: what a lossy run lost

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def expected(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(kind, path) -> (calls, bytes) the job made: the writes that create the small files
        open and close each once more."""
        out = {("pread64", FILE): (self.preads, self.preads * self.size)}
        for name in SMALL_FILES:
            out[("openat", name)] = (self.rounds + 1, 0)
            out[("close", name)] = (self.rounds + 1, 0)
            out[("pread64", name)] = (self.rounds, self.rounds * self.size)
        return out


def run_long(
    runs: Path, seconds: float, size: int = 4096, threads: int = 1, progress=print
) -> LongRun:
    """Trace the job for ``seconds`` with ``./cli.py trace --image`` in a process of its own, as
    a user runs it: its ``sampler_rss`` is then the memory of a twintrace process and nothing
    else (not of a test runner that has run hundreds of tests). SystemExit if the run failed."""
    command = [
        sys.executable,
        str(REPO / "cli.py"),
        "trace",
        "--image",
        BASE_TAG,
        "--out",
        str(runs),
        "--timeout",
        str(seconds + 600),
        "--quiet",
        "--",
        "python3",
        "-c",
        JOB,
        str(seconds),
        str(size),
        str(threads),
    ]
    processing = None
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        tail: list[str] = []
        for line in proc.stderr:
            if "processing the trace" in line:
                processing = time.monotonic()
            progress(line.rstrip("\n"))
            tail = [*tail[-19:], line]
        out = proc.stdout.read()
        code = proc.wait()
    processing_s = time.monotonic() - processing if processing is not None else float("nan")
    if code != 0 or not out.strip():
        raise SystemExit(f"the traced run failed (exit {code}): {''.join(tail)[-2000:]}")
    run_dir = Path(out.strip().splitlines()[-1])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    log = (run_dir / "raw" / "main" / "container.log").read_text()
    match = _LONGRUN_RE.search(log)
    if match is None:
        raise SystemExit(f"{run_dir}: the job printed no LONGRUN line: {log[-500:]}")
    return LongRun(
        run_dir,
        manifest["status"],
        size,
        threads,
        int(match.group(1)),
        int(match.group(2)),
        manifest["start_ns"],
        manifest["end_ns"],
        processing_s,
        manifest.get("error"),
    )


def rss_samples(run: LongRun) -> pd.DataFrame:
    """The run's memory samples (``tracer_rss_*``, ``sampler_rss``): ts_ns, metric, value."""
    samples = pd.read_parquet(run.run_dir / "samples.parquet", columns=["ts_ns", "metric", "value"])
    metric = samples["metric"].astype(str)
    keep = metric.str.startswith("tracer_rss_") | (metric == SAMPLER_RSS)
    return samples[keep].assign(metric=metric[keep]).reset_index(drop=True)


@dataclasses.dataclass(frozen=True)
class Growth:
    """A process's resident set over a run: median of the second quarter, max of the last half."""

    metric: str
    first_median: float
    last_max: float
    samples: int

    @property
    def growth(self) -> float:
        return self.last_max - self.first_median


def rss_growth(run: LongRun, rss: pd.DataFrame) -> list[Growth]:
    """The growth of every memory metric over the run (samples of the run's span only): the max
    over its last half minus the median of its second quarter. The first quarter is warm-up: a
    process that touches new memory once (a first garbage collection, a code path run for the
    first time: the runner's process grew by 0.9 MiB in one step 20 s into a 2-minute run) has
    not leaked; a leak keeps growing through the second half."""
    middle = (run.start_ns + run.end_ns) // 2
    warm = run.start_ns + (run.end_ns - run.start_ns) // 4
    out = []
    for metric, rows in rss.groupby("metric", sort=True):
        rows = rows[(rows["ts_ns"] >= run.start_ns) & (rows["ts_ns"] <= run.end_ns)]
        first = rows[(rows["ts_ns"] >= warm) & (rows["ts_ns"] < middle)]["value"]
        last = rows[rows["ts_ns"] >= middle]["value"]
        if len(first) and len(last):
            out.append(Growth(str(metric), float(first.median()), float(last.max()), len(rows)))
    return out


def raw_sizes(run: LongRun) -> dict[str, int]:
    """Every file of the run's raw/ (relative name) and its size in bytes."""
    raw = run.run_dir / "raw"
    return {
        str(p.relative_to(raw)): p.stat().st_size for p in sorted(raw.rglob("*")) if p.is_file()
    }


def raw_rates(run: LongRun, sizes: dict[str, int]) -> tuple[float, float]:
    """(syscalls.txt bytes per second per busy thread, the rest of raw/ but block.txt in bytes
    per second)."""
    syscalls = sizes.get("syscalls.txt", 0)
    rest = sum(sizes.values()) - syscalls - sizes.get("block.txt", 0)
    return syscalls / run.duration_s / run.threads, rest / run.duration_s


def block_line_bytes(run: LongRun, sizes: dict[str, int]) -> float:
    """raw/block.txt bytes per block request traced (0 without any)."""
    kinds = pd.read_parquet(run.run_dir / "events.parquet", columns=["kind"])["kind"].astype(str)
    requests = int(kinds.str.startswith("block_").sum())
    return sizes.get("block.txt", 0) / requests if requests else 0.0


def traced_counts(run: LongRun) -> dict[tuple[str, str], tuple[int, int]]:
    """(kind, path) -> (calls, bytes) of the job's files in the trace, rows weighted by
    ``count``."""
    frame = pd.read_parquet(
        run.run_dir / "events.parquet", columns=["kind", "path", "count", "bytes"]
    )
    paths = {path for _, path in run.expected()}
    frame = frame[frame["path"].isin(paths)].astype({"kind": str, "path": str})
    sums = frame.groupby(["kind", "path"])[["count", "bytes"]].sum()
    return {
        key: (int(sums.loc[key, "count"]), int(sums.loc[key, "bytes"]))
        if key in sums.index
        else (0, 0)
        for key in run.expected()
    }


_INGEST = """
import json, sys, time
from pathlib import Path
from tracing import ingest

def status(key):  # kiB
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1])

raw, roots = Path(sys.argv[1]), {int(k): v for k, v in json.loads(sys.argv[2]).items()}
base = status("VmRSS")
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from here on
t = time.perf_counter()
events, stats = ingest.build_events(raw, roots)
samples = ingest.build_samples(raw)
print(json.dumps({"seconds": time.perf_counter() - t, "rows": events.num_rows,
                  "base_kib": base, "peak_kib": status("VmHWM")}))
"""


def ingest_cost(run: LongRun) -> dict:
    """Time and peak memory of tracing.ingest on the run's raw files, in a fresh process:
    ``seconds``, ``rows`` (events), ``base_kib`` (resident after imports) and ``peak_kib`` (the
    peak resident set while ingesting: VmHWM, reset once the modules are imported)."""
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    roots = {str(c["main_pid"]): c["role"] for c in manifest["containers"] if c["main_pid"]}
    result = subprocess.run(
        [sys.executable, "-c", _INGEST, str(run.run_dir / "raw"), json.dumps(roots)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def report(run: LongRun, every_s: float) -> bool:
    """Print the run's memory, raw files, ingest and counts; True when every check passed."""
    ok = run.status == "completed"
    print(
        f"run {run.run_dir.name}: {run.status}, {run.duration_s:.0f} s, {run.threads} busy "
        f"thread(s), {run.preads} preads of {run.size} B ({run.preads / run.duration_s:.0f}/s), "
        f"{run.rounds} open/pread/close rounds"
    )
    if run.error:
        print(f"  {run.error}")
    rss = rss_samples(run)
    print(f"\nresident set (MiB, max per {every_s / 60:g} min window):")
    metrics = sorted(rss["metric"].unique())
    print("  window (min)  " + "  ".join(f"{m:>20}" for m in metrics))
    rss = rss.assign(window=(rss["ts_ns"] - run.start_ns) // int(every_s * 1e9))
    for window, rows in rss[rss["ts_ns"] >= run.start_ns].groupby("window"):
        peak = rows.groupby("metric")["value"].max()
        label = f"{window * every_s / 60:g}-{(window + 1) * every_s / 60:g}"
        print(f"  {label:>12}  " + "  ".join(f"{_mib(peak.get(m, 0)):>20}" for m in metrics))
    print(f"\nresident set growth (bound {_mib(RSS_GROWTH_BOUND)} MiB):")
    for g in rss_growth(run, rss):
        flat = g.growth <= RSS_GROWTH_BOUND
        ok &= flat
        print(
            f"  {g.metric:>22}: second quarter median {_mib(g.first_median)} MiB, last half max "
            f"{_mib(g.last_max)} MiB, growth {_mib(g.growth)} MiB: {'flat' if flat else 'GROWS'}"
        )
    sizes = raw_sizes(run)
    print("\nraw files:")
    for name, size in sizes.items():
        print(f"  {name:>24}: {size:>14,} B  {size / run.duration_s:>12,.0f} B/s")
    per_thread, rest = raw_rates(run, sizes)
    per_request = block_line_bytes(run, sizes)
    within = (
        per_thread <= SYSCALLS_BUDGET
        and rest <= OTHER_RAW_BUDGET
        and per_request <= BLOCK_LINE_BUDGET
    )
    ok &= within
    print(
        f"  syscalls.txt {per_thread:,.0f} B/s per busy thread (budget {SYSCALLS_BUDGET:,}); "
        f"block.txt {per_request:.0f} B per block request (budget {BLOCK_LINE_BUDGET}); the "
        f"rest {rest:,.0f} B/s (budget {OTHER_RAW_BUDGET:,}): "
        f"{'within budget' if within else 'OVER BUDGET'}"
    )
    cost = ingest_cost(run)
    print(
        f"\ningest: {run.processing_s:.1f} s inside the run (tables and summary); in a fresh "
        f"process {cost['seconds']:.1f} s for {cost['rows']:,} events, peak memory "
        f"{cost['peak_kib'] / 1024:.0f} MiB ({cost['base_kib'] / 1024:.0f} MiB after imports)"
    )
    traced, expected = traced_counts(run), run.expected()
    print("\ncounts (traced / the job's):")
    for key, want in expected.items():
        got = traced[key]
        ok &= got == want
        print(f"  {key[0]:>8} {key[1]:<20} {got[0]:>12,} / {want[0]:>12,} calls, "
              f"{got[1]:>16,} / {want[1]:>16,} B: {'exact' if got == want else 'WRONG'}")  # fmt: skip
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--size", default="4KiB", help="pread request size")
    parser.add_argument("--threads", type=int, default=1, help="busy threads")
    parser.add_argument("--every", type=float, default=5.0, help="RSS window, minutes")
    parser.add_argument("--out", type=Path, help="keep the run directory under this directory")
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="twintrace-long-"))
    try:
        run = run_long(work, args.minutes * 60, parse_size(args.size), args.threads)
        ok = report(run, min(args.every * 60, max(run.duration_s / 4, 1.0)))
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
