"""Drive the bpftrace scripts in tracing/bpf as child processes of the tracer agent
(tracing/agent.py), in the tracer's image.

Each script takes two positional parameters: the container's cgroup-v2 id and a file that its
BEGIN probe creates. bpftrace runs BEGIN only after every other probe is attached, so once all
files exist no event of the container can be missed.

A run of several containers is traced by ONE set of scripts: each script's filter
``cgroup == $1`` is rendered as ``(cgroup == A || cgroup == B ...)`` over the run's cgroup ids
and the rendered script is saved next to its output (``raw/<name>.bt``), so what ran is on
record.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.errors import UserError
from tracing.procs import ChildProcess

BPF_DIR = Path(__file__).parent / "bpf"
SCRIPTS: tuple[str, ...] = ("syscalls", "block", "cache", "proc")
# Long enough for dataset paths, and small enough for the scripts' BPF stacks.
STRLEN = 200
# Perf ring buffer pages per CPU (default 64): a deeper buffer rides out bursts of small reads
# without losing events while bpftrace's user-space side catches up.
PERF_RB_PAGES = 1024
# Keys per map (bpftrace's default is 4096). syscalls.bt's aggregate maps hold the keys of one
# 100 ms period (thread x file x 10 ms bin x size and latency bucket); an update to a full map
# is lost, so leave room: a loader with 16 workers that each open 500 files a second uses
# about 16 x 50 x 2 = 1600 keys a period.
MAP_KEYS_MAX = 32768


def script_path(name: str) -> Path:
    return BPF_DIR / f"{name}.bt"


CGROUP_FILTER = "cgroup == $1"
#: cache.bt's test for a page of a memory file system, rendered over their devices.
MEMORY_FS = "0 /* MEMORY_FS */"
#: block.bt's test for a bio charged to a traced container's block cgroup (``$cg``).
BLOCK_CGROUPS = "0 /* BLOCK_CGROUPS */"


def kernel_dev(major: int, minor: int) -> int:
    """A device number as the kernel's tracepoints print it (``MKDEV``: 20 bits of minor)."""
    return (major << 20) | minor


def render(
    name: str,
    cgroup_ids: Sequence[int],
    memory_devs: Sequence[int] = (),
    block_ids: Sequence[int] = (),
) -> str:
    """Script ``name`` with its container filter over ``cgroup_ids`` (one or more); in
    cache.bt, its memory file systems' test over ``memory_devs`` (kernel device numbers); in
    block.bt, its test of a bio's block cgroup over ``block_ids`` (the containers'
    :attr:`tracing.cgroups.ProcessCgroups.block_id`; none given: ``cgroup_ids``)."""
    if not cgroup_ids:
        raise ValueError("no cgroup to trace")
    text = script_path(name).read_text()
    if memory_devs:
        test = " || ".join(f"args->s_dev == {int(d)}" for d in sorted(set(memory_devs)))
        text = text.replace(MEMORY_FS, f"({test})")
    blocks = sorted({int(i) for i in (block_ids or cgroup_ids)})
    text = text.replace(BLOCK_CGROUPS, "(" + " || ".join(f"$cg == {i}" for i in blocks) + ")")
    if CGROUP_FILTER not in text:
        raise AssertionError(f"{name}.bt has no `{CGROUP_FILTER}` filter")
    ids = [int(i) for i in cgroup_ids]
    predicate = (
        f"cgroup == {ids[0]}"
        if len(ids) == 1
        else "(" + " || ".join(f"cgroup == {i}" for i in ids) + ")"
    )
    return text.replace(CGROUP_FILTER, predicate)


#: bpftrace's scheduling priority (its nice value): above the traced containers' (0), so that on
#: a busy host the workload waits for a CPU, not the tracer. A tracer 300 ms behind its probes
#: may lose events (a "BEHIND" mark: the run is lossy): with two traced test suites and a
#: cluster's image pulls sharing 2 CPUs, DLIO's DLRM run fell behind 34 times at priority 0.
#: Raising it needs CAP_SYS_NICE (the tracer's container has it, tracing/launcher.py); without
#: it ``nice`` says so on bpftrace's stderr and bpftrace runs at 0.
TRACER_NICE = -10


def command(out: Path, script: Path, ready_file: Path) -> list[str]:
    """The argument list for one rendered script: bpftrace, at :data:`TRACER_NICE`, run in the
    tracer's image (whose bpftrace is on its PATH) with ``ready_file``'s directory as its
    working directory."""
    # --unsafe: only for BEGIN's system("touch READY_FILE"), the readiness signal. The file is
    # named relative to bpftrace's working directory: a long literal path would not fit, with
    # the 200-byte strings, in BEGIN's 512-byte BPF stack.
    # -k: bpftrace reports a failed helper call (an update to a full map, which would lose
    # that update silently) as a warning line in the output; the ingest counts it as lost. The
    # scripts look up and delete only keys they know exist (has_key), so no other warning
    # comes from them.
    return [
        "nice",  # execs bpftrace: its pid and its command line are bpftrace's
        "-n",
        str(TRACER_NICE),
        "bpftrace",
        "--unsafe",
        "-k",
        "-B",
        "full",
        "-o",
        str(out),
        str(script),
        "0",  # $1: unused once rendered; kept so the scripts also run by hand
        ready_file.name,
    ]


def hooks_not_found(said: str) -> list[str]:
    """The lines of bpftrace's output that name a hook it did not find: bpftrace 0.23
    attaches the hooks it finds and only warns of one it does not ("WARNING: tracepoint not
    found: syscalls:sys_enter_x")."""
    return [line for line in said.splitlines() if "not found:" in line]


class Tracer:
    """The bpftrace processes of one run, writing into ``raw_dir``."""

    def __init__(
        self,
        raw_dir: Path,
        ctl_dir: Path,
        cgroup_ids: Sequence[int],
        scripts: tuple[str, ...] = SCRIPTS,
        memory_devs: Sequence[int] = (),
        block_ids: Sequence[int] = (),
    ):
        self.raw_dir = raw_dir
        self.ctl_dir = ctl_dir
        self.cgroup_ids = tuple(cgroup_ids)
        self.memory_devs = tuple(memory_devs)
        self.block_ids = tuple(block_ids)
        self.scripts = scripts
        self.children: dict[str, ChildProcess] = {}

    def start(self, timeout: float = 60.0) -> None:
        """Start every script and wait until all probes of all of them are attached."""
        env = {
            "BPFTRACE_MAX_STRLEN": str(STRLEN),
            "BPFTRACE_PERF_RB_PAGES": str(PERF_RB_PAGES),
            "BPFTRACE_MAX_MAP_KEYS": str(MAP_KEYS_MAX),
        }
        ready = {}
        for name in self.scripts:
            ready[name] = self.ctl_dir / f"{name}.ready"
            ready[name].unlink(missing_ok=True)
            script = self.raw_dir / f"{name}.bt"
            script.write_text(render(name, self.cgroup_ids, self.memory_devs, self.block_ids))
            self.children[name] = ChildProcess(
                command(self.raw_dir / f"{name}.txt", script, ready[name]),
                self.raw_dir / f"{name}.stdout",
                self.raw_dir / f"{name}.stderr",
                env=env,
                name=f"bpftrace {name}.bt",
                cwd=self.ctl_dir,
                no_fork=True,  # started by the agent, from a gRPC call
            )
        for name, child in self.children.items():
            child.wait_until(ready[name].exists, timeout, "its probes attached")
        for name, child in self.children.items():
            missing = hooks_not_found(child.stderr_tail(50))
            if missing:
                raise UserError(f"bpftrace {name}.bt: {missing[0]}: see `./cli.py doctor`")

    def missed_probes(self) -> dict[str, int]:
        """Probe hits the kernel skipped, by script: a tracepoint that fires while another
        BPF program runs on the same CPU (a block completion's interrupt arriving during a
        system call's probe, say) does not run its program; the kernel counts these per
        program (``recursion_misses`` in the program's fdinfo). Each may be a lost event.
        Read while bpftrace runs (its descriptors are gone after)."""
        return {name: program_misses(child.pid) for name, child in self.children.items()}

    def stop(self) -> dict[str, int]:
        """Stop every script (SIGINT flushes their output), all at once: each takes a few
        tenths of a second to detach its probes and print its maps. Returns exit codes by
        script."""
        for child in self.children.values():
            child.interrupt()
        return {name: child.stop(timeout=15.0) for name, child in self.children.items()}

    def failed(self) -> str | None:
        """A message if a script exited early (e.g. a probe failed), else None."""
        for name, child in self.children.items():
            code = child.poll()
            if code is not None:
                return f"bpftrace {name}.bt exited early with code {code}: {child.stderr_tail(5)}"
        return None


def program_misses(pid: int, proc: Path = Path("/proc")) -> int:
    """The sum of ``recursion_misses`` over the BPF programs process ``pid`` holds open (0
    when it has exited or the kernel does not count them)."""
    total = 0
    try:
        fds = list((proc / str(pid) / "fdinfo").iterdir())
    except OSError:
        return 0
    for fd in fds:
        try:
            text = fd.read_text()
        except OSError:
            continue
        if "prog_type:" not in text:
            continue
        for line in text.splitlines():
            if line.startswith("recursion_misses:"):
                total += int(line.split()[1])
    return total
