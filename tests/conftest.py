"""Shared fixtures. Integration tests need root, bpftrace, tracefs and a Docker engine: they are
skipped without them on a developer machine, but with CI=true a missing prerequisite fails them,
so CI can never pass by skipping the real thing."""

from __future__ import annotations

import contextlib
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
#: The environment variable holding this session's temporary folder (each xdist worker has its
#: own): every run a test makes is under it. Set by :func:`host_profiles`, which every test uses
#: (an environment variable, not a global: the tests import this file as ``tests.conftest``, a
#: module apart from the ``conftest`` that pytest loads).
BASETEMP_ENV = "TWINTRACE_TESTS_BASETEMP"

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

    os.environ[BASETEMP_ENV] = str(tmp_path_factory.getbasetemp().resolve())
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


def run_label(runs_root: Path, proc: subprocess.Popen[str], deadline: float) -> str:
    """The label of the Docker objects of the one run that ``proc`` (a ``./cli.py trace``)
    started under ``runs_root``, once its run directory exists (before any of its containers):
    a test acts on its own run's containers, never on another's running beside it."""
    import time

    from tracing.container import RUN_LABEL

    while not (runs_root.is_dir() and (found := list(runs_root.iterdir()))):
        assert time.monotonic() < deadline and proc.poll() is None, "the run did not start"
        time.sleep(0.05)
    (run_dir,) = found
    return f"{RUN_LABEL}={run_dir.name}"


def left_behind(run_id: str) -> list[str]:
    """The containers and networks of run ``run_id`` still on this host's engine."""
    from tracing.container import RUN_LABEL, client

    cli = client()
    label = {"label": f"{RUN_LABEL}={run_id}"}
    return [c.name for c in cli.containers.list(all=True, filters=label)] + [
        n.name for n in cli.networks.list(filters=label)
    ]


@contextlib.contextmanager
def reaped(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Kill and reap ``proc`` on the way out of the block if it is still running (an assertion
    failed, a wait timed out), so that no test leaves a CLI behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
    """Pids of bpftrace processes running one of our scripts (rendered into a run's raw/) for a
    run of this test session: the tracers of the other lane's runs (``pytest -n 2`` runs two at
    once), of a cluster node's agent or of a user's run on this host are not this session's."""
    under = os.environ[BASETEMP_ENV].encode() + b"/"
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
                and any(part.endswith(b".bt") and part.startswith(under) for part in cmdline)
            ):
                pids.append(int(proc.name))
    return pids


#: How ``pytest -n 2`` runs the suite in two workers (:func:`pytest_xdist_make_scheduler`; not yet
#: what `make test` does, CONTRIBUTING.md says why):
#: the integration modules in two lanes, each lane one worker running its modules one after
#: another, the two lanes side by side (a traced run leaves a third to half of the CPU idle), the
#: other tests filling in; then the ``serial`` modules alone (a second session). The "cache" lane
#: holds every module that drops the whole page cache (the studies' cold runs: fidelity, grouping,
#: hfta, stalls, the experiment files) or whose figures depend on what it holds or on whose I/O
#: reaches the disk (the block lane is host-wide); the "apart" lane only modules that do none of
#: this (their datasets are evicted file by file, ``tracing.host.evict_files``). ``serial``:
#: timed to the millisecond (the emulator's sleeps, a report opened within 2 s, BERT's real steps
#: against emulated ones) or stopping the Docker engine itself. Every module with integration
#: tests is in one of the three (a new one is refused at collection until it is placed).
CACHE_LANE = frozenset(
    {
        "test_analysis_integration",
        "test_dlio",
        "test_epoch_barrier",
        "test_experiment",
        "test_grouping",
        "test_hfta",
        "test_long_run",
        "test_run_progress",
        "test_stalls",
        "test_sustain",
        "test_trace_integration",
    }
)
APART_LANE = frozenset(
    {
        "test_agent",
        "test_cluster",
        "test_compose",
        "test_damaged_files",
        "test_disk_full",
        "test_gpus",
        "test_hostprofile",
        "test_limits",
        "test_multicontainer",
        "test_reingest",
        "test_sophon_trace",
        "test_tfrecord_reference",
        "test_trace_zoo",
        "test_workloads_unet3d",
    }
)
SERIAL = frozenset({"test_emulation", "test_engine_restart", "test_fidelity", "test_run_report"})


def lane_of(module: str) -> str | None:
    """The lane of a test module (its file's stem), None for a module in neither."""
    return "cache" if module in CACHE_LANE else "apart" if module in APART_LANE else None


@pytest.hookimpl(tryfirst=True)  # before `-m` selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unplaced = set()
    for item in items:
        if item.get_closest_marker("integration") is None:
            continue
        module = item.path.stem
        if module in SERIAL:
            item.add_marker(pytest.mark.serial)
        elif lane_of(module) is None:
            unplaced.add(module)
    if unplaced:
        raise pytest.UsageError(
            f"integration tests in {', '.join(sorted(unplaced))}: name the module in "
            "CACHE_LANE, APART_LANE or SERIAL (tests/conftest.py)"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each lane one unit of work, the rest a unit per test. xdist hands the largest units out
    first, one to each worker, and a worker more only when it has two tests left: the two lanes
    start at once on different workers, and the others fill in after the shorter one. (The
    ``xdist_group`` mark does this job, but xdist 3.8 names a group by rewriting a test's node
    id, which pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(Path(nodeid.split("::", 1)[0]).stem) or nodeid

    return Lanes(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        from _pytest.mark.expression import Expression

        # Would `-m` select a serial test (marked integration and serial, perhaps docker, bpftrace)?
        expr = config.option.markexpr
        selects = Expression.compile(expr).evaluate if expr else (lambda matcher: True)
        marks = ({"integration", "serial", *more} for more in ((), ("docker", "bpftrace")))
        if any(selects(lambda m, marks=ms: m in marks) for ms in marks):
            raise pytest.UsageError(
                "the serial tests run alone: with -n, add -m 'not serial' and run -m serial "
                "after (CONTRIBUTING.md)"
            )
    # The dataset writers' fork server starts once per test session, preloading the modules of
    # the first generator that runs: list them all, so that the BERT writers do not each load
    # numba (~1 s) when another generator ran first.
    from datagen.common import set_worker_preload
    from datagen.registry import GENERATORS

    set_worker_preload(module for module, _, _ in GENERATORS.values())
    # A session started with Ctrl-C ignored (`pytest &` in a script without job control, or
    # under nohup) hands that on to every process it starts, and the tests that press Ctrl-C at
    # a run or a generator would see it ignored: a handler (not SIG_IGN) is reset on exec.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
