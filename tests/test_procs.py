"""Child processes (tracing/procs.py) and stopping a run's bpftrace scripts together."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from tracing.bpftrace import Tracer
from tracing.procs import ChildProcess

#: A child that, on SIGINT, notes when it got it, takes a while to finish (as bpftrace does,
#: detaching its probes and printing its maps), notes when it finished and exits 0.
SLOW_TO_STOP = (
    "import signal, sys, time\n"
    "def stop(*_):\n"
    "    open(sys.argv[1], 'w').write(str(time.monotonic_ns()))\n"
    "    time.sleep(0.3)\n"
    "    open(sys.argv[2], 'w').write(str(time.monotonic_ns()))\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGINT, stop)\n"
    "open(sys.argv[3], 'w').close()\n"
    "while True:\n"
    "    time.sleep(1)\n"
)


def _slow_child(tmp_path: Path, name: str) -> ChildProcess:
    child = ChildProcess(
        [sys.executable, "-c", SLOW_TO_STOP, *(tmp_path / f"{name}.{e}" for e in ("got", "done"))]
        + [tmp_path / f"{name}.ready"],
        tmp_path / f"{name}.out",
        tmp_path / f"{name}.err",
        name=name,
    )
    child.wait_until((tmp_path / f"{name}.ready").exists, 30, "its handler set")
    return child


def _at(path: Path) -> int:
    return int(path.read_text())


def test_stop_interrupts_waits_and_returns_the_exit_code(tmp_path: Path) -> None:
    child = _slow_child(tmp_path, "a")
    assert child.stop(timeout=30) == 0
    assert _at(tmp_path / "a.got") < _at(tmp_path / "a.done")
    assert child.stop() == 0  # again: the same code, no signal sent


def test_a_child_deaf_to_sigint_is_killed_after_the_timeout(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = ChildProcess(
        ["sh", "-c", f"trap '' INT; touch {ready}; sleep 30"],
        tmp_path / "out",
        tmp_path / "err",
        name="deaf",
    )
    child.wait_until(ready.exists, 30, "its trap set")
    assert child.stop(timeout=0.5) == -signal.SIGKILL


def test_a_tracer_interrupts_every_script_before_waiting_for_any(tmp_path: Path) -> None:
    """Each script gets SIGINT before the first has finished stopping: they stop together,
    not one after the other."""
    tracer = Tracer(tmp_path, tmp_path, cgroup_ids=())
    tracer.children = {name: _slow_child(tmp_path, name) for name in ("syscalls", "block", "cache")}
    assert tracer.stop() == {"syscalls": 0, "block": 0, "cache": 0}
    first_done = min(_at(tmp_path / f"{n}.done") for n in tracer.children)
    assert max(_at(tmp_path / f"{n}.got") for n in tracer.children) < first_done
