#!/usr/bin/env python3
"""Benchmark: a raw bpftrace trace into events.parquet, against a bare ``pandas.read_csv``.

Method: synthesize the raw directory of a busy training container (:func:`make_raw`): N lines of
raw/syscalls.txt (default 5,000,000) as tracing/bpf/syscalls.bt prints them, with block, cache
and process files beside. Six DataLoader worker processes, forked by the main process at each
epoch (they inherit its descriptors and pread64 its index file through them), open an image
among 200,000, read it whole, read its end, close it (one in 50 through a dup of the
descriptor, one in 5 with an lseek first); the main process maps shared memory and checkpoints
every 30 s (many 1 MiB writes, an fsync). The tracer's aggregation is applied as syscalls.bt
does it: beyond 4 reads or writes of a thread in a 10 ms bin, calls are folded into
``@agg`` rows per (descriptor generation, size and latency buckets), printed by a 100 ms
interval probe; lines come out of per-CPU buffers polled every ms, so the file is out of
time order by up to a few ms (aggregated rows by up to ~110 ms). A "Lost N events" line and a
last line cut short complete it.

The calls traced one by one are printed as the tracer prints them now (``--format map``: from
its 100 ms kernel maps, ``@evQ[ts, tid, comm]: (kind, pid, fd, ret, arg, lat)``, openat's as
``@opQ[...]``) or as it did before (``--format tsv``: a tab-separated line per call); beside
raw/ the same calls are written as tab-separated lines (``syscalls.tsv``), the input of the
bare parse, so both sides read the same calls.

Then, in one process, alternating for --rounds rounds (the order flips every round):
  A: tracing.ingest.write_events: parse, merge, descriptor join, events.parquet written;
  B: pandas.read_csv of syscalls.tsv (tab-separated, no further processing).
Prints each round, the median and spread (min-max) of time(B) / time(A) (>= 0.5 is the goal:
the whole ingest in at most twice the time of a bare parse), and the peak RSS of an ingest run
alone in a child process (:func:`peak_rss`).

The output of each round is removed before it (the runner writes events.parquet into a new run
directory; renaming over an existing file costs ext4 a flush, ~50 ms for 100 MB).

Measured with `--rounds 5` on a 2-vCPU Intel Xeon (Emerald Rapids) Firecracker VM, a fresh
machine (numba's cache empty before the run; its compile is not part of a round):

  format  lines   rows     ratio median (min-max)   ingest   pandas.read_csv   ingest peak RSS
  map     5 M     5.35 M   0.46 (0.40-0.46)         1.08 s   0.49 s            511 MiB

Before this version the same command printed 0.27 (ingest 3.1 s) for a new user on such a
machine, and 0.26-0.28 (ingest 1.9 s) here for every earlier version tried, including the one
that gave 0.53 on the AMD VM below: the machine, not a later change or the compiled-code cache (the cache only moves the
compile out of the first run). ``perf`` showed where: two thirds of the parse in numba's
reference counting (an atomic increment and decrement of every array passed to a helper, even
an inlined one), which the AMD VM pays far less for. Then: the kernels compiled without numba's
runtime (tracing/ingest/jit.py: they allocate nothing; the path dictionary's kernel split so
that it allocates nothing either, its strings gathered by Arrow's ``take``), a thread name's
length compared as an integer (int64 against uint64 compared as floats, in every lookup), the
comm's end found 8 bytes at a time, and numbers read a word at a time (the digits found in one
load and converted by multiplications, :func:`tracing.ingest.scan._read_number`): the parse
kernel alone went from 235 MB/s to 767 MB/s.

Where the time goes now, CPU seconds at 5 M lines (three threads on two cores): reader 0.64-0.70
(the parse kernel 0.55 of it), main 0.45-0.50 (the join 0.17, the table 0.17 with the path
dictionary 0.06), writer 0.83-0.84 (pyarrow's Parquet encoding: about 0.03 s a column for the 17
columns, LZ4 0.24, the path column's dictionary hashed again 0.10). The three add up to about
2 CPU seconds, so the ingest cannot end before about 1 s on two cores; the writer alone takes
1.7 times pandas.read_csv's 0.49 s. The ratio of 0.5 holds where the writer's part does: the
figure misses it here by 10 %, and the rest is the Parquet file's encoding, which this version
leaves as it is (a smaller or plainer file would change what every reader gets).

Measured before on the 2-vCPU AMD EPYC VM of the project, LZ4 but delta-encoded times and
latencies, a row group per round (~110 Ki rows), `--rounds 3`:

  format  lines   rows     ratio median (min-max)   ingest   pandas.read_csv   ingest peak RSS
  map     5 M     5.35 M   0.53 (0.47-0.54)         1.04 s   0.56 s            510 MiB   (idle VM)
  tsv     5 M     5.35 M   0.57 (0.51-0.58)         0.97 s   0.56 s            532 MiB   (busy VM)
  tsv     20 M    21.4 M   0.73 (0.70-0.98)         5.88 s   4.76 s            578 MiB   (loaded VM)

The two tsv rows were measured before the tracer printed from maps (other sessions' jobs
running); the map form's file is 10 % larger (each line carries its map's name and brackets:
411 MB against 375 MB at 5 M lines) and its lines come in key order within a 100 ms period,
which the per-block time sort already handles. The streaming ingest's memory is flat: +46 MiB
for 4x the trace, where pandas.read_csv holds the whole file; events.parquet is 101 MB at 5 M
(it was 128 MB). Before that version: 0.36 (0.26-0.39) at 5 M, 1.76 s, 592 MiB; 0.68 at 20 M.
Before that (the merge_asof implementation, build_events + write_table): 0.14 at 5 M (4.3-5.5 s
against 0.6-0.8 s) with 1.7 GB RSS, on the old bench's trace (tests/data/raw repeated). On that
VM, CPU seconds at 5 M lines: process 1.65-1.73; reader 0.53-0.59, main 0.45-0.48, writer
0.67-0.68.

Usage: python bench/trace_ingest.py [--events 5000000] [--rounds 5] [--dir DIR] [--keep]
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
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench import spread  # noqa: E402
from tracing import aggregates, ingest  # noqa: E402
from tracing.ingest import jit  # noqa: E402

MAIN_PID = 4000
WORKERS = 6
EPOCH_S = 60.0
SLICE_S = 10.0
LINES_PER_S = 24_000  # one-by-one and aggregated lines of the whole container, roughly
BIN_NS = aggregates.BIN_NS
AGG_INTERVAL_NS = 100_000_000
CPUS = 4


def _fmt(columns: list[pa.Array | np.ndarray | str]) -> pa.Array:
    """Tab-joined text lines from columns (numbers or strings)."""
    parts = []
    for col in columns:
        if isinstance(col, str):
            parts.append(col)
        elif isinstance(col, np.ndarray) and col.dtype.kind in "iu":
            parts.append(pc.cast(pa.array(col), pa.string()))
        else:
            parts.append(pa.array(col, type=pa.string()))
    return pc.binary_join_element_wise(*parts, "\t")


class _Slice:
    """The calls of SLICE_S seconds of the container (see the module doc), as columns."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.cols: dict[str, list[np.ndarray]] = {
            k: [] for k in ("ts", "kind", "pid", "tid", "fd", "ret", "arg", "lat")
        }
        self.paths: list[np.ndarray] = []

    def add(self, ts, kind, pid, tid, fd, ret, arg, lat, path=None) -> None:
        n = len(ts)
        for key, value in zip(self.cols, (ts, kind, pid, tid, fd, ret, arg, lat), strict=True):
            self.cols[key].append(np.broadcast_to(np.asarray(value), n).copy())
        self.paths.append(
            np.broadcast_to(np.asarray("" if path is None else path, dtype=object), n).copy()
        )

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame({k: np.concatenate(v) for k, v in self.cols.items()})
        df["path"] = np.concatenate(self.paths)
        return df


def _worker_calls(s: _Slice, t0: int, t1: int, pid: int, index_fd: int, rng) -> None:
    """One DataLoader worker from t0 to t1 (ns): samples back to back."""
    mean_gap = 5.5e6  # decode and transform of one image, ns
    n = int((t1 - t0) / mean_gap * 1.1) + 4
    gaps = rng.lognormal(np.log(mean_gap), 0.5, n).astype(np.int64)
    start = t0 + np.cumsum(gaps)
    start = start[start < t1 - 2_000_000]
    n = len(start)
    size = rng.lognormal(np.log(110_000), 0.4, n).astype(np.int64)
    image = rng.integers(0, 200_000, n)
    paths = np.array(
        [f"/data/imagenet/train/n{c // 1300:08d}/n{c // 1300:08d}_{c:06d}.JPEG" for c in image],
        dtype=object,
    )
    lat = rng.lognormal(np.log(9000), 0.6, (n, 6)).astype(np.int64)
    fd = 7
    # pread64 of the index (a descriptor inherited from the main process)
    s.add(start, "pread64", pid, pid, index_fd, 64, image * 64, lat[:, 5])
    t = start + lat[:, 5] + 3000
    s.add(t, "openat", pid, pid, -1, fd, -1, lat[:, 0], paths)
    seek = rng.random(n) < 0.2
    t_seek = t + 2000
    s.add(t_seek[seek], "lseek", pid, pid, fd, 0, -1, 600)
    dup = rng.random(n) < 0.02
    s.add(t[dup] + 2500, "dup", pid, pid, fd, fd + 1, -1, 900)
    read_fd = np.where(dup, fd + 1, fd)
    t = t + lat[:, 1] + 4000
    s.add(t, "read", pid, pid, read_fd, size, -1, lat[:, 1])
    t = t + lat[:, 2] + 1500
    s.add(t, "read", pid, pid, read_fd, 0, -1, lat[:, 2] // 4)
    t = t + 2000
    s.add(t[dup], "close", pid, pid, fd + 1, 0, -1, 1500)
    s.add(t + 500, "close", pid, pid, fd, 0, -1, lat[:, 3] // 4)


def _main_calls(s: _Slice, t0: int, t1: int, rng, epoch_start: bool, ckpt: bool) -> None:
    pid = MAIN_PID
    steps = np.arange(t0 + 5_000_000, t1, 100_000_000)
    n = len(steps)
    shm = np.array([f"/dev/shm/torch_{pid}_{rng.integers(1 << 30)}_{i}" for i in range(n)])
    lat = rng.lognormal(np.log(8000), 0.5, (n, 4)).astype(np.int64)
    s.add(steps, "openat", pid, pid + 2, -1, 30, -1, lat[:, 0], shm)
    s.add(steps + 20_000, "mmap", pid, pid + 2, 30, 0x7F0000000000, 1 << 22, lat[:, 1])
    s.add(steps + 40_000, "close", pid, pid + 2, 30, 0, -1, lat[:, 2] // 4)
    s.add(steps + 60_000, "write", pid, pid, 1, 96, -1, lat[:, 3])
    if ckpt:  # 2000 writes of 1 MiB over ~2 s, then fsync
        t = t0 + 1_000_000_000
        s.add([t], "openat", pid, pid, -1, 31, -1, 40_000, "/ckpt/model-latest.pt")
        n_w = 2000
        w_lat = rng.lognormal(np.log(600_000), 0.3, n_w).astype(np.int64)
        wt = t + np.cumsum(w_lat + 400_000)
        s.add(wt, "write", pid, pid, 31, 1 << 20, -1, w_lat)
        s.add([wt[-1] + 1_000_000], "fsync", pid, pid, 31, 0, -1, 90_000_000)
        s.add([wt[-1] + 92_000_000], "close", pid, pid, 31, 0, -1, 4000)


def _aggregate(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split calls into one-by-one lines and aggregated rows as syscalls.bt does."""
    df = df.sort_values("ts", kind="stable", ignore_index=True)
    changes = df["kind"].isin(["openat", "close", "dup"]).astype(np.int64)
    df["gen"] = changes.groupby(df["pid"]).cumsum()
    df["bin"] = df["ts"] // BIN_NS
    foldable = df["kind"].isin(aggregates.KIND_CODES)
    rank = foldable.astype(np.int64).groupby([df["tid"], df["bin"]]).cumsum()
    folded = foldable & (rank > aggregates.LINES_PER_BIN)
    one = df[~folded]
    agg = df[folded].copy()
    nbytes = np.maximum(agg["ret"].to_numpy(), 0)
    agg["size"] = np.floor(np.log2(np.maximum(nbytes, 1))).astype(np.int64)
    agg["latb"] = np.floor(np.log2(np.maximum(agg["lat"].to_numpy(), 1))).astype(np.int64)
    agg["code"] = agg["kind"].map({k: i for i, k in enumerate(aggregates.KIND_CODES)})
    agg["nbytes"] = nbytes
    keys = ["pid", "tid", "fd", "code", "gen", "bin", "size", "latb"]
    rows = (
        agg.groupby(keys, sort=False)
        .agg(
            count=("ts", "size"),
            bytes=("nbytes", "sum"),
            lat_sum=("lat", "sum"),
            lat_max=("lat", "max"),
            last=("ts", "max"),
        )
        .reset_index()
    )
    return one, rows


def _num(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def _map_lines(one: pd.DataFrame, comm: np.ndarray) -> pa.Array:
    """The calls traced one by one as syscalls.bt prints them from its maps: ``@evQ[ts, tid,
    comm]: (kind, pid, fd, ret, arg, latency)``, openat ``@opQ[ts, tid, comm]: (pid, ret,
    latency, path)``."""
    ts = one["ts"].to_numpy()
    key = [
        _num((ts // AGG_INTERVAL_NS) % 4), "[", _num(ts), ", ", _num(one["tid"].to_numpy()),
        ", ", pa.array(comm, pa.string()), "]: (",
    ]  # fmt: skip
    code = one["kind"].map({k: i for i, k in enumerate(ingest.SYSCALL_KINDS)}).to_numpy()
    fields = [_num(code)]
    for col in ("pid", "fd", "ret", "arg", "lat"):
        fields += [", ", _num(one[col].to_numpy())]
    ev = pc.binary_join_element_wise("@ev", *key, *fields, ")", "")
    path = pa.array(one["path"].to_numpy(dtype=object), pa.string())
    fields = [_num(one["pid"].to_numpy()), ", ", _num(one["ret"].to_numpy()), ", "]
    fields += [_num(one["lat"].to_numpy()), ", ", path]
    op = pc.binary_join_element_wise("@op", *key, *fields, ")", "")
    return pc.if_else(pa.array(one["kind"].to_numpy() == "openat"), op, ev)


def _slice_lines(df: pd.DataFrame, rng, form: str) -> tuple[pa.Array, np.ndarray, pa.Array]:
    """The text lines of one slice in ``form`` (``map``: as syscalls.bt prints now, ``tsv``: a
    tab-separated line per call, as it printed before), the times they are printed at (the
    file order), and the tab-separated form of the same lines (what pandas reads)."""
    one, agg = _aggregate(df)
    comm = np.where(
        one["pid"].to_numpy() == MAIN_PID,
        np.where(one["tid"].to_numpy() == MAIN_PID, "python3", "pt_main_thread"),
        "pt_data_worker",
    )
    lines = _fmt(
        [
            one["ts"].to_numpy(),
            one["kind"].to_numpy(dtype=object),
            one["pid"].to_numpy(),
            one["tid"].to_numpy(),
            one["fd"].to_numpy(),
            one["ret"].to_numpy(),
            one["arg"].to_numpy(),
            one["lat"].to_numpy(),
            comm,
            one["path"].to_numpy(dtype=object),
        ]
    )
    ts = one["ts"].to_numpy()
    tsv = lines
    if form == "map":  # printed with the period's map, after it ends, in key (time) order
        lines = _map_lines(one, comm)
        printed = (ts // AGG_INTERVAL_NS + 1) * AGG_INTERVAL_NS + 4_000
    else:  # per-CPU buffers polled every ms: a line waits for its CPU's next poll
        cpu = (one["tid"].to_numpy() * 7 + ts // 50_000_000) % CPUS
        phase = cpu * (1_000_000 // CPUS)
        printed = (ts - phase) // 1_000_000 * 1_000_000 + 1_000_000 + phase
    agg_lines = pc.binary_join_element_wise(
        pc.cast(pa.array(np.full(len(agg), "@agg0[")), pa.string()),
        pc.binary_join_element_wise(
            *[pc.cast(pa.array(agg[k].to_numpy()), pa.string()) for k in agg.columns[:8]], ", "
        ),
        "]: (",
        pc.binary_join_element_wise(
            *[
                pc.cast(pa.array(agg[k].to_numpy()), pa.string())
                for k in ("count", "bytes", "lat_sum", "lat_max", "last")
            ],
            ", ",
        ),
        ", -1)",
        "",
    )
    bin_end = (agg["bin"].to_numpy() + 1) * BIN_NS
    agg_printed = (bin_end // AGG_INTERVAL_NS + 1) * AGG_INTERVAL_NS + 5_000
    return (
        pa.concat_arrays([lines, agg_lines]),
        np.concatenate([printed, agg_printed]),
        pa.concat_arrays([tsv, agg_lines]),
    )


def make_raw(raw: Path, n_lines: int, seed: int = 1, form: str = "map") -> dict[str, int]:
    """Write a synthetic raw directory with ``n_lines`` lines of events in syscalls.txt, its
    calls traced one by one in ``form`` (``map`` as the tracer prints them now, ``tsv`` as it
    did before), and beside it (outside raw/) ``syscalls.tsv``: the same lines, each call a
    tab-separated line, the file pandas.read_csv reads."""
    rng = np.random.default_rng(seed)
    raw.mkdir(parents=True, exist_ok=True)
    t_start = 1_000_000_000_000
    written = aggregated = 0
    pids = [MAIN_PID]
    proc_lines = []
    block_lines = []
    cache_lines = []
    slice_no = 0
    with open(raw / "syscalls.txt", "w") as out, open(raw.parent / "syscalls.tsv", "w") as tsv:
        out.write(f"Attaching 30 probes...\nREADY {t_start}\n")
        tsv.write(f"Attaching 30 probes...\nREADY {t_start}\n")
        first = (
            f"{t_start + 1000}\topenat\t{MAIN_PID}\t{MAIN_PID}\t-1\t5\t-1\t9000\tpython3\t"
            "/data/imagenet/train.index\n"
        )
        out.write(
            first
            if form == "tsv"
            else f"@op0[{t_start + 1000}, {MAIN_PID}, python3]: "
            f"({MAIN_PID}, 5, 9000, /data/imagenet/train.index)\n"
        )
        tsv.write(first)
        while written < n_lines:
            t0 = t_start + int(slice_no * SLICE_S * 1e9)
            t1 = t0 + int(SLICE_S * 1e9)
            s = _Slice(rng)
            epoch_start = slice_no % int(EPOCH_S / SLICE_S) == 0
            if epoch_start:
                if slice_no:
                    for p in pids[1:]:
                        proc_lines.append(f"{t0 + 100}\texit\t{p}\t{p}\t-1\tpt_data_worker\t")
                base = MAIN_PID + 100 + slice_no * 10
                pids = [MAIN_PID] + [base + w for w in range(WORKERS)]
                for k, p in enumerate(pids[1:]):
                    proc_lines.append(
                        f"{t0 + 1000 + k}\tfork\t{MAIN_PID}\t{MAIN_PID}\t{p}\tpython3\t"
                    )
                    proc_lines.append(
                        f"{t0 + 1500 + k}\tfork\t{p}\t{p}\t{p + 5000}\tpt_data_worker\t"
                    )
            for p in pids[1:]:
                _worker_calls(s, t0 + 2_000_000, t1, p, 5, rng)
            _main_calls(s, t0, t1, rng, epoch_start, slice_no % 3 == 1)
            lines, printed, tsv_lines = _slice_lines(s.frame(), rng, form)
            order = pa.array(np.argsort(printed, kind="stable"))
            lines, tsv_lines = lines.take(order), tsv_lines.take(order)
            if written + len(lines) > n_lines:
                lines = lines.slice(0, n_lines - written)
                tsv_lines = tsv_lines.slice(0, n_lines - written)
            aggregated += int(pc.sum(pc.starts_with(lines, "@agg")).as_py() or 0)
            written += len(lines)
            text = "\n".join(lines.to_pylist())
            if slice_no == 1:
                out.write("Lost 12 events\n")
            out.write(text + "\n")
            tsv.write("\n".join(tsv_lines.to_pylist()) + "\n")
            # block requests and page cache, a few per ms / per 100 ms
            n_b = int(SLICE_S * 300)
            bt = np.sort(rng.integers(t0, t1, n_b))
            for t, sec in zip(bt.tolist(), rng.integers(0, 1 << 30, n_b).tolist(), strict=True):
                block_lines.append(
                    f"{t}\tRA\t266338304\t{sec}\t131072\t180000\t{pids[-1]}\t1\tpt_data_worker"
                )
            for tick in range(t0, t1, 100_000_000):
                cache_lines.append(f"T {tick}")
                for p in pids[1:]:
                    cache_lines.append(f"@add[{p}, pt_data_worker]: {int(rng.integers(100, 900))}")
            slice_no += 1
        # cut short when bpftrace stopped
        out.write(f"{t1}\tread\t{MAIN_PID}\t{MAIN_PID}\t3" if form == "tsv" else f"@ev0[{t1}, 4")
    (raw / "proc.txt").write_text("Attaching 4 probes...\nREADY 1\n" + "\n".join(proc_lines) + "\n")
    (raw / "block.txt").write_text(
        "Attaching 4 probes...\nREADY 1\n" + "\n".join(block_lines) + "\n"
    )
    (raw / "cache.txt").write_text(
        "Attaching 5 probes...\nREADY 1\n" + "\n".join(cache_lines) + "\n"
    )
    return {"lines": written, "aggregated": aggregated}


def run_ingest(raw: Path, out: Path) -> float:
    # The runner writes events.parquet into a new run directory: no file to replace. Renaming
    # over the last round's file would add ext4's flush on replace (~50 ms for 100 MB).
    out.unlink(missing_ok=True)
    t = time.perf_counter()
    ingest.write_events(raw, out, {MAIN_PID: "main"})
    return time.perf_counter() - t


def run_pandas(raw: Path) -> float:
    """pandas.read_csv of the trace's calls, each a tab-separated line (syscalls.tsv)."""
    t = time.perf_counter()
    pd.read_csv(
        raw.parent / "syscalls.tsv",
        sep="\t",
        header=None,
        names=list(ingest.SYSCALL_FIELDS),
        skiprows=2,
        quoting=3,
        keep_default_na=False,
        on_bad_lines="skip",
    )
    return time.perf_counter() - t


def peak_rss(raw: Path, out: Path) -> dict:
    """Peak RSS (MiB, VmHWM reset after the imports) and time of one write_events alone in a
    fresh process."""
    out.unlink(missing_ok=True)
    return spread.peak_rss(
        "from pathlib import Path\nfrom tracing import ingest\nfrom tracing.ingest import jit\njit.compile()",
        f"ingest.write_events(Path({str(raw)!r}), Path({str(out)!r}), {{{MAIN_PID}: 'main'}})",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="reuse/keep the raw trace in --dir")
    parser.add_argument(
        "--format",
        choices=("map", "tsv"),
        default="map",
        help="how the synthetic syscalls.txt prints calls traced one by one: map (as "
        "syscalls.bt prints them now) or tsv (a line per call, as it printed before)",
    )
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="twintrace-ingest-bench-"))
    raw = base / f"{args.format}-{args.events}" / "raw"
    try:
        if not (args.keep and (raw / "syscalls.txt").exists()):
            shutil.rmtree(raw.parent, ignore_errors=True)
            t = time.perf_counter()
            made = make_raw(raw, args.events, form=args.format)
            print(
                f"synthesized {made['lines']} lines ({made['aggregated']} aggregated) "
                f"in {time.perf_counter() - t:.0f} s"
            )
        size = (raw / "syscalls.txt").stat().st_size
        tsv_size = (raw.parent / "syscalls.tsv").stat().st_size
        print(
            f"raw/syscalls.txt ({args.format}): {size / 1e6:.0f} MB; the same calls as "
            f"tab-separated lines (pandas.read_csv's input): {tsv_size / 1e6:.0f} MB"
        )
        jit.compile()  # numba's compilation or cache load is not part of a round
        run_ingest(raw, base / "events.parquet")  # warm: page cache, allocator
        ratios, a_times, b_times = [], [], []
        for i in range(args.rounds):
            if i % 2 == 0:
                a, b = run_ingest(raw, base / "events.parquet"), run_pandas(raw)
            else:
                b, a = run_pandas(raw), run_ingest(raw, base / "events.parquet")
            a_times.append(a)
            b_times.append(b)
            ratios.append(b / a)
            print(f"round {i + 1}: ingest {a:.2f} s, pandas.read_csv {b:.2f} s, ratio {b / a:.2f}")
        rows = pq.ParquetFile(base / "events.parquet").metadata.num_rows
        print(
            f"events.parquet: {rows} rows, {(base / 'events.parquet').stat().st_size / 1e6:.0f} MB"
        )
        print(
            f"ratio pandas_time / ingest_time: median {statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {args.rounds} rounds)"
        )
        print(
            f"ingest median {statistics.median(a_times):.2f} s "
            f"({rows / statistics.median(a_times) / 1e6:.1f} M rows/s), "
            f"pandas.read_csv median {statistics.median(b_times):.2f} s"
        )
        alone = peak_rss(raw, base / "events.parquet")
        print(
            f"ingest alone in a fresh process: {alone['seconds']:.2f} s, peak RSS "
            f"{alone['rss_mib']:.0f} MiB (imports and compiled code: {alone['imports_mib']:.0f} MiB)"
        )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
