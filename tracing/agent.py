"""The tracer agent: the process that owns one host's side of a traced run, and its protocol.

It runs in the ``twintrace/tracer`` image (tracing/tracer_container.py starts it, with the
privileges listed there), one per host and run, and is driven over gRPC by the run's
coordinator (``./cli.py trace``: tracing/runner.py) through :class:`AgentClient`; a run over
several hosts drives one agent per host through the same client. The agent needs no Docker
socket: the coordinator names the run's containers by id, and the agent finds their processes
and cgroups in ``/proc`` (it shares the host's PID and cgroup namespaces).

The protocol (docs/agent.md): service ``twintrace.agent.v1.Agent``, every request and reply one
JSON object (UTF-8) as the gRPC message, so that any gRPC client can speak it without generated
code. A run goes Hello -> Attach -> Release -> Status* -> Stop -> Fetch* -> Shutdown:

- ``Hello {}`` -> ``{protocol, sources, pid, state}``: ``sources`` is the digest of
  the tracing code in the image, checked by the client against its own (:func:`sources_digest`).
- ``Attach {run_id, run_dir, containers: [{role, container_id, barrier}], scripts,
  sample_interval, network, host_dir, net_bandwidth_bits_s?}`` -> ``{containers: {role:
  {main_pid, cgroup_id}}, tracer_pids, memory_file_systems, shaped}``:
  finds each container's first process (held at its barrier), starts the samplers and the
  bpftrace scripts over the containers' cgroups and answers once every probe is attached;
  its outputs go to ``raw/`` (``raw/<host_dir>/`` in a run over several hosts). With
  ``net_bandwidth_bits_s`` it first caps what each container sends (a run across hosts:
  tracing/shaper.py, :class:`~tracing.shaper.EgressShaper`; the agent then needs
  ``NET_ADMIN``); ``shaped``: role -> the interfaces capped. Stop removes the caps.
- ``Release {at_ns?}`` -> ``{released_ns}``: lets every container go (its barrier FIFO) at
  once; the time is the host's CLOCK_MONOTONIC, the clock of every event. With ``at_ns`` (the
  joint release of a run across hosts) it answers at once, ``released_ns`` null, and lets them
  go when the host's clock (as ``Clock`` reports it) reaches ``at_ns``: nothing of the call's
  answer competes for the CPUs with the containers' first instructions; ``Status`` then says
  when.
- ``Status {}`` -> ``{state, failed, released_ns}``: ``failed`` says why a bpftrace script or
  the sampler ended early, or why the release failed (null while all run); ``released_ns``:
  when the containers were let go (null until then).
- ``Stop {}`` -> ``{exit_codes, missed_probes, sampler_error, shaper_error, files: [{path,
  size}]}``: cancels a timed release still to come, removes the network caps, stops the
  scripts (they print their last period) and the samplers; ``files`` are the outputs,
  relative to the run directory.
- ``Fetch {path}`` -> a stream of byte chunks: one output file, for a coordinator on another
  host (one that sees the file itself, at its size, reads it there).
- ``Shutdown {}`` -> ``{}``: the agent stops what still runs and exits.
- ``Clock {}`` -> ``{received_ns, sent_ns}``: the agent's CLOCK_MONOTONIC when the call came
  and when it answers, at any time (not ordered, not behind another call's lock): the
  coordinator estimates the host's clock offset from such exchanges (tracing/clock.py).

A call that cannot be carried out answers ``FAILED_PRECONDITION`` (out of order) or
``INVALID_ARGUMENT`` with one line saying why. Every call renews the agent's lease: an agent
that hears nothing for ``lease_s`` seconds (its coordinator was killed, or lost its network)
stops its scripts and samplers, keeps what they wrote, and exits.

Docker-free (it runs inside the tracer's image): standard library, grpcio and the tracing code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

# Before grpc loads: its fork handlers wait for the server's threads to be idle before a fork,
# and the agent forks bpftrace (subprocess with preexec_fn) from within a call: they would wait
# forever. The agent's children never use gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
import grpc  # noqa: E402

from core.errors import UserError
from core.rpc import RECONNECT_OPTIONS
from tracing import bpftrace
from tracing.barrier import release
from tracing.cgroups import cgroups_of
from tracing.clock import ROUNDS, ClockEstimate, measure
from tracing.samplers import Sampler
from tracing.shaper import EgressShaper

SERVICE = "twintrace.agent.v1.Agent"
PROTOCOL = 1
#: The port the agent listens on inside its container (published on the host's loopback).
PORT = 7443
#: Seconds without a call after which the agent gives its run up.
LEASE_S = 15.0
#: Bytes per Fetch chunk (gRPC's default message limit is 4 MiB).
CHUNK = 1 << 20
#: What the image's tracing code is: these trees, relative to the project's root.
SOURCE_GLOBS = ("core/*.py", "tracing/*.py", "tracing/bpf/*.bt")

log = logging.getLogger("twintrace.agent")


def sources_digest(root: Path) -> str:
    """A digest of the tracing code under ``root`` (:data:`SOURCE_GLOBS`): the client compares
    the image's with its checkout's, so a run never mixes two versions of the code."""
    digest = hashlib.sha256()
    for pattern in SOURCE_GLOBS:
        for path in sorted(root.glob(pattern)):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


class CallError(Exception):
    """A call that cannot be carried out: a gRPC status code and one line."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def container_processes(container_id: str, proc: Path = Path("/proc")) -> list[int]:
    """The host pids of the container's processes: those whose cgroup paths name its id (true
    of Docker's cgroupfs and systemd drivers, cgroup v1 and v2)."""
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if container_id in (entry / "cgroup").read_text():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def first_process(pids: Sequence[int], proc: Path = Path("/proc")) -> int:
    """The root of the processes' tree: the one whose parent is not among them (a container
    held at its barrier has only its entry point)."""
    members = set(pids)
    roots = []
    for pid in pids:
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent not in members:
            roots.append(pid)
    if not roots:
        raise CallError(grpc.StatusCode.FAILED_PRECONDITION, "the container has no process")
    return min(roots)


#: File systems whose pages are memory, not file data on a device (cache.bt counts them apart).
MEMORY_FS_TYPES = ("tmpfs", "ramfs", "devtmpfs", "hugetlbfs")


def memory_file_systems(
    pids: dict[str, int], proc: Path = Path("/proc"), shmem: bool = True
) -> list[dict[str, Any]]:
    """The memory file systems the containers see (role -> a process of each): each one's
    kernel device number (``dev``: what cache.bt's tracepoints carry), ``major:minor``, type
    and mount point, from ``/proc/PID/mountinfo`` while the containers exist (their /dev/shm
    goes with them); with ``shmem``, also the kernel's internal shmem mount (memfd, shared
    anonymous memory, SysV shared memory), which no mount table lists: a memfd's device."""
    found: dict[int, dict[str, Any]] = {}
    for role, pid in pids.items():
        try:
            lines = (proc / str(pid) / "mountinfo").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            left, _, right = line.partition(" - ")
            fields, after = left.split(), right.split()
            if len(fields) < 5 or not after or after[0] not in MEMORY_FS_TYPES:
                continue
            major, minor = (int(x) for x in fields[2].split(":"))
            dev = bpftrace.kernel_dev(major, minor)
            found.setdefault(
                dev,
                {"dev": dev, "major_minor": fields[2], "fstype": after[0], "mount": fields[4],
                 "role": role},
            )  # fmt: skip
    if shmem:
        fd = os.memfd_create("twintrace-shmem-probe")
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        dev = bpftrace.kernel_dev(os.major(st.st_dev), os.minor(st.st_dev))
        found.setdefault(
            dev,
            {"dev": dev, "major_minor": f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}",
             "fstype": "shmem", "mount": "(internal: memfd, shared anonymous memory)", "role": ""},
        )  # fmt: skip
    return sorted(found.values(), key=lambda f: f["dev"])


class RunSide:
    """One host's side of one run: its containers, samplers and bpftrace scripts."""

    def __init__(self, request: dict[str, Any]) -> None:
        try:
            self.run_id = str(request["run_id"])
            self.run_dir = Path(request["run_dir"])
            self.members = [
                (str(c["role"]), str(c["container_id"]), self.run_dir / str(c["barrier"]))
                for c in request["containers"]
            ]
            self.scripts = tuple(request.get("scripts", bpftrace.SCRIPTS))
            self.interval = float(request.get("sample_interval", 0.1))
            self.network = bool(request.get("network", False))
            # A run over several hosts: this host's outputs in raw/<host_dir>/ (and its
            # tracer's control files in ctl/<host_dir>/), beside the other hosts'.
            self.host_dir = str(request.get("host_dir") or "")
            rate = request.get("net_bandwidth_bits_s")
            if rate is not None and (isinstance(rate, bool) or int(rate) != rate or rate <= 0):
                raise ValueError(f"net_bandwidth_bits_s {rate!r}")
            self.shaper = EgressShaper(int(rate)) if rate is not None else None
        except (KeyError, TypeError, ValueError) as exc:
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, f"bad Attach: {exc!r}") from None
        if not self.members:
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, "Attach names no container")
        unknown = set(self.scripts) - set(bpftrace.SCRIPTS)
        if unknown:
            raise CallError(
                grpc.StatusCode.INVALID_ARGUMENT, f"unknown scripts: {', '.join(sorted(unknown))}"
            )
        if "/" in self.host_dir or self.host_dir in (".", ".."):
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, f"bad host_dir {self.host_dir!r}")
        self.raw = self.run_dir / "raw" / self.host_dir
        self.ctl = self.run_dir / "ctl" / self.host_dir
        if not self.raw.is_dir():
            raise CallError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{self.raw} is not a folder this agent can see (its writable mount)",
            )
        self.sampler: Sampler | None = None
        self.tracer: bpftrace.Tracer | None = None
        self.stopped: dict[str, Any] | None = None
        #: When the containers were let go (CLOCK_MONOTONIC), None until then.
        self.released_ns: int | None = None
        self.release_error: str | None = None
        self._releaser: threading.Thread | None = None
        self._cancel = threading.Event()

    def attach(self) -> dict[str, Any]:
        found = {}
        for role, container_id, _ in self.members:
            pids = container_processes(container_id)
            if not pids:
                raise CallError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"container {role} ({container_id[:12]}) has no process on this host",
                )
            pid = first_process(pids)
            found[role] = (pid, cgroups_of(pid))
        if self.shaper is not None:  # held at their barriers: capped before a byte is sent
            for role, (pid, _) in found.items():
                self.shaper.add(role, pid)
        self.sampler = Sampler(
            self.raw / "samples.csv",
            {role: cg for role, (_, cg) in found.items()},
            self.interval,
            netns={role: pid for role, (pid, _) in found.items()} if self.network else None,
        )
        self.sampler.start()
        memory = memory_file_systems({role: pid for role, (pid, _) in found.items()})
        self.tracer = bpftrace.Tracer(
            self.raw,
            self.ctl,
            [cg.v2_id for _, cg in found.values()],
            self.scripts,
            [fs["dev"] for fs in memory],
            [cg.block_id for _, cg in found.values()],
        )
        self.tracer.start()
        pids = {name: child.pid for name, child in self.tracer.children.items()}
        self.sampler.watch({f"tracer_rss_{name}": pid for name, pid in pids.items()})
        return {
            "containers": {
                role: {"main_pid": pid, "cgroup_id": cg.v2_id} for role, (pid, cg) in found.items()
            },
            "tracer_pids": pids,
            "memory_file_systems": memory,
            "shaped": self.shaper.devices() if self.shaper is not None else {},
        }

    def release(self, at_ns: int | None = None) -> dict[str, Any]:
        """Let every container go now; with ``at_ns``, at that CLOCK_MONOTONIC time (now if
        past), from a thread: the answer does not wait for it (the module doc)."""
        if at_ns is None:
            self._release_now()
        else:
            self._releaser = threading.Thread(
                target=self._release_at, args=(at_ns,), name="release", daemon=True
            )
            self._releaser.start()
        return {"released_ns": self.released_ns}

    def _release_now(self) -> None:
        for _, _, barrier in self.members:  # back to back: every container within ~1 ms
            release(barrier)
        self.released_ns = time.monotonic_ns()

    def _release_at(self, at_ns: int) -> None:
        # Stop cancels a release still to come; the last millisecond slept, for precision.
        if self._cancel.wait(max(0, at_ns - time.monotonic_ns() - 1_000_000) / 1e9):
            return
        while (left := at_ns - time.monotonic_ns()) > 0:
            time.sleep(left / 1e9)
        try:
            self._release_now()
        except UserError as exc:
            self.release_error = f"the release failed: {exc}"

    def failed(self) -> str | None:
        if self.release_error is not None:
            return self.release_error
        failure = self.tracer.failed() if self.tracer is not None else None
        if failure is None and self.sampler is not None and self.sampler.error is not None:
            failure = f"the sampler failed: {self.sampler.error!r}"
        return failure

    def stop(self) -> dict[str, Any]:
        """Stop the scripts, then the samplers; idempotent (a second call answers the first's
        reply)."""
        if self.stopped is not None:
            return self.stopped
        if self._releaser is not None:  # a release still to come does not come
            self._cancel.set()
            self._releaser.join(timeout=5.0)
        shaper_error = None
        if self.shaper is not None:
            try:
                self.shaper.remove()
            except UserError as exc:
                shaper_error = str(exc)
        codes: dict[str, int] = {}
        missed: dict[str, int] = {}
        stopped_ns = None
        if self.tracer is not None:
            time.sleep(0.2)  # lets block completions of the last requests reach the tracer
            missed = self.tracer.missed_probes()
            stopped_ns = time.monotonic_ns()
            codes = self.tracer.stop()
        if self.sampler is not None:
            self.sampler.stop()
        names = ["samples.csv"] + [
            f"{script}.{ext}"
            for script in self.scripts
            for ext in ("bt", "txt", "stdout", "stderr")
        ]
        files = [
            {
                "path": str((self.raw / name).relative_to(self.run_dir)),
                "size": (self.raw / name).stat().st_size,
            }
            for name in names
            if (self.raw / name).is_file()
        ]
        self.stopped = {
            "exit_codes": codes,
            "stopped_ns": stopped_ns,
            "missed_probes": missed,
            "sampler_error": repr(self.sampler.error)
            if self.sampler and self.sampler.error
            else None,
            "files": files,
            "shaper_error": shaper_error,
        }
        return self.stopped


class Agent:
    """The agent's state: at most one run at a time, a lease renewed by every call."""

    def __init__(self, lease_s: float = LEASE_S, sources: str = "", clock_offset_ns: int = 0):
        self.lease_s = lease_s
        self.sources = sources
        #: Added to the times Clock reports: a host whose clock is off by a known amount, for
        #: the tests of the offset estimator (hosts sharing one kernel have offset 0).
        self.clock_offset_ns = clock_offset_ns
        self.run: RunSide | None = None
        self.state = "idle"  # idle, attached, released, stopped
        self.lock = threading.Lock()
        self.last_call = time.monotonic()
        self.done = threading.Event()  # set by Shutdown or an expired lease
        self.given_up: str | None = None  # why it stopped what ran on its own (give_up)
        self.in_flight = 0  # calls being answered: the lease does not run out under one
        self._counting = threading.Lock()  # in_flight's: calls run on several threads

    # -- the calls --------------------------------------------------------------------------

    def hello(self, _: dict) -> dict:
        return {
            "protocol": PROTOCOL,
            "sources": self.sources,
            "pid": os.getpid(),
            "state": self.state,
        }

    def attach(self, request: dict) -> dict:
        if self.state != "idle":
            raise CallError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this agent already serves run {self.run.run_id if self.run else '?'}",
            )
        run = RunSide(request)
        self.run = run
        try:
            reply = run.attach()
        except BaseException as exc:
            run.stop()
            self.state = "stopped"
            if isinstance(exc, CallError):
                raise
            if isinstance(exc, UserError):
                raise CallError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
            raise
        self.state = "attached"
        log.info("run %s: attached to %d containers", run.run_id, len(run.members))
        return reply

    def release(self, request: dict) -> dict:
        at = request.get("at_ns")
        if at is not None and (not isinstance(at, int) or isinstance(at, bool)):
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, f"bad Release at_ns {at!r}")
        run = self._expect("attached")
        reply = run.release(None if at is None else at - self.clock_offset_ns)
        self.state = "released"
        log.info("run %s: released", run.run_id)
        return reply

    def status(self, _: dict) -> dict:
        return {
            "state": self.state,
            # the cause first: a tracer stopped by the agent's own end ends its bpftrace too
            "failed": (
                f"the tracer agent stopped: {self.given_up}"
                if self.given_up
                else self.run.failed()
                if self.run
                else None
            ),
            "released_ns": self.run.released_ns if self.run else None,
        }

    def stop(self, _: dict) -> dict:
        if self.run is None:
            raise CallError(grpc.StatusCode.FAILED_PRECONDITION, "no run to stop")
        reply = self.run.stop()
        self.state = "stopped"
        log.info("run %s: stopped, exit codes %s", self.run.run_id, reply["exit_codes"])
        return reply

    def fetch(self, request: dict) -> Iterator[bytes]:
        if self.run is None or self.state != "stopped":
            raise CallError(grpc.StatusCode.FAILED_PRECONDITION, "Fetch comes after Stop")
        path = (self.run.run_dir / str(request.get("path", ""))).resolve()
        listed = {(self.run.run_dir / f["path"]).resolve() for f in self.run.stopped["files"]}
        if path not in listed:
            raise CallError(
                grpc.StatusCode.INVALID_ARGUMENT, f"{request.get('path')!r} is not an output"
            )
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def shutdown(self, _: dict) -> dict:
        self.done.set()
        return {}

    def clock(self, _: dict) -> dict:
        received = time.monotonic_ns() + self.clock_offset_ns
        return {"received_ns": received, "sent_ns": time.monotonic_ns() + self.clock_offset_ns}

    # -- plumbing ---------------------------------------------------------------------------

    def _expect(self, state: str) -> RunSide:
        if self.state != state or self.run is None:
            raise CallError(
                grpc.StatusCode.FAILED_PRECONDITION, f"the agent is {self.state}, not {state}"
            )
        return self.run

    def give_up(self, why: str) -> None:
        """Stop what runs (the lease expired, or the process is told to end)."""
        with self.lock:
            if self.run is not None and self.state != "stopped":
                log.warning("run %s: %s: stopping its tracer", self.run.run_id, why)
                self.given_up = why
                try:
                    self.run.stop()
                finally:
                    self.state = "stopped"
        self.done.set()

    def watch_lease(self) -> None:
        while not self.done.wait(0.5):
            if not self.in_flight and time.monotonic() - self.last_call > self.lease_s:
                self.give_up(f"no call for {self.lease_s:.0f} s (lease expired)")

    def _count(self, step: int) -> None:
        with self._counting:
            self.in_flight += step

    def handler(self, method: Callable[[dict], Any], stream: bool, locked: bool = True) -> Callable:
        def call(request: bytes, context: grpc.ServicerContext) -> Any:
            self.last_call = time.monotonic()
            try:
                body = json.loads(request or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc}")
            self._count(+1)
            try:
                if stream:
                    yield from method(body)  # Fetch: not under the lock (long)
                    return
                if locked:
                    with self.lock:
                        reply = method(body)
                else:
                    reply = method(body)
            except CallError as exc:
                context.abort(exc.code, str(exc))
            finally:
                self.last_call = time.monotonic()
                self._count(-1)
            yield json.dumps(reply).encode()

        if stream:
            return grpc.unary_stream_rpc_method_handler(call)

        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            return next(call(request, context))

        return grpc.unary_unary_rpc_method_handler(unary)

    def handlers(self) -> grpc.GenericRpcHandler:
        unary = {
            "Hello": self.hello,
            "Attach": self.attach,
            "Release": self.release,
            "Status": self.status,
            "Stop": self.stop,
            "Shutdown": self.shutdown,
        }
        methods = {name: self.handler(m, False) for name, m in unary.items()}
        methods["Fetch"] = self.handler(self.fetch, True)
        methods["Clock"] = self.handler(self.clock, False, locked=False)
        return grpc.method_handlers_generic_handler(SERVICE, methods)


def serve(agent: Agent, listen: str) -> tuple[grpc.Server, int]:
    """Start the gRPC server on ``listen`` (host:port; port 0 picks one). Returns it and its
    port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((agent.handlers(),))
    port = server.add_insecure_port(listen)
    if port == 0:
        raise UserError(f"the agent cannot listen on {listen}")
    server.start()
    return server, port


def run_agent(listen: str, lease_s: float, root: Path, clock_offset_ns: int = 0) -> int:
    """The agent's process: serve until Shutdown, an expired lease, SIGTERM or SIGINT."""
    import signal

    agent = Agent(lease_s, sources_digest(root), clock_offset_ns)
    server, port = serve(agent, listen)
    log.info("listening on port %d (lease %.0f s, sources %s)", port, lease_s, agent.sources)

    def on_signal(signum: int, frame: Any) -> None:
        why = (
            f"{signal.Signals(signum).name} (its container was stopped: `docker stop`, or its "
            "engine shutting down)"
        )
        threading.Thread(target=agent.give_up, args=(why,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=agent.watch_lease, name="lease", daemon=True).start()
    agent.done.wait()
    agent.give_up("shutting down")
    server.stop(grace=1.0).wait()
    log.info("exited")
    return 0


class AgentClient:
    """The coordinator's side of the protocol, one agent at ``address`` (host:port). A call
    the agent refuses, or an agent that stopped answering, is a UserError saying so."""

    def __init__(self, address: str, timeout: float = 120.0) -> None:
        self.address = address
        self.timeout = timeout
        self.channel = grpc.insecure_channel(address, options=RECONNECT_OPTIONS)

    def wait_ready(self, timeout: float, alive: Callable[[], str | None]) -> dict:
        """Hello, retried until it answers within ``timeout`` s; ``alive()`` says why the
        agent cannot come up (its container exited), None while it may."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.call("Hello", timeout=2.0)
            except UserError:
                why = alive()
                if why is not None:
                    raise UserError(f"the tracer agent did not start: {why}") from None
                if time.monotonic() > deadline:
                    raise UserError(
                        f"the tracer agent at {self.address} did not answer within {timeout:.0f} s"
                    ) from None
                time.sleep(0.1)

    def call(self, method: str, body: dict | None = None, timeout: float | None = None) -> dict:
        stub = self.channel.unary_unary(f"/{SERVICE}/{method}")
        try:
            reply = stub(json.dumps(body or {}).encode(), timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise UserError(self._describe(method, exc)) from None
        return json.loads(reply)

    def clock(self, rounds: int = ROUNDS) -> ClockEstimate:
        """The agent's clock offset to this process's CLOCK_MONOTONIC (tracing/clock.py)."""

        def ask() -> tuple[int, int]:
            reply = self.call("Clock", timeout=10.0)
            return reply["received_ns"], reply["sent_ns"]

        return measure(ask, rounds)

    def fetch(self, path: str, target: Path) -> int:
        """Copy output ``path`` (relative to the run directory) into ``target`` (written
        whole or not at all); returns its bytes."""
        stub = self.channel.unary_stream(f"/{SERVICE}/Fetch")
        partial = target.with_name(target.name + ".part")
        size = 0
        try:
            with open(partial, "wb") as out:
                for chunk in stub(json.dumps({"path": path}).encode(), timeout=self.timeout):
                    out.write(chunk)
                    size += len(chunk)
        except grpc.RpcError as exc:
            partial.unlink(missing_ok=True)
            raise UserError(self._describe("Fetch", exc)) from None
        partial.replace(target)
        return size

    def collect(self, run_dir: Path, files: Sequence[dict]) -> list[str]:
        """Bring the outputs of a Stop reply into ``run_dir``: those this host does not see at
        their size (another host's agent) are fetched. Returns the fetched paths."""
        fetched = []
        for item in files:
            local = Path(run_dir) / item["path"]
            if local.is_file() and local.stat().st_size == item["size"]:
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            self.fetch(item["path"], local)
            fetched.append(item["path"])
        return fetched

    def _describe(self, method: str, exc: grpc.RpcError) -> str:
        code = exc.code() if hasattr(exc, "code") else None
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return f"the tracer agent at {self.address} stopped answering ({method}: {detail})"
        return f"the tracer agent refused {method}: {detail}"

    def close(self) -> None:
        self.channel.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tracing.agent", description=__doc__)
    parser.add_argument("--listen", default=f"0.0.0.0:{PORT}", help="host:port to serve on")
    parser.add_argument("--lease", type=float, default=LEASE_S, help="seconds without a call")
    parser.add_argument(
        "--clock-offset-ns", type=int, default=0, help="added to Clock's times (tests only)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s agent %(levelname)s %(message)s", stream=sys.stderr
    )
    return run_agent(
        args.listen, args.lease, Path(__file__).resolve().parent.parent, args.clock_offset_ns
    )


if __name__ == "__main__":
    sys.exit(main())
