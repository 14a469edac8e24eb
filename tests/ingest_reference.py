"""FROZEN COPY of tracing/ingest.py before streaming ingest (commit b47217e), the reference of
tests/test_ingest_equivalence.py: tracing.ingest must give the same rows. Two known bugs are
patched (marked "PATCH"): a copy of a copy of a copy (dups resolved in two passes only) or a
dup2(fd, fd) of a copy (it copied itself, stale) could get a stale or no path, and a dup of a
descriptor of unknown file onto one that named a file left the old name. Do not edit otherwise (but
its schema constants, ParseStats, container_owners and _steps, which now come from the package:
what a parse counts, which process is in which container (tests/test_ingest.py checks it) and
the phases' steps are not what the check is about; build_samples and build_phases, which no
test used, removed; and summarize's per-container part moved into ``_role_groups``, unchanged).

Turn a run's raw tracer output into events.parquet, samples.parquet and phases.parquet.

Parsing is vectorised: pyarrow's multithreaded CSV reader does the text work, pandas does the
fd -> path join with ``merge_asof``. Lines that are not events (bpftrace's "Attaching N probes",
"READY", blank lines, a line cut short when bpftrace was stopped) are skipped; "Lost N events"
lines are counted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from store.rundir import (
    EVENTS_COLUMNS,
    FD_KINDS,
    READ_KINDS,
    WRITE_KINDS,
    arrow_schema,
)
from tracing.ingest.parse import container_owners  # tested apart: tests/test_ingest.py
from tracing.ingest.schema import _LOST_RE, _PROC_COLUMNS, PAGE_SIZE
from tracing.ingest.stats import ParseStats  # what it counts is not what the check is about
from tracing.ingest.tables import _steps  # the phases' steps: not the rows checked

# Column order and Arrow types of events.parquet: the single definition lives in store.rundir.
EVENTS_SCHEMA = arrow_schema(EVENTS_COLUMNS)

_SYSCALL_COLUMNS = {
    "ts_ns": pa.int64(),
    "kind": pa.string(),
    "pid": pa.int32(),
    "tid": pa.int32(),
    "fd": pa.int32(),
    "ret": pa.int64(),
    "arg": pa.int64(),
    "latency_ns": pa.int64(),
    "comm": pa.string(),
    "path": pa.string(),
}
_BLOCK_COLUMNS = {
    "ts_ns": pa.int64(),
    "rwbs": pa.string(),
    "dev": pa.int64(),
    "sector": pa.int64(),
    "bytes": pa.int64(),
    "latency_ns": pa.int64(),
    "pid": pa.int32(),
    "in_container": pa.int8(),
    "comm": pa.string(),
}
_CACHE_RE = re.compile(r"^@(add|del)\[(\d+), (.*)\]: (\d+)$")


def _read_tsv(path: Path, columns: dict[str, pa.DataType], stats: ParseStats) -> pd.DataFrame:
    """Read a tab-separated bpftrace output file into a DataFrame with the given columns."""
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame({c: pd.Series(dtype=t.to_pandas_dtype()) for c, t in columns.items()})
    table = pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=list(columns), block_size=16 << 20),
        parse_options=pacsv.ParseOptions(
            delimiter="\t", quote_char=False, escape_char=False, invalid_row_handler=stats.handler
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=columns, strings_can_be_null=False, quoted_strings_can_be_null=False
        ),
    )
    return table.to_pandas()


def parse_syscalls(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/syscalls.txt (tracing/bpf/syscalls.bt) into event rows (path unresolved)."""
    df = _read_tsv(path, _SYSCALL_COLUMNS, stats)
    kind = df["kind"]
    is_rw = kind.isin(READ_KINDS + WRITE_KINDS).to_numpy()
    is_pos = kind.isin(("pread64", "pwrite64")).to_numpy()
    is_mmap = (kind == "mmap").to_numpy()
    ret = df["ret"].to_numpy()
    arg = df["arg"].to_numpy()
    out = pd.DataFrame(
        {
            "ts_ns": df["ts_ns"],
            "kind": kind,
            "pid": df["pid"],
            "tid": df["tid"],
            "comm": df["comm"],
            "fd": np.where(
                (kind == "openat").to_numpy(), np.where(ret >= 0, ret, -1), df["fd"]
            ).astype(np.int32),
            "path": df["path"].where(df["path"] != "", None),
            "bytes": np.where(is_rw, np.maximum(ret, 0), np.where(is_mmap, arg, 0)),
            "count": np.ones(len(df), dtype=np.int64),
            "ret": ret,
            "offset": np.where(
                is_pos, arg, np.where((kind == "lseek").to_numpy() & (ret >= 0), ret, -1)
            ),
            "latency_ns": df["latency_ns"],
            "latency_max_ns": df["latency_ns"],
            "dev": None,
            "in_container": True,
        }
    )
    return out


def parse_block(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/block.txt (tracing/bpf/block.bt)."""
    df = _read_tsv(path, _BLOCK_COLUMNS, stats)
    rwbs = df["rwbs"].astype(str)
    kind = np.where(
        rwbs.str.contains("R", regex=False),
        "block_read",
        np.where(rwbs.str.contains("W", regex=False), "block_write", "block_other"),
    )
    dev = df["dev"].to_numpy()
    dev_str = (
        pd.Series((dev >> 20).astype(str), dtype=object)
        + ":"
        + pd.Series((dev & 0xFFFFF).astype(str), dtype=object)
    )
    return pd.DataFrame(
        {
            "ts_ns": df["ts_ns"],
            "kind": kind,
            "pid": df["pid"],
            "tid": np.full(len(df), -1, dtype=np.int32),
            "comm": df["comm"],
            "fd": np.full(len(df), -1, dtype=np.int32),
            "path": None,
            "bytes": df["bytes"],
            "count": np.ones(len(df), dtype=np.int64),
            "ret": np.zeros(len(df), dtype=np.int64),
            "offset": df["sector"] * 512,
            "latency_ns": df["latency_ns"],
            "latency_max_ns": df["latency_ns"],
            "dev": dev_str.to_numpy() if len(df) else None,
            "in_container": df["in_container"].to_numpy() == 1,
        }
    )


def parse_cache(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/cache.txt (tracing/bpf/cache.bt): per-process page counts per 100 ms block."""
    ts_col: list[int] = []
    rows: list[tuple[str, int, str, int]] = []
    if path.exists():
        ts = 0
        with open(path, errors="replace") as fh:
            # A few lines per 100 ms: a plain loop is fine here (not a hot path).
            for line in fh:
                line = line.rstrip("\n")
                if line.startswith("T "):
                    ts = int(line[2:])
                    continue
                match = _CACHE_RE.match(line)
                if match:
                    ts_col.append(ts)
                    rows.append(
                        (match.group(1), int(match.group(2)), match.group(3), int(match.group(4)))
                    )
                elif _LOST_RE.match(line):
                    stats.lost_events += int(_LOST_RE.match(line).group(1))
    pages = np.array([r[3] for r in rows], dtype=np.int64)
    n = len(rows)
    return pd.DataFrame(
        {
            "ts_ns": np.array(ts_col, dtype=np.int64),
            "kind": ["cache_add" if r[0] == "add" else "cache_delete" for r in rows],
            "pid": np.array([r[1] for r in rows], dtype=np.int32),
            "tid": np.full(n, -1, dtype=np.int32),
            "comm": [r[2] for r in rows],
            "fd": np.full(n, -1, dtype=np.int32),
            "path": None,
            "bytes": pages * PAGE_SIZE,
            "count": pages,
            "ret": np.zeros(n, dtype=np.int64),
            "offset": np.full(n, -1, dtype=np.int64),
            "latency_ns": np.zeros(n, dtype=np.int64),
            "latency_max_ns": np.zeros(n, dtype=np.int64),
            "dev": None,
            "in_container": True,
        }
    )


def parse_proc(path: Path, stats: ParseStats) -> pd.DataFrame:
    """Parse raw/proc.txt (tracing/bpf/proc.bt). Thread creations are kept for now."""
    df = _read_tsv(path, _PROC_COLUMNS, stats)
    n = len(df)
    return pd.DataFrame(
        {
            "ts_ns": df["ts_ns"],
            "kind": df["kind"],
            "pid": df["pid"],
            "tid": df["tid"],
            "comm": df["comm"],
            "fd": np.full(n, -1, dtype=np.int32),
            "path": df["path"].where(df["path"] != "", None),
            "bytes": np.zeros(n, dtype=np.int64),
            "count": np.ones(n, dtype=np.int64),
            "ret": df["child"].astype(np.int64),
            "offset": np.full(n, -1, dtype=np.int64),
            "latency_ns": np.zeros(n, dtype=np.int64),
            "latency_max_ns": np.zeros(n, dtype=np.int64),
            "dev": None,
            "in_container": True,
        }
    )


def drop_thread_forks(proc: pd.DataFrame, known_pids: np.ndarray) -> pd.DataFrame:
    """Keep only forks that created a process: the child later acts as a thread-group leader."""
    is_fork = (proc["kind"] == "fork").to_numpy()
    leaders = np.union1d(known_pids, proc.loc[~is_fork, "pid"].to_numpy())
    keep = ~is_fork | np.isin(proc["ret"].to_numpy(), leaders)
    return proc[keep]


def _descriptor_table(sys: pd.DataFrame) -> pd.DataFrame:
    """(ts_ns, pid, fd, path) for every descriptor that came to name a file: successful openat
    calls, plus dup/dup2/dup3/fcntl copies of descriptors already in the table.

    ``path`` holds path codes (see :func:`resolve_paths`), -1 for none. Every successful close
    adds a row with code -1 1 ns after it: a descriptor number that is reused by a call we do
    not trace (socket, pipe, accept, a descriptor received over a socket, as DataLoader workers
    do for shared memory) must not inherit the closed file's name. The close itself still
    resolves to the file it closed.
    """
    kind, fd = sys["kind"], sys["fd"]
    table = sys.loc[(kind == "openat") & (fd >= 0), ["ts_ns", "pid", "fd", "path"]]
    closes = sys.loc[(kind == "close") & (sys["ret"] == 0) & (fd >= 0), ["ts_ns", "pid", "fd"]]
    if len(closes):
        tombstones = closes.assign(ts_ns=closes["ts_ns"] + 1, path=np.int32(-1))
        table = pd.concat([table, tombstones], ignore_index=True)
    table = table.sort_values("ts_ns", kind="stable")
    dups = sys.loc[(kind == "dup") & (sys["ret"] >= 0), ["ts_ns", "pid", "fd", "ret"]].sort_values(
        "ts_ns", kind="stable"
    )
    dups = dups[(dups["fd"] != dups["ret"]).to_numpy()]  # PATCH: dup2(fd, fd) changes nothing
    if len(dups) == 0 or len(table) == 0:
        return table
    copies = table.iloc[0:0]
    previous = None
    for _ in range(len(dups) + 1):  # PATCH: until nothing changes (was: two passes)
        known = pd.concat([table, copies], ignore_index=True).sort_values("ts_ns", kind="stable")
        found = pd.merge_asof(dups, known, on="ts_ns", by=["pid", "fd"], direction="backward")
        # PATCH: a copy of a descriptor of unknown file unnames the new one (was: left out)
        copies = pd.DataFrame(
            {
                "ts_ns": found["ts_ns"],
                "pid": found["pid"],
                "fd": found["ret"].astype(np.int32),
                "path": found["path"].fillna(-1).astype(np.int32),
            }
        )
        if previous is not None and previous.equals(copies):
            break
        previous = copies
    return pd.concat([table, copies], ignore_index=True).sort_values("ts_ns", kind="stable")


def _codes(merged: pd.DataFrame) -> np.ndarray:
    """The path codes a merge_asof found, -1 where it found none."""
    return merged["path"].fillna(-1).to_numpy().astype(np.int32)


def resolve_paths(sys: pd.DataFrame, forks: pd.DataFrame) -> pd.DataFrame:
    """Fill ``path`` of fd-based calls from the latest descriptor of the same (pid, fd) that
    named a file (openat, or a dup of such a descriptor).

    Descriptors inherited across fork are looked up in the parent's table as it was at fork time.
    The joins carry integer codes of the paths, not the strings (several times faster).
    """
    sys = sys.reset_index(drop=True)
    codes, names = pd.factorize(sys["path"], use_na_sentinel=True)
    codes = codes.astype(np.int32)
    slim = pd.DataFrame(
        {
            "ts_ns": sys["ts_ns"],
            "pid": sys["pid"],
            "fd": sys["fd"],
            "ret": sys["ret"],
            "kind": sys["kind"],
            "path": codes,
        }
    )
    opens = _descriptor_table(slim)
    fd_rows = np.flatnonzero((slim["kind"].isin(FD_KINDS) & (slim["fd"] >= 0)).to_numpy())
    if len(fd_rows) == 0 or len(opens) == 0:
        return sys
    calls = (
        slim.loc[fd_rows, ["ts_ns", "pid", "fd"]]
        .assign(row=fd_rows)
        .sort_values("ts_ns", kind="stable")
    )
    merged = pd.merge_asof(
        calls, opens.assign(seen=True), on="ts_ns", by=["pid", "fd"], direction="backward"
    )
    resolved = codes.copy()
    resolved[merged["row"].to_numpy()] = _codes(merged)
    # Only descriptors this process never opened nor closed can be inherited from its parent.
    unresolved = merged[merged["seen"].isna()]
    if len(unresolved) and len(forks):
        parent = forks.drop_duplicates("ret", keep="first")
        parent = pd.DataFrame(
            {
                "pid": parent["ret"].astype(np.int32).to_numpy(),
                "ppid": parent["pid"].to_numpy(),
                "fork_ts": parent["ts_ns"].to_numpy(),
            }
        )
        inherited = unresolved[["row", "pid", "fd"]].merge(parent, on="pid", how="inner")
        if len(inherited):
            inherited = inherited.rename(columns={"fork_ts": "ts_ns"}).sort_values(
                "ts_ns", kind="stable"
            )
            parent_opens = opens.rename(columns={"pid": "ppid"})
            found = pd.merge_asof(
                inherited, parent_opens, on="ts_ns", by=["ppid", "fd"], direction="backward"
            )
            found_codes = _codes(found)
            hit = found_codes >= 0
            resolved[found["row"].to_numpy()[hit]] = found_codes[hit]
    paths = pa.array(np.asarray(names, dtype=object)).take(pa.array(resolved, mask=resolved < 0))
    sys["path"] = pd.Series(paths.to_pandas(), index=sys.index).astype(sys["path"].dtype)
    return sys


def attribute_containers(
    events: pd.DataFrame, proc: pd.DataFrame, roots: Mapping[int, str]
) -> pd.Series:
    """The ``container`` column (as tracing.ingest.parse.attribute_containers)."""
    roles = set(roots.values())
    inside = events["in_container"].to_numpy(dtype=bool)
    if len(roles) == 1:
        (role,) = roles
        return pd.Series(np.where(inside, role, None), dtype="string")
    owner = container_owners(proc, roots)
    mapped = events["pid"].map(owner).astype("string")
    return mapped.where(inside, pd.NA)


def build_events(
    raw_dir: Path, roots: Mapping[int, str] | None = None
) -> tuple[pa.Table, ParseStats]:
    """Parse every raw tracer file of a run into one events table sorted by time.

    ``roots`` maps each container's first process (host pid) to its role, for the
    ``container`` column; None (raw files without a manifest) leaves the column null."""
    stats = ParseStats()
    sys = parse_syscalls(raw_dir / "syscalls.txt", stats)
    proc = parse_proc(raw_dir / "proc.txt", stats)
    proc = drop_thread_forks(proc, np.unique(sys["pid"].to_numpy()))
    forks = proc[proc["kind"] == "fork"]
    sys = resolve_paths(sys, forks)
    frames = [
        sys,
        parse_block(raw_dir / "block.txt", stats),
        parse_cache(raw_dir / "cache.txt", stats),
        proc,
    ]
    events = (
        pd.concat([f for f in frames if len(f)], ignore_index=True)
        if any(len(f) for f in frames)
        else frames[0]
    )
    events = events.sort_values("ts_ns", kind="stable", ignore_index=True)
    events["kind"] = events["kind"].astype(str)
    events["container"] = (
        attribute_containers(events, proc, roots)
        if roots
        else pd.Series(pd.NA, index=events.index, dtype="string")
    )
    events["host"] = pd.Series(pd.NA, index=events.index, dtype="string")
    table = pa.Table.from_pandas(events, preserve_index=False)
    table = table.select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA)
    return table, stats


def summarize(events: pa.Table, phases: pd.DataFrame, stats: ParseStats) -> dict:
    """Counts and bytes per kind, grouped as in summary.json (docs/run-format.md); with
    several containers also per container (``containers``)."""
    df = events.select(["kind", "bytes", "count", "container"]).to_pandas()
    df["kind"] = df["kind"].astype(str)
    result = {
        "steps": _steps(phases),
        "lost_events": stats.lost_events,
        "skipped_lines": stats.skipped_lines,
        **_kind_groups(df),
    }
    roles = sorted(set(df["container"].dropna()) | set(phases["container"].dropna()))
    if len(roles) > 1:
        result["containers"] = {role: _role_groups(df, phases, role) for role in roles}
    return result


def _role_groups(df: pd.DataFrame, phases: pd.DataFrame, role: str) -> dict:
    """Steps and kind groups of container ``role`` (summarize's per-container part, in a
    function of its own since the FROZEN COPY: the same computation)."""

    def own(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[(frame["container"] == role).fillna(False).to_numpy()]

    return {"steps": _steps(own(phases)), **_kind_groups(own(df))}


def _kind_groups(df: pd.DataFrame) -> dict[str, dict]:
    agg = df.groupby("kind", observed=True).agg(count=("count", "sum"), bytes=("bytes", "sum"))
    groups: dict[str, dict] = {"syscalls": {}, "block": {}, "page_cache": {}, "processes": {}}
    for kind, row in agg.iterrows():
        entry = {"count": int(row["count"]), "bytes": int(row["bytes"])}
        if kind.startswith("block_"):
            groups["block"][kind] = entry
        elif kind.startswith("cache_"):
            groups["page_cache"][kind] = entry
        elif kind in ("fork", "exec", "exit"):
            groups["processes"][kind] = int(row["count"])
        else:
            groups["syscalls"][kind] = entry
    return groups
