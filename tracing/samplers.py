"""Time-series samplers: each container's CPU and memory, host CPU, and real GPUs via NVML.

One background thread samples every container of the run (and the host) every ``interval``
seconds and appends ``ts_ns,metric,value,unit,container`` lines to a CSV file; ``container`` is
the container's role, empty for host-wide metrics. Timestamps are CLOCK_MONOTONIC, the clock of bpftrace and of the
workload's events, so all tables line up without an alignment step.

Host-wide: ``host_cpu_user``, ``host_cpu_system``, ``host_cpu_iowait``, ``host_cpu_idle``
(percent) and, where NVML sees GPUs, ``gpu<i>_util``, ``gpu<i>_mem_util`` (percent) and
``gpu<i>_mem_used`` (bytes) per GPU (:class:`Gpus`).

Per container: ``container_cpu`` (percent of one core, the cgroup's CPU time),
``container_cpu_loader`` (the part of it used by data-loader worker processes: PyTorch names
them ``pt_data_worker``; from each process's ``/proc/PID/stat`` CPU time, in clock ticks),
``container_mem_rss``, ``container_mem_cache`` (the page cache of files on devices),
``container_mem_shm`` (shared memory: tmpfs such as /dev/shm, where loader workers hand
batches over, and memfd; the kernel counts it as file pages, the cache metric does not) and
``container_mem_pinned`` (bytes; the part of the page cache mapped into its processes or in
shared memory), ``container_pids`` (its processes and threads: the cgroup's
``pids.current``) and ``container_pids_refused`` (how many times the kernel refused it a new
process or thread at its limit, ``--pids-limit``: ``pids.events``' ``max``, a running count).
The loader share lets a
comparison tell the data pipeline's CPU from the model's on a host whose accelerator is its
CPU (docs/similarity.md).

The tool's own memory, host-wide rows (no container): ``sampler_rss``, the resident set of the
twintrace process whose thread samples (the tracer agent, tracing/agent.py), and
``tracer_rss_<script>``, that of each bpftrace process, given with :meth:`Sampler.watch` once started (bytes, from
``/proc/PID/statm``: one small read per process and sample). A long run shows with them that
the tracer's memory stays flat (docs/run-format.md, "Budget of a long run"). And their CPU:
``sampler_cpu`` and ``tracer_cpu_<script>`` (percent of one core, from ``/proc/PID/stat``
clock ticks): the tracer's own cost, which a container's CPU time does not include.

Network, per container of a run that has a network (given with ``netns``: role -> a process of
the container): ``container_net_rx`` and ``container_net_tx`` (bytes per second over the
sample interval), the bytes its interfaces other than loopback received and sent, from
``/proc/PID/net/dev`` (the counters of that process's network namespace: the container's own,
so the bytes are on its veth, headers included).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from tracing.cgroups import ProcessCgroups

_HOST_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
#: Process names (``/proc/PID/comm``) of data-loader workers (as analysis.processes has them).
LOADER_COMMS = ("pt_data_worker",)
_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
#: The metric of the sampling process's own resident set.
SAMPLER_RSS = "sampler_rss"


class OpenFiles:
    """The files a sampler reads every sample, kept open and read again from offset 0 (one
    ``pread`` instead of an open, a read and a close each time: a sample of a run reads about
    twenty). Files not read during a sample are closed at its end (:meth:`sweep`), so those of
    processes that have gone do not pile up; a read that fails (the process has exited)
    closes its file."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._used: set[str] = set()

    def read(self, path: Path | str) -> str:
        """The file's text; OSError as ``Path.read_text`` raises it."""
        key = str(path)
        fd = self._fds.get(key)
        if fd is None:
            fd = os.open(key, os.O_RDONLY | os.O_CLOEXEC)
            self._fds[key] = fd
        self._used.add(key)
        try:
            chunks = [os.pread(fd, 65536, 0)]
            while len(chunks[-1]) == 65536:
                chunks.append(os.pread(fd, 65536, 65536 * len(chunks)))
        except OSError:
            self._close(key)
            raise
        return b"".join(chunks).decode(errors="replace")

    def sweep(self) -> None:
        """Close the files not read since the last sweep."""
        for key in [k for k in self._fds if k not in self._used]:
            self._close(key)
        self._used = set()

    def close(self) -> None:
        for key in list(self._fds):
            self._close(key)

    def _close(self, key: str) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)


def _read_text(path: Path, files: OpenFiles | None) -> str:
    return files.read(path) if files is not None else path.read_text()


def _read_int(path: Path, files: OpenFiles | None = None) -> int | None:
    try:
        return int(_read_text(path, files).split()[0])
    except (FileNotFoundError, ValueError, IndexError, OSError):
        return None


def _read_keyed(path: Path, files: OpenFiles | None = None) -> dict[str, int]:
    try:
        text = _read_text(path, files)
    except (FileNotFoundError, OSError):
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _host_cpu_times(files: OpenFiles | None = None) -> list[int]:
    fields = _read_text(Path("/proc/stat"), files).split("\n", 1)[0].split()[1:9]
    return [int(f) for f in fields]


class Gpus:
    """The host's GPUs through NVML (pynvml, from the nvidia-ml-py package): one ``sample()``
    gives ``gpu<i>_util`` and ``gpu<i>_mem_util`` (percent of the last sample period in which a
    kernel ran / device memory was read or written, as NVML defines them) and ``gpu<i>_mem_used``
    (bytes), where ``i`` is the GPU's NVML index, the index docker's ``--gpus`` ids use.

    Every GPU of the host is sampled, not only the run's (the sampler runs on the host); rows
    are host-wide (no container). Without the library, a driver or a GPU there are no GPU rows
    and nothing fails: ``handles`` is empty. A GPU whose handle NVML refuses (no permission, lost
    from the bus) is left out; a query that fails in one sample (an NVMLError, ``Not
    Supported`` say) leaves out that metric of that sample and nothing else.
    """

    def __init__(self) -> None:
        self.handles: list[tuple[int, object]] = []  # (NVML index, handle)
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no library, no driver: sample no GPU
            return
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError:
            count = 0
        for index in range(count):
            try:
                self.handles.append((index, pynvml.nvmlDeviceGetHandleByIndex(index)))
            except pynvml.NVMLError:
                continue

    def sample(self) -> list[tuple[str, float, str]]:
        """One reading of every GPU: (metric, value, unit) rows."""
        rows: list[tuple[str, float, str]] = []
        for index, handle in self.handles:
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                rows += [
                    (f"gpu{index}_util", util.gpu, "percent"),
                    (f"gpu{index}_mem_util", util.memory, "percent"),
                ]
            except self._nvml.NVMLError:
                pass
            try:
                mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                rows.append((f"gpu{index}_mem_used", mem.used, "bytes"))
            except self._nvml.NVMLError:
                pass
        return rows

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml, nvml = None, self._nvml
            self.handles = []
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass


class Sampler:
    """Samples the run's containers' cgroups, the host CPU and GPUs on a background thread."""

    def __init__(
        self,
        out_csv: Path,
        cgroups: Mapping[str, ProcessCgroups],
        interval: float = 0.1,
        netns: Mapping[str, int] | None = None,
    ) -> None:
        self.out_csv = out_csv
        self.cgroups = dict(cgroups)
        self.netns = dict(netns or {})  # role -> pid whose network namespace is sampled
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.samples = 0
        # metric -> pid of each process whose RSS is sampled; replaced whole (never mutated)
        # by watch(), so the sampling thread always reads a consistent mapping.
        self._processes: dict[str, int] = {SAMPLER_RSS: os.getpid()}
        self._files: OpenFiles | None = None  # the sampling thread's, while it runs

    def watch(self, processes: Mapping[str, int]) -> None:
        """Also sample the resident set of these processes (metric name -> pid), in bytes,
        from the next sample on; a process that has exited gives no more rows."""
        self._processes = {**self._processes, **processes}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="twintrace-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        gpus = Gpus()
        self._files = OpenFiles()
        try:
            with open(self.out_csv, "w", buffering=1 << 16) as out:
                out.write("ts_ns,metric,value,unit,container\n")
                prev = self._read_counters()
                next_t = time.monotonic() + self.interval
                while not self._stop.wait(max(0.0, next_t - time.monotonic())):
                    next_t += self.interval
                    cur = self._read_counters()
                    self._write(out, prev, cur, gpus)
                    prev = cur
                    self.samples += 1
        except BaseException as exc:  # recorded and reported by the runner
            self.error = exc
        finally:
            gpus.close()
            self._files.close()

    def _read_counters(self) -> dict:
        files = self._files
        procs = self._processes
        counters = {
            "t": time.monotonic_ns(),
            "containers": {
                role: _container_counters(cg, files) for role, cg in self.cgroups.items()
            },
            "host": _host_cpu_times(files),
            "processes": {m: process_rss(pid, files=files) for m, pid in procs.items()},
            "ticks": {cpu_metric(m): process_ticks(pid, files=files) for m, pid in procs.items()},
            "net": {role: net_bytes(pid, files=files) for role, pid in self.netns.items()},
        }
        if files is not None:
            files.sweep()
        return counters

    @staticmethod
    def _write(out: TextIO, prev: dict, cur: dict, gpus: Gpus) -> None:
        ts = cur["t"]
        dt = max(1, cur["t"] - prev["t"])
        rows: list[tuple[str, float, str, str]] = []
        for role, now in cur["containers"].items():
            before = prev["containers"][role]
            if now["usage_ns"] is not None and before["usage_ns"] is not None:
                cpu = 100.0 * (now["usage_ns"] - before["usage_ns"]) / dt
                rows.append(("container_cpu", cpu, "percent", role))
            if now["loaders"] is not None and before["loaders"] is not None:
                loader = loader_cpu_percent(before["loaders"], now["loaders"], dt)
                rows.append(("container_cpu_loader", loader, "percent", role))
            if now["mem"].get("rss") is not None:
                rows.append(("container_mem_rss", now["mem"]["rss"], "bytes", role))
            if now["mem"].get("cache") is not None:
                rows.append(("container_mem_cache", now["mem"]["cache"], "bytes", role))
            if now["mem"].get("shm") is not None:
                rows.append(("container_mem_shm", now["mem"]["shm"], "bytes", role))
            if now["mem"].get("pinned") is not None:
                rows.append(("container_mem_pinned", now["mem"]["pinned"], "bytes", role))
            for metric, key in (("container_pids", "current"), ("container_pids_refused", "max")):
                if now["pids"].get(key) is not None:
                    rows.append((metric, now["pids"][key], "count", role))
        for role, now_net in cur.get("net", {}).items():
            before_net = prev.get("net", {}).get(role)
            if now_net is not None and before_net is not None:
                for metric, a, b in zip(NET_METRICS, before_net, now_net, strict=True):
                    rows.append((metric, max(0, b - a) * 1e9 / dt, "bytes/s", role))
        deltas = [c - p for c, p in zip(cur["host"], prev["host"], strict=True)]
        total = sum(deltas) or 1
        by_name = dict(zip(_HOST_CPU_FIELDS, deltas, strict=True))
        host = [
            ("host_cpu_user", 100.0 * (by_name["user"] + by_name["nice"]) / total, "percent"),
            (
                "host_cpu_system",
                100.0 * (by_name["system"] + by_name["irq"] + by_name["softirq"]) / total,
                "percent",
            ),
            ("host_cpu_iowait", 100.0 * by_name["iowait"] / total, "percent"),
            ("host_cpu_idle", 100.0 * by_name["idle"] / total, "percent"),
            *gpus.sample(),
            *((m, rss, "bytes") for m, rss in cur.get("processes", {}).items() if rss is not None),
            *(
                (m, 100.0 * max(0, ticks - before) * _TICK_NS / dt, "percent")
                for m, ticks in cur.get("ticks", {}).items()
                if ticks is not None and (before := prev.get("ticks", {}).get(m)) is not None
            ),
        ]
        rows += [(m, v, u, "") for m, v, u in host]
        out.write("".join(f"{ts},{m},{_number(v)},{u},{c}\n" for m, v, u, c in rows))


def _number(value: float) -> str:
    """Counts (bytes, GPU percents) exactly, rates to six significant digits: 6-digit ``g`` of
    a byte count such as 85899345920 would lose the last 5 digits."""
    if isinstance(value, int):
        return str(value)
    return f"{value:.6g}"


def cpu_usage_ns(cg: ProcessCgroups, files: OpenFiles | None = None) -> int | None:
    """CPU time a container's cgroup has used since it was made (ns; v1 cpuacct or v2), None
    when it cannot be read (the container gone)."""
    if cg.is_v1:
        return _read_int(cg.cpuacct_dir / "cpuacct.usage", files) if cg.cpuacct_dir else None
    usec = _read_keyed(cg.v2_dir / "cpu.stat", files).get("usage_usec")
    return usec * 1000 if usec is not None else None


def _container_counters(cg: ProcessCgroups, files: OpenFiles | None = None) -> dict:
    """CPU time, memory and processes of one container's cgroup (v1 controllers or v2), and
    the CPU ticks of its data-loader worker processes (pid -> ticks)."""
    loaders = loader_ticks(cg.v2_dir / "cgroup.procs", files=files)
    usage_ns = cpu_usage_ns(cg, files)
    pids: dict[str, int | None] = {}
    if cg.pids_dir is not None:
        pids = {
            "current": _read_int(cg.pids_dir / "pids.current", files),
            "max": _read_keyed(cg.pids_dir / "pids.events", files).get("max"),
        }
    if cg.is_v1:
        stat = _read_keyed(cg.memory_dir / "memory.stat", files)
        return {
            "usage_ns": usage_ns,
            "mem": {
                "rss": stat.get("rss"),
                "cache": _file_data(stat, "cache"),
                "shm": stat.get("shmem"),
                "pinned": _pinned(stat, "mapped_file"),
            },
            "pids": pids,
            "loaders": loaders,
        }
    stat = _read_keyed(cg.v2_dir / "memory.stat", files)
    return {
        "usage_ns": usage_ns,
        "mem": {
            "rss": stat.get("anon"),
            "cache": stat.get("file"),
            "pinned": _pinned(stat, "file_mapped"),
        },
        "pids": pids,
        "loaders": loaders,
    }


#: The network metrics, in the order :func:`net_bytes` returns their counters.
NET_METRICS = ("container_net_rx", "container_net_tx")


def net_bytes(
    pid: int, proc: Path = Path("/proc"), files: OpenFiles | None = None
) -> tuple[int, int] | None:
    """(received, sent) bytes of every interface but loopback in the network namespace of
    process ``pid`` (``/proc/PID/net/dev``); None when it cannot be read (it has exited)."""
    try:
        text = _read_text(proc / str(pid) / "net" / "dev", files)
    except OSError:
        return None
    rx = tx = 0
    for line in text.splitlines()[2:]:
        name, sep, fields = line.partition(":")
        if not sep or name.strip() == "lo":
            continue
        values = fields.split()
        try:
            rx += int(values[0])
            tx += int(values[8])
        except (IndexError, ValueError):
            return None
    return rx, tx


def _file_data(stat: dict, cache: str) -> int | None:
    """The page cache of files on devices: the kernel's file pages (``cache``) less shared
    memory (tmpfs, /dev/shm, memfd: ``shmem``), which it counts among them."""
    if stat.get(cache) is None:
        return None
    return max(0, int(stat[cache]) - int(stat.get("shmem") or 0))


def _pinned(stat: dict, mapped: str) -> int | None:
    """Page cache the container cannot give back while it runs: file pages mapped into its
    processes (their code and libraries) plus shared memory (tmpfs, /dev/shm: the loader
    workers' batches), which has nowhere to go without swap."""
    if stat.get(mapped) is None:
        return None
    return int(stat[mapped]) + int(stat.get("shmem") or 0)


def cpu_metric(rss_metric: str) -> str:
    """The CPU metric of a process watched under ``rss_metric`` (``tracer_rss_syscalls`` ->
    ``tracer_cpu_syscalls``, ``sampler_rss`` -> ``sampler_cpu``)."""
    return rss_metric.replace("_rss", "_cpu", 1)


def process_rss(pid: int, proc: Path = Path("/proc"), files: OpenFiles | None = None) -> int | None:
    """Resident set size of process ``pid`` in bytes (the second field of ``/proc/PID/statm``,
    in pages); None when it cannot be read (the process has exited)."""
    try:
        return int(_read_text(proc / str(pid) / "statm", files).split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def loader_ticks(
    procs: Path, proc: Path = Path("/proc"), files: OpenFiles | None = None
) -> dict[int, int] | None:
    """CPU time (user + system clock ticks, all threads) of each data-loader worker process
    listed in a cgroup's ``cgroup.procs``; None when the list cannot be read. Processes that
    exit while being read are left out."""
    try:
        pids = [int(line) for line in _read_text(procs, files).split()]
    except (OSError, ValueError):
        return None
    out = {}
    for pid in pids:
        try:
            if not _read_text(proc / str(pid) / "comm", files).startswith(LOADER_COMMS):
                continue
        except OSError:
            continue
        ticks = process_ticks(pid, proc, files)
        if ticks is not None:
            out[pid] = ticks
    return out


def process_ticks(
    pid: int, proc: Path = Path("/proc"), files: OpenFiles | None = None
) -> int | None:
    """CPU time of process ``pid`` (user + system clock ticks, all its threads); None when it
    cannot be read (the process has exited)."""
    try:
        # utime and stime are fields 14 and 15; the name (field 2) may hold spaces.
        fields = _read_text(proc / str(pid) / "stat", files).rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def loader_cpu_percent(before: dict[int, int], now: dict[int, int], dt_ns: int) -> float:
    """Percent of one core the loader workers used between two :func:`loader_ticks` readings:
    a worker's ticks since the first reading, or all of them for one started since."""
    ticks = sum(t - before.get(pid, 0) for pid, t in now.items())
    return 100.0 * max(0, ticks) * _TICK_NS / dt_ns
