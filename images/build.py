"""Build the twintrace images with the Docker SDK, skipping the ones that are up to date.

Images and their inputs:
- ``twintrace/os:bookworm`` (only without a registry): a Debian root made by debootstrap and
  imported with ``docker import``;
- ``twintrace/base:latest`` from ``Dockerfile.base`` and a wheelhouse of
  ``images/requirements.txt`` downloaded on the host;
- ``twintrace/<workload>:<variant>`` from ``images/<workload>/Dockerfile`` and ``workloads/``.

Each built image carries the label ``twintrace.inputs-hash``: a hash of everything it was built
from (files, build arguments, the parent image id). An image whose label matches is skipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import docker
import docker.errors

from core.errors import UserError
from workloads.config import VARIANTS

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
BASE_CONTEXT = CACHE / "base-context"
BASE_TAG = "twintrace/base:latest"
OS_TAG = "twintrace/os:bookworm"
REGISTRY_BASE = "python:3.11-slim"
HASH_LABEL = "twintrace.inputs-hash"
# One image per workload and variant: images/<workload>/Dockerfile.
IMAGE_WORKLOADS = ("unet3d", "bert", "dlrm", "resnet18", "resnet50", "alexnet")

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class BuildResult:
    tag: str
    image_id: str
    built: bool  # False when the existing image was up to date


def workload_tag(workload: str, variant: str) -> str:
    return f"twintrace/{workload}:{variant}"


def _hash_files(paths: Iterable[Path], extra: Iterable[str] = ()) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        if "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        h.update(str(path.relative_to(REPO)).encode())
        h.update(path.read_bytes())
    for item in extra:
        h.update(item.encode())
    return h.hexdigest()[:16]


def _existing_hash(cli: docker.DockerClient, tag: str) -> tuple[str | None, str | None]:
    try:
        image = cli.images.get(tag)
    except docker.errors.ImageNotFound:
        return None, None
    return (image.labels or {}).get(HASH_LABEL), image.id


def _stream_build(cli: docker.DockerClient, log: Log, **kwargs: object) -> str:
    """Run a build, forwarding its output lines to ``log``; return the image id."""
    tail: list[str] = []
    image_id = None
    try:
        for chunk in cli.api.build(decode=True, rm=True, forcerm=True, **kwargs):
            if "error" in chunk:
                raise UserError(
                    f"building {kwargs.get('tag')} failed: {chunk['error'].strip()}\n"
                    + "\n".join(tail[-10:])
                )
            line = (chunk.get("stream") or "").rstrip()
            if line:
                tail.append(line)
                log(line)
            aux = chunk.get("aux")
            if isinstance(aux, dict) and "ID" in aux:
                image_id = aux["ID"]
    except docker.errors.APIError as exc:
        raise UserError(f"building {kwargs.get('tag')} failed: {exc.explanation or exc}") from None
    if image_id is None:
        image_id = cli.images.get(str(kwargs["tag"])).id
    return image_id


def prepare_wheelhouse(log: Log) -> Path:
    """Fetch (or build) the pinned wheels of images/requirements.txt for the host's Python."""
    wheelhouse = BASE_CONTEXT / "wheelhouse"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    req = REPO / "images" / "requirements.txt"
    marker = wheelhouse / "requirements.txt"
    if marker.exists() and marker.read_bytes() == req.read_bytes():
        return wheelhouse
    log(f"downloading wheels into {wheelhouse}")
    # `pip wheel` takes published wheels as they are and builds one from a source-only release.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "-q",
        "-w",
        str(wheelhouse),
        "-r",
        str(req),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(
            f"could not download the image's Python wheels: {done.stderr.strip().splitlines()[-1:]}; "
            "check that PyPI is reachable from this host"
        )
    shutil.copyfile(req, marker)  # written last: marks a complete wheelhouse
    return wheelhouse


def bootstrap_os_image(cli: docker.DockerClient, log: Log) -> str:
    """Make twintrace/os:bookworm with debootstrap + docker import (no registry needed)."""
    if shutil.which("debootstrap") is None:
        raise UserError(
            "debootstrap is not installed: run `make setup` as root (apt-get install debootstrap)"
        )
    log("bootstrapping a Debian bookworm root with debootstrap (about a minute)")
    with tempfile.TemporaryDirectory(
        prefix="twintrace-rootfs-", dir=CACHE if CACHE.exists() else None
    ) as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,ca-certificates",
            "bookworm",
            str(rootfs),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise UserError(
                "debootstrap failed: "
                + " ".join(
                    done.stdout.strip().splitlines()[-3:] + done.stderr.strip().splitlines()[-3:]
                )
            )
        log("importing the root filesystem as " + OS_TAG)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            cli.api.import_image_from_stream(
                tar.stdout, repository=OS_TAG.split(":")[0], tag=OS_TAG.split(":")[1]
            )
        finally:
            tar.stdout.close()
            tar.wait()
    return cli.images.get(OS_TAG).id


def resolve_base_os(
    cli: docker.DockerClient, log: Log, base_image: str | None, bootstrap: bool
) -> str:
    """Pick the OS image under twintrace/base: explicit, registry, or bootstrapped locally."""
    if bootstrap:
        # An existing twintrace/os image is reused; `docker rmi twintrace/os:bookworm` forces a new one.
        if not _has(cli, OS_TAG):
            bootstrap_os_image(cli, log)
        return OS_TAG
    if base_image:
        if not _has(cli, base_image) and not _try_pull(cli, base_image, log):
            raise UserError(
                f"base image {base_image} is neither local nor pullable: use --bootstrap-base to make one with debootstrap"
            )
        return base_image
    for candidate in (REGISTRY_BASE, OS_TAG):
        if _has(cli, candidate):
            return candidate
    if _try_pull(cli, REGISTRY_BASE, log):
        return REGISTRY_BASE
    log(f"no registry reachable for {REGISTRY_BASE}: bootstrapping a local base instead")
    bootstrap_os_image(cli, log)
    return OS_TAG


def _has(cli: docker.DockerClient, tag: str) -> bool:
    try:
        cli.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _try_pull(cli: docker.DockerClient, tag: str, log: Log) -> bool:
    log(f"pulling {tag}")
    try:
        cli.images.pull(tag)
        return True
    except docker.errors.APIError as exc:
        log(f"pull failed: {str(exc.explanation or exc)[:160]}")
        return False


def build_base(
    cli: docker.DockerClient, log: Log, base_image: str | None = None, bootstrap: bool = False
) -> BuildResult:
    os_image = resolve_base_os(cli, log, base_image, bootstrap)
    os_id = cli.images.get(os_image).id
    wheelhouse = prepare_wheelhouse(log)
    inputs = _hash_files([REPO / "Dockerfile.base", *wheelhouse.iterdir()], [os_image, os_id])
    current, image_id = _existing_hash(cli, BASE_TAG)
    if current == inputs and image_id:
        return BuildResult(BASE_TAG, image_id, False)
    log(f"building {BASE_TAG} on {os_image}")
    image_id = _stream_build(
        cli,
        log,
        path=str(BASE_CONTEXT),
        dockerfile=str(REPO / "Dockerfile.base"),
        tag=BASE_TAG,
        buildargs={"BASE_IMAGE": os_image},
        labels={HASH_LABEL: inputs},
    )
    return BuildResult(BASE_TAG, image_id, True)


def build_workload(
    cli: docker.DockerClient, workload: str, variant: str, base_id: str, log: Log
) -> BuildResult:
    tag = workload_tag(workload, variant)
    dockerfile = REPO / "images" / workload / "Dockerfile"
    inputs = _hash_files(
        [dockerfile, *(p for p in (REPO / "workloads").rglob("*") if p.is_file())],
        [variant, base_id],
    )
    current, image_id = _existing_hash(cli, tag)
    if current == inputs and image_id:
        return BuildResult(tag, image_id, False)
    log(f"building {tag}")
    image_id = _stream_build(
        cli,
        log,
        path=str(REPO),
        dockerfile=f"images/{workload}/Dockerfile",
        tag=tag,
        buildargs={"VARIANT": variant, "BASE_TAG": BASE_TAG},
        labels={HASH_LABEL: inputs},
    )
    return BuildResult(tag, image_id, True)


def build(
    cli: docker.DockerClient,
    workloads: Iterable[str] | None = None,
    variants: Iterable[str] | None = None,
    log: Log = lambda line: None,
    base_image: str | None = None,
    bootstrap_base: bool = False,
) -> list[BuildResult]:
    """Build what is missing or out of date; return every requested image with its state."""
    chosen = list(workloads or IMAGE_WORKLOADS)
    for name in chosen:
        if name not in IMAGE_WORKLOADS:
            raise UserError(
                f"unknown workload {name!r}: choose one of {', '.join(IMAGE_WORKLOADS)}"
            )
    chosen_variants = list(variants or VARIANTS)
    for variant in chosen_variants:
        if variant not in VARIANTS:
            raise UserError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    CACHE.mkdir(exist_ok=True)
    base = build_base(cli, log, base_image, bootstrap_base)
    results = [base]
    for name in chosen:
        for variant in chosen_variants:
            results.append(build_workload(cli, name, variant, base.image_id, log))
    return results
