"""Topologies: the services of a compose file as the containers ("roles") of one traced run.

A topology is written in the compose file format, so the same description serves three
engines: ``docker-compose`` on one host (untraced), ``./cli.py trace --compose FILE`` (traced,
one host), and, later, ``docker stack deploy`` across a Swarm or Kubernetes through a converter
(docs/topologies.md says how each key maps). The file is resolved by ``docker-compose config``
itself (variable interpolation, ``extends``, anchors, relative paths), so it means here exactly
what it means to compose.

Keys used per service: ``image`` (required: build images first), ``entrypoint`` and
``command`` (run after the tracer's barrier), ``environment``, ``volumes`` (bind mounts only;
read-write unless ``:ro``, as compose has it), ``working_dir``, ``mem_limit`` or
``deploy.resources.limits.memory``, ``cpus`` or ``deploy.resources.limits.cpus``,
``shm_size``, the GPU reservation ``deploy.resources.reservations.devices`` (an entry with
``capabilities: [gpu]`` and ``count`` (a number or ``all``; neither count nor ``device_ids``
means all, as in compose) or ``device_ids``: what docker's ``--gpus`` would ask for, see
:func:`service_gpus`), ``deploy.placement.constraints`` (on a run across nodes, ``--nodes``:
tracing/placement.py), and ``labels`` ``twintrace.daemon: "true"`` for a service that runs until
the others are done. Every run has a private internal network of its own on which services reach
each other by name, so ``networks``, ``ports`` and ``network_mode`` are ignored, with a
warning, as are keys that do not apply to a traced run (``build``, ``depends_on``,
``restart``, ...): every service is held at the barrier and released at once.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from core.errors import UserError
from core.units import parse_size
from tracing.container import OUT_MOUNT, BindMount, gpu_request
from tracing.request import ContainerSpec, RunOptions, RunRequest

USED_KEYS = frozenset(
    {
        "image",
        "entrypoint",
        "command",
        "environment",
        "volumes",
        "working_dir",
        "mem_limit",
        "cpus",
        "pids_limit",
        "shm_size",
        "deploy",
        "labels",
    }
)
DAEMON_LABEL = "twintrace.daemon"


def resolve(compose_file: Path) -> dict[str, Any]:
    """The compose file as ``docker-compose config`` resolves it (a mapping)."""
    exe = shutil.which("docker-compose")
    if exe is None:
        raise UserError(
            "docker-compose is not installed: run `make setup` as root "
            "(apt-get install docker-compose)"
        )
    compose_file = Path(compose_file).resolve()
    try:
        done = subprocess.run(
            [exe, "-f", str(compose_file), "config"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=compose_file.parent,
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"`docker-compose config` did not answer within 60 s for {compose_file}"
        ) from None
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        raise UserError(f"{compose_file} is not a valid compose file: {tail}")
    data = yaml.safe_load(done.stdout)
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise UserError(f"{compose_file} has no services")
    return data


def topology_request(
    compose_file: Path,
    runs_root: Path,
    *,
    services: Sequence[str] = (),
    run: RunOptions | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunRequest:
    """A run of the compose file's ``services`` (all when empty), one container each.

    ``run.limits`` apply to services that set none of their own."""
    data = resolve(compose_file)
    defined: Mapping[str, Any] = data["services"]
    chosen = list(services) or list(defined)
    unknown = [s for s in chosen if s not in defined]
    if unknown:
        raise UserError(
            f"{compose_file} has no service {unknown[0]!r}; its services: {', '.join(defined)}"
        )
    run = run or RunOptions()
    ignored: set[str] = set()
    containers = []
    for name in chosen:
        service = defined[name] or {}
        ignored |= set(service) - USED_KEYS
        containers.append(service_spec(name, service, run, Path(compose_file).parent))
    if run.nodes is None and any(c.constraints for c in containers) and warn is not None:
        warn(
            f"ignored in {compose_file}: deploy.placement (it places services on the nodes of "
            "a run across nodes, --nodes)"
        )
    if ignored and warn is not None:
        warn(
            f"ignored in {compose_file} (a traced run has its own network and starts every "
            f"service at once): {', '.join(sorted(ignored))}"
        )
    return RunRequest(
        label=Path(compose_file).stem,
        runs_root=Path(runs_root),
        containers=tuple(containers),
        run=run,
        source=str(Path(compose_file).resolve()),
    )


def service_spec(
    name: str, service: Mapping[str, Any], run: RunOptions, base: Path
) -> ContainerSpec:
    """One compose service as a container of the run (``run``: the defaults for limits and
    GPUs a service does not set itself)."""
    limits = run.limits
    where = f"service {name}"
    image = service.get("image")
    if not image:
        raise UserError(f"{where} has no image: build it and name it with `image:`")
    entrypoint = _argv(service.get("entrypoint"), f"{where}: entrypoint")
    command = _argv(service.get("command"), f"{where}: command")
    # The tracer's barrier takes the image's ENTRYPOINT's place: the service runs entrypoint +
    # command as given, or, with neither, the image's own ENTRYPOINT + CMD.
    given = entrypoint is not None or command is not None
    mounts = tuple(_mount(v, f"{where}: volumes", base) for v in service.get("volumes") or [])
    resources = ((service.get("deploy") or {}).get("resources") or {}).get("limits") or {}
    memory = service.get("mem_limit") or resources.get("memory")
    cpus = service.get("cpus") or resources.get("cpus")
    pids = service.get("pids_limit") or resources.get("pids")
    labels = service.get("labels") or {}
    if isinstance(labels, list):
        labels = dict(item.split("=", 1) for item in labels if "=" in item)
    return ContainerSpec(
        role=name,
        image=str(image),
        command=tuple((entrypoint or []) + (command or [])) if given else None,
        mounts=mounts,
        environment=_environment(service.get("environment"), where),
        memory_bytes=parse_size(memory) if memory else limits.memory_bytes,
        cpus=float(cpus) if cpus else limits.cpus,
        pids_limit=int(pids) if pids else limits.pids,
        shm_bytes=parse_size(service["shm_size"]) if service.get("shm_size") else 1 << 30,
        working_dir=service.get("working_dir"),
        # A service that mounts its own output directory keeps it (its MLLOG is copied).
        out=not any(m.target == OUT_MOUNT for m in mounts),
        daemon=str(labels.get(DAEMON_LABEL, "")).lower() in ("1", "true", "yes"),
        gpus=service_gpus(service, where) or run.gpus,
        constraints=_constraints(service, where),
    )


def _constraints(service: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """``deploy.placement.constraints``, each checked to be a constraint the swarm knows
    (tracing/placement.py: CONSTRAINT)."""
    from tracing.placement import parse_constraint

    placement = (service.get("deploy") or {}).get("placement") or {}
    found = placement.get("constraints") or []
    if not isinstance(found, list):
        raise UserError(f"{where}: deploy.placement.constraints must be a list")
    for text in found:
        parse_constraint(str(text), f"{where}: deploy.placement.constraints")
    return tuple(str(text) for text in found)


def service_gpus(service: Mapping[str, Any], where: str) -> str | None:
    """The GPUs a compose service reserves, as ``--gpus`` text (``all``, a count ``N``, or
    ``device=0,1``), or None when it reserves none.

    Compose's form (``deploy.resources.reservations.devices``, as ``docker-compose config``
    prints it)::

        devices:
          - capabilities: [gpu]     # required: entries without "gpu" are not GPUs
            driver: nvidia          # optional
            count: 2                # or `all`; or device_ids: ["0", "3"]; neither: all

    One GPU entry per service (docker's ``--gpus`` is one request); ``count`` and ``device_ids``
    together are refused, as docker refuses them."""
    reservations = ((service.get("deploy") or {}).get("resources") or {}).get("reservations")
    devices = (reservations or {}).get("devices") or []
    if not isinstance(devices, list):
        raise UserError(f"{where}: deploy.resources.reservations.devices must be a list")
    gpu_entries = [
        d for d in devices if isinstance(d, Mapping) and "gpu" in _capabilities(d, where)
    ]
    if not gpu_entries:
        return None
    if len(gpu_entries) > 1:
        raise UserError(
            f"{where}: {len(gpu_entries)} GPU device reservations; a traced run's container "
            "takes one (docker's --gpus): merge them into one entry"
        )
    (entry,) = gpu_entries
    count, ids = entry.get("count"), entry.get("device_ids")
    if count is not None and ids:
        raise UserError(f"{where}: a GPU reservation sets count or device_ids, not both")
    if ids:
        if not isinstance(ids, list) or not all(isinstance(i, str | int) for i in ids):
            raise UserError(f"{where}: device_ids must be a list of GPU ids, got {ids!r}")
        texts = [str(i).strip() for i in ids]
        # docker's explicit form: a lone index would read as a GPU count to --gpus.
        text = "device=" + ",".join(texts)
    elif count is None or str(count).strip().lower() in ("all", "-1"):
        text = "all"
    elif (isinstance(count, int) and not isinstance(count, bool)) or str(count).isdigit():
        text = str(count)
    else:
        raise UserError(f"{where}: GPU count must be a number or all, got {count!r}")
    try:
        gpu_request(text)
    except UserError as exc:
        raise UserError(f"{where}: GPU reservation: {exc}") from None
    return text


def _capabilities(device: Mapping[str, Any], where: str) -> list[str]:
    """A device reservation's capabilities, flat (compose allows a list of lists, as docker's
    API has them)."""
    caps = device.get("capabilities") or []
    if not isinstance(caps, list):
        raise UserError(f"{where}: device capabilities must be a list, got {caps!r}")
    flat: list[str] = []
    for cap in caps:
        flat += [str(c) for c in cap] if isinstance(cap, list) else [str(cap)]
    return flat


def _argv(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list):
        return [str(v) for v in value]
    raise UserError(f"{where}: expected a string or a list, got {type(value).__name__}")


def _environment(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, list):
        return dict((item.split("=", 1) if "=" in item else (item, "")) for item in map(str, value))
    raise UserError(f"{where}: environment must be a mapping or a list")


def _mount(value: Any, where: str, base: Path) -> BindMount:
    """A bind mount from compose's short (``SRC:DST[:ro]``) or long syntax."""
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) < 2:
            raise UserError(f"{where}: {value!r} is a volume, not a bind mount: use SRC:DST")
        source, target = parts[0], parts[1]
        read_only = len(parts) > 2 and "ro" in parts[2].split(",")
    elif isinstance(value, dict):
        if value.get("type", "bind") != "bind":
            raise UserError(
                f"{where}: only bind mounts are traced runs' volumes, got type {value.get('type')}"
            )
        source, target = str(value.get("source", "")), str(value.get("target", ""))
        read_only = bool(value.get("read_only", False))
    else:
        raise UserError(f"{where}: cannot read volume {value!r}")
    path = (base / source).resolve() if not Path(source).is_absolute() else Path(source)
    if not source or not path.exists():
        raise UserError(f"{where}: bind-mount source {path} does not exist")
    if not target.startswith("/"):
        raise UserError(f"{where}: mount target {target!r} must be an absolute path")
    return BindMount(path, target, read_only)
