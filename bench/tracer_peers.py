#!/usr/bin/env python3
"""Benchmark: twintrace against DFTracer, the I/O tracer users of AI workloads pick today.

Method: the same containerised jobs run untraced, under DFTracer inside the container
(``LD_PRELOAD`` of its ``libdftracer_preload.so``, tracing only the dataset directory) and under
twintrace (``./cli.py trace``: bpftrace and the samplers outside the container), alternated, the
order rotated every round, for ``--rounds`` rounds. Two cases:

- ``storm``: the job of bench/tracer_storm.py, ``--calls`` page-cached ``pread`` calls of
  ``--size`` bytes in one process; its cost is the loop's own time.
- ``unet3d``: the UNet3D ``sleep`` workload, one epoch over the small dataset of
  experiments/fidelity.py (generated once under ``--data-root``, or ``--data``) with
  ``--workers`` forked DataLoader workers, a constant ``--compute-s`` step (the data pipeline
  dominates) and the page cache dropped before every run; its cost is the median step time.

Printed per case and tracer: untraced/traced (the job's time untraced over its time traced, 1.0
costs nothing) per round, their median and spread (min..max); and the trace's completeness
against ground truth, for the main process and the loader workers apart: opens of the dataset
files and the bytes read from them. Truth: the storm opens its file twice (written, then read)
and preads ``calls + 1`` times (one warm-up); the UNet3D epoch opens every file of the dataset's
manifest once in a loader worker and reads all its bytes, and the main process opens none.
Bytes count as found per file up to the file's truth (at the system-call level numpy reads
4,224 bytes of an .npy file twice: the header's page, then the header again). twintrace's rows are weighted by ``count``; a
DFTracer ``-fork`` trace file is a forked process's (a loader worker), its other files the main
process's. Tracers (``--tracers``): ``dftracer`` (every call one event, as it is used
today), ``dftracer-agg`` (its own aggregation, ``DFTRACER_ENABLE_AGGREGATION=1``: one row per
call name and second, without file names) and ``twintrace``.

    python bench/tracer_peers.py --rounds 5 --json tracer-peers.json

DFTracer is installed on the host, pinned, and mounted read-only into the containers:

    .venv/bin/python -m pip install --no-deps --target .cache/dftracer/2.2.0 dftracer==2.2.0

Run as root with the images built, on an otherwise idle machine. docs/tracer-peers.md has the
results and what makes them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.json as pa_json  # noqa: E402

from bench.tracer_storm import FILE, run_job  # noqa: E402
from core.errors import UserError  # noqa: E402
from core.units import parse_size  # noqa: E402
from datagen.common import load_manifest  # noqa: E402
from experiments.fidelity import SETUPS, dataset, step_times  # noqa: E402
from store.rundir import load_run  # noqa: E402
from tracing.container import DATA_MOUNT, OUT_MOUNT, BindMount  # noqa: E402
from tracing.host import drop_caches  # noqa: E402
from tracing.request import RunOptions, workload_request  # noqa: E402
from tracing.runner import trace  # noqa: E402
from workloads.profile import Linear, Normal, SleepProfile  # noqa: E402

DFTRACER_VERSION = "2.2.0"
DFTRACER_HOME = REPO / ".cache" / "dftracer" / DFTRACER_VERSION
DFTRACER_MOUNT = "/opt/dftracer"
PRELOAD = "dftracer/lib64/libdftracer_preload.so"
#: DFTracer's log prefix in the container's output directory: it writes
#: ``dftracer-<hash>-preload.pfw.gz`` (a process started with the preload) and
#: ``dftracer-<hash>-fork.pfw.gz`` (a forked one) into the run's ``out/<role>/``.
DFTRACER_LOG = f"{OUT_MOUNT}/dftracer"
ROLES = ("main", "workers")
#: The DataLoader names its worker processes so (torch sets the thread name at start).
WORKER_COMM = "pt_data_worker"
#: twintrace event kinds that open a file and that read from one.
TT_OPENS = ("openat",)
TT_READS = ("read", "pread64", "readv")
#: DFTracer event names of the same (POSIX and STDIO interceptors).
DFT_OPENS = ("open", "open64", "openat", "openat64", "fopen", "fopen64")
DFT_READS = ("read", "pread", "pread64", "readv", "preadv", "preadv2", "fread")
#: Only these fields of DFTracer's JSON lines are read (the rest are ignored).
DFT_SCHEMA = pa.schema(
    [
        ("name", pa.string()),
        ("pid", pa.int64()),
        (
            "args",
            pa.struct(
                [
                    ("name", pa.string()),  # FH metadata: the path
                    ("value", pa.string()),  # FH metadata: its hash
                    ("fhash", pa.string()),
                    ("ret", pa.int64()),
                    ("size", pa.int64()),  # fread: item size (ret counts items)
                    ("dft_cnt", pa.int64()),  # aggregated rows: calls
                    ("ret_sum", pa.int64()),  # aggregated rows: their returns' sum
                ]
            ),
        ),
    ]
)


@dataclasses.dataclass(frozen=True)
class Tracer:
    """One way of running a case: twintrace on or off, DFTracer in the container or not."""

    name: str
    twintrace: bool = False
    dftracer: bool = False
    aggregate: bool = False  # DFTracer's aggregation mode


TRACERS = {
    t.name: t
    for t in (
        Tracer("untraced"),
        Tracer("dftracer", dftracer=True),
        Tracer("dftracer-agg", dftracer=True, aggregate=True),
        Tracer("twintrace", twintrace=True),
    )
}


@dataclasses.dataclass(frozen=True)
class Counts:
    """Opens of, read calls on and bytes read from a file (or all files)."""

    opens: int = 0
    reads: int = 0
    bytes: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.opens + other.opens, self.reads + other.reads, self.bytes + other.bytes)


#: What a trace holds: (role, path) -> counts; path None where the tracer does not say which
#: file (DFTracer's aggregated rows).
Found = dict[tuple[str, str | None], Counts]


@dataclasses.dataclass(frozen=True)
class Completeness:
    """One role's trace against the truth. ``covered``: bytes found per file, each file's
    counted up to its truth (unattributed bytes up to what the named files leave)."""

    role: str
    opens: int
    opens_true: int
    bytes: int
    covered: int
    bytes_true: int
    per_file: bool  # every counted call named its file

    @property
    def complete(self) -> bool:
        return self.opens == self.opens_true and self.covered == self.bytes_true

    def describe(self) -> str:
        share = f" ({100 * self.covered / self.bytes_true:.1f} %)" if self.bytes_true else ""
        extra = f", {self.bytes} read" if self.bytes != self.covered else ""
        extra += "" if self.per_file else ", no file names"
        return (
            f"{self.role}: opens {self.opens}/{self.opens_true}, bytes "
            f"{self.covered}/{self.bytes_true}{share}{extra}"
        )


def completeness(found: Found, truth: Mapping[tuple[str, str], Counts]) -> list[Completeness]:
    """Each role's found opens and bytes against ``truth`` ((role, path) -> expected counts).
    Calls on files outside the truth were filtered out before (they are not dataset files)."""
    result = []
    for role in ROLES:
        mine = {path: c for (r, path), c in found.items() if r == role}
        expected = {path: c for (r, path), c in truth.items() if r == role}
        bytes_true = sum(c.bytes for c in expected.values())
        covered = sum(min(mine.get(p, Counts()).bytes, c.bytes) for p, c in expected.items())
        unnamed = mine.get(None, Counts())
        covered += min(unnamed.bytes, bytes_true - covered)
        result.append(
            Completeness(
                role,
                opens=sum(c.opens for c in mine.values()),
                opens_true=sum(c.opens for c in expected.values()),
                bytes=sum(c.bytes for c in mine.values()),
                covered=covered,
                bytes_true=bytes_true,
                per_file=unnamed == Counts(),
            )
        )
    return result


def twintrace_found(run_dir: Path, paths: Collection[str]) -> tuple[Found, list[str]]:
    """Opens and reads of ``paths`` in a twintrace run's events.parquet, rows weighted by
    ``count`` (a process named ``pt_data_worker`` is a loader worker, any other the main one),
    and what its summary says it lost or could not parse."""
    summary = json.loads((run_dir / "summary.json").read_text())
    notes = [
        f"twintrace {key.replace('_', ' ')}: {summary[key]}"
        for key in ("lost_events", "skipped_lines")
        if summary.get(key)
    ]
    events = pd.read_parquet(
        run_dir / "events.parquet", columns=["kind", "comm", "path", "count", "bytes", "ret"]
    )
    events = events[events["path"].isin(list(paths))]
    kind = events["kind"].astype(str)
    is_open = kind.isin(TT_OPENS) & (events["ret"] >= 0)
    is_read = kind.isin(TT_READS)
    frame = pd.DataFrame(
        {
            "role": (events["comm"] == WORKER_COMM).map({True: "workers", False: "main"}),
            "path": events["path"],
            "opens": events["count"].where(is_open, 0),
            "reads": events["count"].where(is_read, 0),
            "bytes": events["bytes"].where(is_read, 0),
        }
    )
    return _found(frame), notes


def dftracer_found(out_dir: Path, paths: Collection[str]) -> tuple[Found, list[str]]:
    """Opens and reads of ``paths`` in the DFTracer trace files of a container's output
    directory, and a note for each file that could not be read (truncated: its process did
    not exit normally). An empty file is a process that exec'd before writing anything (the
    container's start-up shell) and is skipped."""
    frames, notes = [], []
    options = pa_json.ParseOptions(explicit_schema=DFT_SCHEMA, unexpected_field_behavior="ignore")
    for path in sorted(out_dir.glob("dftracer-*.pfw.gz")):
        if path.stat().st_size == 0:
            continue
        try:
            table = pa_json.read_json(
                pa.input_stream(path, compression="gzip"), parse_options=options
            )
        except (pa.ArrowInvalid, OSError, EOFError):
            notes.append(f"DFTracer file {path.name} unreadable")
            continue
        frame = table.flatten().to_pandas()
        frame["role"] = "workers" if path.name.endswith("-fork.pfw.gz") else "main"
        frames.append(frame)
    if not frames:
        return {}, notes
    lines = pd.concat(frames, ignore_index=True)
    names = lines[lines["name"] == "FH"]
    hashes = dict(zip(names["args.value"], names["args.name"], strict=True))
    calls = lines[lines["name"].isin(DFT_OPENS + DFT_READS)]
    calls = calls.assign(path=calls["args.fhash"].map(hashes))
    # Aggregated rows carry no file hash: they are the data directory's, file unknown.
    calls = calls[calls["args.fhash"].isna() | calls["path"].isin(list(paths))]
    n = calls["args.dft_cnt"].fillna(1).astype("int64")
    returned = calls["args.ret_sum"].fillna(calls["args.ret"]).fillna(0).clip(lower=0)
    item = calls["args.size"].where(calls["name"] == "fread", 1).fillna(1)
    is_read = calls["name"].isin(DFT_READS)
    frame = pd.DataFrame(
        {
            "role": calls["role"],
            "path": calls["path"],
            "opens": n.where(calls["name"].isin(DFT_OPENS), 0),
            "reads": n.where(is_read, 0),
            "bytes": (returned * item).astype("int64").where(is_read, 0),
        }
    )
    return _found(frame), notes


def _found(frame: pd.DataFrame) -> Found:
    sums = frame.groupby(["role", "path"], dropna=False)[["opens", "reads", "bytes"]].sum()
    return {
        (role, None if pd.isna(path) else path): Counts(int(o), int(r), int(b))
        for (role, path), (o, r, b) in zip(sums.index, sums.to_numpy(), strict=True)
    }


def dftracer_setup(home: Path, data_dir: str, aggregate: bool) -> tuple[dict[str, str], BindMount]:
    """The container environment that makes DFTracer (installed in ``home`` on the host,
    mounted read-only) trace every process of the container, files under ``data_dir`` only."""
    environment = {
        "LD_PRELOAD": f"{DFTRACER_MOUNT}/{PRELOAD}",
        "DFTRACER_ENABLE": "1",
        "DFTRACER_INIT": "PRELOAD",
        "DFTRACER_LOG_FILE": DFTRACER_LOG,
        "DFTRACER_DATA_DIR": data_dir,
        "DFTRACER_INC_METADATA": "1",  # FH lines: file hash -> path
    }
    if aggregate:
        environment["DFTRACER_ENABLE_AGGREGATION"] = "1"
    return environment, BindMount(home, DFTRACER_MOUNT, True)


def check_dftracer(home: Path) -> None:
    """Exit with the command that installs DFTracer when ``home`` does not hold it."""
    if (
        not (home / PRELOAD).is_file()
        or not (home / f"dftracer-{DFTRACER_VERSION}.dist-info").is_dir()
    ):
        raise SystemExit(
            f"DFTracer {DFTRACER_VERSION} is not installed in {home}: run `{sys.executable} -m "
            f"pip install --no-deps --target {home} dftracer=={DFTRACER_VERSION}`"
        )


@dataclasses.dataclass(frozen=True)
class Case:
    """A job to trace: ``run(tracer, runs_root, environment, mounts)`` gives (seconds, lower
    is faster; its run directory). ``data_dir``: what DFTracer traces, in the container."""

    name: str
    data_dir: str
    truth: Mapping[tuple[str, str], Counts]
    run: Callable[[Tracer, Path, Mapping[str, str], tuple[BindMount, ...]], tuple[float, Path]]


def storm_case(size: int, calls: int) -> Case:
    """bench/tracer_storm.py's job: one process, ``calls + 1`` preads of one page-cached file."""

    def run(
        tracer: Tracer, runs: Path, environment: Mapping[str, str], mounts: tuple[BindMount, ...]
    ) -> tuple[float, Path]:
        return run_job(size, calls, runs, tracer.twintrace, environment=environment, mounts=mounts)

    truth = {("main", FILE): Counts(opens=2, reads=calls + 1, bytes=(calls + 1) * size)}
    return Case("storm", str(Path(FILE).parent), truth, run)


def unet3d_case(data: Path, workers: int, compute_s: float, work: Path) -> Case:
    """One UNet3D sleep epoch over ``data`` with ``workers`` loader workers, cold cache."""
    setup = SETUPS["unet3d"]
    manifest = load_manifest(data)
    truth = {
        ("workers", f"{DATA_MOUNT}/{f['name']}"): Counts(opens=1, bytes=int(f["bytes"]))
        for f in manifest["files"]
    }
    profile = work / "unet3d-profile.json"
    SleepProfile(
        workload="unet3d",
        accelerator="none",
        source="bench/tracer_peers.py: constant compute time, data pipeline dominates",
        compute=Normal(mean=Linear(const=compute_s)),
    ).save(profile)
    # One whole epoch (no max_steps): every file is opened exactly once.
    settings = {
        **{k: v for k, v in setup.settings.items() if k != "max_steps"},
        "epochs": 1,
        "workers": workers,
        "checkpoint_every": 0,
        "seed": 0,
    }

    def run(
        tracer: Tracer, runs: Path, environment: Mapping[str, str], mounts: tuple[BindMount, ...]
    ) -> tuple[float, Path]:
        request = workload_request(
            "unet3d",
            "sleep",
            data,
            runs,
            settings=settings,
            options=dict(setup.options),
            profile=profile,
            mounts=mounts,
            run=RunOptions(tracing=tracer.twintrace),
        )
        containers = tuple(
            dataclasses.replace(c, environment={**c.environment, **environment})
            for c in request.containers
        )
        drop_caches()
        run_dir = trace(dataclasses.replace(request, containers=containers)).check()
        return statistics.median(step_times(load_run(run_dir))), run_dir

    return Case("unet3d", DATA_MOUNT, truth, run)


@dataclasses.dataclass
class Result:
    """A case's measurements for one tracer, one entry per round."""

    seconds: list[float] = dataclasses.field(default_factory=list)
    completeness: list[list[Completeness]] = dataclasses.field(default_factory=list)
    notes: set[str] = dataclasses.field(default_factory=set)


def measure(
    case: Case, tracers: list[str], rounds: int, work: Path, dftracer_home: Path
) -> dict[str, Result]:
    """Run ``case`` untraced and under each of ``tracers``, order rotated each round."""
    modes = ["untraced", *tracers]
    results = {m: Result() for m in modes}
    paths = {path for _, path in case.truth}
    for i in range(rounds):
        shift = i % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            tracer = TRACERS[mode]
            environment, mounts = {}, ()
            if tracer.dftracer:
                environment, mount = dftracer_setup(dftracer_home, case.data_dir, tracer.aggregate)
                mounts = (mount,)
            seconds, run_dir = case.run(tracer, work / "runs", environment, mounts)
            result = results[mode]
            result.seconds.append(seconds)
            if tracer.dftracer or tracer.twintrace:
                found, notes = (
                    dftracer_found(run_dir / "out" / "main", paths)
                    if tracer.dftracer
                    else twintrace_found(run_dir, paths)
                )
                result.completeness.append(completeness(found, case.truth))
                result.notes.update(notes)
            shutil.rmtree(run_dir)
        base = results["untraced"].seconds[-1]
        parts = [f"untraced {base:.3f} s"]
        for mode in tracers:
            result = results[mode]
            state = "complete" if all(c.complete for c in result.completeness[-1]) else "INCOMPLETE"
            parts.append(
                f"{mode} {result.seconds[-1]:.3f} s ({base / result.seconds[-1]:.3f}, {state})"
            )
        print(f"{case.name} round {i + 1}: " + ", ".join(parts), flush=True)
    return results


def summary(case: Case, results: dict[str, Result]) -> list[dict[str, object]]:
    """Per tracer: untraced/traced per round, median, spread; completeness of the last round
    and in how many rounds the trace was complete."""
    base = results["untraced"].seconds
    rows = []
    for mode, result in results.items():
        if mode == "untraced":
            continue
        ratios = [u / t for u, t in zip(base, result.seconds, strict=True)]
        last = result.completeness[-1]
        rows.append(
            {
                "case": case.name,
                "tracer": mode,
                "untraced_s": base,
                "traced_s": result.seconds,
                "ratios": ratios,
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "complete_rounds": sum(all(c.complete for c in r) for r in result.completeness),
                "rounds": len(ratios),
                "completeness": [{**dataclasses.asdict(c), "complete": c.complete} for c in last],
                "describe": "; ".join(c.describe() for c in last),
                "notes": sorted(result.notes),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="storm,unet3d", help="storm, unet3d or both")
    parser.add_argument(
        "--tracers",
        default="dftracer,dftracer-agg,twintrace",
        help="dftracer, dftracer-agg, twintrace",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", default="4KiB", help="storm: bytes per pread")
    parser.add_argument("--calls", type=int, default=200_000, help="storm: preads")
    parser.add_argument(
        "--data", type=Path, help="unet3d: a dataset (default: generated under --data-root)"
    )
    parser.add_argument("--data-root", type=Path, default=Path("/var/tmp/twintrace-fidelity"))
    parser.add_argument("--workers", type=int, default=2, help="unet3d: DataLoader workers")
    parser.add_argument("--compute-s", type=float, default=0.005, help="unet3d: step compute")
    parser.add_argument("--dftracer", type=Path, default=DFTRACER_HOME, help="its --target dir")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    cases = args.cases.split(",")
    tracers = args.tracers.split(",")
    for name in tracers:
        if name not in TRACERS or name == "untraced":
            raise SystemExit(
                f"unknown tracer {name!r}: choose from dftracer, dftracer-agg, twintrace"
            )
    for name in cases:
        if name not in ("storm", "unet3d"):
            raise SystemExit(f"unknown case {name!r}: choose storm or unet3d")
    if any(TRACERS[t].dftracer for t in tracers):
        check_dftracer(args.dftracer)
    work = Path(tempfile.mkdtemp(prefix="twintrace-peers-"))
    rows = []
    try:
        for name in cases:
            if name == "storm":
                case = storm_case(parse_size(args.size), args.calls)
            else:
                data = args.data or dataset(args.data_root, SETUPS["unet3d"])
                case = unet3d_case(data, args.workers, args.compute_s, work)
            rows += summary(case, measure(case, tracers, args.rounds, work, args.dftracer))
    except UserError as exc:
        raise SystemExit(str(exc)) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    for row in rows:
        print(
            f"{row['case']} {row['tracer']}: untraced/traced = {row['median']:.3f} (median of "
            f"{row['rounds']}; spread {row['min']:.3f} .. {row['max']:.3f}); complete in "
            f"{row['complete_rounds']}/{row['rounds']} rounds; {row['describe']}"
            + "".join(f"; {note}" for note in row["notes"])
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "schema_version": 1,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "dftracer_version": DFTRACER_VERSION,
                    "results": rows,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
