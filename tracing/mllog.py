"""Parse a workload's MLLOG file (``raw/mllog.log``) into the rows of ``phases.parquet``.

Input: MLCommons ``:::MLLOG {json}`` lines as written by :mod:`workloads.events` (other lines,
e.g. stray prints, are ignored). Output columns, documented in docs/run-format.md:
``ts_ns``, ``end_ns``, ``duration_ns`` (int64), ``key``, ``kind`` (string), ``rank``, ``pid``,
``epoch``, ``step`` (int32), ``value`` (the event's value as a JSON string).

- ``X_start`` / ``X_stop`` pairs become one ``interval`` row with key ``X``. Pairs are matched
  by (X, rank, epoch), not by pid, so a stop written by another process of the same rank still
  closes the interval; the innermost open start is closed first. A start never stopped (the
  workload crashed or was interrupted) ends at the last timestamp in the file; a stop without
  a start is dropped. The row's value is the stop's value, or the start's when the stop has none.
- Duration events (POINT_IN_TIME with metadata ``start_ns``) become ``interval`` rows from
  ``start_ns`` to ``ts_ns``.
- Other POINT_IN_TIME events (``step_end``, ...) become ``point`` rows.

Times come from metadata ``ts_ns`` (CLOCK_MONOTONIC). Lines from foreign MLLOG writers without
it fall back to ``time_ms`` (wall clock) x 1e6; such a file cannot be aligned with the trace.
A truncated last line (the writer was killed mid-line) is ignored silently; other undecodable
MLLOG lines are skipped with a warning naming their line numbers.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from store.rundir import PHASES_COLUMNS

MARKER = ":::MLLOG"

# The documented columns and dtypes of phases.parquet (the one definition is in store.rundir),
# but ``container`` and ``host``: one MLLOG file is one container's, and ingest says which.
COLUMNS: Mapping[str, str] = {
    k: v for k, v in PHASES_COLUMNS.items() if k not in ("container", "host")
}


def empty_phases() -> pd.DataFrame:
    """A phases frame with no rows and the documented dtypes."""
    return pd.DataFrame({name: pd.Series([], dtype=dtype) for name, dtype in COLUMNS.items()})


def _decode(path: Path) -> list[dict[str, Any]]:
    """The decoded JSON objects of the MLLOG lines of ``path``, in file order."""
    lines = path.read_text(errors="replace").splitlines()
    events: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, line in enumerate(lines, start=1):
        at = line.find(MARKER)
        if at < 0:
            continue
        try:
            event = json.loads(line[at + len(MARKER) :])
        except json.JSONDecodeError:
            if number != len(lines):  # a crash truncates only the last line
                bad.append(number)
            continue
        if isinstance(event, dict) and isinstance(event.get("key"), str):
            events.append(event)
        else:
            bad.append(number)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        warnings.warn(
            f"{path}: skipped {len(bad)} malformed MLLOG line(s) (line {shown})", stacklevel=3
        )
    return events


def _int(meta: dict[str, Any], name: str, default: int = -1) -> int:
    value = meta.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def parse_mllog(path: str | Path) -> pd.DataFrame:
    """Parse MLLOG file ``path`` into a phases frame sorted by ``ts_ns`` (see module doc).

    A missing file gives an empty frame with the documented dtypes.
    """
    path = Path(path)
    if not path.exists():
        return empty_phases()
    events = _decode(path)
    if not events:
        return empty_phases()

    cols: dict[str, list[Any]] = {name: [] for name in COLUMNS}

    def add(ts: int, end: int, key: str, kind: str, meta: dict[str, Any], value: Any) -> None:
        cols["ts_ns"].append(ts)
        cols["end_ns"].append(end)
        cols["key"].append(key)
        cols["kind"].append(kind)
        cols["rank"].append(_int(meta, "rank"))
        cols["pid"].append(_int(meta, "pid"))
        cols["epoch"].append(_int(meta, "epoch", _int(meta, "epoch_num")))
        cols["step"].append(_int(meta, "step"))
        cols["value"].append(json.dumps(value))

    # Open intervals: (name, rank, epoch) -> stack of (ts_ns, metadata, value) of starts.
    open_: dict[tuple[str, int, int], list[tuple[int, dict[str, Any], Any]]] = {}
    last_ns = 0
    for event in events:
        meta = event.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        ts = _int(meta, "ts_ns", _int(event, "time_ms", 0) * 1_000_000)
        last_ns = max(last_ns, ts)
        key: str = event["key"]
        etype = event.get("event_type")
        value = event.get("value")
        if etype == "INTERVAL_START" and key.endswith("_start"):
            ident = (key[: -len("_start")], _int(meta, "rank"), _int(meta, "epoch"))
            open_.setdefault(ident, []).append((ts, meta, value))
        elif etype == "INTERVAL_END" and key.endswith("_stop"):
            ident = (key[: -len("_stop")], _int(meta, "rank"), _int(meta, "epoch"))
            starts = open_.get(ident)
            if starts:  # a stop without a start is dropped
                start_ts, start_meta, start_value = starts.pop()
                chosen = start_value if value is None else value
                add(start_ts, ts, ident[0], "interval", start_meta, chosen)
        elif "start_ns" in meta:
            add(_int(meta, "start_ns", ts), ts, key, "interval", meta, value)
        else:
            add(ts, ts, key, "point", meta, value)
    for (name, _, _), starts in open_.items():
        for start_ts, start_meta, start_value in starts:
            add(start_ts, max(last_ns, start_ts), name, "interval", start_meta, start_value)

    cols["duration_ns"] = [end - ts for ts, end in zip(cols["ts_ns"], cols["end_ns"], strict=True)]
    frame = pd.DataFrame(
        {name: pd.Series(cols[name], dtype=dtype) for name, dtype in COLUMNS.items()}
    )
    return frame.sort_values("ts_ns", kind="stable", ignore_index=True)
