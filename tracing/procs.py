"""One wrapper for every child process the tracer starts (bpftrace, dockerd, debootstrap, ...).

Argument lists only, never shell strings; stdout and stderr go to separate files; stop is SIGINT,
a bounded wait, then SIGKILL; the exit code is recorded. Children run in their own session so a
Ctrl-C at the terminal reaches only us, and we stop them in a known order.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from core.errors import UserError

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the parent dies, even by SIGKILL itself.

    Without it a tracer killed with `kill -9` would leave bpftrace attached and running."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ChildProcess:
    """A started child process with its output files."""

    def __init__(
        self,
        argv: Sequence[str],
        stdout_path: Path,
        stderr_path: Path,
        env: dict[str, str] | None = None,
        name: str | None = None,
        cwd: Path | None = None,
        no_fork: bool = False,
    ) -> None:
        self.argv = [str(a) for a in argv]
        self.name = name or Path(self.argv[0]).name
        # no_fork: from a threaded server whose fork handlers must not run (grpcio's wait for
        # its threads to idle, forever, when a call forks: the agent, tracing/agent.py). The
        # death signal is then set by util-linux's setpriv between vfork and exec, so Python
        # spawns without fork(): no preexec_fn.
        preexec = _die_with_parent
        if no_fork:
            self.argv = ["setpriv", "--pdeathsig", "KILL", "--", *self.argv]
            preexec = None
        self.stdout_path = Path(stdout_path)
        self.stderr_path = Path(stderr_path)
        self.returncode: int | None = None
        self._interrupted = False
        full_env = dict(os.environ)
        full_env.update(env or {})
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=full_env,
                    start_new_session=True,
                    cwd=cwd,
                    preexec_fn=preexec,
                )
            except FileNotFoundError:
                raise UserError(
                    f"{self.argv[0]} is not installed: run `make setup` as root"
                ) from None

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> int | None:
        """Return the exit code if the process has ended, else None."""
        code = self._popen.poll()
        if code is not None:
            self.returncode = code
        return code

    def interrupt(self) -> None:
        """Send SIGINT (once) to the child's process group, if it still runs: :meth:`stop`
        then waits for it. Interrupting several children first lets them end together."""
        if not self._interrupted and self.poll() is None:
            self._interrupted = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._popen.pid, signal.SIGINT)

    def stop(self, timeout: float = 10.0) -> int:
        """Stop with SIGINT (unless :meth:`interrupt` sent it), wait up to ``timeout`` seconds,
        then SIGKILL. Returns the exit code."""
        if self.poll() is None:
            self.interrupt()
            try:
                self._popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self._popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._popen.wait()
        self.returncode = self._popen.returncode
        return self.returncode

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until ``ready()`` is true; fail if the child exits first or time runs out."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.poll() is not None:
                raise ChildFailed(
                    self, f"{self.name} exited with code {self.returncode} before {what}"
                )
            if time.monotonic() > deadline:
                raise ChildFailed(self, f"{self.name} did not get {what} within {timeout:.0f} s")
            time.sleep(0.02)

    def stderr_tail(self, lines: int = 10) -> str:
        """The last lines of the child's stderr, for error messages."""
        try:
            text = self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])


class ChildFailed(UserError):
    """A child process failed; the message ends with the tail of its stderr."""

    def __init__(self, child: ChildProcess, message: str) -> None:
        tail = child.stderr_tail()
        super().__init__(f"{message}" + (f"; its stderr ends with:\n{tail}" if tail else ""))
        self.child = child
