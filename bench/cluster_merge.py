#!/usr/bin/env python3
"""Benchmark: merging the hosts' events of a run across nodes into one events.parquet, against
the number of nodes (1 to 64), so that the cost of a 100-node run is measured, not guessed.

Method: one node's events.parquet made the way a run makes it (``bench/trace_ingest.py``'s
synthetic raw trace of a busy training container, ``--lines`` lines, through
``tracing.ingest.write_events`` with a host), then copied as the output of N nodes: node i's
rows with its own host name and its times shifted by i x 137 us, so that the nodes' rows
interleave as theirs do in a run. Per round, every node count (1, 2, 3, 8, 16, 32, 64 by
default; the order rotates every round) is merged with ``tracing.ingest.merge_events`` (what
the runner calls once each host's part is ingested), timed alone. Prints per count the median
time and its spread over the rounds, rows per second, the time per node and the ratio to one
node's merge; then the peak RSS of a merge of each count alone in a fresh process (the merge
reads every part whole: its memory grows with the run's rows, docs/cluster.md) and the least
squares line through the medians, extrapolated to 100 nodes.

Measured on the 2-vCPU AMD EPYC VM of the project (``--lines 200000 --rounds 3``, 213,754 rows
per node): see docs/cluster.md, "What a run across nodes costs".
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.spread import median_spread  # noqa: E402
from bench.trace_ingest import MAIN_PID, make_raw  # noqa: E402
from tracing import ingest  # noqa: E402

SHIFT_NS = 137_000


def node_parts(base: Path, lines: int, count: int) -> list[Path]:
    """``count`` nodes' events files (module doc)."""
    raw = base / "raw"
    make_raw(raw, lines)
    first = base / "node-1.parquet"
    ingest.write_events(raw, first, {MAIN_PID: "main"}, host="node-1")
    table = pq.read_table(first)
    parts = [first]
    for i in range(2, count + 1):
        shifted = table.set_column(
            table.schema.get_field_index("ts_ns"),
            "ts_ns",
            pc.add(table["ts_ns"], pa.scalar((i - 1) * SHIFT_NS, pa.int64())),
        )
        host = pa.array([f"node-{i}"] * len(shifted)).dictionary_encode()
        shifted = shifted.set_column(shifted.schema.get_field_index("host"), "host", host)
        parts.append(base / f"node-{i}.parquet")
        pq.write_table(shifted, parts[-1], compression=ingest.COMPRESSION)
    shutil.rmtree(raw)
    return parts


def merge_time(parts: list[Path], out: Path) -> float:
    out.unlink(missing_ok=True)
    t = time.perf_counter()
    ingest.merge_events(parts, out)
    return time.perf_counter() - t


_PEAK_RSS = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from tracing import ingest

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

before = hwm()
with open("/proc/self/clear_refs", "w") as fh:  # the peak so far (imports) is reset
    fh.write("5")
t = time.perf_counter()
ingest.merge_events([Path(p) for p in {parts!r}], Path({out!r}))
print(json.dumps({{"seconds": time.perf_counter() - t, "rss_mib": hwm(), "imports_mib": before}}))
"""


def peak_rss(parts: list[Path], out: Path) -> dict:
    """Peak RSS (MiB) and time of one merge alone in a fresh process."""
    out.unlink(missing_ok=True)
    code = _PEAK_RSS.format(repo=str(REPO), parts=[str(p) for p in parts], out=str(out))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000, help="raw lines per node")
    parser.add_argument("--nodes", default="1,2,3,8,16,32,64", help="node counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    counts = sorted({int(n) for n in args.nodes.split(",")})
    if not counts or counts[0] < 1:
        parser.error("--nodes: counts of 1 or more, e.g. 1,2,8")
    base = args.dir or Path(tempfile.mkdtemp(prefix="twintrace-merge-bench-"))
    try:
        t = time.perf_counter()
        parts = node_parts(base, args.lines, counts[-1])
        rows = pq.ParquetFile(parts[0]).metadata.num_rows
        size = parts[0].stat().st_size
        print(
            f"{counts[-1]} nodes' events files of {rows} rows ({size / 1e6:.1f} MB) each, "
            f"made in {time.perf_counter() - t:.0f} s"
        )
        out = base / "events.parquet"
        merge_time(parts[: counts[-1]], out)  # warm: page cache, allocator
        times: dict[int, list[float]] = {n: [] for n in counts}
        for r in range(args.rounds):
            order = counts[r % len(counts) :] + counts[: r % len(counts)]
            for n in order:
                times[n].append(merge_time(parts[:n], out))
            print(f"round {r + 1}: " + ", ".join(f"{n}: {times[n][-1]:.2f} s" for n in counts))
        one = statistics.median(times[counts[0]]) / counts[0]
        print("nodes  rows        merge time (median, spread)      M rows/s  s per node  vs 1")
        for n in counts:
            median = statistics.median(times[n])
            print(
                f"{n:>5}  {n * rows:>10}  {median_spread(times[n], '.3f'):<32} "
                f"{n * rows / median / 1e6:>8.2f}  {median / n:>10.4f}  {median / n / one:>4.2f}"
            )
        slope, intercept = np.polyfit(counts, [statistics.median(times[n]) for n in counts], 1)
        print(
            f"least squares: {slope:.4f} s per node + {intercept:.3f} s; 100 nodes of "
            f"{rows} rows: {100 * slope + intercept:.1f} s"
        )
        for n in counts:
            alone = peak_rss(parts[:n], out)
            print(
                f"{n} nodes alone in a fresh process: {alone['seconds']:.2f} s, peak RSS "
                f"{alone['rss_mib']:.0f} MiB, {alone['rss_mib'] - alone['imports_mib']:.0f} MiB "
                f"over the imports ({(alone['rss_mib'] - alone['imports_mib']) / (n * rows) * 2**20:.0f}"
                " B per row)"
            )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
