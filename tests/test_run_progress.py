"""A traced run's training progress (tracing/progress.py), read from MLLOG files written as the
workloads write them (workloads/events.py's Emitter), and trace's line on a terminal."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from commands.trace import training_line
from tests.conftest import REPO, traced_events
from tracing import container
from tracing.progress import (
    LogTail,
    RankProgress,
    TrainingStatus,
    TrainingWatch,
    event_log,
    watch_training,
)
from tracing.request import ContainerSpec
from workloads.config import WorkloadConfig
from workloads.events import Emitter


def _epoch(em: Emitter, epoch: int, steps: int, *, stop: bool = True) -> None:
    """What the training loop logs for an epoch of ``steps`` steps (workloads/training.py):
    instrumented per-step durations too, which the watch must skip."""
    em.start("epoch", epoch=epoch)
    for step in range(steps):
        em.duration("load_batch_mem", 1, 2, epoch=epoch, step=step)
        em.step_end(epoch=epoch, step=step, samples=2)
    if stop:
        em.stop("epoch", epoch=epoch, value={"steps": steps, "samples": 2 * steps})


def test_figures_follow_the_growing_log(tmp_path: Path) -> None:
    log = tmp_path / "out" / "main" / "mllog.log"
    watch = TrainingWatch({"main": log}, lambda status: None, totals={"main": (3, 0)})
    assert watch.poll() is None  # the container has not written its log yet
    with Emitter(log, instrumenting=True) as em:
        em.start("init")
        em.stop("init")
        em.start("run")
        assert watch.poll() is None  # no epoch yet: nothing to show
        _epoch(em, 1, 5, stop=False)
        status = watch.poll()
        assert status is not None
        (rank,) = status.ranks
        # epochs from the run's settings; an epoch's steps are not known before one ends
        assert (rank.epoch, rank.epochs, rank.step, rank.steps) == (1, 3, 5, None)
        assert rank.phase == "training" and rank.rate is not None and rank.rate > 0
        assert status.line().startswith("epoch 1/3 · step 5 · ")
        assert status.line().endswith(" steps/s")
        em.stop("epoch", epoch=1, value={"steps": 5, "samples": 10})
        _epoch(em, 2, 2, stop=False)
        (rank,) = watch.poll().ranks
        assert (rank.epoch, rank.step, rank.steps) == (2, 2, 5)  # epoch 1's steps: the total
        em.stop("epoch", epoch=2, value={"steps": 5, "samples": 10})
        em.start("eval", epoch=2)
        status = watch.poll()
        assert status.line() == "epoch 2/3 · step 5/5 · evaluating"
        em.stop("eval", epoch=2)
        em.start("checkpoint", epoch=2)
        assert watch.poll().line() == "epoch 2/3 · step 5/5 · checkpointing"
        em.stop("checkpoint", epoch=2)
        _epoch(em, 3, 5)
        em.stop("run")
        assert watch.poll().line() == "epoch 3/3 · step 5/5 · done"
    assert watch.poll() == watch.poll()  # nothing new: the same status


def test_max_steps_is_the_total_until_an_epoch_ends(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    watch = TrainingWatch({"main": log}, lambda status: None, totals={"main": (2, 40)})
    with Emitter(log) as em:
        _epoch(em, 1, 3, stop=False)
    assert watch.poll().line().startswith("epoch 1/2 · step 3/40 · ")


def test_a_partly_written_last_line_is_not_misread(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    with Emitter(log) as em:
        em.start("epoch", epoch=1)
        em.step_end(epoch=1, step=0, samples=2)
    # The next line as the Emitter writes it, reaching the file in two parts.
    scratch = tmp_path / "scratch.log"
    with Emitter(scratch) as em:
        em.step_end(epoch=1, step=1, samples=2)
    line = scratch.read_bytes()
    watch = TrainingWatch({"main": log}, lambda status: None)
    assert watch.poll().ranks[0].step == 1
    done = watch.tails["main"].offset
    half = len(line) // 2
    for part in (line[:half], line[half:-1]):  # all of it but its newline, in two writes
        with open(log, "ab") as f:
            f.write(part)
        assert watch.poll().ranks[0].step == 1  # not yet: the line is not whole
        assert watch.tails["main"].offset == done
    with open(log, "ab") as f:
        f.write(b"\n")
    assert watch.poll().ranks[0].step == 2
    assert watch.tails["main"].offset == log.stat().st_size


def test_a_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    with Emitter(log) as em:
        _epoch(em, 1, 4, stop=False)
    tail = LogTail(log)
    assert [e["key"] for e in tail.read()] == ["epoch_start"] + ["step_end"] * 4
    log.unlink()
    assert tail.read() == []
    with Emitter(log) as em:
        em.start("epoch", epoch=1)
    assert [e["key"] for e in tail.read()] == ["epoch_start"]


def test_the_slowest_rank_is_shown(tmp_path: Path) -> None:
    # One container per rank: a file each.
    logs = {f"rank{r}": tmp_path / f"rank{r}" / "mllog.log" for r in range(3)}
    for r, path in logs.items():
        with Emitter(path, rank=int(r[-1])) as em:
            _epoch(em, 1, {"rank0": 6, "rank1": 4, "rank2": 5}[r], stop=False)
    status = TrainingWatch(logs, lambda status: None, {r: (1, 0) for r in logs}).poll()
    assert [r.name for r in status.ranks] == ["rank 0", "rank 1", "rank 2"]
    assert status.slowest.name == "rank 1"
    assert status.line().startswith("epoch 1/1 · step 4 · ")
    assert status.line().endswith(" · slowest of 3 ranks: rank 1")
    # One container of two ranks (rank processes writing one file), a rank done is ahead.
    log = tmp_path / "main" / "mllog.log"
    with Emitter(log) as em, em.for_rank(1) as em1:
        _epoch(em, 1, 2)
        em.stop("run")
        _epoch(em1, 1, 1, stop=False)
    status = TrainingWatch({"main": log}, lambda status: None).poll()
    assert status.slowest == status.ranks[1]
    assert status.line().endswith("slowest of 2 ranks: rank 1")


def test_rank_names() -> None:
    from tracing.progress import _names

    assert list(_names([("main", 0), ("main", 1)]).values()) == ["rank 0", "rank 1"]
    assert list(_names([("job0", 0), ("job1", 0)]).values()) == ["job0", "job1"]
    both = _names([("a", 0), ("a", 1), ("b", 0)])
    assert list(both.values()) == ["a rank 0", "a rank 1", "b rank 0"]


def test_a_log_without_training_shows_nothing(tmp_path: Path) -> None:
    # A DLIO run writes no MLLOG; a storage container's log has no epochs.
    storage = tmp_path / "storage" / "mllog.log"
    with Emitter(storage) as em:
        em.start("init")
        em.point("offload_plan", {"layers": 2})
    watch = TrainingWatch({"main": tmp_path / "main" / "mllog.log", "storage": storage}, print)
    assert watch.poll() is None


def test_stop_joins_the_thread_and_clears_the_display(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    reports: list[TrainingStatus | None] = []
    seen = threading.Event()

    def report(status: TrainingStatus | None) -> None:
        reports.append(status)
        seen.set()

    watch = TrainingWatch({"main": log}, report, poll_s=0.01).start()
    thread = watch._thread
    assert thread is not None and thread.is_alive() and thread.daemon
    with Emitter(log) as em:
        _epoch(em, 1, 3, stop=False)
    assert seen.wait(10)
    watch.stop()
    assert not thread.is_alive() and thread not in threading.enumerate()
    assert reports[0] is not None and reports[0].ranks[0].step == 3
    assert reports[-1] is None
    count = len(reports)
    watch.stop()  # a second stop does nothing
    assert len(reports) == count


def test_an_error_in_the_report_ends_the_watch_not_the_run(tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    with Emitter(log) as em:
        _epoch(em, 1, 1, stop=False)

    def broken(status: TrainingStatus | None) -> None:
        raise OSError("the terminal went away")

    with TrainingWatch({"main": log}, broken, poll_s=0.01) as watch:
        deadline = time.monotonic() + 10
        while watch.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert isinstance(watch.error, OSError)


def test_the_runner_watches_the_containers_out_logs(tmp_path: Path) -> None:
    config = WorkloadConfig("unet3d", "sleep", epochs=4, max_steps=7)
    specs = [ContainerSpec("rank0", "img", config=config), ContainerSpec("own", "img", out=False)]
    log = event_log(tmp_path, "rank0")
    with Emitter(log) as em:
        _epoch(em, 1, 2, stop=False)
    reports: list[TrainingStatus | None] = []
    with watch_training(specs, tmp_path, reports.append):
        deadline = time.monotonic() + 10
        while not reports and time.monotonic() < deadline:
            time.sleep(0.05)
    assert reports[0].line().startswith("epoch 1/4 · step 2/7 · ")
    assert reports[-1] is None
    assert not any(t.name == "training-progress" for t in threading.enumerate())
    with watch_training(specs, tmp_path, None):  # nothing to report to: no thread
        assert not any(t.name == "training-progress" for t in threading.enumerate())


def test_trace_shows_the_line_on_a_terminal_only() -> None:
    status = TrainingStatus((RankProgress("rank 0", 1, 3, 40, 120, 12.34, "training"),))
    assert status.line() == "epoch 1/3 · step 40/120 · 12.3 steps/s"
    log = io.StringIO()
    with training_line(Console(file=log, force_terminal=False)) as show:
        assert show is None  # a log file: no progress lines, no watch
    assert log.getvalue() == ""
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100, markup=False)
    stderr = sys.stderr
    with training_line(console) as show:
        assert show is not None
        assert screen.getvalue() == ""  # nothing until the first status (a DLIO run: never)
        show(status)
        assert sys.stderr is not stderr  # taken over: a container's lines go above the line
        container.stderr_sink(b"[rank0] a line of the run\n")
        show(None)
        assert sys.stderr is stderr
        show(status)  # shown again; the end of the command takes it away
    assert sys.stderr is stderr
    out = screen.getvalue()
    assert out.count("epoch 1/3 · step 40/120 · 12.3 steps/s") >= 2
    assert "[rank0] a line of the run\n" in out
    show(status)  # a late report, after the command's end, shows nothing
    assert screen.getvalue() == out


def _run_on_a_terminal(argv: list[str], timeout: float) -> tuple[int, int, str, str]:
    """``argv`` with its stderr on a pseudo-terminal: (pid, exit status, stdout, the terminal's
    bytes as text)."""
    master, slave = pty.openpty()
    env = {**os.environ, "TWINTRACE_NO_REEXEC": "1", "TERM": "xterm", "COLUMNS": "200"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env, text=True)
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1.0)[0]:
                if proc.poll() is not None:  # ended, and its output read
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not chunk:
                break
            screen += chunk
        else:
            proc.kill()
        stdout = proc.communicate(timeout=60)[0]
    finally:
        os.close(master)
    return proc.pid, proc.returncode, stdout, screen.decode(errors="replace")


@pytest.mark.integration
@pytest.mark.docker
@pytest.mark.bpftrace
def test_a_traced_run_shows_its_ranks_progress_on_a_terminal(
    images, tiny_unet3d: Path, runs_root: Path
) -> None:
    # Two rank containers, 3 epochs (of 7 steps: 14 cases, batch 1, half each), a step
    # emulated in about 0.55 s: the watch, polling 4 times a second, sees most of them.
    pid, code, stdout, screen = _run_on_a_terminal(
        [sys.executable, str(REPO / "cli.py"), "trace", "--workload", "unet3d"]
        + ["--variant", "sleep", "--data", str(tiny_unet3d), "--epochs", "3"]
        + ["--batch-size", "1", "--workers", "1", "--accelerators", "2", "--rank-containers"]
        + ["--set", "patch_size=32", "--out", str(runs_root)],
        timeout=600,
    )
    assert code == 0, screen[-3000:]
    run_dir = Path(stdout.splitlines()[-1])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    # Ground truth: the steps each rank logged in each epoch.
    phases = pd.read_parquet(run_dir / "phases.parquet")
    steps = phases[phases["key"] == "step_end"].groupby(["container", "epoch"]).size()
    assert len(steps) == 6 and steps.nunique() == 1, steps
    n = int(steps.iloc[0])
    shown = re.findall(
        r"epoch (\d)/3 · step (\d+)(?:/(\d+))? · [^\r\n\x1b]*?slowest of 2 ranks: rank [01]",
        screen,
    )
    assert len(shown) >= 3, screen[-3000:]
    for epoch, step, total in shown:
        assert 1 <= int(epoch) <= 3 and 0 <= int(step) <= n
        assert total in ("", str(n))  # known once an epoch has ended: the steps it had
    assert any(total == str(n) for _, _, total in shown)  # epochs 2 and 3
    assert any(int(step) < n for _, step, _ in shown)  # seen during an epoch, not only at its end
    assert "\x1b[2K" in screen  # redrawn in place
    # The coordinator read out/<role>/mllog.log on the host: nothing of it is in the trace. Of
    # its own I/O only the block lane, which is host-wide by design, may hold a request (a
    # manifest's write reaching the disk), never in a container, never a read.
    events = traced_events(run_dir)
    mine = events[events["pid"] == pid]
    assert (mine["kind"].str.startswith("block_") & ~mine["in_container"]).all(), mine
    assert not (mine["kind"] == "block_read").any()
    assert not events["path"].str.contains(str(run_dir), regex=False, na=False).any()
    outside = events[events["container"].isna()]  # block requests of the host's own threads
    assert not outside["kind"].isin(["openat", "read", "pread64", "readv"]).any()
