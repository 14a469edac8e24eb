#!/usr/bin/env python3
"""Benchmark: the tracer's cost per system call, on a job that does nothing but small reads.

Method: a container (the base image) writes a 64 MiB file into its own file system (so it is
page-cached), then ``pread``s it in ``--calls`` requests of ``--size`` bytes in a loop and
prints the loop's own time (start-up and file creation are outside it). The same job is run
traced (``./cli.py trace --image``: bpftrace and the samplers) and untraced (the same container
started the same way, tracing off), alternated A/B then B/A for ``--rounds`` rounds at each
request size. Printed per size: untraced/traced loop time per round, its median and spread
(min..max), and the traced run's pread64 count and bytes against the job's (the trace must be
complete whatever it costs: exactly ``calls + 1`` preads of the file, one warm-up included).

Goals (issue "Tracing at any event rate"): >= 0.7 at 4 KiB, >= 0.9 at 64 KiB.

With ``--floor``, each round also runs the job untraced while bpftrace holds bare probes that
do nothing but the minimum (:data:`FLOORS`): on ``sys_enter_pread64``/``sys_exit_pread64``
the entry time kept per thread, read and deleted at exit (what a latency needs), or a count at
exit alone (what counts and bytes need), on syscall tracepoints and on raw tracepoints, with
the host's bpftrace 0.17 and twintrace/tracer's 0.23, scoped to every task (``cgroup``
filter off): the cost of merely hooking a system call on this kernel, below which no tracer
of that kind can go. Printed as untraced/floor, one line per floor.

    python bench/tracer_storm.py --sizes 4KiB,64KiB --rounds 3 --calls 200000

Run as root with the images built, on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.spread import median_spread  # noqa: E402
from core.units import parse_size  # noqa: E402
from tracing.container import BindMount  # noqa: E402
from tracing.request import RunOptions, image_request  # noqa: E402
from tracing.runner import trace  # noqa: E402
from workloads.config import BASE_TAG  # noqa: E402

FILE = "/tmp/storm.bin"
FILE_BYTES = 64 << 20
#: The job: argv size, calls. Prints "STORM <seconds>" for the pread loop alone.
JOB = f"""
import os, sys, time
size, calls = int(sys.argv[1]), int(sys.argv[2])
with open({FILE!r}, "wb") as f:
    f.write(os.urandom({FILE_BYTES}))
fd = os.open({FILE!r}, os.O_RDONLY)
span = {FILE_BYTES} // size
os.pread(fd, size, 0)
t = time.perf_counter()
for i in range(calls):
    os.pread(fd, size, (i % span) * size)
print("STORM", time.perf_counter() - t, flush=True)
"""
_STORM_RE = re.compile(r"STORM (\S+)")


def run_job(
    size: int,
    calls: int,
    runs: Path,
    traced: bool,
    *,
    environment: Mapping[str, str] | None = None,
    mounts: Sequence[BindMount] = (),
) -> tuple[float, Path]:
    """One run of the job; (its loop time in seconds, its run directory). ``environment`` and
    ``mounts`` are the container's (bench/tracer_peers.py runs another tracer inside it)."""
    request = image_request(
        BASE_TAG,
        ["python3", "-c", JOB, str(size), str(calls)],
        runs,
        mounts=mounts,
        environment=environment,
        run=RunOptions(tracing=traced),
    )
    run_dir = trace(request).check()
    log = (run_dir / "raw" / "main" / "container.log").read_text()
    match = _STORM_RE.search(log)
    if match is None:
        raise SystemExit(f"{run_dir}: the job printed no STORM line: {log[-500:]}")
    return float(match.group(1)), run_dir


def traced_preads(run_dir: Path) -> tuple[int, int]:
    """pread64 calls on the job's file and their bytes, from the traced run's events (rows
    weighted by their ``count``)."""
    table = pq.read_table(run_dir / "events.parquet", columns=["kind", "path", "count", "bytes"])
    mask = pc.and_(pc.equal(table["kind"], "pread64"), pc.equal(table["path"], FILE))
    rows = table.filter(mask)
    return int(pc.sum(rows["count"]).as_py() or 0), int(pc.sum(rows["bytes"]).as_py() or 0)


#: The floors' probes, each the least a tracer of that kind does: (label, where bpftrace runs,
#: script). "host" is the host's bpftrace (Debian 12: 0.17); "image" is twintrace/tracer's
#: (Debian 13: 0.23) in its container (tracing/tracer_container.py). Enter+exit keeps each call's entry
#: time per thread and reads it at exit, what a latency needs; exit-only counts calls, what
#: counts and bytes need. Syscall tracepoints fire for pread64 only; raw tracepoints fire for
#: every system call of every task (and the program must tell them apart).
FLOORS: tuple[tuple[str, str, str], ...] = (
    (
        "tracepoint enter+exit, bpftrace 0.17",
        "host",
        "tracepoint:syscalls:sys_enter_pread64 { @s[tid] = nsecs; }\n"
        "tracepoint:syscalls:sys_exit_pread64 /@s[tid]/ { $l = nsecs - @s[tid]; delete(@s[tid]); }",
    ),
    (
        "tracepoint enter+exit, bpftrace 0.23",
        "image",
        "tracepoint:syscalls:sys_enter_pread64 { @s[tid] = nsecs; }\n"
        "tracepoint:syscalls:sys_exit_pread64 /@s[tid]/ { $l = nsecs - @s[tid]; delete(@s[tid]); }",
    ),
    (
        "raw tracepoint enter+exit, bpftrace 0.23",
        "image",
        "rawtracepoint:sys_enter { @s[tid] = nsecs; }\n"
        "rawtracepoint:sys_exit /@s[tid]/ { $l = nsecs - @s[tid]; delete(@s[tid]); }",
    ),
    (
        "tracepoint exit only, bpftrace 0.23",
        "image",
        "tracepoint:syscalls:sys_exit_pread64 { @n = count(); }",
    ),
    (
        "raw tracepoint exit only, bpftrace 0.23",
        "image",
        "rawtracepoint:sys_exit { @n = count(); }",
    ),
)
_READY = 'BEGIN { system("touch %s", str($1)); }\n'
_END = "\nEND { clear(@s); }\n"


def run_floor(size: int, calls: int, runs: Path, where: str, script: str) -> float:
    """The job's loop time, untraced, while one floor's bare probes are attached."""
    from tracing.container import client
    from tracing.tracer_container import start_tracer

    runs.mkdir(parents=True, exist_ok=True)
    ready = runs / "floor.ready"
    ready.unlink(missing_ok=True)
    text = _READY + script + (_END if "@s[" in script else "\n")
    # BEGIN runs once every probe is attached; it creates the file (--unsafe: for system()).
    argv = ["bpftrace", "--unsafe", "-e", text, ready.name]
    proc = tracer = None
    if where == "host":
        proc = subprocess.Popen(
            argv, cwd=runs, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    else:
        tracer = start_tracer(client(), argv, runs, f"twintrace-floor-{time.monotonic_ns()}")
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc is not None:
                ended = proc.poll() is not None
            else:
                tracer.reload()
                ended = tracer.status != "running"
            if ended or time.monotonic() > deadline:
                logs = tracer.logs().decode(errors="replace")[-500:] if tracer else ""
                raise SystemExit(f"bpftrace did not attach the floor's probes (run as root) {logs}")
            time.sleep(0.1)
        seconds, run_dir = run_job(size, calls, runs, False)
        shutil.rmtree(run_dir)
        return seconds
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        if tracer is not None:
            tracer.remove(force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4KiB,64KiB")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--floor", action="store_true", help="also measure the probes' floor")
    args = parser.parse_args()
    # The host's bpftrace row only where the host has one (twintrace needs none).
    measured = [f for f in FLOORS if f[1] == "image" or shutil.which("bpftrace")]
    work = Path(tempfile.mkdtemp(prefix="twintrace-storm-"))
    try:
        for size_text in args.sizes.split(","):
            size = parse_size(size_text)
            ratios: list[float] = []
            floors: dict[str, list[float]] = {label: [] for label, _, _ in measured}
            for i in range(args.rounds):
                times = {}
                for traced in (True, False) if i % 2 == 0 else (False, True):
                    times[traced], run_dir = run_job(size, args.calls, work / "runs", traced)
                    if traced:
                        calls, nbytes = traced_preads(run_dir)
                    shutil.rmtree(run_dir)
                ratios.append(times[False] / times[True])
                floor = ""
                if args.floor:
                    for label, where, script in measured:
                        seconds = run_floor(size, args.calls, work / "runs", where, script)
                        floors[label].append(times[False] / seconds)
                    floor = "; untraced/floor " + ", ".join(
                        f"{values[-1]:.3f}" for values in floors.values()
                    )
                expected = (args.calls + 1, (args.calls + 1) * size)
                complete = "complete" if (calls, nbytes) == expected else "INCOMPLETE"
                print(
                    f"{size_text} round {i + 1}: untraced {times[False]:.3f} s, traced "
                    f"{times[True]:.3f} s, untraced/traced {ratios[-1]:.3f}; traced preads "
                    f"{calls} ({nbytes} B) of {expected[0]} ({expected[1]} B): {complete}{floor}",
                    flush=True,
                )
            print(
                f"{size_text}: untraced/traced = {median_spread(ratios)}, median of {args.rounds}"
            )
            for label, values in floors.items():
                if values:
                    print(f"{size_text}: untraced/floor = {median_spread(values)}: {label}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
