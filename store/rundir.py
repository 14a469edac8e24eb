"""The run directory (``docs/run-format.md``): the one owner of its format.

Everything about the layout of a run lives here and nowhere else: the schema version, the
column names and dtypes of the three tables (``events``, ``samples``, ``phases``), the event
kinds, creating a run directory, the manifest, writing a table or a versioned JSON file, and
every reader (manifest, summary, tables, comparison and scores files). Each file written
carries ``schema_version`` and each loader checks it; a damaged file is a one-line
:class:`~core.errors.UserError` naming it.

Example::

    run = load_run("20261121-163005-unet3d-sleep-3f2a")     # resolved against ./runs
    reads = run.events[run.events["kind"] == "read"]
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import functools
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core import __version__ as TWINTRACE_VERSION
from core import versioned
from core.atomic import atomic_path
from core.errors import UserError, no_room
from core.units import format_size
from core.versioned import utc_now

#: The layout version of every file this code reads and writes. Version 2 added the
#: ``container`` column (the role of the run's container an event, sample or phase came from)
#: and the manifest's ``containers`` list, for runs of several containers. Version 3 added
#: aggregated syscall rows (``count`` calls in one row; ``bytes`` and ``latency_ns`` their totals)
#: and the ``latency_max_ns`` column. Version 4 added the ``host`` column (the name of the host
#: an event, sample or phase came from: runs over several hosts) and the manifest's ``hosts``.
SCHEMA_VERSION = 4
#: The run format's JSON files (manifest, summary, comparisons, scores; tables: :func:`read_table`)
#: and how an older one is brought up to date: version 3's JSON files are version 4's (its tables
#: lack only ``host``, the manifest's one host: :func:`migrate_table`).
RUN_FORMAT = versioned.Layout(
    "run format file", SCHEMA_VERSION, {3: lambda body: {**body, "tables_version": 3}}
)

#: Event kinds by what they do (``kind`` column of events).
READ_KINDS: tuple[str, ...] = ("read", "pread64", "readv")
WRITE_KINDS: tuple[str, ...] = ("write", "pwrite64", "writev")
FD_KINDS: tuple[str, ...] = (
    *READ_KINDS,
    *WRITE_KINDS,
    "close",
    "lseek",
    "fsync",
    "fdatasync",
    "mmap",
    "dup",
)
#: The process tree's kinds (tracing/bpf/proc.bt): oom_kill, a process the kernel chose to kill
#: for memory (its pid in ``ret``).
PROCESS_KINDS: tuple[str, ...] = ("fork", "exec", "exit", "oom_kill")

#: The instrumentation's event log inside a workload container (``tracing.container.OUT_MOUNT``
#: + ``mllog.log``): the tool's own output, whose volume differs by variant by design (an
#: ``original`` step logs one line, an ``instrumented`` or ``sleep`` step about eight), so the
#: similarity analysis leaves its writes out of both runs (docs/analysis.md).
EVENT_LOG_PATH = "/twintrace/out/mllog.log"

# Column name -> pandas dtype string, in file order. 'string' is pandas' nullable string dtype,
# 'category' a dictionary-encoded string (Parquet dictionary), the integer widths are those of
# docs/run-format.md. Keep these three in step with that document.
EVENTS_COLUMNS: Mapping[str, str] = {
    "ts_ns": "int64",
    "kind": "category",
    "pid": "int32",
    "tid": "int32",
    "comm": "string",
    "fd": "int32",
    "path": "string",
    "bytes": "int64",
    "count": "int64",
    "ret": "int64",
    "offset": "int64",
    "latency_ns": "int64",
    "latency_max_ns": "int64",
    "dev": "string",
    "in_container": "bool",
    "container": "string",
    "host": "string",
}

SAMPLES_COLUMNS: Mapping[str, str] = {
    "ts_ns": "int64",
    "metric": "string",
    "value": "float64",
    "unit": "string",
    "container": "string",
    "host": "string",
}

PHASES_COLUMNS: Mapping[str, str] = {
    "ts_ns": "int64",
    "end_ns": "int64",
    "duration_ns": "int64",
    "key": "string",
    "kind": "string",
    "rank": "int32",
    "pid": "int32",
    "epoch": "int32",
    "step": "int32",
    "value": "string",
    "container": "string",
    "host": "string",
}

#: Table name -> (file name, columns), in the order the run directory documents them.
TABLES: Mapping[str, tuple[str, Mapping[str, str]]] = {
    "events": ("events.parquet", EVENTS_COLUMNS),
    "samples": ("samples.parquet", SAMPLES_COLUMNS),
    "phases": ("phases.parquet", PHASES_COLUMNS),
}

MANIFEST = "manifest.json"
SUMMARY = "summary.json"
RUN_SUBDIRS = ("raw", "ctl", "out")
STATUSES = ("running", "completed", "lossy", "failed", "interrupted")
#: Statuses of a run whose workload completed and whose trace was processed; a ``lossy`` one's
#: tracer lost events (the summary's ``lost_events``), so its counts and bytes are lower bounds.
FINISHED = ("completed", "lossy")
#: Container paths under which the tracer mounts its own files (never the data measured).
TOOL_MOUNTS = "/twintrace/"

_ARROW_TYPES: Mapping[str, pa.DataType] = {
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    # int8 indices: a category column holds a small fixed vocabulary (20 event kinds).
    "category": pa.dictionary(pa.int8(), pa.string()),
}

# Arrow strings become pandas' nullable 'string' dtype directly, rather than Python objects that
# would then have to be converted one by one (slow on millions of rows).
_STRING_MAPPER = {
    pa.string(): pd.StringDtype(),
    pa.large_string(): pd.StringDtype(),
}.get


def arrow_schema(columns: Mapping[str, str]) -> pa.Schema:
    """The Parquet (Arrow) schema for a table described by ``columns``, for writers.

    ``'category'`` maps to ``dictionary<int8, string>``, ``'string'`` to ``string``; every
    column is declared non-nullable except strings (``path`` and ``dev`` are null by design).
    """
    fields = []
    for name, dtype in columns.items():
        arrow_type = _ARROW_TYPES[dtype]
        fields.append(pa.field(name, arrow_type, nullable=dtype == "string"))
    return pa.schema(fields)


def empty_frame(columns: Mapping[str, str]) -> pd.DataFrame:
    """An empty DataFrame with exactly the documented columns and dtypes."""
    return pd.DataFrame({name: pd.Series([], dtype=dtype) for name, dtype in columns.items()})


def conform(frame: pd.DataFrame, columns: Mapping[str, str], where: str) -> pd.DataFrame:
    """Return ``frame`` with the documented columns first, in order, cast to their dtypes.

    Extra columns are kept after the documented ones (a reader must not break on them). A
    missing column or a value that does not fit its dtype (e.g. a null in an integer column) is
    a :class:`UserError` naming ``where`` and the column: the file was not written by the
    schema this code reads.
    """
    missing = [name for name in columns if name not in frame.columns]
    if missing:
        raise UserError(
            f"{where} lacks column {missing[0]!r} required by run format schema_version "
            f"{SCHEMA_VERSION}: it was not written by a compatible twintrace; re-create the run"
        )
    # Cast only what differs and select columns by name: rebuilding the frame from a dict of
    # columns would copy every column (pandas consolidates them), a cost on millions of rows.
    casts = {name: dtype for name, dtype in columns.items() if str(frame[name].dtype) != dtype}
    if casts:
        frame = frame.copy(deep=False)  # copy-on-write: the caller's frame is left alone
        for name, dtype in casts.items():
            try:
                frame[name] = frame[name].astype(dtype)
            except (TypeError, ValueError) as exc:
                raise UserError(
                    f"{where}: column {name!r} cannot be read as {dtype}: {exc}"
                ) from None
    extras = [name for name in frame.columns if name not in columns]
    frame = frame[[*columns, *extras]]
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0:
        frame = frame.reset_index(drop=True)
    return frame


def read_table(
    path: Path, columns: Mapping[str, str], fill: Mapping[str, Any] | None = None
) -> pd.DataFrame:
    """Read one Parquet table of a run and conform it to ``columns``; ``fill``: values of
    columns an older schema lacks (:func:`migrate_table`)."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(
            f"cannot read {path}: {exc}; the run may have been interrupted while writing it"
        ) from None
    frame = table.to_pandas(types_mapper=_STRING_MAPPER, split_blocks=True, self_destruct=True)
    for name, value in (fill or {}).items():
        if name not in frame.columns:
            frame[name] = pd.Series(value, index=frame.index, dtype=columns[name])
    return conform(frame, columns, str(path))


def migrate_table(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The columns a run's tables lack for their schema version (``tables_version``: that of
    the run's first manifest, when it was brought up to date), with their values: a version-3
    run (one host) gets ``host``, the manifest's host name."""
    if manifest.get("tables_version", manifest.get("schema_version")) == 3:
        return {"host": (manifest.get("host") or {}).get("hostname")}
    return {}


def write_table(path: Path, frame: pd.DataFrame | pa.Table, columns: Mapping[str, str]) -> None:
    """Write one table of a run atomically, with exactly its documented columns and types.

    A DataFrame is conformed first (the documented columns, in order; extra columns are
    dropped); an Arrow table must already have the schema of :func:`arrow_schema`.
    """
    schema = arrow_schema(columns)
    if isinstance(frame, pd.DataFrame):
        frame = conform(frame, columns, str(path))
        table = pa.Table.from_pandas(frame[list(columns)], schema=schema, preserve_index=False)
    else:
        table = frame.select(list(columns)).cast(schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    """Write a JSON file of the run format atomically, stamped (:data:`RUN_FORMAT`)."""
    versioned.write_json(path, RUN_FORMAT, obj)


def load_json(path: Path, what: str) -> dict[str, Any]:
    """Read a JSON file of the run format (summary, comparison, scores, state), checked and up
    to date (:data:`RUN_FORMAT`). Missing, truncated, damaged or foreign files are a one-line
    UserError naming the file."""
    path = Path(path)
    missing = f"is {path.parent} a twintrace run directory? (`./cli.py runs` lists runs)"
    data = versioned.read_json(path, what, missing)
    return versioned.upgrade(dataclasses.replace(RUN_FORMAT, what=what), data, str(path))


# ---------------------------------------------------------------------------------------------
# Creating a run directory and its manifest


def new_run_dir(root: Path, label: str, variant: str | None) -> Path:
    """Create a fresh, uniquely named run directory under ``root``; never reuse one.

    The returned path is absolute: it is bind-mounted into the run's containers."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)[:40]
    parts = [stamp, safe] + ([variant] if variant else [])
    for _ in range(20):
        path = root / "-".join([*parts, secrets.token_hex(2)])
        try:
            path.mkdir()
        except FileExistsError:
            continue
        for sub in RUN_SUBDIRS:
            (path / sub).mkdir()
        return path
    raise UserError(f"could not create a new run directory under {root}")


#: Room a run directory keeps (``.reserve``, allocated when the run starts) until its run
#: ends, so that a run whose file system filled can still write its manifest saying so.
RESERVE_NAME = ".reserve"
RESERVE_BYTES = 1 << 20
#: Less than this free on a run directory's file system after tracing: it filled during the
#: run, and the tracer's output (written as it comes, in pieces far smaller) was cut.
FULL_BYTES = 1 << 20


def reserve_room(run_dir: Path) -> None:
    """Allocate :data:`RESERVE_BYTES` in ``run_dir`` (:data:`RESERVE_NAME`). A file system
    without that much room and :data:`FULL_BYTES` more (a run that could only fill it) removes
    ``run_dir`` and refuses the run in one line."""
    path = Path(run_dir) / RESERVE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.write(fd, bytes(RESERVE_BYTES))  # a file system without fallocate
        full = room_left(run_dir) is not None
    except OSError as exc:
        if not no_room(exc):
            raise
        full = True
    finally:
        os.close(fd)
    if full:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise UserError(
            f"{Path(run_dir).parent}: its file system has no room for a run (at least "
            f"{format_size(RESERVE_BYTES + FULL_BYTES)} free, and as much as the trace takes): "
            "free some space or give another --out"
        )


def give_back_room(run_dir: Path) -> None:
    """Free the room :func:`reserve_room` kept (nothing when there is none)."""
    (Path(run_dir) / RESERVE_NAME).unlink(missing_ok=True)


def room_left(run_dir: Path) -> int | None:
    """The bytes free (to root) on ``run_dir``'s file system when that is under
    :data:`FULL_BYTES` (it filled), else None."""
    st = os.statvfs(run_dir)
    free = st.f_bfree * st.f_frsize
    return free if free < FULL_BYTES else None


def git_revision() -> str | None:
    """HEAD of the twintrace checkout, with -dirty when there are local changes."""
    repo = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


#: The status a reader gives a run whose manifest says ``running`` while the process that ran
#: it is gone (killed, or the machine restarted): its tables may be missing or partial.
INCOMPLETE = "incomplete"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None where there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def this_process() -> dict[str, Any]:
    """This process as a manifest records its coordinator: host, boot, pid and start, which
    together name it (a pid alone is reused)."""
    return {
        "hostname": socket.gethostname(),
        "boot_id": _BOOT_ID.read_text().strip() if _BOOT_ID.exists() else None,
        "pid": os.getpid(),
        "started": _process_start(os.getpid()),
    }


def coordinator_alive(manifest: Mapping[str, Any]) -> bool | None:
    """Whether the process that runs the run (the manifest's ``coordinator``) still runs; None
    where this host cannot tell (another host's, or not recorded)."""
    who = manifest.get("coordinator")
    if not isinstance(who, Mapping) or who.get("hostname") != socket.gethostname():
        return None
    boot = _BOOT_ID.read_text().strip() if _BOOT_ID.exists() else None
    if who.get("boot_id") != boot:
        return False  # the machine restarted since
    return _process_start(int(who["pid"])) == who.get("started")


def run_status(manifest: Mapping[str, Any]) -> str:
    """The manifest's status, except :data:`INCOMPLETE` for a ``running`` run whose
    coordinator is gone."""
    status = str(manifest.get("status") or "unknown")
    if status == "running" and coordinator_alive(manifest) is False:
        return INCOMPLETE
    return status


def initial_manifest(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """The manifest as first written (status ``running``); the tracer finalises it."""
    return {
        "schema_version": SCHEMA_VERSION,
        "twintrace_version": TWINTRACE_VERSION,
        "run_id": run_dir.name,
        "status": "running",
        "error": None,
        "git_revision": git_revision(),
        "command_line": shlex.join(sys.argv),
        "coordinator": this_process(),
        "started_at": utc_now(),
        "ended_at": None,
        "start_ns": None,
        "end_ns": None,
        "exit_code": None,
        "lost_events": None,
        "containers": [],
        **fields,
    }


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> None:
    """(Re)write ``manifest.json`` atomically."""
    if manifest.get("status") not in STATUSES:
        raise ValueError(f"bad run status {manifest.get('status')!r}")
    write_json(Path(run_dir) / MANIFEST, manifest)


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """One run directory: its manifest and its three tables.

    The tables are read lazily, on first access, and then kept: listing or comparing runs only
    needs the manifests, and ``events.parquet`` can hold millions of rows, so nothing pays for
    a table it does not use. A table whose file is absent (a failed or interrupted run) reads as
    an empty frame with the documented dtypes and its name is in :attr:`missing`.
    """

    path: Path
    manifest: dict[str, Any]
    missing: frozenset[str] = frozenset()

    def _table(self, name: str) -> pd.DataFrame:
        file_name, columns = TABLES[name]
        if name in self.missing:
            return empty_frame(columns)
        return read_table(self.path / file_name, columns, migrate_table(self.manifest))

    # cached_property writes to the instance __dict__ directly, so it works on a frozen
    # dataclass; eq=False keeps instances hashable by identity (the manifest is a dict).
    @functools.cached_property
    def events(self) -> pd.DataFrame:
        """``events.parquet`` conformed to :data:`EVENTS_COLUMNS`."""
        return self._table("events")

    @functools.cached_property
    def samples(self) -> pd.DataFrame:
        """``samples.parquet`` conformed to :data:`SAMPLES_COLUMNS`."""
        return self._table("samples")

    @functools.cached_property
    def phases(self) -> pd.DataFrame:
        """``phases.parquet`` conformed to :data:`PHASES_COLUMNS`."""
        return self._table("phases")

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.path.name)

    @property
    def status(self) -> str:
        """The manifest's status (:func:`run_status`: ``incomplete`` for a run left running)."""
        return run_status(self.manifest)

    @property
    def incomplete(self) -> bool:
        """True when the run did not complete or a table is missing: plots are partial."""
        return self.status != "completed" or bool(self.missing)

    @property
    def start_ns(self) -> int | None:
        """CLOCK_MONOTONIC ns when the workload was released: the time origin of plots."""
        value = self.manifest.get("start_ns")
        return int(value) if value is not None else None

    @property
    def end_ns(self) -> int | None:
        value = self.manifest.get("end_ns")
        return int(value) if value is not None else None

    @property
    def workload(self) -> str:
        """The workload name from the config, else the image part of the run id."""
        return self._from_config("workload", 0)

    @property
    def variant(self) -> str:
        """The variant from the config, else the variant part of the run id."""
        return self._from_config("variant", 1)

    def _from_config(self, key: str, part: int) -> str:
        config = self.manifest.get("config") or {}
        return str(config[key]) if config.get(key) else _run_id_parts(self.run_id)[part]

    @property
    def data_mounts(self) -> tuple[str, ...]:
        """Container paths (no trailing ``/``) of the read-only mounts of the run's containers:
        the dataset, the storage being measured. The tool's own mounts under /twintrace/
        (control files, a sleep profile) are not data."""
        targets = {
            str(m["target"]).rstrip("/") or "/"
            for c in self.manifest.get("containers") or []
            for m in c.get("mounts") or []
            if isinstance(m, Mapping) and m.get("read_only") and m.get("target")
        }
        targets = {t for t in targets if not t.startswith(TOOL_MOUNTS)}
        return tuple(sorted(targets))

    @property
    def containers(self) -> list[str]:
        """The roles of the run's containers, in the manifest's order (one for most runs)."""
        return [str(c.get("role")) for c in self.manifest.get("containers") or []]

    @property
    def placement(self) -> dict[str, str]:
        """Role -> host of a run across several hosts (``trace --nodes``); empty for a run of
        one host."""
        placed = {
            str(c.get("role")): str(c["host"])
            for c in self.manifest.get("containers") or []
            if c.get("host")
        }
        return placed if len(set(placed.values())) > 1 else {}

    @property
    def label(self) -> str:
        """``run id (workload, variant)``, the heading used by plots."""
        return f"{self.run_id} ({self.workload}, {self.variant})"


def _run_id_parts(run_id: str) -> tuple[str, str]:
    """(workload or image, variant) from ``<date>-<time>-<workload>-<variant>-<hex>``.

    The workload (an image tag for ``--image`` runs) may itself contain dashes; variants do not.
    """
    parts = run_id.split("-")
    if len(parts) < 5:
        return (run_id, "unknown")
    return ("-".join(parts[2:-2]), parts[-2])


def resolve_run(ref: str | Path, runs_root: Path = Path("runs")) -> Path:
    """The run directory that ``ref`` names: a path, a run id under ``runs_root``, or a unique
    prefix of one.

    Raises :class:`UserError` naming what was tried when nothing (or more than one run) matches.
    """
    path = Path(ref)
    if (path / MANIFEST).is_file():
        return path
    candidate = Path(runs_root) / str(ref)
    if (candidate / MANIFEST).is_file():
        return candidate
    # A bare prefix is convenient ("20261121-1630"), but only when it is unambiguous.
    if path.name == str(ref) and Path(runs_root).is_dir():
        matches = sorted(
            p
            for p in Path(runs_root).iterdir()
            if p.name.startswith(str(ref)) and (p / MANIFEST).is_file()
        )
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            names = ", ".join(p.name for p in matches[:5])
            more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
            raise UserError(
                f"run {str(ref)!r} is ambiguous: it matches {names}{more}; give the full run id"
            )
    if path.exists():
        raise UserError(
            f"{path} is not a run directory (it has no {MANIFEST}): "
            "list the runs with `./cli.py runs`"
        )
    tried = (
        f"{path} is no run directory"
        if path == candidate
        else (f"neither {path} nor {candidate} is a run directory")
    )
    raise UserError(f"no run {str(ref)!r}: {tried}; list the runs with `./cli.py runs`")


def load_manifest(run_dir: Path) -> dict[str, Any]:
    """Read ``manifest.json`` and check its ``schema_version``."""
    if not (Path(run_dir) / MANIFEST).exists():
        raise UserError(
            f"{run_dir} is not a run directory (it has no {MANIFEST}): "
            "list the runs with `./cli.py runs`"
        )
    return load_json(Path(run_dir) / MANIFEST, "manifest")


def load_summary(run_dir: Path) -> dict[str, Any]:
    """Read ``summary.json`` (written when the trace was processed) and check its version."""
    return load_json(Path(run_dir) / SUMMARY, "summary")


def load_comparison(path: Path) -> dict[str, Any]:
    """Read a ``comparison-*.json`` written by ``./cli.py compare`` and check its version."""
    return load_json(Path(path), "comparison")


def load_run(ref: str | Path, runs_root: Path = Path("runs")) -> Run:
    """Load the run that ``ref`` names (see :func:`resolve_run`); tables are read on first use.

    Example: ``load_run("runs/20261121-163005-unet3d-sleep-3f2a").phases``
    """
    run_dir = resolve_run(ref, runs_root)
    manifest = load_manifest(run_dir)
    missing = frozenset(
        name for name, (file_name, _) in TABLES.items() if not (run_dir / file_name).is_file()
    )
    return Run(path=run_dir, manifest=manifest, missing=missing)
