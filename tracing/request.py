"""What a traced run is: one request type, and the one builder for each way of asking for one.

A run holds one or more containers ("roles"). Every caller that traces something (``./cli.py
trace``, the experiment orchestrator, ``bench/``, the tests) describes it with a
:class:`RunRequest` made by one of the builders here and hands it to
:func:`tracing.runner.trace`, which returns a :class:`tracing.runner.RunOutcome`:

- :func:`workload_request`: a workload of the zoo in one container, or one container per rank
  (``rank_containers``);
- :func:`image_request`: any image with any command;
- :func:`topology_request` (in :mod:`tracing.topology`): the services of a compose file.

Sizes are parsed once, here, into bytes (:func:`core.units.parse_size`: ``MB``/``GB`` are powers
of 1000, ``MiB``/``GiB`` and docker's ``m``/``g`` powers of 1024); everything downstream takes
bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.atomic import atomic_write_text
from core.errors import SettingError, UserError
from core.units import parse_size
from tracing.container import DATA_MOUNT, BindMount, gpu_request
from tracing.host import block_device
from workloads.config import (
    DEFAULT_MASTER_PORT,
    MASTER_ADDR_ENV,
    MASTER_PORT_ENV,
    PEERS_ENV,
    WorkloadConfig,
    image_tag,
)
from workloads.data import check_manifest

if TYPE_CHECKING:
    from tracing.remote import StorageNode
    from workloads.profile import SleepProfile

#: Where a sleep profile given with ``--profile`` is mounted in a workload container.
PROFILE_MOUNT = "/twintrace/profile"
#: Where profiles made from the profile database (``--accelerator``) are kept, under the runs
#: root (no run directory: ``./cli.py runs`` lists only directories with a manifest).
PROFILES_SUBDIR = ".profiles"


@dataclasses.dataclass(frozen=True)
class ContainerSpec:
    """One container of a run: what it runs, what it sees, and its limits.

    ``command`` None runs the image's own ENTRYPOINT + CMD. ``config`` (workload runs) is
    written to the container's control directory ``ctl/<role>/config.json``, mounted at
    ``/twintrace/ctl``; ``ctl_files`` (path relative to it -> text) are written there too (a
    peer tool's configuration, say). ``out`` mounts the container's own ``out/<role>/``
    directory of the run at ``/twintrace/out``.
    """

    role: str
    image: str
    command: tuple[str, ...] | None = None
    config: WorkloadConfig | None = None
    mounts: tuple[BindMount, ...] = ()
    environment: Mapping[str, str] = dataclasses.field(default_factory=dict)
    memory_bytes: int | None = None
    cpus: float | None = None
    # The most processes and threads at once (docker's --pids-limit): past it, fork and clone
    # fail with EAGAIN.
    pids_limit: int | None = None
    # Reads from these disks capped at so many bytes per second (docker's --device-read-bps,
    # the blkio throttle): a slower storage device, emulated.
    device_read_bps: tuple[tuple[str, int], ...] = ()
    shm_bytes: int = 1 << 30  # loader workers share tensors through /dev/shm
    working_dir: str | None = None
    out: bool = True
    # A service (a storage server, say) that runs until the others are done: the run ends when
    # every container that is not a daemon has exited, and then stops the daemons.
    daemon: bool = False
    gpus: str | None = None  # docker's --gpus: all, a count, or device ids
    ctl_files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # A single container that must reach another host (a storage node started elsewhere,
    # --storage-host): it joins docker's default bridge network, which routes out, instead of
    # having no network.
    external_network: bool = False
    # Across nodes (``--nodes``): the swarm's placement constraints (compose's
    # ``deploy.placement.constraints``): the container goes to a node of the run that meets
    # them (tracing/placement.py: deal). Runs on one host have no use for them.
    constraints: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in self.ctl_files:
            parts = Path(name).parts
            if not parts or Path(name).is_absolute() or ".." in parts:
                raise ValueError(f"ctl_files: {name!r} is not a path inside the control directory")
        if not self.role or not all(c.isalnum() or c in "-_" for c in self.role):
            raise UserError(
                f"bad container role {self.role!r}: use letters, digits, '-' and '_' only"
            )
        if self.gpus is not None:
            gpu_request(self.gpus)  # validated before anything starts
        if self.memory_bytes is not None and self.memory_bytes < 6 * 2**20:
            raise UserError(
                f"memory limit {self.memory_bytes} bytes is below docker's minimum of 6 MiB"
            )
        if self.cpus is not None and self.cpus <= 0:
            raise SettingError("{cpus} must be positive, got {got}", got=self.cpus)
        if self.pids_limit is not None and self.pids_limit < 1:
            raise SettingError("{pids_limit} must be 1 or more, got {got}", got=self.pids_limit)


def gpu_count(gpus: str) -> int | None:
    """How many GPUs ``--gpus`` text gives a container: the count, the number of ids, or None
    for ``all`` (as many as the host has)."""
    request = gpu_request(gpus)
    if request["Count"] == -1:
        return None
    return request["Count"] or len(request["DeviceIDs"])


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-container resource limits, parsed once."""

    memory_bytes: int | None = None
    cpus: float | None = None
    # The dataset's disk read at most this many bytes per second (a slower device, emulated).
    read_bps: int | None = None
    pids: int | None = None  # the most processes and threads of each container

    def __post_init__(self) -> None:
        if self.read_bps is not None and self.read_bps < 1:
            raise UserError(f"the read rate limit must be positive, got {self.read_bps} B/s")

    @classmethod
    def parse(cls, memory: str | int | None, cpus: float | None) -> Limits:
        """``memory`` as the user wrote it (``2GiB``, ``500MB``, ``2g``, bytes), or None."""
        return cls(parse_size(memory) if memory not in (None, "") else None, cpus)


def read_throttle(data_dir: Path, read_bps: int | None) -> tuple[tuple[str, int], ...]:
    """The read throttle of a container that reads ``data_dir``: its disk at ``read_bps``."""
    if read_bps is None:
        return ()
    return ((block_device(Path(data_dir)), int(read_bps)),)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to run, whatever is run: default per-container ``limits``, the sampler interval, a
    timeout, tracing on or off (off: the baseline for overhead), and whether the containers'
    output is shown as it is written (``echo``)."""

    limits: Limits = Limits()
    gpus: str | None = None  # GPUs for every container (docker's --gpus)
    sample_interval: float = 0.1
    timeout_s: float | None = None
    tracing: bool = True
    echo: bool = False
    # A cap on what each container receives (across nodes: sends), in bits per second
    # (tracing.shaper, --net-bandwidth).
    net_bandwidth_bits_s: int | None = None
    # Across hosts: the containers dealt over the first ``nodes`` nodes of a swarm, or over the
    # nodes ``node_names`` (tracing/placement.py); None: this host. The swarm: the virtual
    # cluster ``cluster``, or the one whose manager's engine is ``engine`` (its nodes pull the
    # run's images from ``registry``, HOST:PORT; None: they have them).
    nodes: int | None = None
    cluster: str = "twintrace"
    node_names: tuple[str, ...] = ()
    engine: str | None = None
    registry: str | None = None

    def __post_init__(self) -> None:
        if self.nodes is not None and self.nodes < 1:
            raise SettingError("{nodes} must be 1 or more, got {got}", got=self.nodes)
        if self.node_names and (
            self.nodes != len(self.node_names) or len(set(self.node_names)) != self.nodes
        ):
            raise SettingError(
                "{nodes} {names}: name each node once", names=",".join(self.node_names)
            )
        if self.nodes is None and (self.engine or self.registry):
            raise SettingError("{engine} and {registry} are for runs across nodes: give {nodes}")
        if self.registry is not None and self.engine is None:
            raise SettingError(
                "{registry} is for the swarm {engine} names (the virtual cluster has its own)"
            )
        if self.nodes is not None and self.net_bandwidth_bits_s is not None and not self.tracing:
            raise SettingError(
                "across nodes {net_bandwidth} is set by each node's tracer agent: trace the run"
            )
        if self.sample_interval <= 0:
            raise SettingError(
                "{sample_interval} must be positive, got {got}", got=self.sample_interval
            )
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise SettingError("{timeout} must be positive, got {got}", got=self.timeout_s)


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """Everything a traced run needs.

    ``label`` and ``variant`` name the run directory; ``config`` is the run's workload config
    (recorded in the manifest; None for image and topology runs); ``run`` says how to run it.
    """

    label: str
    runs_root: Path
    containers: tuple[ContainerSpec, ...]
    variant: str | None = None
    config: WorkloadConfig | None = None
    run: RunOptions = RunOptions()
    source: str | None = None  # the topology file a run came from
    #: A peer tool's run (DLIO): what it is and how it was set up, recorded in the manifest
    #: (``peer``); None for our own workloads.
    peer: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.containers:
            raise UserError("a run needs at least one container")
        roles = [c.role for c in self.containers]
        if len(set(roles)) != len(roles):
            raise UserError(f"container roles must be unique, got {', '.join(roles)}")
        external = [c.role for c in self.containers if c.external_network]
        if external and len(self.containers) > 1:
            raise UserError(
                f"container {external[0]} needs a route out of the host, which a run of several "
                "containers (on its private network) cannot give it"
            )
        networked = len(self.containers) > 1 or bool(external)
        if self.run.net_bandwidth_bits_s is not None and not networked:
            raise SettingError(
                "{net_bandwidth} caps a run's network, and a run of one container has none: "
                "use a remote dataset ({options} dataset=remote-...), {compose} or "
                "{rank_containers}"
            )

    @property
    def roles(self) -> list[str]:
        return [c.role for c in self.containers]


def dataset_dirs(request: RunRequest) -> list[Path]:
    """The datasets a run's containers read: the sources of their dataset mounts (ours at
    :data:`tracing.container.DATA_MOUNT`, DLIO's at its data directory)."""
    from workloads import dlio

    targets = (DATA_MOUNT, dlio.DATA_DIR)
    found = {m.source for c in request.containers for m in c.mounts if m.target in targets}
    return sorted(found)


def workload_request(
    workload: str,
    variant: str,
    data_dir: Path | None,
    runs_root: Path,
    *,
    settings: Mapping[str, Any] | None = None,
    options: Mapping[str, str] | None = None,
    profile: Path | None = None,
    accelerator: str | None = None,
    profile_model: str | None = None,
    rank_containers: bool = False,
    mounts: Sequence[BindMount] = (),
    run: RunOptions = RunOptions(),
    storage: StorageNode | None = None,
) -> RunRequest:
    """A run of a zoo workload: one container, or one container per rank.

    ``settings`` are WorkloadConfig fields (epochs, batch_size, workers, accelerators, ...);
    ``options`` the workload's own ``--set KEY=VALUE`` options (validated here, before anything
    starts); ``profile`` a sleep profile file. ``accelerator`` (``a100``, ``v100``, ...; sleep
    variant only, not with ``profile``) takes the profile from the profile database instead
    (:func:`accelerator_profile`), for ``profile_model`` (an image workload can emulate any
    image model; default: the workload's own) at the run's batch size and accelerator count;
    it is written under ``runs_root/.profiles/`` (named by its content) and mounted as
    ``profile`` is. Neither: the workload's shipped default profile. ``rank_containers``:
    ``accelerators`` = G containers, each running one data-parallel rank over its shard, joined
    by torch.distributed (gloo) over the run's private network.

    A remote image dataset (option ``dataset=remote-...``, docs/sophon.md) adds the ``storage``
    container serving ``data_dir`` (``storage``: its workers and limits), and the training
    containers get no dataset mount; with the option ``storage_host`` set the server runs
    elsewhere, there is no ``data_dir`` and the one training container gets a route out
    (:mod:`tracing.remote`).
    """
    from tracing.remote import StorageNode, check_served_dataset, storage_container
    from workloads.profile import load_profile
    from workloads.registry import get_workload

    spec = get_workload(workload)
    settings = dict(settings or {})
    emulated = None
    if accelerator is not None or profile_model is not None:
        # Before the data checks: a wrong accelerator or model fails without touching the data.
        emulated = accelerator_profile(
            spec.config(variant, **settings), accelerator, profile_model, profile, options
        )
    options = dict(options or {})
    parsed = spec.parse_options(options)  # names and types checked before anything starts
    remote = bool(getattr(parsed, "remote", False))
    external = remote and "storage_host" in options  # a storage node started elsewhere
    if "storage_host" in options and not remote:
        raise SettingError(
            "{storage_host} names the storage node of a remote dataset: add "
            "{options} dataset=remote-nooff (or remote-alloff, remote-partial, remote-sophon)"
        )
    if storage is not None and (not remote or external):
        raise SettingError(
            "{prep_workers} and {storage_cpus} size the run's storage container: they are for "
            "a remote dataset ({options} dataset=remote-...) without {storage_host}"
        )
    if external:
        if data_dir is not None:
            raise SettingError(
                "{data} and {storage_host} both say where the samples are: with {storage_host} "
                "the storage server reads its own {data}"
            )
        if rank_containers:
            raise SettingError("{rank_containers} and {storage_host} cannot be combined")
    elif data_dir is None:
        raise SettingError(
            "{data} is required: generate a dataset with "
            "`./cli.py datagen {generator} --out DIR --size 1GB`",
            generator=spec.datagen,
        )
    else:
        data_dir = Path(data_dir).resolve()
        spec.check_data(data_dir)
        check_manifest(data_dir, spec.datagen)
        if remote:
            check_served_dataset(data_dir)
    extra = list(mounts)
    if profile is not None:
        if variant != "sleep":
            raise SettingError("{profile} is only used by the sleep variant")
        emulated = load_profile(profile)  # checked now; the warning below reads it
    elif emulated is not None:
        profile = write_profile(emulated, Path(runs_root))
    if profile is not None:
        extra.append(BindMount(Path(profile).resolve(), f"{PROFILE_MOUNT}/profile.json", True))
        settings["profile"] = f"{PROFILE_MOUNT}/profile.json"
    config = spec.config(variant, options=options, **settings)
    if variant == "sleep":
        from store.hostprofiles import foreign_fix, rank_threads, warn_if_foreign
        from workloads.profile import default_profile

        warn_if_foreign(
            emulated or default_profile(workload),
            rank_threads(config.accelerators, config.threads),
            foreign_fix(workload, config.batch_size),
        )
    image = image_tag(workload, variant)
    common = {
        "image": image,
        # A remote dataset's samples come over the network: no dataset for training to read.
        "mounts": (*(() if remote else (BindMount(data_dir, DATA_MOUNT, True),)), *extra),
        "memory_bytes": run.limits.memory_bytes,
        "cpus": run.limits.cpus,
        "pids_limit": run.limits.pids,
        "device_read_bps": read_throttle(data_dir, run.limits.read_bps),
        "gpus": run.gpus,
    }
    if rank_containers:
        if config.accelerators < 2:
            raise SettingError("{rank_containers} needs {accelerators} 2 or more")
        # Every rank container gets the same --gpus: with a count N docker gives each GPUs
        # 0..N-1, with ids the same ids. Rank r computes on the r-th GPU it sees
        # (workloads.training.resolve_device), so fewer GPUs than ranks would put two ranks on
        # one GPU (NCCL refuses that).
        have = gpu_count(run.gpus) if run.gpus is not None else None
        if have is not None and have < config.accelerators:
            raise SettingError(
                "{gpus} {given} gives every rank container the same {have} GPU(s), fewer "
                "than the {ranks} ranks: use {gpus} all (rank r computes on GPU "
                "r), or a compose topology that reserves one GPU per rank service",
                given=run.gpus,
                have=have,
                ranks=config.accelerators,
            )
        roles = [f"rank{r}" for r in range(config.accelerators)]
        env = {
            MASTER_ADDR_ENV: roles[0],
            MASTER_PORT_ENV: str(DEFAULT_MASTER_PORT),
            PEERS_ENV: ",".join(roles),
        }
        containers = tuple(
            ContainerSpec(role=role, config=config.replace(rank=r), environment=env, **common)
            for r, role in enumerate(roles)
        )
    else:
        containers = (
            ContainerSpec(role="main", config=config, external_network=external, **common),
        )
    if remote and not external:
        assert data_dir is not None
        node = storage or StorageNode()
        containers = (
            *containers,
            storage_container(image, data_dir, node, run.limits.cpus, run.limits.memory_bytes),
        )
    return RunRequest(
        label=workload,
        variant=variant,
        runs_root=Path(runs_root),
        containers=containers,
        config=config,
        run=run,
    )


def accelerator_profile(
    config: WorkloadConfig,
    accelerator: str | None,
    profile_model: str | None = None,
    profile: Path | None = None,
    options: Mapping[str, Any] | None = None,
) -> SleepProfile:
    """The sleep profile ``--accelerator`` asks for: the profile database's entry for the
    config's workload (or ``profile_model``) on ``accelerator`` at its batch size, for its
    number of accelerators; for ``cpu``, this host's measurement with the workload
    ``options`` (``experiments/hostprofile.py`` makes it). UserErrors for the combinations
    that make no sense."""
    from store.profiledb import sleep_profile_for

    if accelerator is None:
        raise SettingError(
            "{profile_model} picks the model whose profile {accelerator} looks up: give "
            "{accelerator} too (./cli.py profiles lists what is covered)"
        )
    if config.variant != "sleep":
        raise SettingError(
            "{accelerator} picks the emulated accelerator of the sleep variant; the "
            "{name} variant runs the real computation: use {variant} sleep",
            name=config.variant,
        )
    if profile is not None:
        raise SettingError(
            "{accelerator} and {profile} both choose the sleep profile: give one of them"
        )
    return sleep_profile_for(
        config.workload,
        accelerator,
        config.batch_size,
        accelerators=config.accelerators,
        model=profile_model,
        options=options,
        threads=config.threads,
    )


def write_profile(profile: SleepProfile, runs_root: Path) -> Path:
    """Write ``profile`` under ``runs_root/.profiles/``, named by its content (the same profile
    is written once, and a run's manifest names a file that never changes); return the path."""
    text = json.dumps(profile.to_dict(), indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    name = f"{profile.workload}-{_slug(profile.accelerator)}-{digest}.json"
    path = Path(runs_root) / PROFILES_SUBDIR / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    return path


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:40]


def image_request(
    image: str,
    command: Sequence[str] | None,
    runs_root: Path,
    *,
    mounts: Sequence[BindMount] = (),
    data_dir: Path | None = None,
    environment: Mapping[str, str] | None = None,
    run: RunOptions = RunOptions(),
) -> RunRequest:
    """A run of any image: ``command`` (None: the image's own), ``data_dir`` at /data (its
    disk's reads capped at the run's ``read_bps``, when it has one)."""
    all_mounts = list(mounts)
    if data_dir is not None:
        all_mounts.append(BindMount.parse(f"{data_dir}:{DATA_MOUNT}:ro"))
    elif run.limits.read_bps is not None:
        raise SettingError("{read_limit} caps the reads of the disk of {data}: give {data}")
    label = image.split("/")[-1].replace(":", "-")
    return RunRequest(
        label=label,
        runs_root=Path(runs_root),
        containers=(
            ContainerSpec(
                role="main",
                image=image,
                command=tuple(command) if command else None,
                mounts=tuple(all_mounts),
                environment=dict(environment or {}),
                memory_bytes=run.limits.memory_bytes,
                cpus=run.limits.cpus,
                pids_limit=run.limits.pids,
                device_read_bps=read_throttle(data_dir, run.limits.read_bps) if data_dir else (),
                gpus=run.gpus,
            ),
        ),
        run=run,
    )


__all__ = [
    "PROFILE_MOUNT",
    "PROFILES_SUBDIR",
    "ContainerSpec",
    "Limits",
    "RunOptions",
    "RunRequest",
    "accelerator_profile",
    "gpu_count",
    "image_request",
    "workload_request",
    "write_profile",
]
