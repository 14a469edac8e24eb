"""The sampler's data-loader CPU (``tracing.samplers.loader_ticks``): read from a fake /proc
tree with known CPU times, so the counts are exact."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tracing.samplers import loader_cpu_percent, loader_ticks


def fake_proc(root: Path, processes: dict[int, tuple[str, int, int]]) -> Path:
    """``/proc/PID/{comm,stat}`` for pid -> (comm, utime, stime); the stat name field holds a
    space and a parenthesis, as a real one may."""
    for pid, (comm, utime, stime) in processes.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        rest = ["S", "1", *["0"] * 9, str(utime), str(stime), *["0"] * 30]
        (d / "stat").write_text(f"{pid} (a (b) c) " + " ".join(rest) + "\n")
    return root


def test_only_loader_workers_are_counted(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path / "proc",
        {10: ("python", 500, 100), 11: ("pt_data_worker", 30, 7), 12: ("pt_data_worker", 5, 0)},
    )
    procs = tmp_path / "cgroup.procs"
    procs.write_text("10\n11\n12\n13\n")  # 13 exited before it was read
    assert loader_ticks(procs, proc) == {11: 37, 12: 5}
    assert loader_ticks(tmp_path / "missing", proc) is None


def test_loader_percent_counts_new_workers_from_zero_and_never_goes_negative() -> None:
    tick_ns = 1e9 / os.sysconf("SC_CLK_TCK")
    dt = int(20 * tick_ns)  # 20 ticks of wall time
    # worker 11 used 10 more ticks, 12 started and used 5, 14 exited (not counted)
    now = {11: 47, 12: 5}
    assert loader_cpu_percent({11: 37, 14: 100}, now, dt) == pytest.approx(75.0)
    assert loader_cpu_percent({11: 50}, {11: 40}, dt) == 0.0  # a pid reused: not negative
