"""Application events in the MLCommons ``:::MLLOG {json}`` format, written by the workloads.

An :class:`Emitter` appends one line per event to a log file (inside the container
``/twintrace/out/mllog.log``); ``tracing/mllog.py`` turns the file into ``phases.parquet``
(see docs/run-format.md). Lines are encoded by ``mlperf_logging.mllog``'s own encoder, with
the caller's file and line as its ``MLLogger`` records them, so the file is also readable by
MLCommons tooling.

Every event carries in ``metadata``: ``ts_ns`` (``time.monotonic_ns()``, the clock bpftrace
uses, taken at the event or at the END of a timed interval), ``rank``, ``pid``
(``os.getpid()`` of the writing process, e.g. a DataLoader worker), ``epoch`` and ``step``
(-1 where not meaningful). Three shapes:

- intervals: ``<name>_start`` (INTERVAL_START) / ``<name>_stop`` (INTERVAL_END) for ``init``,
  ``run``, ``epoch``, ``eval``, ``checkpoint`` (mllog constants where they exist);
- duration events: POINT_IN_TIME, ``value`` = duration in ns, metadata ``start_ns`` as well.
  Logged only when the emitter is ``instrumenting`` (variants ``instrumented`` and ``sleep``);
- points: POINT_IN_TIME without ``start_ns``, e.g. ``step_end`` (``value`` and metadata
  ``samples`` = samples in the step), logged by every variant.

Several processes write to one file: the emitter opens it with ``O_APPEND`` and writes each
line with a single ``os.write``, so lines from forked DataLoader workers (which inherit the
descriptor) or spawned rank processes (which reopen it when the emitter is unpickled) never
interleave, and nothing sits in a user-space buffer to be lost or duplicated by ``fork``.

Cost: ~7 us per event on the 2-core build machine (``MLLogger`` itself took ~150 us: it reads
the caller's source line through ``inspect`` and goes through ``logging``; with a DataLoader
worker logging two events per sample, that made ``instrumented`` AlexNet steps 7-9 % slower
than ``original`` ones). Timestamps are taken before encoding, and the training loop logs a
step's durations after the step, so this cost never falls inside a measured interval.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import _encode_log

#: The point event each rank logs once, before its first step, saying what computes its steps
#: (value ``cpu``, ``cuda:N`` or ``emulated: CARD``; ``workloads.training.accelerator_label``).
ACCELERATOR_KEY = "accelerator"
#: The point event of each evaluation's accuracy (MLPerf's ``eval_accuracy``): value the top-1
#: accuracy, metadata the evaluation's other figures (``loss``, ``top5``, ``samples``; an array's
#: per-model lists).
EVAL_ACCURACY_KEY = constants.EVAL_ACCURACY

# Interval names and their (start key, stop key); mllog has constants for all but checkpoint.
INTERVAL_KEYS: dict[str, tuple[str, str]] = {
    "init": (constants.INIT_START, constants.INIT_STOP),
    "run": (constants.RUN_START, constants.RUN_STOP),
    "epoch": (constants.EPOCH_START, constants.EPOCH_STOP),
    "eval": (constants.EVAL_START, constants.EVAL_STOP),
    "checkpoint": ("checkpoint_start", "checkpoint_stop"),
}

# Variants whose runs log per-step duration events (the original variant logs only intervals
# and step_end, so its timing is not perturbed by instrumentation).
INSTRUMENTED_VARIANTS: tuple[str, ...] = ("instrumented", "sleep")

#: mllog's event types.
START, END, POINT = "INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"


class Emitter:
    """Writes MLLOG events for one rank to ``path`` (appending; the file may already exist).

    Pass it explicitly to the code that logs; :meth:`for_rank` gives a copy for another rank.
    It pickles as (path, rank, instrumenting) and reopens the file in the new process.
    ``instrumenting`` switches the per-step duration events on; intervals and points are
    always written.
    """

    def __init__(self, path: str | Path, *, rank: int = 0, instrumenting: bool = False) -> None:
        self.path = Path(path)
        self.rank = rank
        self.instrumenting = instrumenting
        self._open()

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def _log(self, event_type: str, key: str, value: Any, metadata: dict[str, Any]) -> None:
        """Write one event as one line, encoded by mllog's own encoder (``_encode_log``), with
        the file and line of the code that called the Emitter method (two frames up), as
        ``MLLogger`` records them. ``MLLogger`` itself is not used: it finds the caller with
        ``inspect.getframeinfo`` (which reads source lines) and goes through ``logging``,
        about 0.15 ms an event, which inflated instrumented steps (tests/test_mllog.py
        checks that the lines are the ones MLLogger writes)."""
        caller = sys._getframe(2)
        meta = {"file": caller.f_code.co_filename, "lineno": caller.f_lineno, **metadata}
        line = _encode_log("", int(time.time() * 1e3), event_type, key, value, meta)
        data = (line + "\n").encode()
        # A regular-file write of this size is not split in practice; loop only for safety.
        while data:
            data = data[os.write(self._fd, data) :]

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "rank": self.rank, "instrumenting": self.instrumenting}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.rank = state["rank"]
        self.instrumenting = state["instrumenting"]
        self._open()

    def for_rank(self, rank: int) -> Emitter:
        """A new emitter writing to the same file for ``rank``."""
        return Emitter(self.path, rank=rank, instrumenting=self.instrumenting)

    def close(self) -> None:
        """Close the file descriptor (events after this raise OSError)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _metadata(self, ts_ns: int, epoch: int, step: int, meta: dict[str, Any]) -> dict[str, Any]:
        return {
            "ts_ns": ts_ns,
            "rank": self.rank,
            "pid": os.getpid(),
            "epoch": epoch,
            "step": step,
            **meta,
        }

    # -- intervals ------------------------------------------------------------------------

    def start(
        self, name: str, *, epoch: int = -1, step: int = -1, value: Any = None, **meta: Any
    ) -> None:
        """Log ``<name>_start`` (INTERVAL_START), e.g. ``start("epoch", epoch=1)``."""
        key = INTERVAL_KEYS.get(name, (f"{name}_start", ""))[0]
        metadata = self._metadata(time.monotonic_ns(), epoch, step, meta)
        self._log(START, key, value, metadata)

    def stop(
        self, name: str, *, epoch: int = -1, step: int = -1, value: Any = None, **meta: Any
    ) -> None:
        """Log ``<name>_stop`` (INTERVAL_END); ``value`` may carry a result (eval loss, bytes)."""
        key = INTERVAL_KEYS.get(name, ("", f"{name}_stop"))[1]
        metadata = self._metadata(time.monotonic_ns(), epoch, step, meta)
        self._log(END, key, value, metadata)

    # -- points ---------------------------------------------------------------------------

    def point(
        self, key: str, value: Any = None, *, epoch: int = -1, step: int = -1, **meta: Any
    ) -> None:
        """Log a POINT_IN_TIME event at the current time (always written)."""
        metadata = self._metadata(time.monotonic_ns(), epoch, step, meta)
        self._log(POINT, key, value, metadata)

    def step_end(self, *, epoch: int, step: int, samples: int) -> None:
        """Log ``step_end`` after a training step: value and metadata ``samples`` = batch size."""
        metadata = self._metadata(time.monotonic_ns(), epoch, step, {"samples": samples})
        self._log(POINT, "step_end", samples, metadata)

    # -- durations ------------------------------------------------------------------------

    def duration(
        self,
        key: str,
        start_ns: int,
        end_ns: int,
        *,
        epoch: int = -1,
        step: int = -1,
        **meta: Any,
    ) -> None:
        """Log an already measured interval ``[start_ns, end_ns]`` (monotonic ns).

        ``value`` is ``end_ns - start_ns``; ``ts_ns`` is ``end_ns``. No-op unless
        ``instrumenting``.
        """
        if not self.instrumenting:
            return
        metadata = self._metadata(end_ns, epoch, step, {"start_ns": start_ns, **meta})
        self._log(POINT, key, end_ns - start_ns, metadata)

    def timed(self, key: str, *, epoch: int = -1, step: int = -1, **meta: Any) -> Timed:
        """Context manager logging the duration of its body as event ``key``.

        >>> with emitter.timed("model_forward_pass", epoch=1, step=3):
        ...     out = model(x)
        """
        return Timed(self, key, epoch, step, meta)


class Timed:
    """The context manager returned by :meth:`Emitter.timed`; ``start_ns``/``end_ns`` after use."""

    def __init__(self, emitter: Emitter, key: str, epoch: int, step: int, meta: dict[str, Any]):
        self.emitter = emitter
        self.key = key
        self.epoch = epoch
        self.step = step
        self.meta = meta
        self.start_ns = 0
        self.end_ns = 0

    def __enter__(self) -> Timed:
        self.start_ns = time.monotonic_ns()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end_ns = time.monotonic_ns()
        if exc_type is None and self.emitter.instrumenting:
            em = self.emitter
            metadata = em._metadata(
                self.end_ns, self.epoch, self.step, {"start_ns": self.start_ns, **self.meta}
            )
            em._log(POINT, self.key, self.end_ns - self.start_ns, metadata)
