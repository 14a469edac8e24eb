"""What the suite needs besides the images, made while `make test` builds them (the builds
leave about half of the CPU idle on a 2-vCPU VM), so that no test waits for it:

- the ingest's kernels compiled into numba's on-disk cache (tracing/ingest/jit.py): the first
  test to ingest a trace paid for the compile, about 55-75 s. A child process ingests a small
  synthetic trace in the tracer's format (bench/trace_ingest.py, ``make_raw``), which calls
  the kernels every run's ingest calls (the two of the path table's compaction, which only a
  trace with very many distinct paths needs, compile when first called);
- twintrace/node, the virtual cluster's node image (images/build.py, ``build_node``:
  debootstrap, about a minute), which tests/test_cluster.py needs.

`make test` starts this in a process group of its own and ends the group with SIGTERM if the
image build fails: the compile and debootstrap end at once, and this process removes its
temporary folders as it unwinds.

Usage: python -m tests.prepare
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def compile_ingest(work: Path) -> None:
    from bench.trace_ingest import MAIN_PID, make_raw
    from tracing import ingest

    make_raw(work / "raw", 20_000)
    ingest.write_events(work / "raw", work / "events.parquet", {MAIN_PID: "main"})


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    from images.build import build_node
    from tracing.container import client

    signal.signal(signal.SIGTERM, _stop)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="twintrace-prepare-") as work:
        child = subprocess.Popen([sys.executable, "-m", "tests.prepare", "--compile", work])
        try:
            failed = False
            try:
                build_node(client(), lambda line: None)
                print(f"prepare: twintrace/node ({time.monotonic() - started:.0f} s)")
            except Exception as exc:  # noqa: BLE001  # said, and the exit status says it
                print(f"prepare: building twintrace/node failed: {exc}", file=sys.stderr)
                failed = True
            if child.wait() != 0:
                print("prepare: compiling the ingest's kernels failed", file=sys.stderr)
                failed = True
            else:
                print(f"prepare: the ingest's kernels ({time.monotonic() - started:.0f} s)")
        finally:
            child.kill()
            child.wait()
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compile"]:
        compile_ingest(Path(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
