"""Aggregated syscall rows: what ``tracing/bpf/syscalls.bt`` prints for a thread's reads and
writes once their rate is high.

The tracer prints the first calls of each thread in every time bin one by one, and folds the rest
into kernel maps keyed by (pid, tid, fd, kind, descriptor generation, bin, request-size bucket,
latency bucket); an interval probe prints those maps. One printed map entry is one line::

    @agg<N>[<pid>, <tid>, <fd>, <kind>, <gen>, <bin>, <size_log2>, <lat_log2>]: (<count>, <bytes>, <latency_sum_ns>, <latency_max_ns>, <last_ts_ns>, <offset>)

``kind`` is a code (:data:`KIND_CODES`), ``gen`` counts the descriptor-changing calls (openat,
close, dup) of the process so that a row never spans two files that held the same descriptor
number, ``bin`` is ``nsecs // BIN_NS``, and the buckets are floor(log2) of the bytes returned and
of the latency. A row becomes one events row with ``count`` calls: ``ts_ns`` is the exit of its
last call, ``bytes`` and ``latency_ns`` are totals, ``offset`` is the lowest offset of its calls
(pread64 and pwrite64; -1 for the others; each call's own offset is kept only for calls traced
one by one).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

#: The tracer's code for each aggregated call kind (tracing/bpf/syscalls.bt).
KIND_CODES: tuple[str, ...] = ("read", "pread64", "readv", "write", "pwrite64", "writev")
#: Width of a time bin (syscalls.bt: ``nsecs / 10000000``).
BIN_NS = 10_000_000
#: Calls of one thread per bin printed one by one before the rest are aggregated.
LINES_PER_BIN = 4

_AGG_RE = re.compile(
    r"^@agg\d+\[(\d+), (\d+), (-?\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\]: "
    r"\((\d+), (-?\d+), (\d+), (\d+), (\d+), (-?\d+)\)$"
)
#: Columns of :func:`parse_aggregate_lines`, as parse_syscalls gives them (path unresolved).
COLUMNS = (
    "ts_ns",
    "kind",
    "pid",
    "tid",
    "fd",
    "bytes",
    "count",
    "offset",
    "latency_ns",
    "latency_max_ns",
)


def is_aggregate(line: str) -> bool:
    """Whether a raw syscalls line is an aggregated row (as opposed to an event or noise)."""
    return line.startswith("@agg")


def parse_aggregate_lines(lines: Iterable[str]) -> tuple[pd.DataFrame, list[str]]:
    """Parse aggregated-row lines; returns (rows, lines that looked aggregated but did not parse,
    e.g. one cut short when bpftrace was stopped)."""
    fields: list[tuple[int, ...]] = []
    bad: list[str] = []
    for line in lines:
        match = _AGG_RE.match(line.rstrip("\n"))
        if match is None:
            bad.append(line)
            continue
        fields.append(tuple(int(g) for g in match.groups()))
    data = np.array(fields, dtype=np.int64).reshape(-1, 14)
    kind_code = data[:, 3]
    if len(data) and (kind_code >= len(KIND_CODES)).any():
        raise ValueError(f"aggregated row with an unknown kind code {int(kind_code.max())}")
    frame = pd.DataFrame(
        {
            "ts_ns": data[:, 12],
            "kind": pd.Series(np.asarray(KIND_CODES, dtype=object)[kind_code], dtype=object),
            "pid": data[:, 0].astype(np.int32),
            "tid": data[:, 1].astype(np.int32),
            "fd": data[:, 2].astype(np.int32),
            "bytes": data[:, 9],
            "count": data[:, 8],
            "offset": data[:, 13],
            "latency_ns": data[:, 10],
            "latency_max_ns": data[:, 11],
        },
        columns=list(COLUMNS),
    )
    return frame, bad
