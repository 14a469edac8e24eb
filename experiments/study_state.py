"""What the studies share: their files' names and the layout of their results, a state file
of the runs done (to resume), the request of a study's run, the loop that traces the runs and
records them, results made JSON-ready, written and read back with their kind and schema checked
(versioned files, :mod:`core.versioned`), and their dataset's files and where they lie on the
disk. Their ``[study]`` settings are declared and checked with :mod:`experiments.study`.

A study (grouping, sophon, hfta, stalls) records each finished run in ``<kind>-state.json``
(:data:`STATE`) with the fingerprint of its settings; run again with the same settings, it
skips the runs whose run directories still say they finished, and starts over when the
settings changed (:func:`pending_runs`, or :func:`kept_or_traced` one run at a time). One
study never imports another: what two of them use is here, in :mod:`analysis.samples`
(figures of a run's samples) or :mod:`analysis.extents` (where files lie on the disk).

A study's run loop::

    state = load_state(state_path, fingerprint(spec.settings()), log)
    for step, key, item in pending_runs(order, key_of, state, log):
        t0 = time.monotonic()
        trace_run(make_request(item), key, state, state_path, t0)
    rows, host = load_runs(order, key_of, state, figures)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from analysis.extents import DiskExtents, disk_extents
from core import versioned
from core.atomic import atomic_write_json
from core.errors import UserError
from core.versioned import Layout
from store.rundir import FINISHED, Run, git_revision, load_manifest, load_run

Log = Callable[[str], None]
T = TypeVar("T")


def _image_workloads() -> tuple[str, ...]:
    from workloads.registry import WORKLOADS

    return tuple(sorted(n for n, w in WORKLOADS.items() if w.datagen == "images"))


#: The image workloads (those that read the images generator's datasets), and the rule in words.
IMAGE_WORKLOADS = _image_workloads()
IMAGE_WORKLOAD = f"an image workload ({', '.join(IMAGE_WORKLOADS)})"


def study_files(
    kind: str, version: int, migrations: Mapping[int, Callable[[dict], dict]] | None = None
) -> tuple[Layout, str, str, str]:
    """A study's results layout (:func:`results_layout`) and its results, figure and state
    file names (:func:`file_names`)."""
    return (results_layout(kind, version, migrations), *file_names(kind))


def results_layout(
    kind: str, version: int, migrations: Mapping[int, Callable[[dict], dict]] | None = None
) -> Layout:
    """The layout of a study's results file (``<kind>.json``) at schema ``version``;
    ``migrations``: from each older version, its body brought one version up."""
    return Layout(
        f"{kind} study's results",
        version,
        kind=kind,
        remedy="run the study again",
        migrations=dict(migrations or {}),
    )


def file_names(kind: str) -> tuple[str, str, str]:
    """The names of a study's results, figure and state files in its output directory."""
    return f"{kind}.json", f"{kind}.html", f"{kind}-state.json"


def fingerprint(settings: Any) -> str:
    """A short digest of a study's ``settings`` (JSON-ready; anything else as its ``str``):
    its state is kept while this stays the same."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_settings(epochs: int, batch_size: int, workers: int, seed: int) -> dict[str, Any]:
    """A study run's training settings: no evaluation, no checkpoints."""
    return {
        "epochs": epochs,
        "batch_size": batch_size,
        "workers": workers,
        "seed": seed,
        "eval_every": 0,
        "checkpoint_every": 0,
    }


#: The file an experiment's or a study's runner holds locked in its directory while it runs.
LOCK_NAME = ".twintrace-runner"


@contextlib.contextmanager
def sole_runner(home: Path) -> Iterator[None]:
    """Hold ``home`` (an experiment's or a study's directory) for this process while it runs:
    a second runner on the same directory is refused in one line naming the first (its pid,
    host and start), before it touches anything. The lock is ``flock`` on ``home/``
    :data:`LOCK_NAME`, which the kernel drops when the holder ends however it ends (SIGKILL
    included), so a dead runner never blocks the next."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    path = home / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            raise UserError(
                f"{home} is being run by {holder}: wait for it to end (or stop it), or give "
                "another --out"
            ) from None
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started}".encode(), 0)
        yield
    finally:
        os.close(fd)


def study_home(out: Path) -> tuple[Path, Path, float]:
    """A study's output directory ``out``, its ``runs/`` (made now) and when it started
    (``time.monotonic()``)."""
    out = Path(out)
    runs_root = out / "runs"
    runs_root.mkdir(parents=True, exist_ok=True)
    return out, runs_root, time.monotonic()


def study_request(
    spec: Any,
    data: Path,
    runs_root: Path,
    log: Log,
    *,
    epochs: int,
    seed: int,
    **settings: Any,
) -> Any:
    """The request (:func:`experiments.request.build_request`) of one run of a study whose
    ``spec`` has a workload, variant, batch size and workers (and, where it has them, an
    accelerator, a profile model, a timeout ``timeout_s``): ``epochs`` without evaluation or
    checkpoints, on ``data``, quiet; ``settings`` (:class:`experiments.request.TraceSettings`
    fields) on top."""
    from experiments.request import TraceSettings, build_request

    given: dict[str, Any] = {
        "workload": spec.workload,
        "variant": spec.variant,
        "data": data,
        "accelerator": getattr(spec, "accelerator", None),
        "profile_model": getattr(spec, "profile_model", None),
        "timeout": getattr(spec, "timeout_s", None),
        "quiet": True,
        **run_settings(epochs, spec.batch_size, spec.workers, seed),
        **settings,
    }
    return build_request(TraceSettings(**given), runs_root, log)


#: A study's state file: the runs done, under the fingerprint of the settings they ran with.
STATE = Layout("study state", 1)


def load_state(path: Path, fingerprint: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The state at ``path`` when it is this version's and of these settings (``fingerprint``);
    else a fresh one (saying why, when a file was there)."""
    fresh = versioned.stamp(STATE, {"fingerprint": fingerprint, "runs": {}})
    if not path.is_file():
        return fresh
    try:
        state = versioned.read_json(path, STATE.what)
    except UserError:
        log(f"{path} is damaged: starting the study's runs afresh")
        return fresh
    try:
        state = versioned.upgrade(STATE, state, str(path))
    except UserError:
        log(f"{path} is of another version: starting the study's runs afresh")
        return fresh
    if state.get("fingerprint") != fingerprint:
        log("the study's settings or dataset changed since its last runs: running them all again")
        return fresh
    return state


def save_state(path: Path, state: Mapping[str, Any]) -> None:
    """Write a study's state (:func:`load_state`) to ``path``, stamped, atomically."""
    versioned.write_json(path, STATE, state)


def run_done(entry: Mapping[str, Any] | None) -> bool:
    """Whether a state entry's run directory still says the run finished."""
    if not entry or not entry.get("run_dir"):
        return False
    try:
        return load_manifest(Path(entry["run_dir"])).get("status") in FINISHED
    except (UserError, OSError):
        return False


def pending_runs(
    order: Sequence[T], key: Callable[[T], str], state: Mapping[str, Any], log: Log
) -> Iterator[tuple[str, str, T]]:
    """(progress ``[i/n]``, key, item) of each run of ``order`` still to do, in order; a run
    done before (:func:`run_done`, its ``key`` in ``state``) is said to be kept and skipped."""
    for i, item in enumerate(order, 1):
        step, name = f"[{i}/{len(order)}]", key(item)
        if run_done(state["runs"].get(name)):
            log(f"{step} {name}: done before, kept")
            continue
        yield step, name, item


def trace_run(
    request: Any,
    key: str,
    state: dict[str, Any],
    state_path: Path,
    started: float,
    **extra: Any,
) -> Any:
    """Trace ``request`` (a :class:`tracing.request.RunRequest`) and record it in ``state`` as
    run ``key``: its directory, status, the seconds since ``started`` (``time.monotonic()``)
    and ``extra``; the state is saved at once. A failed run is a UserError naming it (the study
    cannot be complete). Returns the run's :class:`tracing.runner.RunOutcome`."""
    from tracing.runner import trace

    outcome = trace(request)
    outcome.check()
    record_run(state, state_path, key, outcome.run_dir, outcome.status, started, **extra)
    return outcome


def record_run(
    state: dict[str, Any],
    state_path: Path,
    key: str,
    run_dir: Path,
    status: str,
    started: float,
    **extra: Any,
) -> None:
    """Record run ``key`` (its directory, status, the seconds since ``started`` and ``extra``) in
    ``state`` and save it at once."""
    state["runs"][key] = {
        "run_dir": str(run_dir),
        "status": status,
        "duration_s": round(time.monotonic() - started, 3),
        **extra,
    }
    save_state(state_path, state)


def kept_or_traced(
    key: str, state: dict[str, Any], state_path: Path, make: Callable[[], Run], log: Log
) -> Run:
    """Run ``key``: the one done before when ``state`` says so and its directory still says it
    finished (:func:`run_done`), else the run ``make()`` traces, recorded at once."""
    entry = state["runs"].get(key)
    if run_done(entry):
        log(f"{key}: done before, kept ({entry['run_dir']})")
        return load_run(Path(entry["run_dir"]))
    started = time.monotonic()
    run = make()
    record_run(state, state_path, key, run.path, run.status, started)
    return run


def load_runs(
    order: Sequence[T],
    key: Callable[[T], str],
    state: Mapping[str, Any],
    row: Callable[[T, Mapping[str, Any], Run], dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each run of ``order`` loaded from the directory its state entry names, one at a time,
    and made a row by ``row(item, entry, run)``; the rows, and the host of the first run that
    recorded one."""
    rows = []
    host: dict[str, Any] = {}
    for item in order:
        entry = state["runs"][key(item)]
        run = load_run(Path(entry["run_dir"]))
        host = host or dict(run.manifest.get("host") or {})
        rows.append(row(item, entry, run))
    return rows, host


def json_ready(value: Any) -> Any:
    """``value`` with NaN (no reads, say) as null, numpy scalars as Python's, tuples as lists:
    JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, np.generic):
        return json_ready(value.item())
    return value


def load_results(path: Path, layout: Layout) -> dict[str, Any]:
    """A study's results file (``grouping.json``, ``sophon.json``, ``hfta.json``) of ``layout``,
    refusing another study's (its ``kind``) or a version this twintrace cannot bring up to date
    with a line saying what to do."""
    return versioned.load_json(Path(path), layout, missing="run the study first")


#: Another job using more cores than this during a run's epoch makes a study warn.
BUSY_HOST_CORES = 0.25


def warn_busy(runs: Mapping[str, float | None], log: Log, *, why: str = "") -> None:
    """Warn about every run (name -> the cores something outside it kept busy during its epoch,
    :func:`analysis.samples.other_cpu_cores`) that shared the host with another job: above
    :data:`BUSY_HOST_CORES` its figures are off. ``why`` says what the study does about it."""
    for name, busy in runs.items():
        if busy is not None and busy > BUSY_HOST_CORES:
            log(
                f"warning: {name} shared the host with another job ({busy:.2f} cores busy "
                f"outside the run): its figures are off; {why}run the study on an idle host "
                "for clean numbers"
            )


def finish(
    layout: Layout,
    out: Path,
    body: Mapping[str, Any],
    *,
    host: Mapping[str, Any],
    settings: Mapping[str, Any],
    started: float,
    figure: Callable[[Mapping[str, Any]], Any],
    table: Callable[[Mapping[str, Any]], Sequence[str]],
    log: Log,
) -> Path:
    """A study's results, written: ``body`` under the header every study's results have (the
    git revision, the ``host`` its runs ran on, its ``settings``) and its time since
    ``started``, stamped with ``layout`` (its kind and version), made JSON-ready
    (:func:`json_ready`) and written atomically to ``out/<kind>.json``, then ``figure(result)``
    to ``out/<kind>.html``; the lines of ``table(result)`` logged. Returns the results' path."""
    from analysis.figures import write_figure

    result = versioned.stamp(
        layout,
        {
            "git_revision": git_revision(),
            "host": dict(host),
            "settings": dict(settings),
            **body,
            "study_s": round(time.monotonic() - started, 1),
        },
    )
    results, figure_name, _ = file_names(str(layout.kind))
    atomic_write_json(out / results, json_ready(result))
    write_figure(figure(result), out / figure_name)
    for line in table(result):
        log(line)
    log(f"figure: {out / figure_name}")
    return out / results


# --------------------------------------------------------------------------------------------
# The dataset


def dataset_files(path: Path) -> list[tuple[str, int]]:
    """(name, bytes) of the dataset's image or group files, from its manifest (the index and
    the manifest itself are not read by the epoch)."""
    from datagen.common import load_manifest as load_data_manifest

    manifest = load_data_manifest(path)
    return [
        (f["name"], int(f["bytes"]))
        for f in manifest["files"]
        if not f["name"].endswith("index.csv")
    ]


def dataset_extents(path: Path) -> DiskExtents | None:
    """Where the dataset's image or group files (:func:`dataset_files`) lie on the disk
    (:func:`analysis.extents.disk_extents`), or None where that cannot be known."""

    def files() -> Iterator[Path]:
        # Read once the disk is known, as disk_extents iterates: not on tmpfs, say.
        for name, _ in dataset_files(path):
            yield path / name

    return disk_extents(path, files())
