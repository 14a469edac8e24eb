"""Two runners on one experiment or study directory: the second is refused in one line naming
the first, before it touches anything; a runner killed with SIGKILL blocks nobody."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

HOLD = """
import sys, time
from pathlib import Path
from experiments.study_state import sole_runner
with sole_runner(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(300)
"""


def _hold(home: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _experiment_run(path: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "cli.py"), "experiment", "run", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )


def test_a_second_runner_is_refused_and_a_killed_one_blocks_nobody(tmp_path: Path) -> None:
    spec = tmp_path / "grid.toml"
    spec.write_text(
        '[experiment]\nname = "grid"\n'
        '[[datasets]]\nname = "unet3d"\ngenerator = "unet3d"\nsize = "2MB"\n'
        '[grid]\nworkload = ["unet3d"]\nvariant = ["sleep"]\n'
        '[workloads.unet3d]\ndataset = "unet3d"\n'
    )
    out = tmp_path / "out"
    holder = _hold(out / "grid")
    try:
        done = _experiment_run(spec, out)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"Error: {out / 'grid'} is being run by pid {holder.pid} on ")
        assert line.endswith(": wait for it to end (or stop it), or give another --out")
        # Refused before anything was made: no dataset, no runs, no state.
        assert sorted(p.name for p in (out / "grid").iterdir()) == [".twintrace-runner"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel dropped the dead holder's lock: the directory can be held at once.
    started = time.monotonic()
    again = _hold(out / "grid")
    again.send_signal(signal.SIGKILL)
    again.wait()
    assert time.monotonic() - started < 30
