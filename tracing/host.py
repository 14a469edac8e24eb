"""Host prerequisites: the checks behind `./cli.py doctor` and the fast ones every trace runs."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import mmap
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import UserError
from tracing.bpftrace import BPF_DIR, hooks_not_found
from workloads.config import BPFTRACE_LABEL, TRACER_IMAGE
from workloads.hostrecord import cpu_model

TRACEFS = Path("/sys/kernel/tracing")
MIN_BPFTRACE = (0, 23)  # has_key() and raw tracepoints
MIN_FREE_BYTES = 5 * 10**9


@dataclasses.dataclass(frozen=True)
class Check:
    """One prerequisite: whether it holds, what was seen, and how to fix it."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def _is_root() -> Check:
    ok = os.geteuid() == 0
    return Check(
        "root",
        ok,
        "running as root" if ok else f"running as uid {os.geteuid()}",
        "run as root (sudo): the tracer's container and cgroup access need it",
    )


def _bpftrace() -> Check:
    """The tracer's image and its bpftrace (no host bpftrace is needed: runs are traced from
    twintrace/tracer's container, tracing/tracer_container.py); the hooks themselves are the "tracer
    image" check's."""
    found = _tracer_image()
    if found is None:
        return Check(
            "bpftrace", False, f"{TRACER_IMAGE} is not built (or no daemon)", "run `./cli.py build`"
        )
    version = found[1]
    match = re.search(r"(\d+)\.(\d+)", version)
    ok = bool(match) and (int(match.group(1)), int(match.group(2))) >= MIN_BPFTRACE
    return Check(
        "bpftrace",
        ok,
        f"bpftrace {version} in {TRACER_IMAGE}",
        f"rebuild the tracer's image (`./cli.py build`): it needs bpftrace >= "
        f"{'.'.join(map(str, MIN_BPFTRACE))}",
    )


def _tracer_image() -> tuple[str, str] | None:
    """(id, bpftrace version) of the tracer's image, or None when it (or the daemon) is not
    there."""
    from tracing.container import client

    try:
        image = client().images.get(TRACER_IMAGE)
    except Exception:
        return None
    return image.id, (image.labels or {}).get(BPFTRACE_LABEL, "?")


def _tracefs() -> Check:
    ok = (TRACEFS / "events").is_dir()
    return Check(
        "tracefs",
        ok,
        f"{TRACEFS} mounted" if ok else f"{TRACEFS} is empty",
        f"mount it: `mount -t tracefs nodev {TRACEFS}` (or `make setup`)",
    )


def _cgroups() -> Check:
    from tracing.cgroups import unified_root

    try:
        root = unified_root()
    except UserError as exc:
        return Check("cgroup v2", False, str(exc), "boot with cgroup v2 (hybrid or unified)")
    layout = "hybrid (v1 controllers + unified)" if root.name == "unified" else "unified (v2 only)"
    return Check("cgroup v2", True, f"{layout} at {root}")


def _docker() -> Check:
    from tracing.container import client

    try:
        version = client().version()
    except UserError as exc:
        return Check(
            "docker daemon",
            False,
            str(exc).split(":")[0],
            "run `make setup` as root (installs docker.io, starts dockerd)",
        )
    return Check(
        "docker daemon", True, f"Docker {version.get('Version')} (API {version.get('ApiVersion')})"
    )


def _base_image() -> Check:
    from tracing.container import client
    from workloads.config import BASE_TAG

    try:
        cli = client()
        cli.images.get(BASE_TAG)
    except UserError:
        return Check("base image", False, "docker daemon down", "start the daemon first")
    except Exception:
        return Check("base image", False, f"{BASE_TAG} not built", "run `./cli.py build`")
    return Check("base image", True, f"{BASE_TAG} present")


def _tracer() -> Check:
    """twintrace/tracer, run with the tracer's privileges (tracing/tracer_container.py), attaches every
    hook the scripts use on this kernel: checked from inside the container that traces."""
    import tempfile

    from tracing.container import client
    from tracing.tracer_container import start_tracer

    found = _tracer_image()
    if found is None:
        return Check("tracer image", False, f"{TRACER_IMAGE} not built", "run `./cli.py build`")
    version = found[1]
    hooks = needed_hooks()
    program = ", ".join(hooks) + " { }\ninterval:ms:1 { exit(); }"
    with tempfile.TemporaryDirectory(prefix="twintrace-doctor-") as out:
        tracer = start_tracer(
            client(), ["bpftrace", "-e", program], Path(out), f"twintrace-doctor-{os.getpid()}"
        )
        try:
            code = tracer.wait(timeout=120)["StatusCode"]
            said = tracer.logs().decode(errors="replace")
        finally:
            tracer.remove(force=True)
    missing = hooks_not_found(said)
    if code != 0 or missing:
        said = "\n".join(missing) or said
        return Check(
            "tracer image",
            False,
            f"bpftrace {version} in {TRACER_IMAGE} could not attach the tracing hooks "
            f"(exit {code}): {' '.join(said.split())[-200:]}",
            "see docs/tracer-peers.md: the tracer needs --pid host, SYS_ADMIN, tracefs and "
            "a kernel with syscall, block, filemap and sched tracepoints",
        )
    return Check(
        "tracer image",
        True,
        f"bpftrace {version} in {TRACER_IMAGE}: all {len(hooks)} hooks attach",
    )


def needed_hooks() -> list[str]:
    """Every kernel hook the bpftrace scripts attach to (``tracepoint:category:name``,
    ``rawtracepoint:name``)."""
    found: set[str] = set()
    for script in BPF_DIR.glob("*.bt"):
        code = re.sub(r"//.*", "", script.read_text())
        found.update(re.findall(r"\b((?:raw)?tracepoint:\w+(?::\w+)?)", code))
    return sorted(found)


def _compose() -> Check:
    """docker-compose, for `./cli.py trace --compose` (topologies) and compose users."""
    exe = shutil.which("docker-compose")
    if exe is None:
        return Check(
            "docker-compose",
            False,
            "not installed (needed by `trace --compose`)",
            "run `make setup` as root (apt-get install docker-compose)",
        )
    try:
        out = subprocess.run(
            [exe, "version", "--short"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("docker-compose", False, f"{exe} does not run: {exc}", "reinstall it")
    return Check("docker-compose", out.returncode == 0, out.stdout.strip() or out.stderr.strip())


def _traffic_control() -> Check:
    """tc, ip and nsenter, for `./cli.py trace --net-bandwidth` (tracing/shaper.py)."""
    missing = [exe for exe in ("tc", "ip", "nsenter") if shutil.which(exe) is None]
    if missing:
        return Check(
            "tc",
            False,
            f"{', '.join(missing)} not installed (needed by `trace --net-bandwidth`)",
            "run `make setup` as root (apt-get install iproute2 util-linux)",
        )
    return Check("tc", True, shutil.which("tc") or "tc")


def _disk(path: Path) -> Callable[[], Check]:
    def check() -> Check:
        target = path if path.exists() else Path.cwd()
        free = shutil.disk_usage(target).free
        ok = free >= MIN_FREE_BYTES
        return Check(
            "disk space",
            ok,
            f"{free / 1e9:.1f} GB free at {target}",
            f"free at least {MIN_FREE_BYTES / 1e9:.0f} GB for images, datasets and runs",
        )

    return check


def _nvidia_runtime() -> Check:
    """The NVIDIA container runtime, which serves `--gpus` (docker's GPU device requests)."""
    from tracing.container import client

    try:
        info = client().info()
    except UserError:
        return Check("nvidia runtime", False, "docker daemon down", "start the daemon first")
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    ok = "nvidia" in runtimes
    return Check(
        "nvidia runtime",
        ok,
        f"docker runtimes: {', '.join(runtimes) or 'none'}",
        "install the NVIDIA Container Toolkit (nvidia-container-toolkit), run "
        "`nvidia-ctk runtime configure --runtime=docker` and restart dockerd",
    )


#: What a traced run needs of this host (the rest of doctor's checks are images and tools).
TRACING_CHECKS: tuple[Callable[[], Check], ...] = (
    _is_root,
    _bpftrace,
    _tracefs,
    _cgroups,
    _docker,
)


def doctor(
    runs_root: Path = Path("runs"), gpus: bool = False, only_tracing: bool = False
) -> list[Check]:
    """Run every check (``gpus``: also the GPU runtime's; ``only_tracing``: only
    :data:`TRACING_CHECKS`, none that starts a container); never raises for a failed check."""
    checks = [
        *TRACING_CHECKS,
        *(
            ()
            if only_tracing
            else (
                _base_image,
                _tracer,
                _compose,
                _traffic_control,
                _disk(runs_root),
                *([_nvidia_runtime] if gpus else []),
            )
        ),
    ]
    results = []
    for check in checks:
        try:
            results.append(check())
        except Exception as exc:  # a check that crashes is a failed check, not a crashed doctor
            results.append(
                Check(
                    check.__name__.strip("_"),
                    False,
                    f"check failed: {exc!r}",
                    "report this as a bug",
                )
            )
    return results


def require_tracing_prerequisites() -> None:
    """The fast checks every trace needs; the first failure becomes a UserError with its fix."""
    for check in (_is_root, _bpftrace, _tracefs):
        result = check()
        if not result.ok:
            raise UserError(f"{result.name}: {result.detail}: {result.fix}")


def host_metadata(docker_version: str | None = None) -> dict[str, Any]:
    """What the run ran on: enough to refuse comparing runs from different setups."""
    os_name = None
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    tracer = _tracer_image()
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "os": os_name,
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "docker_version": docker_version,
        "bpftrace_version": f"bpftrace v{tracer[1]}" if tracer else None,
        "tracer": f"{TRACER_IMAGE} {tracer[0]}" if tracer else None,
        "python_version": platform.python_version(),
    }


def block_device(path: Path) -> str:
    """The whole disk that holds ``path`` (``/dev/vda`` for a file on ``/dev/vda1``): what a
    container's read throttle names. A path on no block device (tmpfs, overlay) is an error."""
    dev = os.stat(path).st_dev
    sys_dir = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not sys_dir.exists():
        raise UserError(
            f"{path} is on no block device (a memory or overlay filesystem): a read rate limit "
            "throttles a disk; put the dataset on one"
        )
    disk = sys_dir.resolve()
    if (disk / "partition").exists():
        disk = disk.parent  # a partition's throttle is set on its disk
    return f"/dev/{disk.name}"


def drop_caches() -> None:
    """Write dirty pages back, then drop the page cache (root): the next run reads cold."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


_PAGE = os.sysconf("SC_PAGE_SIZE")


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.argtypes = (
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    )
    libc.mmap.restype = ctypes.c_void_p
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    return libc


def resident_bytes(path: Path) -> tuple[int, int]:
    """(bytes of ``path`` in the page cache now, its size): ``mincore(2)`` over a read-only
    shared mapping of the file, as vmtouch and fincore measure it (mapping faults nothing in)."""
    libc = _libc()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return 0, 0
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if address in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap {path}: {os.strerror(err)}")
        pages = (size + _PAGE - 1) // _PAGE
        vec = np.zeros(pages, dtype=np.uint8)
        try:
            if libc.mincore(address, size, vec.ctypes.data) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore {path}: {os.strerror(err)}")
        finally:
            libc.munmap(address, size)
    resident = vec & 1
    # The last page holds only the file's tail.
    tail = size - (pages - 1) * _PAGE
    return int(resident[:-1].sum()) * _PAGE + int(resident[-1]) * tail, size


def resident_fraction(paths: Iterable[Path]) -> float:
    """Fraction of the bytes of ``paths`` in the page cache now (0 for no bytes)."""
    resident = total = 0
    for path in paths:
        r, n = resident_bytes(path)
        resident += r
        total += n
    return resident / total if total else 0.0


def evict_files(roots: Iterable[Path]) -> int:
    """Take every file under ``roots`` (a directory's files, recursively, symbolic links
    followed; or a file) out of the page cache: written back (``fdatasync``), then
    ``posix_fadvise(POSIX_FADV_DONTNEED)``, so that the next read of it comes from the device
    and nothing else's pages go (the libraries a run maps stay cached). Pages a process has
    mapped stay. Needs read access only; returns the bytes of the files."""
    done = 0
    for root in roots:
        files = [root] if not root.is_dir() else (p for p in root.rglob("*") if p.is_file())
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                done += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return done


def warm_files(paths: Iterable[Path], chunk: int = 8 << 20) -> int:
    """Read every file of ``paths`` whole, so that it is in the page cache; return the bytes."""
    done = 0
    buf = bytearray(chunk)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                done += n
    return done
