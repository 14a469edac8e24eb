"""One traced run asked for by its settings: the options object and the one builder.

Whoever asks for a run (``./cli.py trace``, the experiment orchestrator, the studies) fills a
:class:`TraceSettings`, the run's settings by name as an experiment file spells them, and calls
:func:`build_request`, which owns every rule between settings and the choice between a workload
of the zoo (:func:`tracing.request.workload_request`), DLIO standing for one
(:func:`experiments.dlio.dlio_request`), any image (:func:`tracing.request.image_request`) and
the services of a compose file (:func:`tracing.topology.topology_request`). What is wrong is a
:class:`core.errors.SettingError` naming the settings: ``rank_containers`` to a file's author,
``--rank-containers`` once the CLI renders it with its flags.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.errors import SettingError
from workloads.config import PEER_VARIANTS

Log = Callable[[str], None]

#: The WorkloadConfig fields a run's settings pass to the workload as they are.
CONFIG_SETTINGS = (
    "epochs",
    "batch_size",
    "workers",
    "accelerators",
    "max_steps",
    "seed",
    "eval_every",
    "checkpoint_every",
)


@dataclasses.dataclass(frozen=True)
class TraceSettings:
    """A traced run's settings, each named as ``./cli.py trace`` names its option (``--batch-size``
    is ``batch_size``); None: the default of what runs. Exactly one of ``workload``, ``image``
    and ``compose`` says what runs."""

    workload: str | None = None
    variant: str = "original"
    data: Path | None = None
    epochs: int | None = None
    batch_size: int | None = None
    workers: int | None = None
    accelerators: int | None = None
    max_steps: int | None = None
    seed: int | None = None
    synthetic: bool = False
    eval_every: int | None = None
    checkpoint_every: int | None = None
    profile: Path | None = None
    accelerator: str | None = None
    profile_model: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    rank_containers: bool = False
    image: str | None = None
    command: tuple[str, ...] = ()
    compose: Path | None = None
    services: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()  # SRC:DST[:ro|:rw]
    memory_limit: str | int | None = None
    cpus: float | None = None
    pids_limit: int | None = None
    read_limit: int | None = None  # the dataset's disk read at most so many bytes per second
    gpus: str | None = None
    sample_interval: float = 0.1
    timeout: float | None = None
    quiet: bool = False
    net_bandwidth: str | None = None  # tc's units: 430mbit
    storage_host: str | None = None
    prep_workers: int | None = None
    storage_cpus: float | None = None
    nodes: str | int | None = None  # a count, or node names separated by commas
    cluster: str = "twintrace"
    engine: str | None = None
    registry: str | None = None
    #: Evict the dataset from the page cache between epochs, every rank waiting meanwhile (the
    #: workload config's ``epoch_barrier``): every epoch reads the storage, not memory.
    cold_epochs: bool = False

    @property
    def config(self) -> dict[str, Any]:
        """The WorkloadConfig settings given (``synthetic`` and ``epoch_barrier`` only when
        on)."""
        given = {name: getattr(self, name) for name in CONFIG_SETTINGS}
        given["synthetic"] = self.synthetic or None
        given["epoch_barrier"] = self.cold_epochs or None
        return {k: v for k, v in given.items() if v is not None}


def parse_nodes(nodes: str | int | None) -> dict[str, Any]:
    """``nodes`` (a count, or node names separated by commas) as RunOptions' ``nodes`` and
    ``node_names``."""
    if nodes is None:
        return {}
    if isinstance(nodes, int):
        return {"nodes": nodes}
    text = nodes.strip()
    if text.isdigit():
        return {"nodes": int(text)}
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise SettingError(
            "{nodes} {text!r}: give a count (3) or node names (node-1,node-3)", text=text
        )
    return {"nodes": len(names), "node_names": names}


def check_settings(s: TraceSettings) -> None:
    """The rules between settings that hold whatever runs (before anything is read)."""
    if sum(x is not None for x in (s.workload, s.image, s.compose)) != 1:
        raise SettingError("give exactly one of {workload} NAME, {image} IMAGE or {compose} FILE")
    if s.rank_containers and s.workload is None:
        raise SettingError("{rank_containers} is for {workload} runs")
    if s.services and s.compose is None:
        raise SettingError("{services} is for {compose} runs")
    if s.command and s.image is None:
        raise SettingError("a {command} is only for {image} runs")
    if (s.accelerator or s.profile_model) and s.workload is None:
        raise SettingError("{accelerator} and {profile_model} are for {workload} runs")
    remote = s.storage_host or s.prep_workers is not None or s.storage_cpus is not None
    if remote and (s.workload is None or s.variant in PEER_VARIANTS):
        raise SettingError(
            "{storage_host}, {prep_workers} and {storage_cpus} are for {workload} runs"
        )
    if s.storage_host and (s.prep_workers is not None or s.storage_cpus is not None):
        raise SettingError(
            "{prep_workers} and {storage_cpus} size the run's storage container, which "
            "{storage_host} replaces: give them to ./cli.py storage-server there"
        )
    if s.variant in PEER_VARIANTS and s.workload is None:
        raise SettingError(
            "{variant} {variant_name} is for {workload} runs", variant_name=s.variant
        )
    if s.variant in PEER_VARIANTS and (s.mounts or s.gpus):
        raise SettingError(
            "{variant} {variant_name} runs on its own dataset and without GPUs: leave out "
            "{mounts} and {gpus}",
            variant_name=s.variant,
        )
    if s.compose is not None and (s.data is not None or s.mounts):
        raise SettingError("{data} and {mounts} are not for {compose} runs: mount in the file")
    if s.cold_epochs:
        if s.workload is None or s.variant in PEER_VARIANTS:
            raise SettingError(
                "{cold_epochs} is for {workload} runs of our variants: DLIO's epochs cannot be "
                "paused"
            )
        if s.engine is not None:
            raise SettingError(
                "{cold_epochs} evicts the dataset from this host's page cache, not from the "
                "nodes' of the swarm {engine} names: give the containers a {memory_limit} instead"
            )
    if s.storage_host is not None and "storage_host" in s.options:
        raise SettingError("give the storage node once: {storage_host} or {options} storage_host")


def run_options(s: TraceSettings) -> Any:
    """How the run runs (:class:`tracing.request.RunOptions`), from the settings."""
    from tracing.request import Limits, RunOptions
    from tracing.shaper import parse_rate

    limits = Limits.parse(s.memory_limit or None, s.cpus)
    if s.read_limit is not None:
        limits = dataclasses.replace(limits, read_bps=s.read_limit)
    if s.pids_limit is not None:
        limits = dataclasses.replace(limits, pids=s.pids_limit)
    return RunOptions(
        limits=limits,
        gpus=s.gpus,
        sample_interval=s.sample_interval,
        timeout_s=s.timeout,
        echo=not s.quiet,
        net_bandwidth_bits_s=parse_rate(s.net_bandwidth) if s.net_bandwidth is not None else None,
        cluster=s.cluster,
        engine=s.engine,
        registry=s.registry,
        **parse_nodes(s.nodes),
    )


def build_request(s: TraceSettings, runs_root: Path, log: Log = print) -> Any:
    """The :class:`tracing.request.RunRequest` of ``s`` under ``runs_root``; a SettingError
    (or another UserError about the input) before anything starts when it cannot run.
    ``log`` hears what is prepared on the way (a host profile measured, DLIO configured)."""
    from tracing.container import BindMount
    from tracing.request import image_request, workload_request

    check_settings(s)
    run = run_options(s)
    mounts = [BindMount.parse(m) for m in s.mounts]
    if s.workload is not None:
        from experiments.hostprofile import prepare_emulation

        options = dict(s.options)
        prepare_emulation(s.workload, s.accelerator, s.data, s.config, options, log)
        common: dict[str, Any] = {
            "settings": s.config,
            "options": options,
            "profile": s.profile,
            "accelerator": s.accelerator,
            "profile_model": s.profile_model,
            "rank_containers": s.rank_containers,
            "run": run,
        }
        if s.variant in PEER_VARIANTS:
            from experiments.dlio import dlio_request

            return dlio_request(s.workload, s.data, runs_root, log=log, **common)
        from tracing.remote import StorageNode

        storage = None
        if s.prep_workers is not None or s.storage_cpus is not None:
            storage = StorageNode(s.prep_workers or 1, s.storage_cpus)
        if s.storage_host is not None:
            options["storage_host"] = s.storage_host
        request = workload_request(
            s.workload,
            s.variant,
            s.data,
            runs_root,
            mounts=mounts,
            storage=storage,
            **common,
        )
        from images.build import check_current
        from tracing.container import client

        check_current(client(), s.workload, s.variant)  # the settings are checked first
        return request
    if s.image is not None:
        return image_request(
            s.image, list(s.command) or None, runs_root, mounts=mounts, data_dir=s.data, run=run
        )
    from tracing.topology import topology_request

    assert s.compose is not None
    return topology_request(
        s.compose,
        runs_root,
        services=s.services,
        warn=lambda msg: log(f"warning: {msg}"),
        run=run,
    )


__all__ = ["TraceSettings", "build_request", "check_settings", "parse_nodes", "run_options"]
