"""Integration: real containers traced by real bpftrace, checked against ground truth."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from store.rundir import load_run
from tests.conftest import (
    REPO,
    STEP_KEYS,
    THREADS_TILL_REFUSED,
    assert_failed_run,
    bpftrace_running,
    error_line,
    reaped,
    refused_unet3d_trace,
    run_cli,
    run_label,
    start_cli,
    traced_events,
)
from tracing.container import RUN_LABEL, BindMount, client
from tracing.host import drop_caches
from tracing.request import image_request, workload_request
from tracing.runner import trace
from workloads.config import BASE_TAG as BASE

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.bpftrace]

SIZES = [1, 4096, 10_000, 123_457, 3 * 65_536 + 7, 1_000_003]


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _trace_over_files(
    tmp_path: Path,
    runs_root: Path,
    files: dict[str, int],
    script: str,
    cold: bool = False,
    read_bps: int | None = None,
) -> Path:
    """Write ``files`` (name -> random bytes of that size) into a directory mounted at /data and
    trace ``python3 -c script`` over it in the base image (page cache dropped first if ``cold``;
    its disk's reads capped at ``read_bps``)."""
    from tracing.request import Limits, RunOptions

    data = tmp_path / "data"
    data.mkdir()
    for name, size in files.items():
        (data / name).write_bytes(os.urandom(size))
    if cold:
        drop_caches()
    run = RunOptions(limits=Limits(read_bps=read_bps))
    command = ["python3", "-c", script]
    return trace(image_request(BASE, command, runs_root, data_dir=data, run=run)).check()


def test_reading_n_known_files_shows_n_opens_and_their_bytes(
    images, tmp_path: Path, runs_root: Path
) -> None:
    script = (
        "import os\n"
        "for name in sorted(os.listdir('/data')):\n"
        "    with open(os.path.join('/data', name), 'rb') as fh:\n"
        "        fh.read()\n"
    )
    # Cold cache, so the page-cache lane must show the files coming in.
    files = {f"file{i}.bin": size for i, size in enumerate(SIZES)}
    run_dir = _trace_over_files(tmp_path, runs_root, files, script, cold=True)
    manifest = _manifest(run_dir)
    assert manifest["status"] == "completed" and manifest["exit_code"] == 0
    assert manifest["lost_events"] == 0
    # The agent's clock, before the release and after the stop: one host, true offset 0.
    clock = manifest["hosts"][manifest["host"]["hostname"]]["clock"]
    assert abs(clock["offset_ns"]) <= clock["bound_ns"] <= 1_000_000, clock
    assert clock["after"]["at_ns"] > clock["before"]["at_ns"] and clock["drift_ppm"] is not None
    events = traced_events(run_dir)
    for i, size in enumerate(SIZES):
        path = f"/data/file{i}.bin"
        opens = events[(events["kind"] == "openat") & (events["path"] == path)]
        assert len(opens) == 1, path
        reads = events[events["kind"].isin(["read", "pread64", "readv"]) & (events["path"] == path)]
        assert reads["bytes"].sum() == size, path
        closes = events[(events["kind"] == "close") & (events["path"] == path)]
        assert len(closes) == 1, path
    # Nothing else under /data was opened, and the process tree was captured.
    data_opens = events[
        (events["kind"] == "openat") & events["path"].str.startswith("/data/", na=False)
    ]
    assert len(data_opens) == len(SIZES)
    assert (events["kind"] == "exec").sum() >= 1
    cache_pages = events.loc[events["kind"] == "cache_add", "count"].sum()
    assert cache_pages * 4096 >= sum(SIZES)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["syscalls"]["openat"]["count"] == int((events["kind"] == "openat").sum())
    samples = pd.read_parquet(run_dir / "samples.parquet")
    assert {"container_cpu", "host_cpu_user"} <= set(samples["metric"].astype(str))
    # One container, role "main": every in-container event and its samples carry it.
    assert [c["role"] for c in manifest["containers"]] == ["main"]
    assert manifest["containers"][0]["exit_code"] == 0
    assert set(events.loc[events["in_container"], "container"]) == {"main"}
    cpu = samples[samples["metric"] == "container_cpu"]
    assert set(cpu["container"]) == {"main"}
    assert samples.loc[samples["metric"] == "host_cpu_user", "container"].isna().all()
    assert load_run(run_dir).data_mounts == ("/data",)
    # A single-container run has no network at all.
    assert manifest["trace"]["network"] == "none"


def test_failed_workload_leaves_a_failed_run(images, runs_root: Path) -> None:
    outcome = trace(image_request(BASE, ["python3", "-c", "import sys; sys.exit(3)"], runs_root))
    assert outcome.status == "failed" and "exited with code 3" in outcome.error
    (run_dir,) = runs_root.iterdir()
    assert run_dir == outcome.run_dir
    manifest = _manifest(run_dir)
    assert manifest["status"] == "failed" and manifest["exit_code"] == 3
    assert "exited with code 3" in manifest["error"]
    assert not client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"})


def test_a_container_killed_for_memory_says_so_with_its_limit(images, runs_root: Path) -> None:
    """A container that needs more memory than its limit: the kernel kills it, and the run is
    failed with the reason and the limit (the engine's OOMKilled), its trace kept and
    processed, nothing of it left."""
    from tracing.request import Limits, RunOptions

    grow = "x = bytearray(512 * 2**20); print(len(x))"  # 512 MiB against a 64 MiB limit
    run = RunOptions(limits=Limits(memory_bytes=64 * 2**20))
    outcome = trace(image_request(BASE, ["python3", "-c", grow], runs_root, run=run))
    assert outcome.status == "failed" and outcome.error is not None
    assert outcome.error.startswith(
        "container main exited with code 137: the kernel killed a process of it for memory, "
        "at its limit of 64.0 MiB (--memory-limit: give it more)"
    ), outcome.error
    manifest = _manifest(outcome.run_dir)
    assert manifest["status"] == "failed" and manifest["exit_code"] == 137
    # The trace is kept, processed, and has the kill: the kernel chose the python process.
    events = traced_events(outcome.run_dir)
    python = events[(events["kind"] == "exec") & events["path"].str.endswith("/python3", na=False)]
    kills = events[events["kind"] == "oom_kill"]
    assert list(kills["ret"]) == list(python["pid"]) and list(kills["container"]) == ["main"]
    assert not client().containers.list(
        all=True, filters={"label": f"{RUN_LABEL}={outcome.run_dir.name}"}
    )
    assert bpftrace_running() == []


def test_ctrl_c_leaves_no_container_no_bpftrace_and_an_interrupted_manifest(
    images, runs_root: Path
) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "cli.py"),
            "trace",
            "--image",
            BASE,
            "--out",
            str(runs_root),
            "--",
            "python3",
            "-c",
            "import time\nwhile True: time.sleep(0.1)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        run_dir = None
        while time.monotonic() < deadline:
            dirs = list(runs_root.glob("*")) if runs_root.exists() else []
            if dirs and (dirs[0] / "manifest.json").exists() and _manifest(dirs[0]).get("start_ns"):
                run_dir = dirs[0]  # released: bpftrace is attached and the workload runs
                assert bpftrace_running()
                break
            time.sleep(0.2)
        assert run_dir is not None, "the trace never started"
        time.sleep(2)  # let the workload run for a moment after release
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert proc.returncode == 130, stderr.decode()
    manifest = _manifest(run_dir)
    assert manifest["status"] == "interrupted"
    assert manifest["ended_at"] is not None
    assert not client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"})
    assert bpftrace_running() == []
    # The run directory is still consistent: the tables exist and the summary says interrupted.
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert (run_dir / "events.parquet").exists()


def test_two_runs_at_once_each_trace_their_own_and_leave_the_other_alone(
    images, tmp_path: Path
) -> None:
    """Two `trace` commands at once on one host (two processes, as two users would): each run
    shows its own container's opens and no other's, the short run's clean-up leaves the long
    one's container and tracer running (it completes, reading its files after the other has
    gone), and nothing of either is left."""
    data = tmp_path / "data"
    data.mkdir()
    files = {"long": ["a0.bin", "a1.bin", "a2.bin"], "short": ["b0.bin", "b1.bin"]}
    for i, name in enumerate(sorted(n for names in files.values() for n in names)):
        (data / name).write_bytes(os.urandom(4096 * (i + 1)))
    read = "for n in {names!r}:\n    open('/data/' + n, 'rb').read()\n"
    scripts = {
        # reads its files, waits for the short run to end, then reads them again
        "long": "import os, time\n"
        + read.format(names=files["long"])
        + "while not os.path.exists('/data/short-done'): time.sleep(0.1)\n"
        + read.format(names=files["long"]),
        "short": read.format(names=files["short"]),
    }
    roots = {who: tmp_path / f"runs-{who}" for who in scripts}

    def start(who: str, mount: str) -> subprocess.Popen:
        command = [sys.executable, str(REPO / "cli.py"), "trace", "--image", BASE]
        command += ["--out", str(roots[who]), "--mount", mount, "--", "python3", "-c", scripts[who]]
        return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    procs = {"long": start("long", f"{data}:/data")}
    try:
        deadline = time.monotonic() + 120
        while not any((d / "manifest.json").exists() for d in roots["long"].glob("*")):
            assert time.monotonic() < deadline and procs["long"].poll() is None, "no long run"
            time.sleep(0.2)
        procs["short"] = start("short", f"{data}:/data")
        _, err = procs["short"].communicate(timeout=300)
        assert procs["short"].returncode == 0, err.decode()
        assert procs["long"].poll() is None, "the long run ended with the short one"
        (data / "short-done").touch()
        _, err = procs["long"].communicate(timeout=300)
        assert procs["long"].returncode == 0, err.decode()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=120)
    for who, names in files.items():
        (run_dir,) = roots[who].iterdir()
        manifest = _manifest(run_dir)
        assert manifest["status"] == "completed", manifest.get("error")
        events = traced_events(run_dir)
        opens = events[(events["kind"] == "openat") & events["path"].str.startswith("/data/")]
        times = 2 if who == "long" else 1
        assert sorted(opens["path"]) == sorted(f"/data/{n}" for n in names * times), who
        assert not client().containers.list(
            all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"}
        )
    assert bpftrace_running() == []


def test_descriptors_exhausted_in_a_container_are_traced_call_by_call(
    images, tmp_path: Path, runs_root: Path
) -> None:
    """A job under `ulimit -n 12` opens files 40 times, keeping them open: the kernel refuses
    the opens beyond its limit (EMFILE); the trace has every call, the refused ones with
    -EMFILE, exactly as many as the job counted."""
    script = (
        "import errno, os\n"
        "fds, refused = [], 0\n"
        "for i in range(40):\n"
        "    try:\n"
        "        fds.append(os.open(f'/data/f{i % 5}.bin', os.O_RDONLY))\n"
        "    except OSError as exc:\n"
        "        assert exc.errno == errno.EMFILE\n"
        "        refused += 1\n"
        "print(len(fds), refused)\n"
    )
    data = tmp_path / "data"
    data.mkdir()
    for i in range(5):
        (data / f"f{i}.bin").write_bytes(os.urandom(100))
    command = ["sh", "-c", f'ulimit -n 12; exec python3 -c "{script}"']
    mounts = (BindMount(data, "/data", True),)
    run_dir = trace(image_request(BASE, command, runs_root, mounts=mounts)).check()
    opened, refused = map(int, (run_dir / "raw" / "main" / "container.log").read_text().split())
    assert refused > 0 and opened + refused == 40
    events = traced_events(run_dir)
    opens = events[(events["kind"] == "openat") & events["path"].str.startswith("/data/", na=False)]
    assert len(opens) == 40
    assert (opens["ret"] >= 0).sum() == opened and (opens["ret"] == -errno.EMFILE).sum() == refused


def test_processes_exhausted_in_a_container_fail_the_run_saying_so_with_the_limit(
    images, runs_root: Path
) -> None:
    """`--pids-limit 16`: a job starts threads, each busy for a second, until the kernel
    refuses one (EAGAIN: Python's "can't start new thread"), and fails. The run is failed
    with that reason and the limit, its samples count the container's threads up to the limit
    and the refusal, and nothing of it is left."""
    done = run_cli(
        "trace", "--image", BASE, "--pids-limit", "16", "--out", str(runs_root), "--",
        "python3", "-c", THREADS_TILL_REFUSED,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (run_dir,) = runs_root.iterdir()
    manifest = _manifest(run_dir)
    assert manifest["status"] == "failed" and manifest["containers"][0]["pids_limit"] == 16
    assert manifest["error"].startswith("container main exited with code 1")
    assert manifest["error"].endswith(
        "; container main reached its limit of 16 processes and threads (fork or clone refused "
        "1 time: --pids-limit: give it more)"
    ), manifest["error"]
    assert "refused after 15 threads" in (run_dir / "raw" / "main" / "container.log").read_text()
    samples = pd.read_parquet(run_dir / "samples.parquet")
    pids = samples[samples["metric"] == "container_pids"]["value"].tolist()
    while pids and pids[-1] == 0:  # sampled after every process had ended (a CI run saw one)
        pids.pop()
    assert max(pids) == 16 and min(pids) >= 1, pids
    refused = samples[samples["metric"] == "container_pids_refused"]["value"]
    assert refused.iloc[0] == 0 and refused.iloc[-1] == 1
    assert not client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"})
    assert bpftrace_running() == []


@pytest.mark.parametrize("when", ["held", "released"])
def test_a_container_removed_by_someone_else_fails_the_run_saying_so(
    images, runs_root: Path, when: str
) -> None:
    """`docker rm -f` of the run's container as soon as it runs (held at its barrier while the
    tracer attaches), or once released: the run is failed, saying so in one line, what it
    traced processed, and nothing of it left."""
    from tracing.container import ROLE_LABEL

    proc = start_cli(
        "trace", "--image", BASE, "--out", str(runs_root), "--quiet", "--",
        "python3", "-c", "import time; time.sleep(60)",
    )  # fmt: skip
    cli = client()
    with reaped(proc):
        deadline = time.monotonic() + 120
        label = run_label(runs_root, proc, deadline)
        while not (
            ctrs := cli.containers.list(
                filters={"label": [label, f"{ROLE_LABEL}=main"], "status": "running"}
            )
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not start"
            time.sleep(0.05)
        while when == "released" and "start_ns" not in _manifest(next(runs_root.iterdir())):
            assert time.monotonic() < deadline and proc.poll() is None, "it was not released"
            time.sleep(0.05)
        ctrs[0].remove(force=True)
        _, err = proc.communicate(timeout=120)
    says = (
        f"container {ctrs[0].name} was removed while it ran (by something other than "
        "twintrace): the run is incomplete"
    )
    run_dir = assert_failed_run(runs_root, proc.returncode, err, says)
    assert when == "held" or (run_dir / "events.parquet").is_file()


def test_a_missing_image_is_one_line_and_no_run_directory(images, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    done = run_cli("trace", "--image", "twintrace/none:missing", "--out", str(runs), "--", "true")
    assert error_line(done) == (
        "Error: image twintrace/none:missing is not built: run `./cli.py build`"
    )
    assert not runs.exists()


def test_a_stale_workload_image_is_refused_in_one_line_and_no_run_directory(
    images, tiny_unet3d: Path, tmp_path: Path
) -> None:
    """twintrace/unet3d:sleep replaced by an image built from other inputs (its inputs hash
    label another, as an image built before the sources changed has): `trace` refuses it."""
    import io

    from images.build import HASH_LABEL

    cli = client()
    tag = "twintrace/unet3d:sleep"
    current = cli.images.get(tag)
    dockerfile = f"FROM {current.id}\nLABEL {HASH_LABEL}=0123456789abcdef\n"
    stale, _ = cli.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    try:
        last = refused_unet3d_trace(tiny_unet3d, tmp_path / "runs")
        assert last.startswith(
            f"Error: image {tag} is stale: it was built from other sources or another "
            "twintrace/base:latest than this checkout's (its inputs 0123456789abcdef, the checkout's "
        ), last
        assert last.endswith("): run `./cli.py build`")
    finally:
        current.tag(tag)
        cli.images.remove(stale.id)


def _unet3d_run(runs_root: Path, data: Path, variant: str, **settings: object) -> Path:
    return trace(
        workload_request(
            "unet3d",
            variant,
            data,
            runs_root,
            settings={"epochs": 1, "batch_size": 2, "workers": 2, **settings},
            options={"patch_size": "32"},
        )
    ).check()


def test_unet3d_sleep_run_reads_every_file_and_takes_the_expected_steps(
    images, tiny_unet3d: Path, runs_root: Path
) -> None:
    run_dir = _unet3d_run(runs_root, tiny_unet3d, "sleep")
    summary = json.loads((run_dir / "summary.json").read_text())
    files = sorted(p.name for p in tiny_unet3d.glob("case_*.npy"))
    cases = len(files) // 2
    assert summary["status"] == "completed" and summary["lost_events"] == 0
    assert summary["steps"] == -(-cases // 2)  # ceil(cases / batch size)
    events = traced_events(run_dir)
    for name in files:
        path = f"/data/{name}"
        assert ((events["kind"] == "openat") & (events["path"] == path)).sum() >= 1, path
        read = events.loc[
            events["kind"].isin(["read", "pread64", "readv"]) & (events["path"] == path), "bytes"
        ].sum()
        size = (tiny_unet3d / name).stat().st_size
        # np.load reads the header through Python's buffered file, then the whole file through a
        # dup of the descriptor: every byte at least once, only the head (a few KiB) twice.
        assert size <= read <= size + 16384, path
    # The dataset files were read by the loader workers, not by the main process.
    data_reads = events[
        events["kind"].isin(["read", "pread64"]) & events["path"].str.startswith("/data/", na=False)
    ]
    assert (
        set(data_reads["comm"].astype(str)) <= {"pt_data_worker", "python"}
        and data_reads["pid"].nunique() == 2
    )
    phases = pd.read_parquet(run_dir / "phases.parquet")
    keys = set(phases["key"].astype(str))
    assert {
        "init",
        "run",
        "epoch",
        "checkpoint",
        "accelerator_busy",
        "all_compute",
        "load_batch_mem",
        "sample_load",
    } <= keys
    assert (phases["key"] == "sample_load").sum() == len(files) // 2
    assert list((run_dir / "out" / "main" / "checkpoints").glob("*.pt"))


def test_unet3d_original_and_instrumented_runs_complete(
    images, tiny_unet3d: Path, runs_root: Path
) -> None:
    original = _unet3d_run(runs_root, tiny_unet3d, "original", max_steps=2)
    summary = json.loads((original / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
    phases = pd.read_parquet(original / "phases.parquet")
    assert "model_forward_pass" not in set(
        phases["key"].astype(str)
    )  # only instrumented logs phases
    checkpoint_writes = traced_events(original)
    ckpt = checkpoint_writes[
        checkpoint_writes["path"].str.contains("/twintrace/out/checkpoints/", na=False)
    ]
    assert ckpt.loc[ckpt["kind"].isin(["write", "writev", "pwrite64"]), "bytes"].sum() > 0

    instrumented = _unet3d_run(runs_root, tiny_unet3d, "instrumented", max_steps=2)
    phases = pd.read_parquet(instrumented / "phases.parquet")
    per_step = STEP_KEYS - {"cum_loss_fn_calc"}
    counts = phases[phases["key"].isin(per_step)].groupby("key").size()
    assert set(counts.index) == per_step and (counts == 2).all()


@pytest.mark.parametrize(("given", "expected"), [("2GiB", 2 * 2**30), ("500MB", 500 * 10**6)])
def test_memory_limit_units_mean_the_same_to_us_and_to_docker(
    images, runs_root: Path, given: str, expected: int
) -> None:
    """`--memory-limit` is parsed once (MB = 10^6, GiB = 2^30) and docker gets bytes: the
    container's own cgroup shows the limit (the kernel rounds it down to whole pages)."""
    show = (
        "(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null"
        " || cat /sys/fs/cgroup/memory.max); ulimit -l"
    )
    done = subprocess.run(
        [sys.executable, str(REPO / "cli.py"), "trace", "--image", BASE, "--memory-limit", given]
        + ["--out", str(runs_root), "--", "sh", "-c", show],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    output = (run_dir / "raw" / "main" / "container.log").read_text().split()
    seen = int(output[0])
    assert expected - 4096 < seen <= expected
    # Emulated host-to-device copies lock host memory: the tracer asks docker for an unlimited
    # RLIMIT_MEMLOCK, and where the daemon's own limit forbids it (it cannot be raised without
    # CAP_SYS_RESOURCE, as on the build machines), it runs with the daemon's and says so.
    entry = _manifest(run_dir)["containers"][0]
    if entry["memlock_unlimited"]:
        assert output[1] == "unlimited"
    else:
        assert int(output[1]) * 1024 == _daemon_memlock_bytes()
    manifest = _manifest(run_dir)
    assert manifest["containers"][0]["memory_limit_bytes"] == expected
    # The container's output also reached the terminal (stderr), as `docker run` shows it.
    assert str(seen) in done.stderr


def _daemon_memlock_bytes() -> int:
    """The Docker daemon's hard RLIMIT_MEMLOCK (what its containers get at most)."""
    pid = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    for line in Path(f"/proc/{pid[0]}/limits").read_text().splitlines():
        if line.startswith("Max locked memory"):
            return int(line.split()[4])
    raise AssertionError("no locked-memory limit for dockerd")


def test_small_reads_at_storm_rate_are_aggregated_and_still_exact(
    images, tmp_path: Path, runs_root: Path
) -> None:
    """Thousands of 4 KiB reads a second: beyond the first calls of each 10 ms bin the tracer
    folds them into aggregated rows, and every file still shows its opens, its read calls and
    its bytes exactly, although the files follow each other on the same descriptor number
    within a bin (the descriptor generation keeps them apart)."""
    sizes = [(1 << 20) + 7 * i for i in range(12)]
    script = (
        "import os\n"
        "names = sorted(os.listdir('/data'))\n"
        "for rep in range(2):\n"
        "    for name in names:\n"
        "        fd = os.open(os.path.join('/data', name), os.O_RDONLY)\n"
        "        while os.read(fd, 4096):\n"
        "            pass\n"
        "        os.close(fd)\n"
        "fd = os.open('/data/' + names[0], os.O_RDONLY)\n"
        "for i in range(20000):\n"
        "    os.pread(fd, 4096, (i % 256) * 4096)\n"
        "os.close(fd)\n"
    )
    files = {f"f{i:02d}.bin": size for i, size in enumerate(sizes)}
    run_dir = _trace_over_files(tmp_path, runs_root, files, script)
    manifest = _manifest(run_dir)
    assert manifest["status"] == "completed" and manifest["lost_events"] == 0
    events = traced_events(run_dir)
    for i, size in enumerate(sizes):
        path = f"/data/f{i:02d}.bin"
        opens = events[(events["kind"] == "openat") & (events["path"] == path)]
        assert len(opens) == 2 + (i == 0), path
        reads = events[(events["kind"] == "read") & (events["path"] == path)]
        # Each pass: ceil(size / 4096) reads with data and one at the end of the file.
        assert reads["count"].sum() == 2 * (-(-size // 4096) + 1), path
        assert reads["bytes"].sum() == 2 * size, path
    # (The interpreter's start-up preads its libraries too: only those of the data file count.)
    preads = events[(events["kind"] == "pread64") & (events["path"] == "/data/f00.bin")]
    assert preads["count"].sum() == 20000 and preads["bytes"].sum() == 20000 * 4096
    # Both kinds of rows are there, and aggregated rows keep their calls' bucket and maximum.
    data_reads = events[events["kind"].isin(["read", "pread64"]) & events["path"].notna()]
    aggregated = data_reads[data_reads["count"] > 1]
    assert len(aggregated) and (data_reads["count"] == 1).any()
    assert (aggregated["bytes"] <= aggregated["count"] * 4096).all()
    assert (aggregated["latency_max_ns"] <= aggregated["latency_ns"]).all()
    assert (aggregated["latency_max_ns"] * aggregated["count"] >= aggregated["latency_ns"]).all()
    # Far fewer rows than calls, and the summary counts calls, not rows.
    calls = int(data_reads["count"].sum())
    assert len(data_reads) < calls / 10
    summary = json.loads((run_dir / "summary.json").read_text())
    all_preads = events.loc[events["kind"] == "pread64", "count"].sum()
    assert summary["syscalls"]["pread64"]["count"] == int(all_preads)


@pytest.mark.parametrize("read_bps", [None, 40_000_000], ids=["free", "capped"])
def test_a_containers_cold_reads_are_its_block_requests_whoever_issued_them(
    images, tmp_path: Path, runs_root: Path, read_bps: int | None
) -> None:
    """Four threads read four 16 MiB files from a cold cache: every byte comes from the device
    through requests the container submitted, although the device's kernel thread issues many
    of them (kblockd, once the queue is busy: 72 % of such a run's bytes were attributed to it
    when a request was attributed at issue). Capped (the blkio throttle, --read-rate), the
    throttle's kernel thread submits the bios it held back: the bios' block cgroup is the
    container's (every byte was the kernel's when the submitting task decided)."""
    sizes = [16 << 20] * 4
    script = (
        "import threading\n"
        "def read(i):\n"
        "    with open(f'/data/f{i}.bin', 'rb') as fh:\n"
        "        while fh.read(1 << 20):\n"
        "            pass\n"
        f"threads = [threading.Thread(target=read, args=(i,)) for i in range({len(sizes)})]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
    )
    files = {f"f{i}.bin": size for i, size in enumerate(sizes)}
    run_dir = _trace_over_files(tmp_path, runs_root, files, script, cold=True, read_bps=read_bps)
    assert _manifest(run_dir)["lost_events"] == 0
    events = traced_events(run_dir)
    reads = events[events["kind"] == "block_read"]
    assert set(reads.loc[reads["in_container"], "container"]) == {"main"}
    inside = reads.loc[reads["in_container"], "bytes"].sum()
    # The data, and the interpreter's libraries: at least every byte of the files.
    assert inside >= sum(sizes), reads.groupby(["in_container", "comm"])["bytes"].sum()
    # What kernel threads issued for the device is not the files (a few MiB of the host's own
    # metadata and other processes' reads at most).
    kernel = reads.loc[~reads["in_container"] & reads["comm"].str.startswith("kworker"), "bytes"]
    assert kernel.sum() < sum(sizes) / 8


SHM_JOB = """
import os
block = bytes(range(256)) * 4096  # 1 MiB
for path, mib in (("/dev/shm/batches", 24), ("/tmp/file-data", 4)):
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)
    os.unlink(path)  # its pages leave the page cache in this container's context
"""


def test_shared_memory_pages_are_counted_apart_from_file_data(images, runs_root: Path) -> None:
    """24 MiB through /dev/shm (tmpfs, as loader workers pass batches) and 4 MiB of a file on
    disk, each written then removed: the 6,144 pages of shared memory freed are shm_delete,
    not cache_delete, whose 1,024 pages of the file are there; the manifest names /dev/shm
    among the memory file systems the agent found."""
    run_dir = trace(image_request(BASE, ["python3", "-c", SHM_JOB], runs_root)).check()
    manifest = _manifest(run_dir)
    memory = manifest["trace"]["memory_file_systems"]
    assert any(fs["mount"] == "/dev/shm" and fs["fstype"] == "tmpfs" for fs in memory), memory
    assert any(fs["fstype"] == "shmem" for fs in memory), memory
    events = traced_events(run_dir)
    pages = events.groupby("kind")["count"].sum()
    assert 24 * 256 <= pages.get("shm_delete", 0) <= 24 * 256 + 64, pages
    assert 4 * 256 <= pages.get("cache_delete", 0) <= 4 * 256 + 64, pages
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["page_cache"]["shm_delete"]["count"] == pages["shm_delete"]
