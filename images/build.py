"""Build the twintrace images with the Docker SDK, skipping the ones that are up to date.

Images and their inputs:
- ``twintrace/os:bookworm`` (only without a registry): a Debian root made by debootstrap and
  imported with ``docker import``;
- ``twintrace/base:latest`` from ``Dockerfile.base`` and a wheelhouse of
  ``images/requirements.txt`` downloaded on the host;
- ``twintrace/<workload>:<variant>``, one per workload of ``workloads/registry.py`` and variant
  it supports, from ``images/Dockerfile.workload`` (or ``images/<workload>/Dockerfile`` where a
  workload has its own) with the build arguments ``WORKLOAD`` and ``VARIANT``. The build context
  is the repository root filtered by ``.dockerignore``: ``workloads/`` and ``core/`` without its
  host-only modules.

Each built image carries the label ``twintrace.inputs-hash``: a hash of everything it was built
from (the files of its build context, build arguments, the parent image id). An image whose
label matches is skipped. A workload image's files are listed by :func:`context_files` with the
rules docker itself applies to the context (``.dockerignore``, the Dockerfile always sent), so
editing host-only code (``tracing/``, ``analysis/``, ``core/rundir.py``, ``cli.py``...) rebuilds
nothing, and editing anything that goes into the images rebuilds them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import docker
import docker.errors
from docker.utils.build import exclude_paths

from core.errors import UserError
from workloads.config import BASE_TAG, VARIANTS, image_tag

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
BASE_CONTEXT = CACHE / "base-context"
OS_TAG = "twintrace/os:bookworm"
REGISTRY_BASE = "python:3.11-slim"
HASH_LABEL = "twintrace.inputs-hash"
# The Dockerfile of every workload image, relative to the repository root (the build context).
WORKLOAD_DOCKERFILE = "images/Dockerfile.workload"

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class BuildResult:
    tag: str
    image_id: str
    built: bool  # False when the existing image was up to date


def image_matrix() -> list[tuple[str, str]]:
    """Every workload image as (workload, variant): the registry's workloads, their variants."""
    from workloads.registry import WORKLOADS  # imports numpy: only when images are listed

    return [(name, variant) for name, spec in WORKLOADS.items() for variant in spec.variants]


def workload_dockerfile(workload: str, root: Path = REPO) -> str:
    """The Dockerfile of ``workload``'s images, relative to ``root``: its own if it has one."""
    own = f"images/{workload}/Dockerfile"
    return own if (root / own).is_file() else WORKLOAD_DOCKERFILE


def workload_build_args(workload: str, variant: str) -> dict[str, str]:
    """The build arguments of ``twintrace/<workload>:<variant>`` (compose passes the same)."""
    return {"WORKLOAD": workload, "VARIANT": variant, "BASE_TAG": BASE_TAG}


def dockerignore_patterns(root: Path = REPO) -> list[str]:
    """The patterns of ``root/.dockerignore``, read as the Docker SDK reads them."""
    path = root / ".dockerignore"
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def context_files(root: Path = REPO, dockerfile: str = WORKLOAD_DOCKERFILE) -> list[str]:
    """The paths (files and directories, relative to ``root``) of the build context that docker
    sends for ``dockerfile``: the SDK's own ``exclude_paths`` over ``.dockerignore``, which
    also keeps the Dockerfile and ``.dockerignore`` themselves."""
    return sorted(exclude_paths(str(root), dockerignore_patterns(root), dockerfile=dockerfile))


def context_hash(root: Path = REPO, dockerfile: str = WORKLOAD_DOCKERFILE) -> str:
    """A hash of the build context: each entry's path, type, permission bits and content."""
    h = hashlib.sha256()
    for rel in context_files(root, dockerfile):
        path = root / rel
        info = path.lstat()
        h.update(f"{rel}\0{oct(stat.S_IMODE(info.st_mode))}\0".encode())
        if stat.S_ISLNK(info.st_mode):
            h.update(b"link\0" + os.readlink(path).encode())
        elif stat.S_ISDIR(info.st_mode):
            h.update(b"dir\0")
        else:
            h.update(b"file\0%d\0" % info.st_size + path.read_bytes())
    return h.hexdigest()


def workload_inputs_hash(
    workload: str, variant: str, base_id: str, root: Path = REPO, context: str | None = None
) -> str:
    """The ``twintrace.inputs-hash`` of ``twintrace/<workload>:<variant>`` built on ``base_id``.

    ``context``: :func:`context_hash` of the workload's Dockerfile, when already computed."""
    if context is None:
        context = context_hash(root, workload_dockerfile(workload, root))
    h = hashlib.sha256(context.encode())
    h.update(workload_dockerfile(workload, root).encode())
    for key, value in sorted(workload_build_args(workload, variant).items()):
        h.update(f"\0{key}={value}".encode())
    h.update(f"\0{base_id}".encode())
    return h.hexdigest()[:16]


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
    cli: docker.DockerClient,
    workload: str,
    variant: str,
    base_id: str,
    log: Log,
    context: str | None = None,
) -> BuildResult:
    """Build ``twintrace/<workload>:<variant>`` unless its inputs hash is already its label."""
    tag = image_tag(workload, variant)
    dockerfile = workload_dockerfile(workload)
    inputs = workload_inputs_hash(workload, variant, base_id, context=context)
    current, image_id = _existing_hash(cli, tag)
    if current == inputs and image_id:
        return BuildResult(tag, image_id, False)
    log(f"building {tag}")
    image_id = _stream_build(
        cli,
        log,
        path=str(REPO),
        dockerfile=dockerfile,
        tag=tag,
        buildargs=workload_build_args(workload, variant),
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
    matrix = image_matrix()
    known = list(dict.fromkeys(name for name, _ in matrix))
    chosen = list(workloads or known)
    for name in chosen:
        if name not in known:
            raise UserError(f"unknown workload {name!r}: choose one of {', '.join(known)}")
    chosen_variants = list(variants or VARIANTS)
    for variant in chosen_variants:
        if variant not in VARIANTS:
            raise UserError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    CACHE.mkdir(exist_ok=True)
    base = build_base(cli, log, base_image, bootstrap_base)
    results = [base]
    contexts: dict[str, str] = {}  # Dockerfile -> context hash, computed once per build
    for name in chosen:
        dockerfile = workload_dockerfile(name)
        if dockerfile not in contexts:
            contexts[dockerfile] = context_hash(REPO, dockerfile)
        for variant in chosen_variants:
            if (name, variant) in matrix:
                results.append(
                    build_workload(cli, name, variant, base.image_id, log, contexts[dockerfile])
                )
    return results
