"""DLIO's own outputs as a run's phases: what the breakdowns, timelines and ``compare`` read.

A ``dlio`` run's container writes DLIO's outputs (``workloads.dlio.OUTPUT_DIR``), which the runner
keeps in ``raw/<role>/dlio/``:

- ``<rank>_output.json``: per epoch and per block of steps (blocks end at checkpoints), each
  step's ``load`` (waiting for the batch), ``proc`` (from the start of that wait to the end of
  the step's computation) and ``compute`` (the computation time it emulated), in seconds;
- ``dlio.log``: one line per step and rank when it is processed,
  ``<ts> Rank R step N processed B samples in P s``, ``ts`` the wall-clock time (microseconds);
- ``per_epoch_stats.json``: rank 0's epoch, block and checkpoint start and end times;
- ``summary.json``: its AU and throughput (:func:`dlio_summary` reads them).

Each step becomes the rows our workloads log (docs/run-format.md, phases.parquet), so a DLIO run
is measured as ours are: ``step_end`` at the step's log time (value: its samples),
``load_batch_mem`` from ``ts - proc`` for ``load`` seconds, ``all_compute`` the last
``compute`` seconds before ``ts`` (DLIO's computation is a sleep that ends the step), and
``epoch``/``checkpoint`` intervals from ``per_epoch_stats.json``. DLIO's steps count from 1 in an
epoch; ours from 0. Wall-clock times become CLOCK_MONOTONIC with the offset the runner measured
at the run's start (``realtime_offset_ns``: CLOCK_REALTIME - CLOCK_MONOTONIC, one kernel).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from tracing.mllog import COLUMNS, empty_phases

_STEP_LINE = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}) Rank (\d+) step (\d+) processed (\d+) samples in "
    r"([0-9.eE+-]+) s"
)
_OUTPUT = re.compile(r"^(\d+)_output\.json$")


def _wall_ns(text: str) -> int:
    """A DLIO timestamp (``%Y-%m-%dT%H:%M:%S.%f``, the container's local time: UTC) in ns."""
    moment = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC)
    return (int(moment.timestamp()) * 1_000_000 + moment.microsecond) * 1000


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _steps_of(output: dict[str, Any], epoch: str) -> tuple[list[float], list[float], list[float]]:
    """Load, proc and compute seconds of an epoch's steps, blocks in order."""
    record = output.get(epoch)
    if not isinstance(record, dict):
        return [], [], []
    lists: list[list[float]] = [[], [], []]
    for k, name in enumerate(("load", "proc", "compute")):
        part = record.get(name)
        if isinstance(part, dict):
            blocks = sorted(
                (key for key in part if str(key).startswith("block")),
                key=lambda key: int(str(key)[5:] or 0),
            )
            for key in blocks:
                lists[k].extend(float(x) for x in part[key])
        elif isinstance(part, list):  # DLIO's first block of an epoch when it lost its key
            lists[k].extend(float(x) for x in part)
    return lists[0], lists[1], lists[2]


def parse_dlio(out_dir: Path, realtime_offset_ns: int, sample_scale: int = 1) -> pd.DataFrame:
    """The phases of the DLIO outputs in ``out_dir`` (module doc); an empty frame when there
    are none. ``realtime_offset_ns``: CLOCK_REALTIME - CLOCK_MONOTONIC during the run;
    ``sample_scale``: our samples in one of DLIO's (DLRM's DLIO samples are whole batches), so
    ``step_end`` counts ours."""
    out_dir = Path(out_dir)
    log = out_dir / "dlio.log"
    if not log.exists():
        return empty_phases()
    # (rank, step) -> (log time, samples) in order: one per epoch
    ends: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for match in _STEP_LINE.finditer(log.read_text(errors="replace")):
        key = (int(match.group(2)), int(match.group(3)))
        when = _wall_ns(match.group(1)) - realtime_offset_ns
        ends.setdefault(key, []).append((when, int(match.group(4))))
    cols: dict[str, list[Any]] = {name: [] for name in COLUMNS if name != "duration_ns"}

    def add(ts: int, end: int, key: str, rank: int, epoch: int, step: int, value: Any) -> None:
        for name, item in (
            ("ts_ns", ts),
            ("end_ns", end),
            ("key", key),
            (
                "kind",
                "interval" if end != ts or key not in ("step_end", "accelerator") else "point",
            ),
            ("rank", rank),
            ("pid", -1),
            ("epoch", epoch),
            ("step", step),
            ("value", json.dumps(value)),
        ):
            cols[name].append(item)

    outputs = sorted(
        (int(m.group(1)), p) for p in out_dir.iterdir() if (m := _OUTPUT.match(p.name))
    )
    first_end = None
    for rank, path in outputs:
        output = _load_json(path)
        if not isinstance(output, dict):
            continue
        epochs = sorted(int(k) for k in output if str(k).isdigit())
        for epoch in epochs:
            load, proc, compute = _steps_of(output, str(epoch))
            for index, (wait, span, busy) in enumerate(zip(load, proc, compute, strict=False)):
                times = ends.get((rank, index + 1), [])
                nth = epochs.index(epoch)
                if nth >= len(times):
                    continue  # a step the log does not place in time
                end, samples = times[nth]
                start = end - round(span * 1e9)
                step = index
                add(start, start + round(wait * 1e9), "load_batch_mem", rank, epoch, step, None)
                add(end - round(busy * 1e9), end, "all_compute", rank, epoch, step, None)
                add(end, end, "step_end", rank, epoch, step, samples * sample_scale)
                first_end = end if first_end is None else min(first_end, end)
    if first_end is not None:
        for rank, _ in outputs:
            add(first_end, first_end, "accelerator", rank, -1, -1, "emulated: DLIO")
    stats = _load_json(out_dir / "per_epoch_stats.json")
    if isinstance(stats, dict):
        for epoch_key, record in stats.items():
            if not (str(epoch_key).isdigit() and isinstance(record, dict)):
                continue
            epoch = int(epoch_key)
            for name, span in record.items():
                if not (isinstance(span, dict) and "start" in span and "end" in span):
                    continue
                key = "checkpoint" if name.startswith("ckpt") else None
                if key is None:
                    continue
                add(
                    _wall_ns(span["start"]) - realtime_offset_ns,
                    _wall_ns(span["end"]) - realtime_offset_ns,
                    key,
                    0,
                    epoch,
                    -1,
                    None,
                )
            if "start" in record and "end" in record:
                add(
                    _wall_ns(record["start"]) - realtime_offset_ns,
                    _wall_ns(record["end"]) - realtime_offset_ns,
                    "epoch",
                    0,
                    epoch,
                    -1,
                    None,
                )
    if not cols["ts_ns"]:
        return empty_phases()
    cols["duration_ns"] = [e - s for s, e in zip(cols["ts_ns"], cols["end_ns"], strict=True)]
    frame = pd.DataFrame(
        {name: pd.Series(cols[name], dtype=dtype) for name, dtype in COLUMNS.items()}
    )
    return frame.sort_values("ts_ns", kind="stable", ignore_index=True)


def dlio_summary(out_dir: Path) -> dict[str, Any] | None:
    """DLIO's own figures of a run (its ``summary.json``): AU (percent, mean over epochs and
    ranks), throughput (samples/s) and I/O (MB/s), or None without the file."""
    summary = _load_json(Path(out_dir) / "summary.json")
    if not isinstance(summary, dict):
        return None
    metric = summary.get("metric") or {}
    return {
        "au_percent": metric.get("train_au_mean_percentage"),
        "au_percent_per_epoch": metric.get("train_au_percentage"),
        "throughput_samples_per_s": metric.get("train_throughput_mean_samples_per_second"),
        "io_mb_per_s": metric.get("train_io_mean_MB_per_second"),
        "epochs": summary.get("epochs"),
        "accelerators": summary.get("num_accelerators"),
    }
