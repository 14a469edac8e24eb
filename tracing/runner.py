"""Trace one run (one or more containers) from start to a finished run directory.

Order of operations (docs/run-format.md describes the result):
1. check prerequisites and images, create the run directory, write the manifest (``running``);
2. create the run's private network (several containers) and start every container held at its
   barrier; find each one's first process and cgroup;
3. start the host's tracer agent (tracing/agent.py, in its container: tracing/tracer_container.py)
   and have it attach the samplers and ONE set of bpftrace scripts filtered on the set of the
   run's cgroup ids; it answers once every probe is attached;
4. the agent releases every container at once; wait until they have all exited (or one failed,
   or Ctrl-C, or a tracer failure, or the agent stopped answering, or the timeout; across
   hosts also a node leaving the run or its agent dying: :func:`_check_hosts`);
5. on every exit path: stop every container; the agent stops bpftrace and the samplers and
   hands its output back, and exits; remove the containers and the network (a host that
   left is not asked: what its agent wrote to the shared run directory is kept);
6. turn the raw output into tables and a summary, finalise the manifest.

:func:`trace` returns a :class:`RunOutcome` (run directory, status, error) for a run that
completed or failed; Ctrl-C raises :class:`RunInterrupted` (a KeyboardInterrupt carrying the
outcome) once the directory is finalised. Problems found before the run directory exists are
a UserError.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import docker
import requests.exceptions

from core.errors import UserError
from core.units import format_size
from store import rundir
from tracing import barrier, bpftrace, container, host, placement, processing, swarm
from tracing.cgroups import ProcessCgroups, cgroups_of
from tracing.clock import host_clock
from tracing.placement import Host
from tracing.progress import Report, cold_epochs, keep_outputs, watch_training
from tracing.request import ContainerSpec, RunRequest, dataset_dirs
from tracing.shaper import Shaper, require_tc
from tracing.tracer_container import LocalAgent, start_agent
from workloads.config import TRACER_IMAGE

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a run ended: its directory, final status and error (None when completed)."""

    run_dir: Path
    status: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The workload completed and its trace was processed (``lossy`` included: the run's
        error then says what the tracer lost)."""
        return self.status in rundir.FINISHED

    def check(self) -> Path:
        """The run directory of a finished run; a UserError (naming the directory) else."""
        if not self.ok:
            raise UserError(f"{self.error} (run directory: {self.run_dir})")
        return self.run_dir


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a run, raised once its directory is finalised."""

    def __init__(self, outcome: RunOutcome) -> None:
        super().__init__(f"interrupted (run directory: {outcome.run_dir})")
        self.outcome = outcome


#: How far ahead of the calls the joint release of a run across hosts is set (ns).
RELEASE_LEAD_NS = 50_000_000
#: How often a run's containers' states are read while it runs (seconds), and how often for a
#: second after one of their log streams ended.
_POLL_S = 0.5
_POLL_QUICK_S = 0.05
#: Across nodes: how long after the release the coordinator first asks for the tasks' states.
_SETTLE_S = 0.2


@dataclasses.dataclass
class _Member:
    """One started container of the run."""

    spec: ContainerSpec
    ctr: Any
    barrier: Path
    host: Host
    main_pid: int = 0
    cgroups: ProcessCgroups | None = None
    logs: container.LogFollower | None = None

    def held(self, commands: dict[str, list[str]], run_id: str) -> container.Held:
        """This container, to start held at its barrier (:func:`tracing.container.start_held`
        on its host's engine, or :func:`tracing.swarm.start_role` as a swarm service)."""
        spec = self.spec
        return container.Held(
            image=self.host.ref(spec.image),
            command=commands[spec.role],
            barrier_dir=self.barrier,
            mounts=spec.mounts,
            run_id=run_id,
            role=spec.role,
            memory_bytes=spec.memory_bytes,
            cpus=spec.cpus,
            pids_limit=spec.pids_limit,
            environment=spec.environment,
            shm_bytes=spec.shm_bytes,
            working_dir=spec.working_dir,
        )


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so that `kill` also leaves a consistent run directory."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def trace(
    request: RunRequest, progress: Progress = lambda msg: None, training: Report | None = None
) -> RunOutcome:
    """Run ``request`` (traced unless ``request.run.tracing`` is False); see the module doc.
    ``progress`` hears what the run is doing, a line at a time; ``training``, while the
    containers run, where their training is (:class:`tracing.progress.TrainingWatch`: it is
    called from a thread of its own, then with None once they have ended)."""
    called_ns = time.monotonic_ns()  # the coordinator's own times: manifest "coordinator_s"
    if request.run.tracing:
        host.require_tracing_prerequisites()
    if request.run.net_bandwidth_bits_s is not None and request.run.nodes is None:
        require_tc()  # across nodes each node's agent caps its containers
    cli = container.client()
    for orphan in container.remove_orphans(cli):
        progress(f"removed the containers of run {orphan}, left behind by a killed tracer")
    # Each distinct image inspected once (rank containers share one).
    found = {tag: container.local_image(cli, tag) for tag in {s.image for s in request.containers}}
    images = {spec.role: found[spec.image].id for spec in request.containers}
    commands = {
        spec.role: list(spec.command or container.default_command(found[spec.image], spec.image))
        for spec in request.containers
    }
    metadata = host.host_metadata(cli.version().get("Version"))
    hosts, manager = [Host(metadata["hostname"], cli)], None
    if request.run.nodes is not None:  # before the run directory: bad input leaves none
        swarm.refuse(
            any(s.device_read_bps for s in request.containers),
            any(s.gpus for s in request.containers),
        )
        tags = sorted(found) + ([TRACER_IMAGE] if request.run.tracing else [])
        sources = [m.source for spec in request.containers for m in spec.mounts]
        hosts, manager = placement.cluster_hosts(
            cli, request.run, tags, [request.runs_root, *sources], progress
        )
    placed = placement.deal(
        [spec.role for spec in request.containers],
        hosts,
        {spec.role: spec.constraints for spec in request.containers} if manager else None,
    )
    idle = [h for h in hosts if h not in placed.values()]  # more nodes than containers
    placement.close(idle)
    hosts = [h for h in hosts if h not in idle]

    run_dir = rundir.new_run_dir(request.runs_root, request.label, request.variant)
    rundir.reserve_room(run_dir)  # given back at the end: the manifest can always say why
    raw, ctl, out = (run_dir / sub for sub in rundir.RUN_SUBDIRS)
    manifest = rundir.initial_manifest(
        run_dir,
        config=request.config.to_dict() if request.config else None,
        source=request.source,
        trace={
            "enabled": request.run.tracing,
            "sample_interval_s": request.run.sample_interval,
            "timeout_s": request.run.timeout_s,
            "bpftrace_scripts": list(bpftrace.SCRIPTS) if request.run.tracing else [],
            "network": _network_kind(request),
            "net_bandwidth_bits_s": request.run.net_bandwidth_bits_s,
        },
        host=metadata,
        containers=[],
        peer=dict(request.peer) if request.peer is not None else None,
        # CLOCK_REALTIME - CLOCK_MONOTONIC: places a tool's wall-clock log times (DLIO's) on
        # the trace's clock
        realtime_offset_ns=time.time_ns() - time.monotonic_ns(),
    )
    if manager is not None:
        manifest["cluster"] = {
            "name": request.run.cluster if request.run.engine is None else None,
            "engine": request.run.engine,
            "registry": request.run.registry,
            "nodes": [h.name for h in hosts],
        }
    manifest["hosts"] = {
        h.name: {"address": h.address, "containers": [r for r, p in placed.items() if p is h]}
        for h in hosts
    }
    for h in hosts:
        if h.host_dir:
            for sub in (raw, ctl):
                (sub / h.host_dir).mkdir()
    members: list[_Member] = []
    for spec in request.containers:
        for sub in (raw, ctl, out):
            (sub / spec.role).mkdir()
        mounts = list(spec.mounts)  # recorded: what the container reads and writes
        if spec.out:
            mounts.append(container.BindMount(out / spec.role, container.OUT_MOUNT, False))
        control = []  # not recorded: the tracer's own files (config), not the storage measured
        if spec.config is not None:
            spec.config.save(ctl / spec.role / "config.json")
        for name, text in spec.ctl_files.items():
            path = ctl / spec.role / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if spec.config is not None or spec.ctl_files:
            control.append(container.BindMount(ctl / spec.role, container.CTL_MOUNT, True))
        manifest["containers"].append(
            {
                "role": spec.role,
                "host": placed[spec.role].name,
                "image": spec.image,
                "image_id": images[spec.role],
                "command": commands[spec.role],
                "config": spec.config.to_dict() if spec.config else None,
                "environment": dict(spec.environment),
                "memory_limit_bytes": spec.memory_bytes,
                "cpus": spec.cpus,
                "pids_limit": spec.pids_limit,
                "device_read_bps": [list(d) for d in spec.device_read_bps],
                "gpus": spec.gpus,
                "daemon": spec.daemon,
                "mounts": [
                    {"source": str(m.source), "target": m.target, "read_only": m.read_only}
                    for m in mounts
                ],
                "container_id": None,
                "cgroup_id": None,
                "main_pid": None,
                "exit_code": None,
            }
        )
        members.append(
            _Member(
                dataclasses.replace(spec, mounts=(*mounts, *control)),
                None,
                ctl / spec.role,
                placed[spec.role],
            )
        )
    rundir.write_manifest(run_dir, manifest)
    progress(f"run directory {run_dir}")

    status, error, pending = "failed", None, None
    # The agents' containers start (about 1.4 s to a first answer) while the run's containers
    # start: in threads, each on its host's engine.
    starting: dict[str, concurrent.futures.Future[LocalAgent]] = {}
    container_ended = threading.Event()  # set by a container's log stream as it ends
    rate = request.run.net_bandwidth_bits_s
    shaper = Shaper(rate) if rate is not None and manager is None else None
    try:
        with _sigterm_as_interrupt():
            try:
                if request.run.tracing:
                    pool = concurrent.futures.ThreadPoolExecutor(len(hosts), "twintrace-agent")
                    for h in hosts:
                        if manager is not None:  # through its launcher service
                            starting[h.name] = pool.submit(
                                swarm.launch_agent,
                                h.connect(),  # a client of its own: it runs in another thread
                                h.name,
                                h.address,
                                run_dir,
                                h.host_dir,
                                h.ref(TRACER_IMAGE),
                                net_admin=rate is not None,
                            )
                            continue
                        starting[h.name] = pool.submit(
                            start_agent,
                            h.connect(),
                            run_dir,
                            gpus=_run_gpus(request),
                            image=h.ref(TRACER_IMAGE),
                            address=h.address,
                        )
                    pool.shutdown(wait=False)  # the tasks still run; the threads end with them
                if len(members) > 1:
                    container.create_network(manager or cli, run_dir.name, manager is not None)
                if manager is not None:
                    _start_services(members, commands, run_dir, manifest, request.run.echo)
                else:
                    _start_all(
                        members, commands, run_dir, manifest, request.run.echo, container_ended
                    )
                networked = len(members) > 1 or members[0].spec.external_network
                if shaper is not None:
                    for m in members:  # held at the barrier: capped before a byte is sent
                        shaper.add(m.spec.role, m.main_pid)
                    manifest["net_shaping"] = shaper.record()
                    progress(f"capped each container's network at {shaper.describe()}")
                if starting:
                    progress("attaching bpftrace probes")
                    for h in hosts:
                        h.agent = starting[h.name].result()
                    _on_every(
                        hosts,
                        lambda h: _attach(h, members, run_dir, request, networked, manifest),
                    )
                    manifest["start_ns"] = _release(hosts, manifest)
                else:
                    for m in members:  # back to back: every container starts within ~1 ms
                        barrier.release(m.barrier)
                    manifest["start_ns"] = time.monotonic_ns()
                rundir.write_manifest(run_dir, manifest)  # still running, now with ids
                progress(f"released {', '.join(m.spec.role for m in members)}")
                specs = [m.spec for m in members]
                with (
                    watch_training(specs, run_dir, training),
                    cold_epochs(
                        specs, run_dir, dataset_dirs(request), manifest, progress
                    ) as between,
                ):
                    status, error = _wait(
                        members, hosts, request.run.timeout_s, manifest, container_ended
                    )
                if between is not None and between.error:
                    said = f"the dataset could not be evicted from the page cache {between.error}"
                    status, error = "failed", f"{error}; {said}" if error else said
                manifest["end_ns"] = time.monotonic_ns()
                if len(members) > 1 and (gone := _network_gone(manager or cli, run_dir.name)):
                    status, error = "failed", f"{error}; {gone}" if error else gone
            except KeyboardInterrupt as exc:
                status, error, pending = "interrupted", "interrupted by the user", exc
            except UserError as exc:
                status, error = "failed", str(exc)
            except BaseException as exc:  # a bug: record it, finish the directory, re-raise
                status, error, pending = "failed", f"internal error: {exc!r}", exc
            finally:
                for h in hosts:  # an agent may still come up: close it
                    if h.agent is None and h.name in starting:
                        with contextlib.suppress(BaseException):
                            h.agent = starting[h.name].result()
                try:
                    _shutdown(members, hosts, manager, run_dir, manifest, shaper)
                except UserError as exc:  # the tracer's output is incomplete: say so
                    status = "failed" if status == "completed" else status
                    error = f"{error}; {exc}" if error else str(exc)
            free = rundir.room_left(run_dir)
            if free is not None:  # the tracer's output was cut where the file system filled
                rundir.give_back_room(run_dir)
                full = (
                    f"the file system of {run_dir.parent} filled while tracing "
                    f"({format_size(free)} free at the end): the trace in raw/ is cut short; "
                    f"free some space and run again (`./cli.py ingest {run_dir}` processes "
                    "what raw/ holds)"
                )
                status, error = "failed", f"{error}; {full}" if error else full
            # On disk the run is still running, now with its end and its outcome before the
            # processing: should this process die while processing (or the processing fail),
            # `./cli.py ingest RUN` finishes it from there.
            manifest["outcome"] = {"status": status, "error": error}
            rundir.write_manifest(run_dir, manifest)
            if free is None:  # a full file system has no room for the tables
                progress("processing the trace")
                placed = [processing.Placed(m.spec.role, m.host, m.main_pid) for m in members]
                status, error = processing.process(
                    run_dir, manifest, placed, status, error, hosts, progress=progress
                )
            if manifest.get("start_ns") and manifest.get("end_ns"):
                manifest["coordinator_s"] = {  # bench/cluster_overhead.py
                    "call_to_release": (manifest["start_ns"] - called_ns) / 1e9,
                    "exit_to_processed": (time.monotonic_ns() - manifest["end_ns"]) / 1e9,
                }
    except KeyboardInterrupt as exc:  # a second Ctrl-C while shutting down or processing
        status, error, pending = "interrupted", "interrupted by the user", exc
    finally:
        rundir.give_back_room(run_dir)
        manifest.update(status=status, error=error, ended_at=rundir.utc_now())
        rundir.write_manifest(run_dir, manifest)
    outcome = RunOutcome(run_dir, status, error)
    if isinstance(pending, KeyboardInterrupt):
        raise RunInterrupted(outcome) from None
    if pending is not None:
        raise pending
    return outcome


def _memory_kill(m: _Member) -> str:
    """What to add to a failed container's error when the kernel killed a process of it for
    memory (a container on this host or a host's engine; a swarm's task does not say: the
    trace does, :func:`tracing.processing.traced_memory_kills`)."""
    if isinstance(m.ctr, swarm.RoleTask) or not container.killed_for_memory(m.ctr):
        return ""
    return (
        f": the kernel killed a process of it for memory{processing.at_limit(m.spec.memory_bytes)}"
    )


def _network_gone(cli: Any, run_id: str) -> str:
    """What to say of a run whose containers ended after its network was removed by
    something other than twintrace ("" while it is there, or when the engine does not say)."""
    try:
        if container.run_networks(cli, run_id):
            return ""
    except (requests.exceptions.ConnectionError, docker.errors.APIError):
        return ""
    return (
        f"the run's network {container.network_name(run_id)} was removed while it ran (by "
        "something other than twintrace): its containers could no longer reach each other"
    )


_T = TypeVar("_T")


def _on_every(items: Sequence[_T], call: Callable[[_T], Any]) -> list[Any]:
    """``call`` on every item (hosts, members), at once when there are several; the first
    error raised (once every call has ended)."""
    if not items:
        return []
    if len(items) == 1:
        return [call(items[0])]
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        futures = [pool.submit(call, item) for item in items]
        return [f.result() for f in futures]


def _release(hosts: list[Host], manifest: dict) -> int:
    """Each host's clock offset, then every agent releases its containers at once (the joint
    release); returns the earliest release on the coordinator's clock."""
    for h in hosts:
        h.agent.clock_before = h.agent.client.clock()
        manifest["hosts"][h.name]["clock"] = host_clock(h.agent.clock_before, None)
        _set_shift(h, manifest, len(hosts))
    if len(hosts) == 1:
        released = [hosts[0].agent.client.call("Release")["released_ns"]]
    else:
        released = _joint_release(hosts)
    for h, at in zip(hosts, released, strict=True):
        manifest["hosts"][h.name]["released_ns"] = at + h.shift_ns
    return min(manifest["hosts"][h.name]["released_ns"] for h in hosts)


#: After the joint release's instant, when the coordinator first asks the agents when they
#: released (seconds): the containers' first instructions have run by then.
RELEASED_ASK_S = 0.05


def _joint_release(hosts: list[Host]) -> list[int]:
    """Across hosts: one instant named on each host's clock, each agent releasing its
    containers when its clock reaches it (the skew is the clocks' error and the hosts'
    scheduling, not the calls' spread: tens of ms lead, every call arrives before it; a late
    one releases at once, and the skew says so). The calls are answered before the instant and
    nothing of the coordinator's runs at it; then each host's release time, on its clock."""
    at = time.monotonic_ns() + RELEASE_LEAD_NS
    _on_every(hosts, lambda h: h.agent.client.call("Release", {"at_ns": at - h.shift_ns}))
    time.sleep(max(0.0, (at - time.monotonic_ns()) / 1e9 + RELEASED_ASK_S))

    def released(h: Host) -> int:
        deadline = time.monotonic() + 10.0
        while True:
            reply = h.agent.client.call("Status")
            if reply.get("released_ns") is not None:
                return int(reply["released_ns"])
            if reply.get("failed"):
                raise UserError(f"{h.name}: {reply['failed']}")
            if time.monotonic() > deadline:
                raise UserError(f"the tracer agent of {h.name} did not release its containers")
            time.sleep(0.01)

    return _on_every(hosts, released)


def _set_shift(h: Host, manifest: dict, n_hosts: int) -> None:
    """Host ``h``'s times on the coordinator's clock: t - offset, the offset its clock record
    applies (tracing/clock.py); a run of one host is on the coordinator's own clock."""
    clock = manifest["hosts"][h.name].get("clock")
    h.shift_ns = -int(clock["offset_ns"]) if clock and n_hosts > 1 else 0


def _run_gpus(request: RunRequest) -> str | None:
    """The GPUs the run's containers ask for (the agent samples them through NVML)."""
    return next((spec.gpus for spec in request.containers if spec.gpus), None)


def _attach_call(
    h: Host,
    mine: list[_Member],
    run_dir: Path,
    request: RunRequest,
    networked: bool,
    rate: int | None,
) -> dict:
    """The agent's ``Attach`` of host ``h``'s containers ``mine`` (see :func:`_attach`)."""
    return h.agent.client.call(
        "Attach",
        {
            "run_id": run_dir.name,
            "run_dir": str(run_dir.resolve()),
            "containers": [
                {
                    "role": m.spec.role,
                    "container_id": m.ctr.id,
                    "barrier": str(m.barrier.relative_to(run_dir)),
                }
                for m in mine
            ],
            "scripts": list(bpftrace.SCRIPTS),
            "sample_interval": request.run.sample_interval,
            "network": networked,
            "host_dir": h.host_dir,
            **({"net_bandwidth_bits_s": rate} if rate is not None else {}),
        },
    )


def _attach(
    h: Host,
    members: list[_Member],
    run_dir: Path,
    request: RunRequest,
    networked: bool,
    manifest: dict,
) -> None:
    """Host ``h``'s agent attaches its samplers and bpftrace scripts to its held containers;
    each one it found must be the process and cgroup docker names."""
    mine = [m for m in members if m.host is h]
    # Across nodes each agent caps what its containers send (on one host: tracing.shaper)
    rate = request.run.net_bandwidth_bits_s if h.swarm else None
    try:
        reply = _attach_call(h, mine, run_dir, request, networked, rate)
    except UserError:
        # One removed meanwhile (by something else) is the cause, and says so; `docker rm -f`
        # kills the processes first, so the agent may find none while the engine still has
        # the container: asked again for a while.
        deadline = time.monotonic() + REMOVAL_S
        while True:
            for m in mine:
                _exit_code(m)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    h.agent.attached = True
    record = manifest["trace"] if not h.host_dir else manifest["hosts"][h.name]
    record["memory_file_systems"] = reply["memory_file_systems"]
    if reply.get("shaped"):  # across hosts: each agent capped what its containers send
        shaping = manifest.setdefault(
            "net_shaping",
            {"rate_bits_s": rate, "devices": {}, "qdisc": "tbf", "direction": "egress"},
        )
        for role, devices in reply["shaped"].items():
            shaping["devices"][role] = f"{h.name}:{devices}"
    for m in mine:
        found = reply["containers"][m.spec.role]
        # A swarm's task: its node's cgroups are the agent's to read (the swarm says its pid).
        cgroup = m.cgroups.v2_id if m.cgroups is not None else found["cgroup_id"]
        if (found["main_pid"], found["cgroup_id"]) != (m.main_pid, cgroup):
            raise UserError(
                f"the tracer agent of {h.name} found container {m.spec.role} as process "
                f"{found['main_pid']} in cgroup {found['cgroup_id']}, docker says process "
                f"{m.main_pid} in cgroup {cgroup}: is the agent on that host?"
            )
        for record in manifest["containers"]:
            if record["role"] == m.spec.role:
                record["cgroup_id"] = cgroup


def _network_kind(request: RunRequest) -> str:
    """The run's network: ``internal`` (several containers), ``bridge`` (one that must reach
    another host) or ``none``."""
    if len(request.containers) > 1:
        return "internal"
    return "bridge" if request.containers[0].external_network else "none"


def _start_all(
    members: list[_Member],
    commands: dict[str, list[str]],
    run_dir: Path,
    manifest: dict,
    echo: bool,
    container_ended: threading.Event,
) -> None:
    """Start every container held at its barrier, on its host's engine, and record its ids;
    each one's log stream sets ``container_ended`` as it ends."""
    network = container.network_name(run_dir.name) if len(members) > 1 else None
    if network is None and members[0].spec.external_network:
        network = container.DEFAULT_BRIDGE
    for i, m in enumerate(members):
        spec = m.spec
        m.ctr = container.start_held(
            m.host.cli,
            m.held(commands, run_dir.name),
            network=network,
            device_read_bps=spec.device_read_bps,
            gpus=spec.gpus,
        )
        m.main_pid = container.main_pid(m.ctr)
        m.cgroups = cgroups_of(m.main_pid)
        m.logs = container.LogFollower(
            m.ctr,
            run_dir / "raw" / spec.role / "container.log",
            echo=echo,
            prefix=f"[{spec.role}] " if len(members) > 1 else "",
            ended=container_ended,
        )
        manifest["containers"][i].update(
            container_id=m.ctr.id,
            cgroup_id=m.cgroups.v2_id,
            main_pid=m.main_pid,
            memlock_unlimited=container.memlock_raised(m.ctr),
        )


def _start_services(
    members: list[_Member],
    commands: dict[str, list[str]],
    run_dir: Path,
    manifest: dict,
    echo: bool,
) -> None:
    """Across nodes: every container as the task of a service on its node (tracing/swarm.py),
    held at its barrier; once every task runs, record its ids."""
    network = container.network_name(run_dir.name) if len(members) > 1 else None
    for m in members:  # every service first: the nodes pull and start them at once
        m.ctr = swarm.start_role(
            m.host.cli,
            m.held(commands, run_dir.name),
            m.host.name,
            constraints=m.spec.constraints,
            network=network,
        )
    for i, m in enumerate(members):
        task = m.ctr
        task.wait_running()
        m.main_pid = task.main_pid
        if echo:
            task.echo(f"[{m.spec.role}] " if len(members) > 1 else "", container.stderr_sink)
        manifest["containers"][i].update(
            container_id=task.id,
            main_pid=m.main_pid,
            memlock_unlimited=task.memlock_raised,
        )


def _wait(
    members: list[_Member],
    hosts: list[Host],
    timeout_s: float | None,
    manifest: dict,
    container_ended: threading.Event,
) -> tuple[str, str | None]:
    """Wait until every container that is not a daemon has exited; the run fails as soon as
    one exits non-zero (the others are then stopped: a rank whose peer died would wait
    forever). Returns (status, error)."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    codes: dict[str, int] = {}
    if any(isinstance(m.ctr, swarm.RoleTask) for m in members):
        # The tasks were just released: asking the swarm's manager for their states at once
        # would compete for the CPUs with the manager node's containers as they start (the
        # release skew, manifest release_skew_ns); an end is noticed 0.2 s later at most.
        time.sleep(_SETTLE_S)
    quick_until = 0.0
    while True:
        container_ended.clear()
        for i, m in enumerate(members):
            if m.spec.role in codes:
                continue
            try:
                code = _exit_code(m)
            except UserError:
                raise
            except Exception as exc:  # the engine does not answer: the host left the run
                if isinstance(m.ctr, swarm.RoleTask):
                    raise UserError(f"the swarm's manager stopped answering: {exc}") from None
                raise _lost(m.host, manifest, f"engine stopped answering ({exc})") from None
            if code is None:
                continue
            codes[m.spec.role] = code
            manifest["containers"][i]["exit_code"] = code
            if code != 0 or m.spec.daemon:
                manifest["exit_code"] = code
                if len(hosts) > 1:  # a peer's host leaving makes a rank fail: that is the cause
                    _check_hosts(hosts, manifest)
                what = "daemon " if m.spec.daemon else ""
                return "failed", (
                    f"{what}container {m.spec.role} exited with code {code}"
                    f"{_memory_kill(m)}{_log_tail(m)}"
                )
        if all(m.spec.role in codes for m in members if not m.spec.daemon):
            manifest["exit_code"] = 0
            return "completed", None
        _check_hosts(hosts, manifest, ping=False)
        if deadline and time.monotonic() > deadline:
            raise UserError(f"the run did not finish within {timeout_s:.0f} s (--timeout)")
        # Asking the engine for every container's state costs the engine and this process
        # ~1.5 ms of CPU each time: ask every 0.5 s, and every 50 ms for a second after a
        # container's log stream ended (it ends as the container stops).
        if time.monotonic() < quick_until:
            time.sleep(_POLL_QUICK_S)
        elif container_ended.wait(_POLL_S):
            quick_until = time.monotonic() + 1.0


#: How long an agent's refused Attach waits for the engine to finish removing a container that
#: something else removed (its cause), before the refusal is the run's error.
REMOVAL_S = 2.0
#: How long the coordinator retries removing a run's overlay network while the swarm still
#: holds the attachments of the containers just removed.
NETWORK_RELEASE_S = 15.0
#: How long the coordinator waits for an agent's Status during the run before it counts the
#: agent as dead (a live agent answers in about a millisecond).
STATUS_TIMEOUT_S = 10.0


def _check_hosts(hosts: list[Host], manifest: dict, ping: bool = True) -> None:
    """A UserError for the first host that left the run (``ping``: its engine does not
    answer) or whose agent died or failed; the host is marked lost (:class:`Host`)."""
    for h in hosts:
        if ping and (silent := _engine_silent(h)):
            raise _lost(h, manifest, f"engine stopped answering ({silent})")
        if h.agent is None:
            continue
        try:
            failure = h.agent.client.call("Status", timeout=STATUS_TIMEOUT_S)["failed"]
        except UserError as exc:
            if silent := _engine_silent(h):  # the node went, its agent with it
                raise _lost(h, manifest, f"engine stopped answering ({silent})") from None
            try:
                gone = h.agent.exited()
                why = f"{exc}; {gone}" if gone else str(exc)
            except Exception:  # its engine does not answer either: the host left
                raise _lost(h, manifest, f"engine and agent stopped answering ({exc})") from None
            raise _lost(h, manifest, f"tracer agent died: {why}", engine_alive=True) from None
        if failure:
            if silent := _engine_silent(h):  # the engine stopped, its containers (the agent's
                # too) with it: that is the cause, not the tracer's end it brought
                raise _lost(h, manifest, f"engine stopped answering ({silent})")
            raise UserError(f"{h.name}: {failure}" if h.host_dir else failure)


def _engine_silent(h: Host) -> str | None:
    """Why host ``h``'s engine does not answer, None when it does. A swarm's node is asked at
    its gossip port (the coordinator has only the manager's engine); this host, by a ping."""
    if h.swarm:
        if swarm.engine_answers(h.address):
            return None
        return f"nothing listens on its swarm port {h.address}:{swarm.GOSSIP_PORT}"
    try:
        h.cli.ping()
        return None
    except Exception as exc:
        return str(exc)


def _lost(h: Host, manifest: dict, why: str, engine_alive: bool = False) -> UserError:
    """Mark host ``h`` lost (recorded in the manifest) and say so: the error of the run.
    ``why`` names what of the host failed ("engine stopped answering ...")."""
    h.lost, h.engine_alive = why, engine_alive
    if h.name in manifest.get("hosts", {}):
        manifest["hosts"][h.name]["lost"] = why
    if not h.host_dir and engine_alive:  # the run's one host: its tracer is what was lost
        return UserError(f"the {why}; what it traced is kept in raw/")
    if not h.host_dir:  # the engine (why: "engine ...")
        return UserError(
            f"the Docker {why}: the run's containers stopped with it; once it is back, the "
            "next run removes what is left of them; what it traced is kept in raw/"
        )
    return UserError(
        f"host {h.name} left the run: its {why}; what its tracer wrote until then is kept in "
        f"raw/{h.host_dir}/"
    )


def _exit_code(m: _Member) -> int | None:
    """Member ``m``'s exit code once it exited, else None."""
    return m.ctr.exit_code() if isinstance(m.ctr, swarm.RoleTask) else container.exit_code(m.ctr)


def _log_tail(m: _Member, lines: int = 8) -> str:
    try:
        text = m.ctr.logs(tail=lines).decode(errors="replace").strip()
    except Exception:
        return ""
    return f"; its output ends with:\n{text}" if text else ""


def _shutdown(
    members: list[_Member],
    hosts: list[Host],
    manager: Any,
    run_dir: Path,
    manifest: dict,
    shaper: Shaper | None = None,
) -> None:
    """Stop everything the run started. Each step runs even if an earlier one failed."""
    # The bandwidth caps first: they are on the host's own interfaces.
    steps: list[Callable[[], Any]] = [shaper.remove] if shaper is not None else []
    gone = {h for h in hosts if not h.engine_alive}  # left the run: nothing there to ask
    tasks = [m for m in members if isinstance(m.ctr, swarm.RoleTask)]  # a swarm's
    # The containers removed at once (each removal waits ~0.1 s for the engine).
    removed = [m for m in members if m.ctr is not None and m.host not in gone and m not in tasks]
    steps.append(lambda: _on_every(removed, lambda m: container.stop_and_remove(m.ctr)))
    steps += [(lambda m=m: m.logs.join()) for m in members if m.logs is not None]
    # A swarm's task: its output as the swarm gathered it, then its service removed (its
    # container with it; on a node that left, once the node is back or removed).
    steps += [
        (lambda m=m: m.ctr.save_logs(run_dir / "raw" / m.spec.role / "container.log"))
        for m in tasks
        if m.host not in gone
    ]
    steps += [(lambda m=m: m.ctr.remove()) for m in tasks]

    def stop_tracer(h: Host) -> None:
        reply = h.agent.client.call("Stop")
        record = manifest if not h.host_dir else manifest["hosts"][h.name]
        record["missed_probes"] = reply["missed_probes"]
        record["bpftrace_exit_codes"] = reply["exit_codes"]
        record["tracer_stopped_ns"] = reply["stopped_ns"]
        for problem in ("sampler_error", "shaper_error"):
            if reply.get(problem):
                record[problem] = reply[problem]
        h.agent.client.collect(run_dir, reply["files"])
        if h.agent.clock_before is not None:  # the clock after the run: its drift
            manifest["hosts"][h.name]["clock"] = host_clock(
                h.agent.clock_before, h.agent.client.clock()
            )
            _set_shift(h, manifest, len(hosts))  # the tighter estimate, now known

    def finish_agent(h: Host) -> None:
        try:
            if h.agent.attached and h.lost is None:
                stop_tracer(h)
        finally:
            (h.agent.abandon if h in gone else h.agent.close)()

    # Every host's agent stopped, collected and closed at once (each waits for its bpftrace
    # and its container to exit: about 1 s a host in turn, bench/cluster_overhead.py).
    steps.append(lambda: _on_every([h for h in hosts if h.agent is not None], finish_agent))
    steps += [
        (lambda h=h: container.remove_run_resources(h.cli, run_dir.name))
        for h in hosts
        if h not in gone and not h.swarm
    ]
    if manager is not None:  # the run's services and its overlay network

        def release_swarm() -> None:
            lost = [h.name for h in gone]
            # The swarm lets go of removed tasks' network attachments a moment later: retried.
            deadline = time.monotonic() + (0 if gone else NETWORK_RELEASE_S)
            try:
                left = swarm.remove_run(manager, run_dir.name, lost)
                while True:
                    container.remove_run_resources(manager, run_dir.name)
                    networks = [n.name for n in container.run_networks(manager, run_dir.name)]
                    if not networks or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            except UserError:
                raise
            except Exception as exc:  # requests' errors too: the manager does not answer
                if not gone:
                    raise
                raise UserError(  # the manager's node may be the one that left
                    f"the cluster's manager did not answer ({exc}): the run's services and "
                    "overlay network may remain; `./cli.py cluster down` removes them"
                ) from None
            left += [f"network {n}" for n in networks]
            if not left:
                return
            manifest["left_behind"] = left
            if not gone:
                raise UserError(
                    f"the run's overlay network {', '.join(networks)} was still in use "
                    f"{NETWORK_RELEASE_S:.0f} s after the run's services were removed: "
                    "`docker network rm` it on the manager"
                )
            names = ", ".join(lost)  # the swarm keeps what a lost node held
            raise UserError(
                f"the swarm keeps {', '.join(left)} of the run until {names} is back in the "
                f"swarm or removed from it (`docker node rm --force {names}` on the manager, "
                "then `docker network rm` should the run's network remain; on the virtual "
                "cluster `./cli.py cluster down`)"
            )

        steps.append(release_swarm)
        steps.append(lambda: placement.close(hosts, manager))
    first_error = None
    for step in steps:
        try:
            step()
        except BaseException as exc:
            first_error = first_error or exc
    if len(hosts) > 1:  # every host's missed probes, for the run's status
        manifest["missed_probes"] = {
            f"{h.name}/{script}": n
            for h in hosts
            for script, n in (manifest["hosts"][h.name].get("missed_probes") or {}).items()
        }
    keep_outputs([m.spec for m in members], run_dir, manifest.get("start_ns"))
    if first_error is not None:
        if isinstance(first_error, requests.exceptions.ConnectionError):
            raise UserError(
                f"the Docker engine did not answer while the run was being stopped "
                f"({first_error}): once it is back, the next run removes what is left"
            ) from None
        raise first_error


def reingest(run_dir: Path, progress: Callable[[str], None] = lambda msg: None) -> RunOutcome:
    """``./cli.py ingest RUN``: process a run's raw/ again into its tables and summary, as its
    own processing did (the same rows), and give it the status that follows: a run whose
    process died while processing gets the outcome its workload had (the manifest's
    ``outcome``, written just before); one whose process died before its containers ended is
    ``interrupted``. A run still being run, or without raw/, is refused in one line."""
    manifest = rundir.load_manifest(run_dir)
    alive = rundir.coordinator_alive(manifest)
    who = manifest.get("coordinator") or {}
    if alive or (alive is None and manifest.get("status") == "running" and who):
        where = "here" if alive else f"on {who.get('hostname')}"
        raise UserError(
            f"{run_dir.name} is still being run {where} (process {who.get('pid')}): wait for "
            "it to end; a run that ends processes its own trace"
        )
    raw = run_dir / "raw"
    if not raw.is_dir():
        raise UserError(f"{run_dir} has no raw/: there is no trace to process")
    rundir.give_back_room(run_dir)  # what a killed run kept
    names = list(manifest.get("hosts") or {}) or [(manifest.get("host") or {}).get("hostname")]
    across = bool(manifest.get("cluster"))
    hosts = [Host(str(n), None, host_dir=str(n) if across else "") for n in names]
    for h in hosts if len(hosts) > 1 else ():  # one host: on the coordinator's own clock
        _set_shift(h, manifest, len(hosts))
    by_name = {h.name: h for h in hosts}
    placed = [
        processing.Placed(
            str(c["role"]), by_name.get(str(c.get("host")), hosts[0]), int(c.get("main_pid") or 0)
        )
        for c in manifest.get("containers") or []
    ]
    before = manifest.get("outcome") or {
        "status": manifest.get("status"),
        "error": manifest.get("error"),
    }
    status, error = before["status"], before.get("error")
    if status == "running" or status == rundir.INCOMPLETE:
        status, error = "interrupted", "the process that ran it ended before its containers did"
    elif status in rundir.FINISHED:
        status, error = "completed", None  # lossy or not: the processing says again
    progress("processing the trace")
    status, error = processing.process(
        run_dir, manifest, placed, status, error, hosts, progress=progress
    )
    manifest.update(status=status, error=error, processed_again_at=rundir.utc_now())
    rundir.write_manifest(run_dir, manifest)
    return RunOutcome(run_dir, status, error)
