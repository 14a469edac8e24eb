"""Application events in the MLCommons ``:::MLLOG {json}`` format, written by the workloads.

An :class:`Emitter` appends one line per event to a log file (inside the container
``/twintrace/out/mllog.log``); ``tracing/mllog.py`` turns the file into ``phases.parquet``
(see docs/run-format.md). Lines are encoded by ``mlperf_logging.mllog`` so the file is also
readable by MLCommons tooling.

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

Cost: ~0.1-0.3 ms per event on a 2-core machine (mllog looks up the caller's file and line for
every event). Timestamps are taken before encoding, and the training loop logs a step's
durations after the step, so this cost never falls inside a measured interval.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from mlperf_logging.mllog import constants, mllog

#: The point event each rank logs once, before its first step, saying what computes its steps
#: (value ``cpu``, ``cuda:N`` or ``emulated: CARD``; ``workloads.training.accelerator_label``).
ACCELERATOR_KEY = "accelerator"

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

# mllog records the caller's file and line: it walks 2 + stack_offset frames up from its
# get_caller (-> _log_helper -> MLLogger.event/start/end -> our method -> the caller), so 2
# names the code that called an Emitter method (or the `with` statement of Emitter.timed).
_STACK_OFFSET = 2


class _AppendHandler(logging.Handler):
    """Logging handler writing each record as one ``os.write`` to an ``O_APPEND`` descriptor."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.INFO)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def emit(self, record: logging.LogRecord) -> None:
        data = (record.getMessage() + "\n").encode()
        # A regular-file write of this size is not split in practice; loop only for safety.
        while data:
            data = data[os.write(self.fd, data) :]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        super().close()


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
        self._handler = _AppendHandler(self.path)
        # A private Logger instance (not logging.getLogger) keeps every emitter independent of
        # the global logging tree and of mllog's module-level logger, which prints to stdout.
        logger = logging.Logger(f"twintrace.mllog.{self.rank}", logging.INFO)
        logger.propagate = False
        logger.addHandler(self._handler)
        self._mllogger = mllog.MLLogger(logger=logger, default_stack_offset=_STACK_OFFSET)

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
        self._handler.close()

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
        self._mllogger.start(key, value, metadata=metadata)

    def stop(
        self, name: str, *, epoch: int = -1, step: int = -1, value: Any = None, **meta: Any
    ) -> None:
        """Log ``<name>_stop`` (INTERVAL_END); ``value`` may carry a result (eval loss, bytes)."""
        key = INTERVAL_KEYS.get(name, ("", f"{name}_stop"))[1]
        metadata = self._metadata(time.monotonic_ns(), epoch, step, meta)
        self._mllogger.end(key, value, metadata=metadata)

    # -- points ---------------------------------------------------------------------------

    def point(
        self, key: str, value: Any = None, *, epoch: int = -1, step: int = -1, **meta: Any
    ) -> None:
        """Log a POINT_IN_TIME event at the current time (always written)."""
        metadata = self._metadata(time.monotonic_ns(), epoch, step, meta)
        self._mllogger.event(key, value, metadata=metadata)

    def step_end(self, *, epoch: int, step: int, samples: int) -> None:
        """Log ``step_end`` after a training step: value and metadata ``samples`` = batch size."""
        metadata = self._metadata(time.monotonic_ns(), epoch, step, {"samples": samples})
        self._mllogger.event("step_end", samples, metadata=metadata)

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
        self._mllogger.event(key, end_ns - start_ns, metadata=metadata)

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
            em._mllogger.event(self.key, self.end_ns - self.start_ns, metadata=metadata)
