"""DLIO runs of the zoo's workloads: its dataset made next to ours, and a traced run request.

``./cli.py trace --workload W --variant dlio --data DIR`` comes here (:func:`dlio_request`):

1. **The dataset.** DLIO reads only what its own generator writes (npz, indexed binary, JPEG
   ...), so DIR gets a mirror, ``DIR-dlio/`` beside it (:func:`mirror_dataset`): the dataset of
   :func:`workloads.dlio.dataset_spec` (file count and sizes measured from DIR's manifest),
   written by DLIO's own generator in the ``twintrace/dlio`` image, with a ``manifest.json`` of
   ours that records both (DLIO's configuration, its source DIR and the source manifest's
   hash, the sizes DLIO actually wrote). It is made once and reused while DIR's manifest and
   the derived configuration are unchanged; it appears whole or not at all (written into a
   temporary directory that is renamed).
2. **The run.** DLIO's configuration (:func:`workloads.dlio.workload_config`) from the run's
   settings and the SAME sleep profile the ``sleep`` variant would use (``--profile``,
   ``--accelerator`` from the profile database, or the workload's shipped default), written
   into the container's control directory; ``--accelerators G`` is G MPI ranks in the one
   container. The runner traces it like any run; its phases come from DLIO's own outputs
   (:mod:`tracing.dlio`).
3. **Rank containers** (``--rank-containers``, and so across the nodes of a swarm with
   ``--nodes K``): one container per rank, ``rank0`` .. ``rank<G-1>`` on the run's private
   network (across nodes, its overlay network). Rank 0's container runs ``mpirun`` over every
   rank's container, one slot each (:func:`mpirun_command`); Open MPI's launcher starts its
   daemon in each other rank's container through ``twintrace-rsh`` (images/dlio/rsh.py), the
   remote shell each of them serves as its first process, with a token of the run instead of
   ssh and its keys. Every rank writes its own outputs (``out/rank<r>/dlio/``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from core.errors import SettingError, UserError
from datagen.common import MARKER_NAME, load_manifest, write_manifest
from store.hostprofiles import foreign_fix, rank_threads, warn_if_foreign
from tracing import container
from tracing.container import BindMount
from tracing.request import (
    ContainerSpec,
    RunOptions,
    RunRequest,
    accelerator_profile,
    read_throttle,
)
from workloads import dlio
from workloads.config import WorkloadConfig

Log = Callable[[str], None]
#: Pillow's default JPEG quality, which DLIO's generator uses.
_JPEG_QUALITY = 75


def mirror_dir(data_dir: Path, spec: dlio.DatasetSpec | None = None) -> Path:
    """Where the DLIO mirror of ``data_dir`` lives: ``<data_dir>-dlio`` beside it (DLRM's,
    whose DLIO samples are batches: ``<data_dir>-dlio-b<batch>``)."""
    data_dir = Path(data_dir).resolve()
    suffix = f"-b{spec.batch_samples}" if spec is not None and spec.batch_samples > 1 else ""
    return data_dir.parent / f"{data_dir.name}-dlio{suffix}"


def jpeg_bytes_per_pixel(mean_bytes: float) -> float:
    """Bytes per pixel of the JPEGs DLIO's generator writes (greyscale uniform noise, Pillow's
    default quality) at about ``mean_bytes``: measured with this host's Pillow on one image."""
    import numpy as np
    from PIL import Image

    side = max(8, int(math.sqrt(max(mean_bytes, 64.0))))
    for _ in range(2):  # the ratio moves a little with the size: measure at the size it gives
        pixels = np.random.default_rng(10).integers(0, 255, size=(side, side), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=_JPEG_QUALITY)
        ratio = buffer.tell() / (side * side)
        side = max(8, int(math.sqrt(mean_bytes / ratio)))
    return ratio


def dataset_spec_of(data_dir: Path, batch_size: int = 1) -> tuple[dlio.DatasetSpec, dict[str, Any]]:
    """The DLIO dataset standing for ``data_dir`` (for runs of ``batch_size``: DLRM's DLIO
    samples are batches) and ``data_dir``'s manifest."""
    manifest = load_manifest(data_dir)
    ratio = 1.0
    if manifest.get("generator") == "images":
        train = [int(f["bytes"]) for f in manifest["files"] if str(f["name"]).startswith("train/")]
        if train:
            ratio = jpeg_bytes_per_pixel(sum(train) / len(train))
    return dlio.dataset_spec(manifest, jpeg_bytes_per_pixel=ratio, batch_size=batch_size), manifest


def _fingerprint(data_dir: Path) -> str:
    return hashlib.sha256((Path(data_dir) / "manifest.json").read_bytes()).hexdigest()


def _yaml(section: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(section), sort_keys=False)


def _ranks(requested: int | None) -> int:
    return requested or max(1, min(len(os.sched_getaffinity(0)), 8))


def dlio_command(ranks: int) -> list[str]:
    """DLIO with our configuration (``CONFIG_DIR/workload/CONFIG_NAME.yaml``), as ``ranks`` MPI
    ranks; Hydra's own files under the output directory."""
    run = [
        "dlio_benchmark",
        "--config-dir",
        dlio.CONFIG_DIR,
        f"workload={dlio.CONFIG_NAME}",
        f"hydra.run.dir={dlio.OUTPUT_DIR}/hydra",
    ]
    return ["mpirun", "-np", str(ranks), *run] if ranks > 1 else run


#: Rank containers: the remote shell of Open MPI's launcher, and how it finds the token.
RSH = "twintrace-rsh"
RSH_TOKEN = "rsh.token"


def rank_role(rank: int) -> str:
    return f"rank{rank}"


def mpirun_command(ranks: int) -> list[str]:
    """Rank 0's command in rank containers: ``mpirun`` over the ``ranks`` containers, one slot
    each, mapped one rank per container (rank r in ``rank<r>``)."""
    hosts = ",".join(f"{rank_role(r)}:1" for r in range(ranks))
    return ["mpirun", "-np", str(ranks), "--host", hosts, "--map-by", "node", *dlio_command(1)]


#: Rank 0's environment in rank containers: Open MPI's launcher starts its daemons through
#: twintrace-rsh, each daemon itself (no tree of daemons starting daemons).
MPIRUN_ENVIRONMENT = {"PRTE_MCA_plm_ssh_agent": RSH, "PRTE_MCA_plm_ssh_no_tree_spawn": "1"}


def mirror_dataset(
    data_dir: Path,
    *,
    batch_size: int = 1,
    ranks: int | None = None,
    log: Log = lambda msg: None,
) -> tuple[Path, dict[str, Any]]:
    """The DLIO mirror of ``data_dir`` (module doc) for runs of ``batch_size``, made now unless
    an up-to-date one is there; returns its directory and manifest. ``ranks``: DLIO generator
    ranks (default: the CPUs, at most 8)."""
    data_dir = Path(data_dir).resolve()
    spec, source = dataset_spec_of(data_dir, batch_size)
    target = mirror_dir(data_dir, spec)
    check_image()
    fingerprint = _fingerprint(data_dir)
    wanted = {
        "dlio_version": dlio.DLIO_VERSION,
        "spec": spec.to_dict(),
        "source": str(data_dir),
        "source_manifest_sha256": fingerprint,
    }
    if (target / "manifest.json").is_file():
        try:
            existing = load_manifest(target)
        except UserError:
            existing = {}
        params = existing.get("params") or {}
        if existing.get("generator") == "dlio" and all(
            params.get(k) == v for k, v in wanted.items() if k != "source"
        ):
            return target, existing
    if target.exists() and any(target.iterdir()) and not (target / MARKER_NAME).is_file():
        raise UserError(
            f"{target} exists and was not written by twintrace: move it away, or it would be "
            f"replaced by the DLIO mirror of {data_dir}"
        )
    ranks = _ranks(ranks)
    log(
        f"generating the DLIO dataset for {data_dir.name} with DLIO's generator ({ranks} ranks): "
        f"{spec.num_files} {spec.format} files, {spec.samples} samples -> {target}"
    )
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        data = work / "data"
        data.mkdir()
        (data / MARKER_NAME).write_text(
            "Written by twintrace (DLIO's generator); may be replaced.\n"
        )
        done = run_generator(spec, data, ranks, work)
        records = done.files
        samples = [r for r in records if not r["name"].endswith(".idx")]
        written = sum(r["bytes"] for r in samples) / max(1, spec.samples)
        manifest = write_manifest(
            data,
            generator="dlio",
            seed=0,
            requested_bytes=int(source.get("total_bytes", 0)),
            files=records,
            params={
                **wanted,
                "source_generator": source.get("generator"),
                "ranks": ranks,
                "sample_bytes": round(written, 1),
                "target_sample_bytes": round(spec.target_bytes, 1),
            },
            duration_s=time.monotonic() - started,
        )
        if target.exists():
            shutil.rmtree(target)
        data.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(
        f"DLIO dataset ready: {len(records)} files, {manifest['total_bytes'] / 1e6:.1f} MB, mean "
        f"sample {manifest['params']['sample_bytes']:.0f} B (ours: {spec.target_bytes:.0f} B)"
    )
    return target, manifest


@dataclasses.dataclass(frozen=True)
class GeneratorRun:
    """What one run of DLIO's generator did: the files it wrote (name relative to the data
    directory, bytes), the wall time of the container (start-up included) and the time DLIO
    itself logs between "Starting data generation" and "Generation done"."""

    files: list[dict[str, Any]]
    wall_s: float
    generation_s: float | None

    @property
    def bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.files)


_GENERATION = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}) (Starting data generation|Generation done)"
)


def run_generator(spec: dlio.DatasetSpec, data: Path, ranks: int, work: Path) -> GeneratorRun:
    """Run DLIO's generator for ``spec`` into the (empty) directory ``data`` as ``ranks`` MPI
    ranks, its configuration and output under ``work``; a UserError with the end of its
    output when it fails or writes another number of files than asked."""
    ctl = work / "ctl"
    out = work / "out"
    for d in (ctl / "dlio" / "workload", out):
        d.mkdir(parents=True, exist_ok=True)
    (ctl / "dlio" / "workload" / f"{dlio.CONFIG_NAME}.yaml").write_text(
        _yaml(dlio.generator_config(spec))
    )
    log_path = work / "dlio-datagen.log"
    started = time.monotonic()
    code = container.run_to_completion(
        container.client(),
        dlio.DLIO_IMAGE,
        dlio_command(ranks),
        [
            BindMount(data, dlio.DATA_DIR, False),
            BindMount(ctl, container.CTL_MOUNT, True),
            BindMount(out, container.OUT_MOUNT, False),
        ],
        label=f"dlio-datagen-{os.getpid()}",
        log_path=log_path,
        environment={"TZ": "UTC", "MPI4PY_RC_FINALIZE": "false"},
        working_dir=container.OUT_MOUNT,
    )
    wall = time.monotonic() - started
    text = log_path.read_text(errors="replace")
    if code != 0:
        tail = text.strip().splitlines()
        raise UserError(
            f"DLIO's generator exited with code {code}: " + (" | ".join(tail[-3:]) or "no output")
        )
    files = sorted((p for p in data.rglob("*") if p.is_file() and p.name != MARKER_NAME), key=str)
    records = [{"name": str(p.relative_to(data)), "bytes": p.stat().st_size} for p in files]
    written = [r for r in records if not r["name"].endswith(".idx")]
    if len(written) != spec.num_files:
        raise UserError(
            f"DLIO's generator wrote {len(written)} data files, {spec.num_files} were asked: "
            "its output ends with " + " | ".join(text.strip().splitlines()[-3:])
        )
    marks = {m.group(2): m.group(1) for m in _GENERATION.finditer(text)}
    span = None
    if len(marks) == 2:
        fmt = "%Y-%m-%dT%H:%M:%S.%f"
        begin = datetime.strptime(marks["Starting data generation"], fmt)
        end = datetime.strptime(marks["Generation done"], fmt)
        span = (end - begin).total_seconds()
    return GeneratorRun(records, wall, span)


VERSION_LABEL = "org.twintrace.dlio.version"


def check_image() -> None:
    """That twintrace/dlio is built and holds the DLIO this twintrace configures; a one-line
    UserError saying how to build it otherwise."""
    import docker.errors

    try:
        image = container.client().images.get(dlio.DLIO_IMAGE)
    except docker.errors.ImageNotFound:
        raise UserError(
            f"{dlio.DLIO_IMAGE} is not built: run `./cli.py build --variant dlio`"
        ) from None
    found = (image.labels or {}).get(VERSION_LABEL)
    if found != dlio.DLIO_VERSION:
        raise UserError(
            f"{dlio.DLIO_IMAGE} holds DLIO {found or 'of no known version'}, this twintrace "
            f"configures DLIO {dlio.DLIO_VERSION}: run `./cli.py build --variant dlio`"
        )


def checkpoint_bytes(config: WorkloadConfig, data_dir: Path, profile: Any) -> int:
    """The size of a checkpoint of ``config``'s model: the profile's when it says, else 4
    bytes per parameter (counted on torch's meta device: nothing is allocated)."""
    if profile.checkpoint_bytes is not None:
        return int(profile.checkpoint_bytes)
    from workloads.emulation import parameter_count
    from workloads.registry import WORKLOADS

    spec = WORKLOADS[config.workload]
    sleep = config.replace(variant="sleep")
    return 4 * parameter_count(spec.task_of(sleep, data_dir))


def dlio_request(
    workload: str,
    data_dir: Path | None,
    runs_root: Path,
    *,
    settings: Mapping[str, Any] | None = None,
    options: Mapping[str, str] | None = None,
    profile: Path | None = None,
    accelerator: str | None = None,
    profile_model: str | None = None,
    run: RunOptions | None = None,
    rank_containers: bool = False,
    log: Log = lambda msg: None,
) -> RunRequest:
    """A traced DLIO run standing for ``workload``'s run with ``settings`` (module doc);
    ``rank_containers``: one container per rank."""
    run = run or RunOptions()
    from workloads.profile import default_profile, load_profile
    from workloads.registry import get_workload

    spec = get_workload(workload)
    if data_dir is None:
        raise SettingError(
            "{data} is required: generate a dataset with "
            "`./cli.py datagen {generator} --out DIR --size 1GB`",
            generator=spec.datagen,
        )
    settings = dict(settings or {})
    if settings.get("synthetic"):
        raise SettingError("{synthetic} is not for the dlio variant: DLIO always reads its dataset")
    data_dir = Path(data_dir).resolve()
    spec.check_data(data_dir)
    options = dict(options or {})
    spec.parse_options(options)
    config = spec.config(dlio.DLIO_VARIANT, options=options, **settings)
    if rank_containers and config.accelerators < 2:
        raise SettingError("{rank_containers} needs {accelerators} 2 or more")
    check_image()
    as_sleep = config.replace(variant="sleep")
    if accelerator is not None or profile_model is not None:
        chosen = accelerator_profile(as_sleep, accelerator, profile_model, profile, options)
    elif profile is not None:
        chosen = load_profile(profile)
    else:
        chosen = default_profile(workload)
    warn_if_foreign(
        chosen,
        rank_threads(config.accelerators, config.threads),
        foreign_fix(workload, config.batch_size),
    )
    ckpt = checkpoint_bytes(config, data_dir, chosen)
    gradients = chosen.collective.gradient_bytes
    if gradients is None:
        gradients = ckpt
    compute = dlio.computation(chosen, config, gradients)
    mirror, manifest = mirror_dataset(data_dir, batch_size=config.batch_size, log=log)
    dataset = dlio.DatasetSpec.from_dict(manifest["params"]["spec"])
    section = dlio.workload_config(config, dataset, compute, ckpt)
    text = _yaml(section)
    peer = {
        "tool": "dlio",
        "version": dlio.DLIO_VERSION,
        "dataset": str(mirror),
        "source_dataset": str(data_dir),
        "profile": {"accelerator": chosen.accelerator, "source": chosen.source},
        "computation_s": {"mean": compute.mean_s, "stdev": compute.stdev_s, **compute.parts},
        "checkpoint_bytes": ckpt,
        "substitutions": list(dataset.substitutions),
        # DLIO's samples per step are batch_size / this: the phases count ours (tracing.dlio)
        "samples_per_dlio_sample": dataset.batch_samples,
        "files_read": section["dataset"]["num_files_train"],
        "config": json.loads(json.dumps(section)),
    }
    member = ContainerSpec(
        role="main",
        image=dlio.DLIO_IMAGE,
        command=tuple(dlio_command(config.accelerators)),
        config=config,
        ctl_files={f"dlio/workload/{dlio.CONFIG_NAME}.yaml": text},
        mounts=(BindMount(mirror, dlio.DATA_DIR, True),),
        environment={"TZ": "UTC", "MPI4PY_RC_FINALIZE": "false"},
        working_dir=container.OUT_MOUNT,
        memory_bytes=run.limits.memory_bytes,
        cpus=run.limits.cpus,
        pids_limit=run.limits.pids,
        device_read_bps=read_throttle(mirror, run.limits.read_bps),
    )
    members: tuple[ContainerSpec, ...] = (member,)
    if rank_containers:
        peer["rank_containers"] = True
        # A secret of the run: only its own containers start commands in each other.
        files = {**member.ctl_files, RSH_TOKEN: secrets.token_hex(16) + "\n"}
        members = tuple(
            dataclasses.replace(
                member,
                role=rank_role(r),
                config=config.replace(rank=r),
                command=tuple(mpirun_command(config.accelerators) if r == 0 else [RSH, "--serve"]),
                environment={**member.environment, **(MPIRUN_ENVIRONMENT if r == 0 else {})},
                ctl_files=files,
            )
            for r in range(config.accelerators)
        )
    return RunRequest(
        label=workload,
        variant=dlio.DLIO_VARIANT,
        runs_root=Path(runs_root),
        containers=members,
        config=config,
        run=run,
        peer=peer,
    )
