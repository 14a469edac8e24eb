#!/usr/bin/env python3
"""Benchmark: merging the hosts' events of a run across nodes into one events.parquet, against
the number of nodes (1 to 64), so that the cost of a 100-node run is measured, not guessed.

Method: one node's events.parquet made the way a run makes it (``bench/trace_ingest.py``'s
synthetic raw trace of a busy training container, ``--lines`` lines, through
``tracing.ingest.write_events`` with a host), then copied as the output of N nodes: node i's
rows with its own host name and its times shifted by i x 137 us, so that the nodes' rows
interleave as theirs do in a run, in row groups of the size ``write_events`` wrote. Per round, every node count (1, 2, 3, 8, 16, 32, 64 by
default; the order rotates every round) is merged by ``tracing.ingest.merge_events`` (what the
runner calls once each host's part is ingested: streamed, each part read a batch at a time)
and by the merge it replaced (:func:`whole_merge`: every part read whole and sorted at once),
alternated (their order flips every round), each timed alone. Prints per merge and count the
median time and its spread over the rounds, rows per second, the time per node and the ratio
to one node's merge, the least squares line through the medians extrapolated to 100 nodes, the
ratio of the two merges' times per count, and the peak RSS of each merge of each count alone
in a fresh process.

Measured on the 2-vCPU AMD EPYC VM of the project (``--lines 200000 --rounds 3``, 213,754 rows
per node): see docs/cluster.md, "What a run across nodes costs".
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

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench import spread  # noqa: E402
from bench.spread import median_spread  # noqa: E402
from bench.trace_ingest import MAIN_PID, make_raw  # noqa: E402
from core.atomic import atomic_path  # noqa: E402
from tracing import ingest  # noqa: E402
from tracing.ingest import events  # noqa: E402

SHIFT_NS = 137_000


def node_parts(base: Path, lines: int, count: int) -> list[Path]:
    """``count`` nodes' events files (module doc)."""
    raw = base / "raw"
    make_raw(raw, lines)
    first = base / "node-1.parquet"
    ingest.write_events(raw, first, {MAIN_PID: "main"}, host="node-1")
    table = pq.read_table(first)
    group = pq.ParquetFile(first).metadata.row_group(0).num_rows  # a row group per round
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
        pq.write_table(shifted, parts[-1], row_group_size=group, compression=ingest.COMPRESSION)
    shutil.rmtree(raw)
    return parts


def whole_merge(parts: list[Path], out: Path) -> None:
    """The merge as it was before it was streamed: every part read whole, sorted at once
    (the same output as one stable sort: tests/test_merge_events.py)."""
    tables = [pq.read_table(part, schema=ingest.EVENTS_SCHEMA) for part in parts]
    table = pa.concat_tables(tables)
    table = table.take(pc.sort_indices(table, sort_keys=[("ts_ns", "ascending")]))
    with atomic_path(out) as tmp:
        sink = events._ParquetSink(tmp)
        try:
            for batch in table.to_batches(ingest.ROW_GROUP_ROWS):
                sink.put(pa.Table.from_batches([batch]))
        finally:
            sink.close()


MERGES = {"streamed": ingest.merge_events, "whole": whole_merge}


def merge_time(parts: list[Path], out: Path, how: str = "streamed") -> float:
    out.unlink(missing_ok=True)
    t = time.perf_counter()
    MERGES[how](parts, out)
    return time.perf_counter() - t


def peak_rss(parts: list[Path], out: Path, how: str) -> dict:
    """Peak RSS (MiB) and time of one merge alone in a fresh process."""
    out.unlink(missing_ok=True)
    return spread.peak_rss(
        "from pathlib import Path\nfrom cluster_merge import MERGES",
        f"MERGES[{how!r}]([Path(p) for p in {[str(p) for p in parts]!r}], Path({str(out)!r}))",
    )


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
        times = {(n, how): [] for n in counts for how in MERGES}
        for r in range(args.rounds):
            order = counts[r % len(counts) :] + counts[: r % len(counts)]
            hows = list(MERGES) if r % 2 == 0 else list(MERGES)[::-1]
            for n in order:
                for how in hows:
                    times[n, how].append(merge_time(parts[:n], out, how))
            print(
                f"round {r + 1}: "
                + ", ".join(
                    f"{n}: {times[n, 'streamed'][-1]:.2f} s ({times[n, 'whole'][-1]:.2f} s whole)"
                    for n in counts
                ),
                flush=True,
            )
        for how in MERGES:
            one = statistics.median(times[counts[0], how]) / counts[0]
            print(f"{how} merge")
            print("nodes  rows        merge time (median, spread)      M rows/s  s per node  vs 1")
            for n in counts:
                median = statistics.median(times[n, how])
                print(
                    f"{n:>5}  {n * rows:>10}  {median_spread(times[n, how], '.3f'):<32} "
                    f"{n * rows / median / 1e6:>8.2f}  {median / n:>10.4f}  {median / n / one:>4.2f}"
                )
            medians = [statistics.median(times[n, how]) for n in counts]
            slope, intercept = np.polyfit(counts, medians, 1)
            print(
                f"least squares: {slope:.4f} s per node + {intercept:.3f} s; 100 nodes of "
                f"{rows} rows: {100 * slope + intercept:.1f} s"
            )
        for n in counts:
            ratios = [w / s for s, w in zip(times[n, "streamed"], times[n, "whole"], strict=True)]
            print(f"{n} nodes: time whole / streamed {median_spread(ratios, '.2f')}")
        for n, how in [(n, how) for n in counts for how in MERGES]:
            alone = peak_rss(parts[:n], out, how)
            print(
                f"{how}, {n} nodes alone in a fresh process: {alone['seconds']:.2f} s, peak RSS "
                f"{alone['rss_mib']:.0f} MiB, {alone['rss_mib'] - alone['imports_mib']:.0f} MiB "
                f"over the imports ({(alone['rss_mib'] - alone['imports_mib']) / (n * rows) * 2**20:.0f}"
                " B per row)"
            )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
