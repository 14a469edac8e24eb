#!/usr/bin/env python3
"""Benchmark: parsing a raw bpftrace trace into events.parquet.

Method: build a raw run directory whose syscalls.txt holds N events (default 5,000,000) by
repeating the real bpftrace output saved in tests/data/raw/syscalls.txt with shifted timestamps
and pids (so the fd -> path join has real work to do). Then, alternating A/B for --rounds rounds:
  A: tracing.ingest.build_events + writing events.parquet (the full ingest path)
  B: a plain pandas.read_csv of the same file (tab-separated, no further processing)
Prints events/s of A and the ratio time(B) / time(A) (> 1 means ingest is faster than plain
pandas parsing even though it does more).

Usage: python bench/trace_ingest.py [--events 5000000] [--rounds 3] [--dir /tmp/ingest-bench]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from core.rundir import EVENTS_COLUMNS, write_table  # noqa: E402
from tracing import ingest  # noqa: E402

SAMPLE = REPO / "tests" / "data" / "raw" / "syscalls.txt"


def make_raw(raw: Path, n_events: int) -> int:
    lines = [line for line in SAMPLE.read_text().splitlines() if line[:1].isdigit()]
    rows = [line.split("\t") for line in lines]
    t0 = int(rows[0][0])
    span = int(rows[-1][0]) - t0 + 1000
    raw.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(raw / "syscalls.txt", "w") as out:
        out.write("Attaching 26 probes...\nREADY 1\n")
        rep = 0
        while written < n_events:
            shift = rep * span
            pid_shift = rep * 100_000
            chunk = []
            for r in rows:
                if written >= n_events:
                    break
                chunk.append(
                    "\t".join(
                        [
                            str(int(r[0]) + shift),
                            r[1],
                            str(int(r[2]) + pid_shift),
                            str(int(r[3]) + pid_shift),
                            *r[4:],
                        ]
                    )
                )
                written += 1
            out.write("\n".join(chunk) + "\n")
            rep += 1
    return written


def run_ingest(raw: Path, out: Path) -> float:
    t = time.perf_counter()
    table, _ = ingest.build_events(raw)
    write_table(out, table, EVENTS_COLUMNS)
    return time.perf_counter() - t


def run_pandas(raw: Path) -> float:
    t = time.perf_counter()
    pd.read_csv(
        raw / "syscalls.txt",
        sep="\t",
        header=None,
        names=list(ingest._SYSCALL_COLUMNS),
        skiprows=2,
        quoting=3,
        keep_default_na=False,
    )
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="twintrace-ingest-bench-"))
    raw = base / "raw"
    try:
        n = make_raw(raw, args.events)
        size = (raw / "syscalls.txt").stat().st_size
        print(f"raw trace: {n} events, {size / 1e6:.0f} MB")
        a_times, b_times = [], []
        for i in range(args.rounds):
            a_times.append(run_ingest(raw, base / "events.parquet"))
            b_times.append(run_pandas(raw))
            print(f"round {i + 1}: ingest {a_times[-1]:.2f} s, pandas.read_csv {b_times[-1]:.2f} s")
        a, b = statistics.median(a_times), statistics.median(b_times)
        print(f"ingest: {n / a / 1e6:.2f} M events/s (median of {args.rounds})")
        print(f"pandas.read_csv: {n / b / 1e6:.2f} M events/s")
        print(f"ratio pandas_time / ingest_time = {b / a:.2f}")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
