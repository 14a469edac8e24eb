"""The MLLOG emitter (workloads/events.py) and its parser (tracing/mllog.py)."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import pandas as pd
import pytest

from tracing.mllog import COLUMNS, parse_mllog
from workloads.events import Emitter


def _lines(path: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()]


def test_emitter_writes_mllog_lines_with_metadata(tmp_path: Path) -> None:
    log = tmp_path / "out" / "mllog.log"
    with Emitter(log, rank=3, instrumenting=True) as em:
        em.start("init")
        em.stop("init")
        with em.timed("model_forward_pass", epoch=1, step=4):
            time.sleep(0.01)
        em.duration("load_batch_mem", 100, 350, epoch=1, step=4)
        em.step_end(epoch=1, step=4, samples=2)
    events = _lines(log)
    assert [e["key"] for e in events] == [
        "init_start",
        "init_stop",
        "model_forward_pass",
        "load_batch_mem",
        "step_end",
    ]
    assert [e["event_type"] for e in events] == [
        "INTERVAL_START",
        "INTERVAL_END",
        "POINT_IN_TIME",
        "POINT_IN_TIME",
        "POINT_IN_TIME",
    ]
    for e in events:
        meta = e["metadata"]
        assert meta["rank"] == 3 and meta["pid"] == os.getpid()
        assert isinstance(meta["ts_ns"], int)
        # mllog's caller lookup names the code that called the emitter, not events.py
        assert meta["file"] == __file__
    forward = events[2]
    assert forward["value"] == forward["metadata"]["ts_ns"] - forward["metadata"]["start_ns"]
    assert forward["value"] >= 10_000_000
    assert events[3]["value"] == 250 and events[3]["metadata"]["start_ns"] == 100
    assert events[4]["value"] == 2 and events[4]["metadata"]["samples"] == 2


def test_emitter_not_instrumenting_skips_durations(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    em = Emitter(log)
    with em.timed("model_forward_pass"):
        pass
    em.duration("all_compute", 1, 2)
    em.step_end(epoch=1, step=0, samples=2)
    em.close()
    assert [e["key"] for e in _lines(log)] == ["step_end"]


def test_emitter_survives_fork_and_pickle(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    em = Emitter(log, instrumenting=True)
    em.point("parent")
    pid = os.fork()
    if pid == 0:  # child: inherited descriptor, own pid
        try:
            for i in range(200):
                em.duration("sample_load", i, i + 1, step=i)
        finally:
            os._exit(0)
    for i in range(200):
        em.duration("load_batch_mem", i, i + 1, step=i)
    os.waitpid(pid, 0)
    clone = pickle.loads(pickle.dumps(em.for_rank(1)))  # what a spawned rank receives
    clone.point("clone")
    em.close()
    clone.close()
    frame = parse_mllog(log)
    assert len(frame) == 402  # no line lost or torn by the concurrent appends
    assert set(frame.loc[frame.key == "sample_load", "pid"]) == {pid}
    assert set(frame.loc[frame.key == "load_batch_mem", "pid"]) == {os.getpid()}
    assert frame.loc[frame.key == "clone", "rank"].tolist() == [1]


def test_parse_real_log_columns_and_pairing(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    with Emitter(log, rank=0, instrumenting=True) as em:
        em.start("init")
        em.stop("init")
        em.start("run")
        em.start("epoch", epoch=1)
        em.duration("load_batch_mem", 1_000, 3_000, epoch=1, step=0)
        em.step_end(epoch=1, step=0, samples=2)
        em.stop("epoch", epoch=1, value={"steps": 1})
        em.start("checkpoint", epoch=1)
        em.stop("checkpoint", epoch=1, value=1234)
        em.stop("eval", epoch=1)  # a stop without a start is dropped
        em.start("epoch", epoch=2)  # never stopped: ends at the last timestamp
        em.point("last")
    frame = parse_mllog(log)
    assert list(frame.columns) == list(COLUMNS)
    assert {c: str(t) for c, t in frame.dtypes.items()} == {
        c: str(pd.Series([], dtype=t).dtype) for c, t in COLUMNS.items()
    }
    rows = {(r.key, r.epoch): r for r in frame.itertuples()}
    assert sorted(rows) == sorted(
        [
            ("init", -1),
            ("run", -1),
            ("epoch", 1),
            ("load_batch_mem", 1),
            ("step_end", 1),
            ("checkpoint", 1),
            ("epoch", 2),
            ("last", -1),
        ]
    )
    assert (frame.duration_ns == frame.end_ns - frame.ts_ns).all()
    assert frame.ts_ns.is_monotonic_increasing
    last_ns = rows[("last", -1)].ts_ns
    assert rows[("run", -1)].end_ns == last_ns  # unmatched start
    assert rows[("epoch", 2)].end_ns == last_ns
    assert rows[("epoch", 1)].kind == "interval" and json.loads(rows[("epoch", 1)].value) == {
        "steps": 1
    }
    assert rows[("checkpoint", 1)].value == "1234"
    batch = rows[("load_batch_mem", 1)]
    assert (batch.kind, batch.ts_ns, batch.end_ns, batch.step) == ("interval", 1_000, 3_000, 0)
    step = rows[("step_end", 1)]
    assert (step.kind, step.duration_ns, step.value, step.step) == ("point", 0, "2", 0)
    assert rows[("init", -1)].pid == os.getpid()


def test_parse_pairs_by_rank_not_pid(tmp_path: Path) -> None:
    def line(key: str, etype: str, ts: int, rank: int, pid: int) -> str:
        meta = {"ts_ns": ts, "rank": rank, "pid": pid, "epoch": 1, "step": -1}
        body = {
            "namespace": "",
            "time_ms": 0,
            "event_type": etype,
            "key": key,
            "value": None,
            "metadata": meta,
        }
        return ":::MLLOG " + json.dumps(body)

    log = tmp_path / "mllog.log"
    log.write_text(
        "\n".join(
            [
                line("eval_start", "INTERVAL_START", 10, 0, 100),
                line("eval_start", "INTERVAL_START", 11, 1, 200),
                line("eval_stop", "INTERVAL_END", 30, 1, 201),  # same rank, other pid
                line("eval_stop", "INTERVAL_END", 40, 0, 100),
            ]
        )
        + "\n"
    )
    frame = parse_mllog(log)
    assert frame[["key", "rank", "ts_ns", "end_ns", "pid"]].values.tolist() == [
        ["eval", 0, 10, 40, 100],
        ["eval", 1, 11, 30, 200],
    ]


def test_parse_ignores_other_lines_and_truncated_last_line(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    with Emitter(log) as em:
        em.step_end(epoch=1, step=0, samples=2)
    text = log.read_text()
    crashed = "epoch 1: 3 steps\n" + text + text[: len(text) // 2]  # killed mid-line
    log.write_text(crashed)
    frame = parse_mllog(log)
    assert frame.key.tolist() == ["step_end"]


def test_parse_warns_on_corrupt_line_in_the_middle(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    with Emitter(log) as em:
        em.point("a")
        em.point("b")
    first, second = log.read_text().splitlines()
    log.write_text(f"{first}\n:::MLLOG {{broken\n{second}\n")
    with pytest.warns(UserWarning, match="line 2"):
        frame = parse_mllog(log)
    assert frame.key.tolist() == ["a", "b"]


def test_parse_missing_file_gives_empty_typed_frame(tmp_path: Path) -> None:
    frame = parse_mllog(tmp_path / "absent.log")
    assert frame.empty and list(frame.columns) == list(COLUMNS)
    assert str(frame.ts_ns.dtype) == "int64" and str(frame["rank"].dtype) == "int32"


def test_emitter_lines_are_the_lines_mllog_writes(tmp_path: Path) -> None:
    """The emitter encodes with mllog's own encoder but finds its caller without
    ``inspect``: every field but the wall-clock time equals what ``MLLogger`` writes for the
    same event from the same line."""
    import logging

    from mlperf_logging.mllog import mllog

    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.Logger("capture")
    logger.addHandler(Capture())
    reference = mllog.MLLogger(logger=logger, default_stack_offset=1)
    meta = {"ts_ns": 5, "rank": 0, "pid": os.getpid(), "epoch": 1, "step": 2, "start_ns": 1}
    log = tmp_path / "mllog.log"
    with Emitter(log, instrumenting=True) as em:
        # one line, so both record the same caller line
        em.duration("sample_load", 1, 5, epoch=1, step=2); reference.event("sample_load", 4, metadata=meta)  # fmt: skip  # noqa: E702
    ours = _lines(log)[0]
    theirs = json.loads(lines[0].split(":::MLLOG ", 1)[1])
    ours.pop("time_ms"), theirs.pop("time_ms")
    assert ours == theirs
    assert list(ours["metadata"])[:2] == ["file", "lineno"] and ours["metadata"]["file"] == __file__
