"""Shared fixtures. Integration tests need root, bpftrace, tracefs and a Docker engine: they are
skipped without them on a developer machine, but with CI=true a missing prerequisite fails them,
so CI can never pass by skipping the real thing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from core.errors import UserError

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

#: The phases an instrumented training step logs (workloads/training.py).
STEP_KEYS = frozenset(
    {
        "load_batch_mem",
        "load_batch_gpu",
        "model_forward_pass",
        "loss_tensor_calc",
        "model_backward_pass",
        "model_optim_step",
        "cum_loss_fn_calc",
        "all_compute",
    }
)


def _missing_prerequisites() -> list[str]:
    from tracing.host import doctor

    # root, bpftrace (the tracer's image), tracefs, cgroup v2, docker daemon
    return [f"{c.name}: {c.detail} ({c.fix})" for c in doctor(only_tracing=True) if not c.ok]


def require(ok: object, why: str) -> None:
    """What a test needs that a developer's machine may lack and CI must have: without it
    (``ok`` false) the calling test is skipped, saying ``why``, or fails with ``CI=true``."""
    if not ok:
        if IN_CI:
            pytest.fail(why)
        pytest.skip(why)


def require_tracing() -> None:
    """Skip (or, in CI, fail) when the real tracing stack is not available."""
    missing = _missing_prerequisites()
    require(not missing, "tracing prerequisites missing: " + "; ".join(missing))


@pytest.fixture(autouse=True, scope="session")
def host_profiles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This host's CPU measurements (store/hostprofiles.py) go to a folder of the test
    session: a test never finds, nor leaves, measurements in the user's cache."""
    from store.hostprofiles import ENV

    folder = tmp_path_factory.mktemp("host-profiles")
    before = os.environ.get(ENV)
    os.environ[ENV] = str(folder)
    yield folder
    if before is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = before


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """Build (or find up to date) the images the integration tests use; tag -> id."""
    require_tracing()
    from images.build import build
    from tracing.container import client

    results = build(client(), None, None)
    return {r.tag: r.image_id for r in results}


@pytest.fixture()
def runs_root(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def unet3d_cases(
    out: Path, size: int, seed: int, s1_range: tuple[int, int], s2_range: tuple[int, int]
) -> Path:
    """UNet3D cases of about ``size`` bytes in all, no side under 40 (patch 32 fits in every
    one), written into ``out``; returns ``out``."""
    from datagen.unet3d import UNet3DGenParams, generate_unet3d

    params = UNet3DGenParams(s1_range=s1_range, s2_range=s2_range, min_dim=40)
    generate_unet3d(out, size, seed=seed, params=params)
    return out


@pytest.fixture(scope="session")
def tiny_unet3d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six small UNet3D cases (patch 32 fits in every one), made once per session."""
    out = tmp_path_factory.mktemp("unet3d-tiny")
    return unet3d_cases(out, 8_000_000, seed=1, s1_range=(40, 48), s2_range=(48, 56))


def assert_one_line_error(message: str, call: Callable[..., object], *args: object) -> None:
    """``call(*args)`` raises a UserError that matches ``message``, in one line."""
    with pytest.raises(UserError, match=message) as caught:
        call(*args)
    assert "\n" not in str(caught.value)


def assert_refuses_other_results(
    load: Callable[[Path], object], path: Path, kind: str, other: str
) -> None:
    """``load`` (a study ``kind``'s results loader) refuses at ``path`` the results of study
    ``other`` and those of a schema version it does not know."""
    path.write_text(json.dumps({"kind": other, "schema_version": 1}))
    with pytest.raises(UserError, match=f"not a {kind} study's results"):
        load(path)
    path.write_text(json.dumps({"kind": kind, "schema_version": 99}))
    with pytest.raises(UserError, match="schema_version 99"):
        load(path)


def run_cli(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``./cli.py ARGS`` as a user runs it (a process of its own, from the checkout), its
    output captured as text; ``kw``: subprocess.run's other keywords (``timeout``, ``env``)."""
    return subprocess.run(
        [sys.executable, str(REPO / "cli.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        **kw,
    )


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The error of a command that failed in one line (exit status 1, no traceback): the last
    line of its stderr."""
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def refused_unet3d_trace(data: Path, runs: Path) -> str:
    """``./cli.py trace`` of unet3d (sleep) over ``data`` into ``runs``, refused in one line
    (:func:`error_line`) before it made a run directory: its error."""
    done = run_cli(
        "trace", "--workload", "unet3d", "--variant", "sleep", "--data", str(data),
        "--out", str(runs),
    )  # fmt: skip
    line = error_line(done)
    assert not runs.exists()
    return line


#: A job that starts threads, each busy for a second, until the kernel refuses one (at a
#: processes limit: Python's "can't start new thread"), says after how many, and fails; it
#: ends once the threads it started have (the interpreter joins them).
THREADS_TILL_REFUSED = (
    "import sys, threading, time\n"
    "started = []\n"
    "try:\n"
    "    while True:\n"
    "        t = threading.Thread(target=time.sleep, args=(1.0,))\n"
    "        t.start()\n"
    "        started.append(t)\n"
    "except RuntimeError as exc:\n"
    "    print('refused after', len(started), 'threads:', exc, flush=True)\n"
    "    sys.exit(1)\n"
)


def start_cli(*args: str) -> subprocess.Popen[str]:
    """``./cli.py ARGS`` started in the background (its output piped, as text), for a test that
    acts on the run while it runs."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "cli.py"), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def left_behind(run_id: str) -> list[str]:
    """The containers and networks of run ``run_id`` still on this host's engine."""
    from tracing.container import RUN_LABEL, client

    cli = client()
    label = {"label": f"{RUN_LABEL}={run_id}"}
    return [c.name for c in cli.containers.list(all=True, filters=label)] + [
        n.name for n in cli.networks.list(filters=label)
    ]


def assert_failed_run(runs_root: Path, returncode: int, stderr: str, says: str) -> Path:
    """The one run under ``runs_root`` failed with the error ``says``: the CLI exited 1 with no
    traceback and ``says`` as its last line, the manifest says the same, and nothing of the run
    is left running. Returns its directory."""
    assert returncode == 1 and "Traceback" not in stderr, stderr
    (run_dir,) = runs_root.iterdir()
    assert stderr.strip().splitlines()[-1] == f"Error: {says} (run directory: {run_dir})"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["error"] == says
    assert left_behind(run_dir.name) == []
    assert bpftrace_running() == []
    return run_dir


def traced_events(run_dir: Path) -> pd.DataFrame:
    """A traced run's events.parquet, with ``kind`` as plain strings for comparisons."""
    df = pd.read_parquet(run_dir / "events.parquet")
    df["kind"] = df["kind"].astype(str)
    return df


def bpftrace_running() -> list[int]:
    """Pids of bpftrace processes running one of our scripts (rendered into a run's raw/)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                cmdline
                and Path(cmdline[0].decode(errors="replace")).name == "bpftrace"
                and any(part.endswith(b".bt") for part in cmdline)
            ):
                pids.append(int(proc.name))
    return pids


def pytest_configure(config: pytest.Config) -> None:
    # The dataset writers' fork server starts once per test session, preloading the modules of
    # the first generator that runs: list them all, so that the BERT writers do not each load
    # numba (~1 s) when another generator ran first.
    from datagen.common import set_worker_preload
    from datagen.registry import GENERATORS

    set_worker_preload(module for module, _, _ in GENERATORS.values())
    # SIGTERM (a CI runner's timeout, `kill`) ends the session as Ctrl-C does, through the
    # running test's `finally` and fixtures' teardown: by default it killed the interpreter
    # there, leaving the test's containers and networks (a compose project's network was).
    signal.signal(signal.SIGTERM, _interrupt)


_SESSION_PID = os.getpid()


def _interrupt(signum: int, frame: object) -> None:
    if os.getpid() != _SESSION_PID:  # a forked child (a loader worker): dies as it did
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(f"signal {signum}")
