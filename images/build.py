"""Build the twintrace images with the Docker SDK, skipping the ones that are up to date.

Images and their inputs:
- ``twintrace/os:bookworm`` (only without a registry): a Debian root made by debootstrap and
  imported with ``docker import``;
- ``twintrace/base:latest`` from ``Dockerfile.base`` and a wheelhouse downloaded on the host:
  ``images/requirements.txt`` with the CPU build of torch (``--torch cpu``, the default), or
  with the CUDA build and its nvidia-* and triton wheels of ``images/requirements-cuda.txt``
  instead (``--torch cuda``). Each part of the wheelhouse is kept in a directory of its own
  under ``.cache/wheelhouse/`` (``common``, ``torch-cpu``, ``torch-cuda``), so switching builds
  neither mixes wheels nor downloads again; the base image's context gets hard links to the
  parts of the chosen build. The base image carries the labels ``org.twintrace.torch``
  (``cpu`` or ``cuda``) and ``org.twintrace.torch.version`` (what ``torch.__version__`` says,
  read from the wheel), and its build checks them against the torch it installed;
- ``twintrace/tracer:latest``: the tracer's image, the tracing code (``core/``, ``tracing/``)
  in /opt/twintrace on ``twintrace/tracer-root:latest``, a Debian trixie root made by
  debootstrap with bpftrace (0.23: raw tracepoints), Python and grpcio (the agent:
  tracing/agent.py), labelled ``org.twintrace.bpftrace`` with the bpftrace version its
  packages installed; ``docker run --rm twintrace/tracer:latest`` prints it
  (``bpftrace --version``). Editing the tracing code rebuilds only the code layer (seconds);
- ``twintrace/dlio:latest`` (``images/dlio/Dockerfile``): the DLIO benchmark pinned in
  ``images/requirements-dlio.txt``, on twintrace/base, from its own wheelhouse part
  (``.cache/wheelhouse/dlio/``); it runs the ``dlio`` variant of every workload;
- ``twintrace/<workload>:<variant>``, one per workload of ``workloads/registry.py`` and variant
  it supports, from ``images/Dockerfile.workload`` (or ``images/<workload>/Dockerfile`` where a
  workload has its own) with the build arguments ``WORKLOAD`` and ``VARIANT``. The build context
  is the repository root filtered by ``.dockerignore``: the packages ``workloads/`` and
  ``core/``, whole (what is host-only lives in ``store/``).

Each built image carries the label ``twintrace.inputs-hash``: a hash of everything it was built
from (the files of its build context, build arguments, the parent image id; for the base image
the torch build too, so switching ``--torch`` rebuilds). An image whose
label matches is skipped. A workload image's files are listed by :func:`context_files` with the
rules docker itself applies to the context (``.dockerignore``, the Dockerfile always sent), so
editing host-only code (``store/``, ``tracing/``, ``analysis/``, ``cli.py``...) rebuilds
nothing, and editing anything that goes into the images rebuilds them.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import docker
import docker.errors
from docker.utils.build import exclude_paths

from core.errors import UserError
from workloads.config import (
    BASE_TAG,
    BPFTRACE_LABEL,
    NODE_IMAGE,
    TRACER_IMAGE,
    VARIANTS,
    image_tag,
)
from workloads.dlio import DLIO_IMAGE, DLIO_VARIANT, DLIO_VERSION

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
BASE_CONTEXT = CACHE / "base-context"
OS_TAG = "twintrace/os:bookworm"
#: The tracer's image (TRACER_IMAGE): a Debian root with a bpftrace that has raw tracepoints.
TRACER_SUITE = "trixie"
# libre2-11: provides the virtual package python3-grpcio depends on, which debootstrap does not
# resolve by itself. python3-docker: the agent's launcher on a swarm's node (tracing/launcher.py).
# iproute2 and util-linux: tc and nsenter, for the network caps of a run across nodes
# (tracing/shaper.py: EgressShaper).
TRACER_PACKAGES = (
    "bpftrace", "python3", "python3-grpcio", "libre2-11", "python3-docker", "iproute2",
    "util-linux",
)  # fmt: skip
TRACER_RECIPE = 3  # bumped when the image's recipe changes (rebuilds it)
REGISTRY_BASE = "python:3.11-slim"
HASH_LABEL = "twintrace.inputs-hash"
#: The label of the base's install stage (Dockerfile.base), which the build removes.
BASE_STAGE_LABEL = "org.twintrace.build-stage=base-install"
# The Dockerfile of every workload image, relative to the repository root (the build context).
WORKLOAD_DOCKERFILE = "images/Dockerfile.workload"
#: The parts of the base image's wheelhouse, one directory each (see :func:`wheel_sets`).
WHEELHOUSES = CACHE / "wheelhouse"
#: The torch builds twintrace/base can have (``./cli.py build --torch``).
TORCH_BUILDS = ("cpu", "cuda")
TORCH_LABEL = "org.twintrace.torch"
TORCH_VERSION_LABEL = "org.twintrace.torch.version"
#: PyTorch's own index of CPU builds (``torch==X+cpu``). On PyPI, Linux x86_64 ``torch==X`` is
#: the CUDA build; with this index too pip prefers ``X+cpu`` (a local version sorts higher).
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"

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


def _up_to_date(cli: docker.DockerClient, tag: str, inputs: str) -> BuildResult | None:
    """The image ``tag`` as it is, when its inputs hash label is ``inputs``; else None."""
    current, image_id = _existing_hash(cli, tag)
    return BuildResult(tag, image_id, False) if current == inputs and image_id else None


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


def _build_labelled(
    cli: docker.DockerClient,
    log: Log,
    tag: str,
    inputs: str,
    what: str = "",
    stage: Callable[[], None] | None = None,
    **build: object,
) -> BuildResult:
    """Build ``tag`` unless its inputs hash label is already ``inputs`` (then the image as it
    is): ``stage()`` first where its build context must be made, then the build (``build``:
    its context, Dockerfile and build arguments) labelled with the hash, logged as "building
    <tag><what>"."""
    if (done := _up_to_date(cli, tag, inputs)) is not None:
        return done
    if stage is not None:
        stage()
    log(f"building {tag}{what}")
    image_id = _stream_build(cli, log, tag=tag, labels={HASH_LABEL: inputs}, **build)
    return BuildResult(tag, image_id, True)


@dataclasses.dataclass(frozen=True)
class WheelSet:
    """One part of the base image's wheelhouse: requirement lines and the pip options that
    fetch them, downloaded into ``.cache/wheelhouse/<name>/``."""

    name: str
    requirements: str
    options: tuple[str, ...] = ()
    #: What this part is and what to do when it cannot be fetched (for the UserError).
    what: str = "the Python wheels of images/requirements.txt"
    help: str = "check that PyPI is reachable from this host"

    def command(self, dest: Path, requirements_file: Path) -> list[str]:
        """The pip command that fetches this part into ``dest``. ``pip wheel`` takes published
        wheels as they are and builds one from a source-only release (tfrecord); ``--no-deps``
        because every file pins its dependencies itself."""
        return [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(dest),
            *self.options,
            "-r",
            str(requirements_file),
        ]

    @property
    def stamp(self) -> str:
        """What a complete download of this part was made from (its marker file's content)."""
        return self.requirements + "# pip options: " + " ".join(self.options) + "\n"


def _is_torch(line: str) -> bool:
    """Whether a requirement line is torch's (not torchdata's, say)."""
    return (
        re.match(r"\s*torch\s*(?:[=<>!~;\[]|$)", line.split("#", 1)[0], re.IGNORECASE) is not None
    )


def torch_pin(root: Path = REPO) -> str:
    """The torch version of ``images/requirements.txt`` (``torch==X``): the one both builds have."""
    for line in (root / "images" / "requirements.txt").read_text().splitlines():
        if _is_torch(line):
            name, sep, version = line.split("#", 1)[0].strip().partition("==")
            if name.strip().lower() == "torch" and sep:
                return version.strip()
    raise UserError("images/requirements.txt pins no torch==VERSION")


def wheel_sets(torch_build: str, root: Path = REPO) -> list[WheelSet]:
    """The parts of the wheelhouse of ``torch_build`` (``cpu`` or ``cuda``), torch first.

    - ``common``: ``images/requirements.txt`` without its torch line (both builds);
    - ``torch-cpu``: that torch line, with PyTorch's CPU index added (:data:`CPU_TORCH_INDEX`);
    - ``torch-cuda``: ``images/requirements-cuda.txt``, the CUDA build of the same torch
      version (PyPI's default Linux x86_64 wheel) and its nvidia-* and triton wheels, every one
      pinned with its sha256 (``--require-hashes``), binary wheels only.
    """
    if torch_build not in TORCH_BUILDS:
        raise UserError(
            f"unknown torch build {torch_build!r}: choose one of {', '.join(TORCH_BUILDS)}"
        )
    lines = (root / "images" / "requirements.txt").read_text().splitlines(keepends=True)
    common = WheelSet("common", "".join(line for line in lines if not _is_torch(line)))
    version = torch_pin(root)
    if torch_build == "cpu":
        torch = WheelSet(
            "torch-cpu",
            "".join(line for line in lines if _is_torch(line)),
            ("--extra-index-url", CPU_TORCH_INDEX),
            f"the CPU build of torch {version}",
            f"check that PyPI and {CPU_TORCH_INDEX} are reachable from this host",
        )
        return [torch, common]
    cuda_file = root / "images" / "requirements-cuda.txt"
    text = cuda_file.read_text()
    pinned = [line.split("#", 1)[0].split() for line in text.splitlines()]
    torch_lines = [p[0] for p in pinned if p and _is_torch(p[0])]
    if torch_lines != [f"torch==={version}"]:
        raise UserError(
            f"{cuda_file.relative_to(root)} must pin torch==={version} (the version of "
            f"images/requirements.txt), found {', '.join(torch_lines) or 'none'}"
        )
    torch = WheelSet(
        "torch-cuda",
        text,
        ("--require-hashes", "--only-binary=:all:"),
        f"the CUDA build of torch {version} and its nvidia-* wheels "
        f"({cuda_file.relative_to(root)})",
        "fetch them from PyPI on an x86_64 host with Python 3.11 and network access (about "
        "2.7 GB), or build with `--torch cpu`",
    )
    return [torch, common]


@dataclasses.dataclass(frozen=True)
class TorchBuild:
    """What a torch wheel is: ``cpu`` or ``cuda``, the version it reports and its CUDA version."""

    build: str
    version: str
    cuda: str | None


def torch_build_of(wheel: Path) -> TorchBuild:
    """Read ``torch/version.py`` of a torch wheel (what ``torch.__version__`` and
    ``torch.version.cuda`` will say), without installing it."""
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read("torch/version.py").decode()
    values: dict[str, object] = {}
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    version, cuda = values.get("__version__"), values.get("cuda")
    if not isinstance(version, str):
        raise UserError(f"{wheel.name} has no torch/version.py __version__: is it a torch wheel?")
    cuda = cuda if isinstance(cuda, str) else None
    return TorchBuild("cuda" if cuda else "cpu", version, cuda)


def _torch_wheel(directory: Path) -> Path:
    wheels = sorted(directory.glob("torch-*.whl"))
    if len(wheels) != 1:
        raise UserError(
            f"{directory} holds {len(wheels)} torch wheels: remove it and run `./cli.py build` again"
        )
    return wheels[0]


def fetch_wheels(part: WheelSet, log: Log, torch_build: str | None = None) -> Path:
    """Download one part of the wheelhouse into ``.cache/wheelhouse/<name>/`` unless a complete
    download of the same requirements is there; return the directory.

    A part is downloaded into a fresh directory that replaces the old one once complete (so no
    wheel of an older pin stays), and its marker, written last, is its :attr:`WheelSet.stamp`.
    ``torch_build``: the part holds torch, whose wheel must be that build."""
    dest = WHEELHOUSES / part.name
    marker = dest / "requirements.txt"
    if marker.exists() and marker.read_text() == part.stamp:
        return dest
    WHEELHOUSES.mkdir(parents=True, exist_ok=True)
    for stale in WHEELHOUSES.glob(f".{part.name}-*"):  # left by a download that was killed
        shutil.rmtree(stale, ignore_errors=True)
    log(f"downloading wheels into {dest}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{part.name}-", dir=WHEELHOUSES))
    tmp.chmod(0o755)  # mkdtemp makes it private; the wheelhouse is not
    try:
        requirements = tmp / "requirements.in"
        requirements.write_text(part.requirements)
        done = subprocess.run(part.command(tmp, requirements), capture_output=True, text=True)
        if done.returncode != 0:
            log_file = WHEELHOUSES / f"{part.name}.pip.log"
            log_file.write_text(done.stdout + done.stderr)
            # pip's first ERROR line says what it could not get ("No matching distribution
            # found for ...", "THESE PACKAGES DO NOT MATCH THE HASHES ..."); the rest is advice.
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            first = (errors or done.stderr.strip().splitlines() or ["pip failed"])[0]
            raise UserError(
                f"could not download {part.what}: pip says {first.removeprefix('ERROR: ')!r} "
                f"(log: {log_file}); {part.help}"
            )
        requirements.unlink()
        if torch_build is not None:
            found = torch_build_of(_torch_wheel(tmp))
            if found.build != torch_build:
                raise UserError(
                    f"pip fetched torch {found.version}, a {found.build} build, for "
                    f"{part.what}: {part.help}"
                )
        (tmp / "requirements.txt").write_text(part.stamp)  # written last: a complete part
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def prepare_wheelhouse(log: Log, torch_build: str = "cpu") -> Path:
    """Fetch the wheels of ``torch_build`` (:func:`wheel_sets`) and put exactly them into the
    base image's build context (``.cache/base-context/wheelhouse``, hard links); return it."""
    parts = wheel_sets(torch_build)
    sources = [
        fetch_wheels(part, log, torch_build if part.name.startswith("torch-") else None)
        for part in parts
    ]
    wheels = {w.name: w for source in sources for w in sorted(source.glob("*.whl"))}
    wheelhouse = BASE_CONTEXT / "wheelhouse"
    stamp = f"torch build: {torch_build}\n" + "".join(f"{name}\n" for name in sorted(wheels))
    marker = wheelhouse / "wheels.txt"
    if marker.exists() and marker.read_text() == stamp:
        return wheelhouse
    if wheelhouse.exists():
        shutil.rmtree(wheelhouse)
    wheelhouse.mkdir(parents=True)
    for name, wheel in wheels.items():
        try:
            os.link(wheel, wheelhouse / name)
        except OSError:  # another file system: copy
            shutil.copyfile(wheel, wheelhouse / name)
    marker.write_text(stamp)
    return wheelhouse


def bootstrap_os_image(cli: docker.DockerClient, log: Log) -> str:
    """Make twintrace/os:bookworm with debootstrap + docker import (no registry needed)."""
    log("bootstrapping a Debian bookworm root with debootstrap (about a minute)")
    return bootstrap_image(cli, OS_TAG, "bookworm", ("python3", "python3-venv", "ca-certificates"))


def bootstrap_image(
    cli: docker.DockerClient,
    tag: str,
    suite: str,
    packages: Sequence[str],
    labels: Callable[[Path], Mapping[str, str]] | None = None,
    command: Sequence[str] = (),
    files: Mapping[str, str] = {},
) -> str:
    """Import a minimal Debian ``suite`` root with ``packages`` (debootstrap) as image ``tag``;
    ``labels`` reads the image's labels from the root before it is imported; ``command`` is
    its CMD; ``files`` (absolute path: text) are written into the root. Returns the image id."""
    if shutil.which("debootstrap") is None:
        raise UserError(
            "debootstrap is not installed: run `make setup` as root (apt-get install debootstrap)"
        )
    with tempfile.TemporaryDirectory(
        prefix="twintrace-rootfs-", dir=CACHE if CACHE.exists() else None
    ) as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}"]
        done = subprocess.run([*cmd, suite, str(rootfs)], capture_output=True, text=True)
        if done.returncode != 0:
            raise UserError(
                f"debootstrap of {suite} failed: "
                + " ".join(
                    done.stdout.strip().splitlines()[-3:] + done.stderr.strip().splitlines()[-3:]
                )
            )
        for path, text in files.items():
            (rootfs / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (rootfs / path.lstrip("/")).write_text(text)
        changes = [f"LABEL {k}={v}" for k, v in (labels(rootfs) if labels else {}).items()]
        if command:
            changes.append(f"CMD {json.dumps(list(command))}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            cli.api.import_image_from_stream(
                tar.stdout, repository=tag.split(":")[0], tag=tag.split(":")[1], changes=changes
            )
        finally:
            tar.stdout.close()
            tar.wait()
    return cli.images.get(tag).id


def dpkg_version(rootfs: Path, package: str) -> str | None:
    """The version of ``package`` installed in ``rootfs`` (its dpkg status), or None."""
    status = rootfs / "var" / "lib" / "dpkg" / "status"
    for stanza in status.read_text(errors="replace").split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Package") == package and "installed" in fields.get("Status", ""):
            return fields.get("Version")
    return None


#: The tracer image's Debian root, under its code layer (build_tracer).
TRACER_ROOT = "twintrace/tracer-root:latest"
#: The tracing code the tracer's agent runs (tracing/agent.py), copied to /opt/twintrace: the
#: same trees its digest covers (tracing.agent.SOURCE_GLOBS; images import no tracing module).
TRACER_SOURCES = ("core/*.py", "tracing/*.py", "tracing/bpf/*.bt")


def tracer_sources(root: Path = REPO) -> list[Path]:
    return sorted(path for pattern in TRACER_SOURCES for path in root.glob(pattern))


def _pynvml() -> Path | None:
    """nvidia-ml-py's one module (pure Python, pinned in requirements.lock), for the agent's
    GPU samples: Debian has no package of it."""
    import importlib.util

    spec = importlib.util.find_spec("pynvml")
    return Path(spec.origin) if spec and spec.origin else None


def build_tracer(cli: docker.DockerClient, log: Log) -> BuildResult:
    """Build twintrace/tracer (module doc) unless its inputs hash is already its label: a
    Debian root (rebuilt only when its suite or packages change) and the tracing code on it."""
    root_inputs = hashlib.sha256(
        json.dumps([TRACER_SUITE, TRACER_PACKAGES, TRACER_RECIPE]).encode()
    ).hexdigest()[:16]
    current, root_id = _existing_hash(cli, TRACER_ROOT)
    if current != root_inputs or not root_id:
        log(f"building {TRACER_ROOT}: a Debian {TRACER_SUITE} root with bpftrace (about a minute)")

        def labels(rootfs: Path) -> dict[str, str]:
            version = dpkg_version(rootfs, "bpftrace")
            if version is None:
                raise UserError(f"the {TRACER_SUITE} root has no bpftrace package installed")
            return {HASH_LABEL: root_inputs, BPFTRACE_LABEL: version.split("-")[0]}

        root_id = bootstrap_image(
            cli, TRACER_ROOT, TRACER_SUITE, TRACER_PACKAGES, labels, ("bpftrace", "--version")
        )
    sources = tracer_sources()
    nvml = _pynvml()
    inputs = _hash_files(sources, [root_id, nvml.read_text() if nvml else ""])
    if (done := _up_to_date(cli, TRACER_IMAGE, inputs)) is not None:
        return done
    log(f"building {TRACER_IMAGE}: the tracing code on {TRACER_ROOT}")
    with tempfile.TemporaryDirectory(prefix="twintrace-tracer-") as tmp:
        context = Path(tmp)
        for path in sources:
            target = context / "twintrace" / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        if nvml is not None:
            shutil.copyfile(nvml, context / "twintrace" / "pynvml.py")
        (context / "Dockerfile").write_text(
            f"FROM {TRACER_ROOT}\n"
            "COPY twintrace /opt/twintrace\n"
            "ENV PYTHONPATH=/opt/twintrace PYTHONDONTWRITEBYTECODE=1\n"
            "WORKDIR /opt/twintrace\n"
            f"LABEL {HASH_LABEL}={inputs}\n"
            # fails the build should the agent or its launcher not import (grpcio, docker)
            "RUN python3 -c 'import tracing.agent, tracing.launcher'\n"
        )
        image_id = _stream_build(cli, log, path=str(context), tag=TRACER_IMAGE)
    return BuildResult(TRACER_IMAGE, image_id, True)


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
    cli: docker.DockerClient,
    log: Log,
    base_image: str | None = None,
    bootstrap: bool = False,
    torch_build: str = "cpu",
) -> BuildResult:
    """Build twintrace/base with the ``torch_build`` (cpu or cuda) build of torch, unless its
    inputs hash (the torch build included) is already its label."""
    # The wheels first: a download that fails costs no OS image bootstrap.
    wheelhouse = prepare_wheelhouse(log, torch_build)
    torch = torch_build_of(_torch_wheel(wheelhouse))
    os_image = resolve_base_os(cli, log, base_image, bootstrap)
    os_id = cli.images.get(os_image).id
    # Wheels are named by package, version and platform and their index never changes a
    # published file: names and sizes stand for their content (hashing 2.7 GB of CUDA
    # wheels on every build would take longer than the check saves).
    wheels = [f"{w.name}:{w.stat().st_size}" for w in sorted(wheelhouse.glob("*.whl"))]
    inputs = _hash_files(
        [REPO / "Dockerfile.base"], [os_image, os_id, f"torch={torch_build}", *wheels]
    )
    built = _build_labelled(
        cli,
        log,
        BASE_TAG,
        inputs,
        f" on {os_image} with torch {torch.version} ({torch_build})",
        path=str(BASE_CONTEXT),
        dockerfile=str(REPO / "Dockerfile.base"),
        buildargs={
            "BASE_IMAGE": os_image,
            "TORCH_BUILD": torch_build,
            "TORCH_VERSION": torch.version,
        },
    )
    if built.built:
        # The install stage's image (the wheelhouse and the venv, Dockerfile.base) is no part
        # of the base: left, it would hold 1.4 GB of the engine's disk for each build.
        cli.images.prune(filters={"dangling": True, "label": BASE_STAGE_LABEL})
    return built


@dataclasses.dataclass(frozen=True)
class BaseTorch:
    """The torch build of an image, from its labels (None where the image has none: it was
    built before the labels existed)."""

    build: str | None
    version: str | None

    def describe(self) -> str:
        if self.build is None:
            return "unknown (built before its torch label: run `./cli.py build`)"
        return f"{self.build} (torch {self.version or '?'})"


def base_torch(cli: docker.DockerClient, tag: str = BASE_TAG) -> BaseTorch | None:
    """The torch build of ``tag`` (default twintrace/base), or None when it is not built."""
    try:
        labels = cli.images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        return None
    return BaseTorch(labels.get(TORCH_LABEL) or None, labels.get(TORCH_VERSION_LABEL) or None)


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
    return _build_labelled(
        cli,
        log,
        tag,
        inputs,
        path=str(REPO),
        dockerfile=dockerfile,
        buildargs=workload_build_args(workload, variant),
    )


def check_current(cli: docker.DockerClient, workload: str, variant: str) -> None:
    """A UserError when ``twintrace/<workload>:<variant>`` is built, but not from this
    checkout's context, Dockerfile and build arguments on the current twintrace/base (its
    inputs hash label is another): a run of it would measure other code than the checkout's.
    Nothing to say when it, or the base, is not built (the run says so as it starts)."""
    tag = image_tag(workload, variant)
    label, image_id = _existing_hash(cli, tag)
    try:
        base_id = cli.images.get(BASE_TAG).id
    except docker.errors.ImageNotFound:
        return
    if image_id is None:
        return
    current = workload_inputs_hash(workload, variant, base_id)
    if label != current:
        raise UserError(
            f"image {tag} is stale: it was built from other sources or another {BASE_TAG} than "
            f"this checkout's (its inputs {label or 'unlabelled'}, the checkout's {current}): "
            "run `./cli.py build`"
        )


DLIO_DIR = REPO / "images" / "dlio"
DLIO_CONTEXT = CACHE / "dlio-context"


def dlio_wheels() -> WheelSet:
    """The wheelhouse part of twintrace/dlio: ``images/requirements-dlio.txt``."""
    return WheelSet(
        "dlio",
        (REPO / "images" / "requirements-dlio.txt").read_text(),
        what="the DLIO benchmark's wheels (images/requirements-dlio.txt)",
    )


def build_dlio(cli: docker.DockerClient, base_id: str, log: Log) -> BuildResult:
    """Build twintrace/dlio (images/dlio/Dockerfile: DLIO pinned, on twintrace/base) unless
    its inputs hash is already its label. Its build context is ``.cache/dlio-context/``: the
    Dockerfile, the build-time patch and hard links to the wheels."""
    part = dlio_wheels()
    if f"dlio-benchmark=={DLIO_VERSION}\n" not in part.requirements:
        raise UserError(
            f"images/requirements-dlio.txt must pin dlio-benchmark=={DLIO_VERSION} (the version "
            "workloads/dlio.py derives configurations for)"
        )
    wheels = fetch_wheels(part, log)
    files = sorted(p for p in DLIO_DIR.iterdir() if p.is_file())
    names = [f"{w.name}:{w.stat().st_size}" for w in sorted(wheels.glob("*.whl"))]
    inputs = _hash_files(files, [base_id, DLIO_VERSION, *names])

    def stage() -> None:
        if DLIO_CONTEXT.exists():
            shutil.rmtree(DLIO_CONTEXT)
        (DLIO_CONTEXT / "wheelhouse").mkdir(parents=True)
        for path in files:
            shutil.copyfile(path, DLIO_CONTEXT / path.name)
        for wheel in wheels.glob("*.whl"):
            try:
                os.link(wheel, DLIO_CONTEXT / "wheelhouse" / wheel.name)
            except OSError:  # another file system: copy
                shutil.copyfile(wheel, DLIO_CONTEXT / "wheelhouse" / wheel.name)

    return _build_labelled(
        cli,
        log,
        DLIO_IMAGE,
        inputs,
        stage=stage,
        path=str(DLIO_CONTEXT),
        dockerfile="Dockerfile",
        buildargs={"BASE_TAG": BASE_TAG, "DLIO_VERSION": DLIO_VERSION},
    )


#: The virtual cluster's node (tracing/cluster.py): Debian 12's Docker engine (the host's
#: version) and registry (2.8), with the tools dockerd calls. One image for the nodes and the
#: registry; the registry's configuration (no authentication: it listens on the cluster's
#: private network only) is written into the root.
NODE_SUITE = "bookworm"
NODE_PACKAGES = ("docker.io", "iptables", "ca-certificates", "procps", "docker-registry")
NODE_REGISTRY_CONFIG = "/etc/twintrace/registry.yml"
NODE_FILES = {
    NODE_REGISTRY_CONFIG: "version: 0.1\n"
    "storage:\n  filesystem:\n    rootdirectory: /var/lib/docker-registry\n"
    "  delete:\n    enabled: true\n"
    "http:\n  addr: :5000\n",
}


def build_node(cli: docker.DockerClient, log: Log) -> BuildResult:
    """Build twintrace/node (debootstrap, about 40 s) unless its inputs hash is its label."""
    inputs = hashlib.sha256(
        json.dumps([NODE_SUITE, NODE_PACKAGES, NODE_FILES]).encode()
    ).hexdigest()[:16]
    if (done := _up_to_date(cli, NODE_IMAGE, inputs)) is not None:
        return done
    log(f"building {NODE_IMAGE}: a Debian {NODE_SUITE} root with Docker's engine and registry")
    image_id = bootstrap_image(
        cli,
        NODE_IMAGE,
        NODE_SUITE,
        NODE_PACKAGES,
        lambda rootfs: {HASH_LABEL: inputs},
        ("dockerd",),
        NODE_FILES,
    )
    return BuildResult(NODE_IMAGE, image_id, True)


def build(
    cli: docker.DockerClient,
    workloads: Iterable[str] | None = None,
    variants: Iterable[str] | None = None,
    log: Log = lambda line: None,
    base_image: str | None = None,
    bootstrap_base: bool = False,
    torch_build: str = "cpu",
) -> list[BuildResult]:
    """Build what is missing or out of date; return every requested image with its state.

    ``torch_build``: the torch of twintrace/base, ``cpu`` or ``cuda`` (:func:`wheel_sets`);
    switching rebuilds the base image and with it every workload image."""
    matrix = image_matrix()
    known = list(dict.fromkeys(name for name, _ in matrix))
    chosen = list(workloads or known)
    for name in chosen:
        if name not in known:
            raise UserError(f"unknown workload {name!r}: choose one of {', '.join(known)}")
    chosen_variants = list(variants or (*VARIANTS, DLIO_VARIANT))
    for variant in chosen_variants:
        if variant not in (*VARIANTS, DLIO_VARIANT):
            raise UserError(
                f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}, {DLIO_VARIANT}"
            )
    if torch_build not in TORCH_BUILDS:
        raise UserError(
            f"unknown torch build {torch_build!r}: choose one of {', '.join(TORCH_BUILDS)}"
        )
    CACHE.mkdir(exist_ok=True)
    base = build_base(cli, log, base_image, bootstrap_base, torch_build)
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
    if DLIO_VARIANT in chosen_variants:  # one image runs DLIO for every workload
        results.append(build_dlio(cli, base.image_id, log))
    results.append(build_tracer(cli, log))
    return results
