"""A traced run's training progress (epoch, step, steps/s), read from its workloads' MLLOG files
as they grow.

Each workload container writes its events to ``/twintrace/out/mllog.log`` (``workloads/events.py``),
which is ``out/<role>/mllog.log`` of the run directory on the host (on a path every node shares
in a run across nodes, so the coordinator reads the files of every node's containers the same
way). :class:`TrainingWatch` reads them here, on the host, outside the run's cgroups: the tracer,
scoped to those cgroups, never sees these reads, and the pages it reads were just written (the
page cache serves them: no block I/O). A run whose containers write no MLLOG (``--variant
dlio``, ``--image``) has nothing to show, and shows nothing.

What it reads, per rank (``metadata.rank``; one file may hold several ranks, one container per
rank gives one file each): ``epoch_start``/``epoch_stop`` (the stop's value holds the epoch's
``steps``), ``step_end`` (``metadata.epoch``, ``metadata.step`` from 0, ``metadata.ts_ns``),
``eval``/``checkpoint`` intervals and ``run_stop``. The log does not say how many epochs a run
has nor, before an epoch has ended, how many steps an epoch has: the run's settings say the
first (``epochs``), and cap the second (``max_steps``); once an epoch has ended its step count
is the next one's total. The rate is the rank's steps over the last :data:`RATE_WINDOW_NS` of
its own ``step_end`` times (its container's clock: differences only, so a node's clock offset
does not matter).

Cost: every :data:`POLL_S` one ``stat`` of each file, and when it grew, one read of what was
appended (whole lines only: a line still being written is read again, whole, next time); the
lines that matter are picked out by a regular expression over the bytes and only they are
decoded (an ``instrumented`` run logs about eight lines a step, and its loader workers more).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.events import INTERVAL_KEYS

if TYPE_CHECKING:
    from tracing.request import ContainerSpec

#: Seconds between two reads of the files.
POLL_S = 0.25
#: The steps/s are those of the last 10 s of a rank's steps.
RATE_WINDOW_NS = 10_000_000_000
#: Bytes read from one file in one poll at most (the rest is read at the next polls).
READ_LIMIT = 4 << 20
#: How long :meth:`TrainingWatch.stop` waits for the thread (it finishes a poll, a read at most).
JOIN_S = 5.0

_STEP_END = "step_end"
_KEYS = {
    _STEP_END,
    *(key for name in ("run", "epoch", "eval", "checkpoint") for key in INTERVAL_KEYS[name]),
}
# A complete MLLOG line (the newline included) whose key is one of _KEYS: the other lines (the
# per-step and per-sample durations) are skipped without being decoded.
_WANTED = re.compile(
    rb':::MLLOG (\{[^\n]*"key": "(?:'
    + b"|".join(re.escape(k.encode()) for k in sorted(_KEYS))
    + rb')"[^\n]*)\n'
)


class LogTail:
    """The MLLOG events of one growing file, read a poll at a time: :meth:`read` returns the
    events of the lines completed since the last call. A file not there yet reads as empty; a
    file that shrank (replaced) is read again from its start."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return []
        if size < self.offset:
            self.offset = 0
        if size == self.offset:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(min(size - self.offset, READ_LIMIT))
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a last line without its newline is still being written
        if end == 0:
            if len(data) == READ_LIMIT:  # one line longer than a read: skip it
                self.offset += len(data)
            return []
        self.offset += end
        events = []
        for match in _WANTED.finditer(data, 0, end):
            try:
                event = json.loads(match.group(1))
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("key") in _KEYS:
                events.append(event)
        return events


@dataclasses.dataclass(frozen=True)
class RankProgress:
    """Where one rank is. ``step``: the steps it has done in epoch ``epoch``; ``steps``: the steps
    of an epoch when known; ``rate``: steps/s (None before two steps); ``phase``: ``training``,
    ``eval``, ``checkpoint`` or ``done``."""

    name: str
    epoch: int
    epochs: int | None
    step: int
    steps: int | None
    rate: float | None
    phase: str

    @property
    def done(self) -> bool:
        return self.phase == "done"


@dataclasses.dataclass(frozen=True)
class TrainingStatus:
    """Every rank that has started training, and what a terminal shows of them (:meth:`line`)."""

    ranks: tuple[RankProgress, ...]

    @property
    def slowest(self) -> RankProgress:
        """The rank furthest behind (a rank done is ahead of every rank still at work)."""
        return min(self.ranks, key=lambda r: (r.done, r.epoch, r.step))

    def line(self) -> str:
        """``epoch 1/3 · step 40/120 · 12.3 steps/s`` for the slowest rank (a total the run
        does not know yet is left out), then which rank that is when there are several."""
        r = self.slowest
        parts = [
            f"epoch {r.epoch}/{r.epochs}" if r.epochs else f"epoch {r.epoch}",
            f"step {r.step}/{r.steps}" if r.steps else f"step {r.step}",
        ]
        if r.phase == "training" and r.rate is not None:
            parts.append(f"{r.rate:.1f} steps/s" if r.rate >= 1 else f"{r.rate:.2f} steps/s")
        elif r.phase != "training":
            parts.append(
                {"eval": "evaluating", "checkpoint": "checkpointing"}.get(r.phase, r.phase)
            )
        if len(self.ranks) > 1:
            parts.append(f"slowest of {len(self.ranks)} ranks: {r.name}")
        return " · ".join(parts)


@dataclasses.dataclass
class _Rank:
    """One rank's state, as its events so far say."""

    epochs: int | None
    max_steps: int
    epoch: int = 0
    step: int = 0
    epoch_steps: int | None = None
    phase: str = "training"
    times: collections.deque[int] = dataclasses.field(default_factory=collections.deque)

    def apply(self, key: str, value: Any, meta: dict[str, Any]) -> None:
        epoch, step, ts = meta.get("epoch"), meta.get("step"), meta.get("ts_ns")
        if key == _STEP_END and isinstance(epoch, int) and isinstance(step, int):
            self.epoch, self.step, self.phase = epoch, step + 1, "training"
            if isinstance(ts, int):
                self.times.append(ts)
                while ts - self.times[0] > RATE_WINDOW_NS:
                    self.times.popleft()
        elif key == INTERVAL_KEYS["epoch"][0] and isinstance(epoch, int):
            self.epoch, self.step, self.phase = epoch, 0, "training"
        elif key == INTERVAL_KEYS["epoch"][1]:
            steps = value.get("steps") if isinstance(value, dict) else None
            if isinstance(steps, int):
                self.step = self.epoch_steps = steps
        elif key in (INTERVAL_KEYS["eval"][0], INTERVAL_KEYS["checkpoint"][0]):
            self.phase = key.removesuffix("_start")
        elif key in (INTERVAL_KEYS["eval"][1], INTERVAL_KEYS["checkpoint"][1]):
            self.phase = "training"
        elif key == INTERVAL_KEYS["run"][1]:
            self.phase = "done"

    def progress(self, name: str) -> RankProgress:
        rate = None
        if len(self.times) > 1 and self.times[-1] > self.times[0]:
            rate = (len(self.times) - 1) / ((self.times[-1] - self.times[0]) / 1e9)
        return RankProgress(
            name,
            self.epoch,
            self.epochs,
            self.step,
            self.epoch_steps or self.max_steps or None,
            rate,
            self.phase,
        )


Report = Callable[[TrainingStatus | None], None]


class TrainingWatch:
    """Reads the MLLOG files ``logs`` (role -> path) every :data:`POLL_S` in a thread of its own
    and calls ``report`` with the run's :class:`TrainingStatus` each time it changed, then with
    None once stopped (a display then takes its line away). ``totals``: role -> (epochs,
    max_steps) from the run's settings (``max_steps`` 0: the whole dataset).

    Use it as a context manager, or :meth:`start` and :meth:`stop` (which joins the thread) on
    every exit path. :meth:`poll` reads once, in the calling thread (what the thread does).
    An error in ``report`` or in reading ends the watch, never the run (:attr:`error`)."""

    def __init__(
        self,
        logs: Mapping[str, Path],
        report: Report,
        totals: Mapping[str, tuple[int | None, int]] | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.tails = {role: LogTail(path) for role, path in logs.items()}
        self.report = report
        self.totals = dict(totals or {})
        self.poll_s = poll_s
        self.error: BaseException | None = None
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported = False

    def poll(self) -> TrainingStatus | None:
        """Read what the files gained; the status of every rank that has started an epoch, or
        None before the first one has."""
        for role, tail in self.tails.items():
            for event in tail.read():
                meta = event.get("metadata")
                if not isinstance(meta, dict) or not isinstance(meta.get("rank"), int):
                    continue
                rank = self._ranks.get((role, meta["rank"]))
                if rank is None:
                    rank = self._ranks[(role, meta["rank"])] = _Rank(
                        *self.totals.get(role, (None, 0))
                    )
                rank.apply(event["key"], event.get("value"), meta)
        started = {key: r for key, r in self._ranks.items() if r.epoch > 0}
        if not started:
            return None
        names = _names(list(started))
        return TrainingStatus(tuple(r.progress(names[key]) for key, r in sorted(started.items())))

    def start(self) -> TrainingWatch:
        self._thread = threading.Thread(target=self._run, name="training-progress", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        last = None
        try:
            while not self._stopping.wait(self.poll_s):
                status = self.poll()
                if status is not None and status != last:
                    self._reported = True
                    self.report(status)
                    last = status
        except Exception as exc:  # no progress shown is no reason to fail the run
            self.error = exc

    def stop(self) -> None:
        """Stop the thread, wait for it (:data:`JOIN_S` at most: it is a daemon, a read that
        hangs on a shared file system cannot hold the process) and report None if it reported
        anything. Safe to call more than once."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(JOIN_S)
            self._thread = None
        if self._reported:
            self._reported = False
            with contextlib.suppress(Exception):
                self.report(None)

    def __enter__(self) -> TrainingWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _names(keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """How each (role, rank) is called: ``rank N`` when the ranks are distinct (one container
    of G ranks, or one container per rank), the role when each role has one rank (jobs side by
    side), else both."""
    ranks = [rank for _, rank in keys]
    roles = [role for role, _ in keys]
    if len(set(ranks)) == len(keys):
        return {key: f"rank {key[1]}" for key in keys}
    if len(set(roles)) == len(keys):
        return {key: key[0] for key in keys}
    return {key: f"{key[0]} rank {key[1]}" for key in keys}


class EpochBarrier:
    """The coordinator's half of the epoch barrier (``WorkloadConfig.epoch_barrier``;
    :data:`workloads.config.EPOCH_BARRIER_DIR`): in a thread of its own, once the run's ``ranks``
    ranks have all ended epoch E (their ``ended-E-R`` files, in any of ``folders``: one per
    container), calls ``between(E)`` (the dataset evicted from the page cache), records it in :attr:`drops`, then
    writes ``go-E`` into every folder, for E = 1 .. ``epochs`` - 1. An error in ``between`` is
    kept (:attr:`error`: the run fails saying it) and the ranks let go all the same, so the run
    ends instead of waiting. Use it as a context manager: the thread is stopped and joined on
    every way out."""

    def __init__(
        self,
        folders: list[Path],
        ranks: int,
        epochs: int,
        between: Callable[[int], None],
        poll_s: float = 0.01,
    ) -> None:
        self.folders = folders
        self.ranks = ranks
        self.epochs = epochs
        self.between = between
        self.poll_s = poll_s
        self.drops: list[dict[str, Any]] = []
        self.error: str | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _ended(self, epoch: int) -> int:
        """How many ranks have ended ``epoch``: one listing of each folder (a rank writes its
        file into its own container's)."""
        from workloads.config import epoch_ended_prefix

        prefix = epoch_ended_prefix(epoch)
        return sum(
            name.startswith(prefix)
            for folder in self.folders
            if folder.is_dir()
            for name in os.listdir(folder)
        )

    def _run(self) -> None:
        from workloads.config import epoch_go_name

        for epoch in range(1, self.epochs):
            while self._ended(epoch) < self.ranks:
                if self._stopping.wait(self.poll_s):
                    return
            began = time.monotonic_ns()
            try:
                self.between(epoch)
            except Exception as exc:  # noqa: BLE001 - said as the run's error
                self.error = self.error or f"after epoch {epoch}: {exc}"
            ended = time.monotonic_ns()
            self.drops.append({"epoch": epoch, "at_ns": began, "took_s": (ended - began) / 1e9})
            for folder in self.folders:
                (folder / epoch_go_name(epoch)).touch()

    def __enter__(self) -> EpochBarrier:
        self._thread = threading.Thread(target=self._run, name="epoch-barrier", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(JOIN_S)
            self._thread = None


def event_log(run_dir: Path, role: str) -> Path:
    """Where the container ``role`` writes its MLLOG events (at ``rundir.EVENT_LOG_PATH``
    inside), on this host: in the run directory's ``out/``, a path every node shares."""
    return run_dir / "out" / role / "mllog.log"


def keep_outputs(specs: Sequence[ContainerSpec], run_dir: Path, started_ns: int | None) -> None:
    """Each container's MLLOG (and a DLIO run's own outputs) moved from the run directory's
    ``out/`` into ``raw/ROLE/``, once its containers are gone. A container that mounts its own
    /twintrace/out (a compose service) writes its MLLOG there: copied (never moved: it is the
    user's) when it was written during this run (since ``started_ns``)."""
    from tracing.container import OUT_MOUNT

    for spec in specs:
        raw = run_dir / "raw" / spec.role
        peer_out = run_dir / "out" / spec.role / "dlio"
        if peer_out.is_dir():
            shutil.move(peer_out, raw / "dlio")
        mllog = event_log(run_dir, spec.role)
        if mllog.exists():
            shutil.move(mllog, raw / "mllog.log")
            continue
        if spec.out or started_ns is None:
            continue
        for mount in spec.mounts:
            if mount.target != OUT_MOUNT:
                continue
            try:
                written = (mount.source / "mllog.log").stat().st_mtime_ns
            except OSError:
                break
            if time.monotonic_ns() - (time.time_ns() - written) >= started_ns:
                shutil.copyfile(mount.source / "mllog.log", raw / "mllog.log")


@contextlib.contextmanager
def watch_training(
    specs: Sequence[ContainerSpec], run_dir: Path, report: Report | None
) -> Iterator[None]:
    """``report`` hears the training progress of the run's containers (``specs``) while the
    body runs (nothing when None); the watch's thread is stopped and joined on every way out."""
    logs = {spec.role: event_log(run_dir, spec.role) for spec in specs if spec.out}
    if report is None or not logs:
        yield
        return
    totals = {
        spec.role: (spec.config.epochs, spec.config.max_steps)
        for spec in specs
        if spec.config is not None
    }
    with TrainingWatch(logs, report, totals):
        yield


@contextlib.contextmanager
def cold_epochs(
    specs: Sequence[ContainerSpec],
    run_dir: Path,
    datasets: Sequence[Path],
    manifest: dict[str, Any],
    progress: Callable[[str], None],
) -> Iterator[EpochBarrier | None]:
    """Between the epochs of a run whose config asks for it (``epoch_barrier``: ``trace
    --cold-epochs``), the run's ``datasets`` evicted from the page cache
    (:func:`tracing.host.evict_files`) while every rank waits (:class:`EpochBarrier`); each
    eviction recorded in the manifest (``cache_drops``). None for any other run."""
    from core.units import format_size
    from tracing.host import evict_files
    from workloads.config import EPOCH_BARRIER_DIR

    trained = [spec for spec in specs if spec.config is not None and spec.out]
    first = trained[0].config if trained else None
    if first is None or not first.epoch_barrier or first.epochs < 2:
        yield None
        return

    def between(epoch: int) -> None:
        evicted = evict_files(datasets)
        progress(
            f"epoch {epoch} ended on every rank: the dataset ({format_size(evicted)}) evicted "
            "from the page cache"
        )

    folders = [event_log(run_dir, spec.role).parent / EPOCH_BARRIER_DIR for spec in trained]
    with EpochBarrier(folders, first.accelerators, first.epochs, between) as barrier:
        try:
            yield barrier
        finally:
            manifest["cache_drops"] = barrier.drops
