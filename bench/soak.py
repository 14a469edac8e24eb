"""Soak: many short traced runs back to back, some stopped at a random moment (Ctrl-C, SIGTERM
or SIGKILL of the `trace` command), then a check that nothing is left on the host and that
every run directory tells the truth.

    python bench/soak.py [--runs 200] [--stop-share 0.3] [--seed 0] [--keep DIR]

Each run is `./cli.py trace --image twintrace/base:latest` of a job that reads a few known
files and sleeps 0-1.5 s, in its own process, as a user would start it. A stopped run gets its
signal at a random moment from its start to 8 s (a run takes ~3-5 s here: the stop lands in the
start-up, the job, the tracer's stop or the processing). After the last run, one more plain run
(whose start removes what a SIGKILLed owner left: `tracing/container.py`, `remove_orphans`),
then the checks:

- no container or network of any run, no tracer container, no bpftrace process, no process
  of the soak's commands;
- every run directory's status (as `runs` shows it) agrees with what happened to its command:
  `completed` when it exited 0; `interrupted` (or `completed`, when the signal came after the
  run's end) for Ctrl-C and SIGTERM; for SIGKILL, `incomplete` while its coordinator is gone
  before the end, and `./cli.py ingest RUN` then gives it a final status; never `running`;
- a completed run shows exactly its job's opens of its data files.

Prints one line per run and a summary; exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from store.rundir import load_manifest, run_status  # noqa: E402
from tracing.container import AGENT_LABEL, RUN_LABEL, client  # noqa: E402
from workloads.config import BASE_TAG  # noqa: E402

FILES = 3
JOB = (
    "import os, random, time\n"
    "for name in sorted(os.listdir('/data')):\n"
    "    open('/data/' + name, 'rb').read()\n"
    "time.sleep(random.uniform(0, 1.5))\n"
)
STOPS = {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}


def start(runs: Path, data: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, str(ROOT / "cli.py"), "trace", "--image", BASE_TAG]
    command += ["--out", str(runs), "--mount", f"{data}:/data", "--", "python3", "-c", JOB]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )


def bpftrace_pids() -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            name = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if name == "bpftrace":
            found.append(int(proc.name))
    return found


def leftovers(procs: list[subprocess.Popen[bytes]]) -> list[str]:
    cli = client()
    left = [
        f"container {c.name}" for c in cli.containers.list(all=True, filters={"label": RUN_LABEL})
    ]
    left += [
        f"tracer {c.name}" for c in cli.containers.list(all=True, filters={"label": AGENT_LABEL})
    ]
    left += [f"network {n.name}" for n in cli.networks.list(filters={"label": RUN_LABEL})]
    left += [f"bpftrace {pid}" for pid in bpftrace_pids()]
    left += [f"command {p.pid}" for p in procs if p.poll() is None]
    return left


def expected(how: str, code: int | None, status: str) -> bool:
    """Whether ``status`` (as readers show it) is true of a command that ended so."""
    if how == "none":
        return code == 0 and status == "completed"
    if how in ("ctrl-c", "sigterm"):
        return status in ("interrupted", "completed")
    return status in ("incomplete", "completed", "interrupted", "failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--stop-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep", type=Path, help="Keep the runs here (default: a temporary directory)."
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    home = args.keep or Path(tempfile.mkdtemp(prefix="twintrace-soak-"))
    data, runs = home / "data", home / "runs"
    data.mkdir(parents=True, exist_ok=True)
    for i in range(FILES):
        (data / f"f{i}.bin").write_bytes(os.urandom(4096 * (i + 1)))
    procs: list[subprocess.Popen[bytes]] = []
    fates: list[tuple[str, str, int | None, float]] = []  # (run dir, how, exit code, seconds)
    failures: list[str] = []
    started_all = time.monotonic()
    for i in range(args.runs + 1):
        before = set(runs.iterdir()) if runs.exists() else set()
        how = (
            rng.choice(sorted(STOPS))
            if i < args.runs and rng.random() < args.stop_share
            else "none"
        )
        started = time.monotonic()
        proc = start(runs, data)
        procs.append(proc)
        if how != "none":
            try:
                proc.wait(timeout=rng.uniform(0, 8))
            except subprocess.TimeoutExpired:
                proc.send_signal(STOPS[how])
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            failures.append(f"run {i}: the command did not end within 300 s")
        made = sorted(set(runs.iterdir()) - before) if runs.exists() else []
        seconds = time.monotonic() - started
        if how == "none" and proc.returncode != 0:
            failures.append(f"run {i}: exit {proc.returncode}: {err.decode()[-300:]}")
        for run_dir in made:
            fates.append((str(run_dir), how, proc.returncode, seconds))
        shown = ", ".join(run_status(load_manifest(d)) for d in made) or "no run directory"
        print(
            f"[{i + 1}/{args.runs + 1}] {how:8s} exit {proc.returncode:4d} {seconds:5.1f} s: {shown}",
            flush=True,
        )
    time.sleep(1)
    left = leftovers(procs)
    failures += [f"left on the host: {thing}" for thing in left]
    statuses: collections.Counter[str] = collections.Counter()
    for run_dir, how, code, _ in fates:
        path = Path(run_dir)
        status = run_status(load_manifest(path))
        if status == "running":
            failures.append(f"{path.name}: says running with its command gone ({how})")
        if status == "incomplete":
            done = subprocess.run(
                [sys.executable, str(ROOT / "cli.py"), "ingest", str(path)],
                capture_output=True, text=True, cwd=ROOT, check=False,
            )  # fmt: skip
            status = run_status(load_manifest(path))
            if status in ("running", "incomplete"):
                failures.append(f"{path.name}: ingest left it {status}: {done.stderr[-200:]}")
            status = f"incomplete -> {status}"
        statuses[f"{how}: {status}"] += 1
        final = status.rpartition("-> ")[2]
        if not expected(how, code, final):
            failures.append(f"{path.name}: {how}, exit {code}, status {status}")
        if final == "completed" and how == "none":
            events = pd.read_parquet(path / "events.parquet", columns=["kind", "path"])
            opens = events[
                (events["kind"].astype(str) == "openat")
                & events["path"].str.startswith("/data/", na=False)
            ]
            if sorted(opens["path"]) != [f"/data/f{k}.bin" for k in range(FILES)]:
                failures.append(f"{path.name}: opens {sorted(opens['path'])}")
    total = time.monotonic() - started_all
    print(json.dumps({
        "runs": args.runs + 1, "run_directories": len(fates), "seconds": round(total, 1),
        "statuses": dict(sorted(statuses.items())), "left_on_host": left, "failures": len(failures),
    }, indent=1))  # fmt: skip
    for failure in failures:
        print("FAIL", failure)
    if not args.keep:
        subprocess.run(["rm", "-rf", str(home)], check=False)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
