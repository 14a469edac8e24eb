"""A held container's start barrier (tracing/container.py): a FIFO its entry point reads one line
from before it runs its command. Released by whoever holds the run's side on the container's
host: the tracer agent (tracing/agent.py) for a traced run, the runner for an untraced one.
Docker-free: it runs inside the tracer's image."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from core.errors import UserError

RELEASE_FIFO = "release"


def release(barrier_dir: Path, timeout: float = 30.0) -> None:
    """Let a held container go: write one line into its barrier FIFO."""
    fifo = Path(barrier_dir) / RELEASE_FIFO
    deadline = time.monotonic() + timeout
    while True:
        try:
            # O_NONBLOCK: fail with ENXIO instead of blocking while the reader is not there yet.
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise UserError(
                    f"the container never reached its start barrier ({exc.strerror})"
                ) from None
            time.sleep(0.01)
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)
