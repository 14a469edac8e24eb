"""GPUs for the run's containers and the images that use them. No GPU is on the build machines,
so what is checked is what twintrace asks of docker, pip and torch:

- `trace --gpus`: the device request the Docker SDK receives, and the refusal of a real daemon
  without the NVIDIA runtime;
- `build --torch cpu|cuda`: the pip command and requirements of each torch build, the wheelhouse
  parts kept apart, the rebuild on a switch, the labels of a real CPU build, and the one-line
  error when the CUDA wheels cannot be fetched (a real pip without an index);
- which GPU each rank computes on, and `gpus` of experiments and compose reservations.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from core.errors import UserError
from tests.conftest import REPO
from tracing import container
from tracing.request import ContainerSpec, RunOptions, image_request


@pytest.mark.parametrize(
    ("text", "count", "ids"),
    [
        ("all", -1, []),
        ("2", 2, []),
        ("0,1", 0, ["0", "1"]),
        ("GPU-3f2a", 0, ["GPU-3f2a"]),
        ("device=1", 0, ["1"]),  # docker's explicit form: GPU 1, not one GPU
        ('"device=0,2"', 0, ["0", "2"]),  # as a shell-quoted docker --gpus argument
    ],
)
def test_gpus_are_parsed_as_docker_reads_them(text: str, count: int, ids: list[str]) -> None:
    request = container.gpu_request(text)
    assert request["Count"] == count and request["DeviceIDs"] == ids
    assert request["Capabilities"] == [["gpu"]]


@pytest.mark.parametrize("text", ["0", "", "1,,2", "device=", "device=1,"])
def test_bad_gpus_are_one_clear_error(text: str) -> None:
    with pytest.raises(UserError, match="gpus"):
        ContainerSpec(role="main", image="x", gpus=text)


class _FakeContainers:
    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}

    def run(self, image: str, **kwargs: Any) -> str:
        self.kwargs = kwargs
        return "started"


class _FakeClient:
    def __init__(self) -> None:
        self.containers = _FakeContainers()


def test_the_sdk_receives_the_device_request(tmp_path: Path) -> None:
    fake = _FakeClient()
    started = container.start_held(
        fake,  # type: ignore[arg-type]
        container.Held("twintrace/unet3d:original", ["python"], tmp_path, [], "run-id", "main"),
        network=None,
        gpus="0,1",
    )
    assert started == "started"
    (request,) = fake.containers.kwargs["device_requests"]
    assert request["DeviceIDs"] == ["0", "1"] and request["Capabilities"] == [["gpu"]]
    assert fake.containers.kwargs["network_mode"] == "none"
    # No --gpus: no device request at all.
    held = container.Held("x", ["python"], tmp_path, [], "r", "main")
    container.start_held(fake, held, network=None)  # type: ignore[arg-type]
    assert "device_requests" not in fake.containers.kwargs


def test_builders_pass_gpus_to_every_container(tmp_path: Path) -> None:
    request = image_request("x", ["true"], tmp_path, run=RunOptions(gpus="all"))
    assert [c.gpus for c in request.containers] == ["all"]


@pytest.mark.integration
@pytest.mark.docker
def test_a_host_without_the_nvidia_runtime_refuses_with_one_line(images, tmp_path: Path) -> None:
    from cli import cli

    info = container.client().info()
    if "nvidia" in (info.get("Runtimes") or {}):
        pytest.skip("this host has the NVIDIA runtime: the refusal cannot be shown here")
    result = CliRunner().invoke(
        cli,
        ["trace", "--image", "twintrace/base:latest", "--gpus", "all", "--quiet"]
        + ["--out", str(tmp_path / "runs"), "--", "true"],
    )
    assert result.exit_code == 1
    assert "docker could not start twintrace/base:latest" in result.output
    assert "Traceback" not in result.output
    doctor = CliRunner().invoke(cli, ["doctor", "--gpus", "--json"])
    assert '"nvidia runtime"' in doctor.output


# -- the torch build of twintrace/base (`./cli.py build --torch cpu|cuda`) ----------------------

CPU_VERSION_PY = "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n"
CUDA_VERSION_PY = "__version__ = '2.13.0+cu130'\ncuda: Optional[str] = '13.0'\n"


def _requirement_lines(text: str) -> list[str]:
    return [
        line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()
    ]


def test_each_torch_build_has_its_own_pip_command_and_requirements(tmp_path: Path) -> None:
    from images.build import CPU_TORCH_INDEX, wheel_sets

    common_lines = _requirement_lines((REPO / "images" / "requirements.txt").read_text())
    cpu_torch, cpu_common = wheel_sets("cpu")
    cuda_torch, cuda_common = wheel_sets("cuda")
    # Both builds share the other packages, without torch.
    assert cpu_common == cuda_common and cpu_common.name == "common"
    assert _requirement_lines(cpu_common.requirements) == [
        line for line in common_lines if not line.startswith("torch")
    ]
    # CPU: images/requirements.txt's torch pin, with PyTorch's CPU index (where X+cpu lives).
    assert cpu_torch.name == "torch-cpu"
    assert _requirement_lines(cpu_torch.requirements) == ["torch==2.13.0"]
    out, req = tmp_path / "out", tmp_path / "req.in"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out)]
    assert cpu_torch.command(out, req) == [
        *pip_wheel, "--extra-index-url", CPU_TORCH_INDEX, "-r", str(req)
    ]  # fmt: skip
    # CUDA: requirements-cuda.txt, hash-pinned, binary wheels only, no CPU index.
    assert cuda_torch.name == "torch-cuda"
    assert cuda_torch.requirements == (REPO / "images" / "requirements-cuda.txt").read_text()
    assert cuda_torch.command(out, req) == [
        *pip_wheel, "--require-hashes", "--only-binary=:all:", "-r", str(req)
    ]  # fmt: skip
    # Different directories: switching builds never mixes their wheels.
    assert cpu_torch.name != cuda_torch.name and cpu_torch.stamp != cuda_torch.stamp
    with pytest.raises(UserError, match="unknown torch build 'rocm'"):
        wheel_sets("rocm")


def test_the_cuda_requirements_pin_torchs_linux_dependencies_by_hash() -> None:
    import re

    lines = _requirement_lines((REPO / "images" / "requirements-cuda.txt").read_text())
    pins, operators = {}, {}
    for line in lines:
        # One wheel per line: NAME==VERSION --hash=sha256:<64 hex digits>, as pip's
        # --require-hashes mode wants every requirement.
        match = re.fullmatch(r"([a-z0-9-]+)(===|==)(\S+) --hash=sha256:[0-9a-f]{64}", line)
        assert match, f"{line!r} is not NAME==VERSION --hash=sha256:..."
        name, operators[name], pins[name] = match.groups()
    # The same torch as images/requirements.txt, and only the build without a local label:
    # `===` (arbitrary equality) refuses the local 2.13.0+cpu wheel that `==` would accept.
    assert pins["torch"] == "2.13.0" and operators["torch"] == "==="
    # What torch 2.13.0's Linux wheel declares (its METADATA on PyPI): cuda-toolkit 13.0.3 with
    # these extras, cudnn/cusparselt/nccl/nvshmem for CUDA 13, triton, cuda-bindings; and what
    # those declare in turn.
    declared = {
        "cuda-toolkit": "13.0.3.0",
        "nvidia-cudnn-cu13": "9.20.0.48",
        "nvidia-cusparselt-cu13": "0.8.1",
        "nvidia-nccl-cu13": "2.29.7",
        "nvidia-nvshmem-cu13": "3.4.5",
        "triton": "3.7.1",
    }
    assert {name: pins[name] for name in declared} == declared
    toolkit_extras = {
        "nvidia-cublas", "nvidia-cuda-runtime", "nvidia-cufft", "nvidia-cufile",
        "nvidia-cuda-cupti", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse",
        "nvidia-nvjitlink", "nvidia-cuda-nvrtc", "nvidia-nvtx",
    }  # fmt: skip
    assert toolkit_extras <= set(pins)
    assert {"cuda-bindings", "cuda-pathfinder"} <= set(pins)
    assert all(pins[n].startswith("13.") for n in ("cuda-bindings", "nvidia-nvjitlink"))


def _fake_torch_wheel(directory: Path, name: str, version_py: str) -> Path:
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("torch/version.py", "from typing import Optional\n\n" + version_py)
    return path


def test_the_torch_build_is_read_from_the_wheel(tmp_path: Path) -> None:
    from images.build import TorchBuild, torch_build_of

    cpu = _fake_torch_wheel(
        tmp_path, "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", CPU_VERSION_PY
    )
    cuda = _fake_torch_wheel(tmp_path, "torch-2.13.0-cp311-cp311-linux_x86_64.whl", CUDA_VERSION_PY)
    assert torch_build_of(cpu) == TorchBuild("cpu", "2.13.0+cpu", None)
    assert torch_build_of(cuda) == TorchBuild("cuda", "2.13.0+cu130", "13.0")


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """images.build's cache directories under tmp_path."""
    from images import build as images_build

    monkeypatch.setattr(images_build, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(images_build, "BASE_CONTEXT", tmp_path / "cache" / "base-context")
    monkeypatch.setattr(images_build, "WHEELHOUSES", tmp_path / "cache" / "wheelhouse")
    return tmp_path / "cache"


def _downloaded(cache: Path) -> None:
    """Complete downloads of every part (as fetch_wheels leaves them), with fake wheels."""
    from images.build import wheel_sets

    for build, version_py in (("cpu", CPU_VERSION_PY), ("cuda", CUDA_VERSION_PY)):
        torch, common = wheel_sets(build)
        for part in (torch, common):
            (cache / "wheelhouse" / part.name).mkdir(parents=True, exist_ok=True)
            (cache / "wheelhouse" / part.name / "requirements.txt").write_text(part.stamp)
        _fake_torch_wheel(cache / "wheelhouse" / torch.name, f"torch-{build}.whl", version_py)
        if build == "cuda":
            (cache / "wheelhouse" / torch.name / "nvidia_nccl_cu13-2.29.7-py3-none.whl").touch()
    (cache / "wheelhouse" / "common" / "numpy-2.4.6-cp311.whl").touch()


def test_switching_the_torch_build_swaps_the_base_context_without_mixing(cache: Path) -> None:
    from images.build import prepare_wheelhouse

    _downloaded(cache)
    context = prepare_wheelhouse(print, "cuda")
    assert sorted(p.name for p in context.glob("*.whl")) == [
        "numpy-2.4.6-cp311.whl",
        "nvidia_nccl_cu13-2.29.7-py3-none.whl",
        "torch-cuda.whl",
    ]
    context = prepare_wheelhouse(print, "cpu")
    assert sorted(p.name for p in context.glob("*.whl")) == [
        "numpy-2.4.6-cp311.whl",
        "torch-cpu.whl",
    ]
    # The CUDA download is still there for the next switch; nothing was downloaded again.
    assert (cache / "wheelhouse" / "torch-cuda" / "torch-cuda.whl").exists()


class _FakeImages:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.pruned: list[dict[str, Any]] = []

    def prune(self, filters: dict[str, Any]) -> None:
        self.pruned.append(filters)

    def get(self, tag: str) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(id=f"sha256:{tag}", labels=self.labels)


def test_switching_the_torch_build_rebuilds_the_base_with_its_labels(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from images import build as images_build

    _downloaded(cache)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        images_build, "_stream_build", lambda cli, log, **kw: calls.append(kw) or "new"
    )
    monkeypatch.setattr(images_build, "resolve_base_os", lambda *args: "twintrace/os:bookworm")
    fake = SimpleNamespace(images=_FakeImages({}))
    assert images_build.build_base(fake, print, torch_build="cpu").built  # type: ignore[arg-type]
    cpu = calls[-1]
    # The install stage's image goes with the build (Dockerfile.base's first stage).
    assert fake.images.pruned == [{"dangling": True, "label": images_build.BASE_STAGE_LABEL}]
    assert cpu["buildargs"]["TORCH_BUILD"] == "cpu"
    assert cpu["buildargs"]["TORCH_VERSION"] == "2.13.0+cpu"
    # An image with the CPU build's inputs hash is up to date for cpu, out of date for cuda.
    fake.images.labels = cpu["labels"]
    assert not images_build.build_base(fake, print, torch_build="cpu").built  # type: ignore[arg-type]
    assert images_build.build_base(fake, print, torch_build="cuda").built  # type: ignore[arg-type]
    cuda = calls[-1]
    assert cuda["buildargs"]["TORCH_BUILD"] == "cuda"
    assert cuda["buildargs"]["TORCH_VERSION"] == "2.13.0+cu130"
    assert cuda["labels"][images_build.HASH_LABEL] != cpu["labels"][images_build.HASH_LABEL]
    # The Dockerfile turns the build arguments into the labels and checks them.
    dockerfile = (REPO / "Dockerfile.base").read_text()
    assert "org.twintrace.torch=${TORCH_BUILD}" in dockerfile
    assert "org.twintrace.torch.version=${TORCH_VERSION}" in dockerfile


def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """pip with no index and an empty find-links directory: what a host that cannot reach PyPI
    gets (environment variables override pip's configuration files)."""
    (tmp_path / "no-wheels").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))


def test_cuda_wheels_that_cannot_be_fetched_are_one_clear_error(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from images.build import prepare_wheelhouse

    _offline(monkeypatch, tmp_path)
    with pytest.raises(UserError) as caught:
        prepare_wheelhouse(print, "cuda")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "could not download the CUDA build of torch 2.13.0 and its nvidia-* wheels "
        "(images/requirements-cuda.txt): pip says "
    )
    assert "torch===2.13.0" in message and "or build with `--torch cpu`" in message
    # Nothing half-downloaded is left to be taken for a complete part.
    assert not (cache / "wheelhouse" / "torch-cuda").exists()
    assert [p.name for p in (cache / "wheelhouse").iterdir()] == ["torch-cuda.pip.log"]


def test_build_torch_cuda_fails_with_one_line_and_exit_1(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli import cli

    _offline(monkeypatch, tmp_path)
    # The wheels are fetched before docker is asked for anything: no daemon needed here.
    monkeypatch.setattr(container, "client", lambda: object())
    result = CliRunner().invoke(cli, ["build", "--torch", "cuda", "--workload", "unet3d"])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert "could not download the CUDA build of torch 2.13.0" in line
    bad = CliRunner().invoke(cli, ["build", "--torch", "rocm"])
    assert bad.exit_code == 2 and "'rocm' is not one of 'cpu', 'cuda'" in bad.output


@pytest.mark.integration
@pytest.mark.docker
def test_the_cpu_build_labels_the_base_image_and_doctor_shows_it(images) -> None:
    import json
    import subprocess

    from cli import cli

    result = CliRunner().invoke(cli, ["build", "--workload", "unet3d", "--variant", "sleep"])
    assert result.exit_code == 0, result.output
    assert "twintrace/base:latest" in result.output
    done = subprocess.run(
        [
            "docker",
            "image",
            "inspect",
            "--format",
            "{{json .Config.Labels}}",
            "twintrace/base:latest",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    labels = json.loads(done.stdout)
    assert labels["org.twintrace.torch"] == "cpu"
    assert labels["org.twintrace.torch.version"] == "2.13.0+cpu"
    doctor = CliRunner().invoke(cli, ["doctor", "--json"])
    (row,) = [c for c in json.loads(doctor.output) if c["name"] == "base torch"]
    assert row["ok"] and row["detail"] == "twintrace/base:latest: cpu (torch 2.13.0+cpu)"
    # GPU runs need the CUDA build: with --gpus the same image fails that row, with the fix.
    doctor = CliRunner().invoke(cli, ["doctor", "--gpus", "--json"])
    (row,) = [c for c in json.loads(doctor.output) if c["name"] == "base torch"]
    assert not row["ok"] and "./cli.py build --torch cuda" in row["fix"]
    assert doctor.exit_code == 1


# -- which GPU a rank computes on (workloads.training.resolve_device) --------------------------


def _device(
    monkeypatch: pytest.MonkeyPatch, visible: int, rank: int, *, own: bool, build: str = "cuda"
) -> str:
    """resolve_device with ``visible`` GPUs, for ``rank`` of 2 (``own``: in a rank container)."""
    import torch

    from workloads.registry import WORKLOADS
    from workloads.training import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.version, "cuda", "13.0" if build == "cuda" else None)
    config = WORKLOADS["unet3d"].config("original", accelerators=2, device="auto")
    if own:
        config = config.replace(rank=rank)
    return str(resolve_device(config, rank))


@pytest.mark.parametrize(
    ("visible", "rank", "own", "device"),
    [
        (0, 1, False, "cpu"),  # auto without a GPU: CPU
        (2, 1, False, "cuda:1"),  # ranks of one process tree: rank r on GPU r
        (1, 0, True, "cuda:0"),  # a rank container given one GPU: it is cuda:0 there
        (1, 1, True, "cuda:0"),  # ... for every rank (before: an error, 1 GPU < 2)
        (4, 1, True, "cuda:1"),  # a rank container that sees all GPUs (--gpus all): its own
    ],
)
def test_each_rank_computes_on_its_own_gpu(
    monkeypatch: pytest.MonkeyPatch, visible: int, rank: int, own: bool, device: str
) -> None:
    assert _device(monkeypatch, visible, rank, own=own) == device


def test_ranks_without_a_gpu_each_are_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # One process tree, one GPU for two ranks: as before.
    with pytest.raises(UserError, match="needs as many GPUs, 1 visible"):
        _device(monkeypatch, 1, 1, own=False)
    # A rank container that sees some GPUs but not one of its own nor all of them.
    import torch

    from workloads.registry import WORKLOADS
    from workloads.training import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    config = WORKLOADS["unet3d"].config("original", accelerators=4, device="cuda", rank=3)
    with pytest.raises(UserError, match="rank 3 of 4 sees 2 GPUs"):
        resolve_device(config, 3)
    # device = cuda in an image with the CPU build of torch: the fix is the CUDA build.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", None)
    config = WORKLOADS["unet3d"].config("original", accelerators=1, device="cuda")
    with pytest.raises(
        UserError, match=r"CPU build: rebuild the images with `./cli.py build --torch cuda`"
    ):
        resolve_device(config, 0)


# -- rank containers, experiments and topologies ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count"),
    [("all", None), ("3", 3), ("0,1", 2), ("GPU-3f2a", 1), ("device=1", 1), ("device=0,1", 2)],
)
def test_gpu_count(text: str, count: int | None) -> None:
    from tracing.request import gpu_count

    assert gpu_count(text) == count


def test_rank_containers_need_a_gpu_per_rank(tiny_unet3d: Path, tmp_path: Path) -> None:
    from tracing.request import workload_request

    def request(gpus: str) -> Any:
        return workload_request(
            "unet3d",
            "original",
            tiny_unet3d,
            tmp_path,
            settings={"accelerators": 2},
            options={"patch_size": 32},
            rank_containers=True,
            run=RunOptions(gpus=gpus),
        )

    # docker gives every container GPUs 0..N-1 for a count: both ranks would share GPU 0.
    with pytest.raises(UserError, match="^gpus 1 gives every rank container the same 1 GPU"):
        request("1")
    with pytest.raises(UserError, match="fewer than the 2 ranks"):
        request("GPU-3f2a")
    assert [c.gpus for c in request("all").containers] == ["all", "all"]
    assert [c.gpus for c in request("0,1").containers] == ["0,1", "0,1"]


EXPERIMENT = """
[[datasets]]
name = "u"
generator = "unet3d"
size = "12MB"

[grid]
workload = ["unet3d"]
variant = ["sleep"]
accelerators = [1, 2]

[settings]
epochs = 1
{settings}

[workloads.unet3d]
dataset = "u"
{own}
"""


@pytest.mark.parametrize(
    ("settings", "own", "gpus"),
    [
        ("", "", None),
        ('gpus = "all"', "", "all"),
        ("gpus = 2", "", "2"),  # a TOML integer count
        ('gpus = "all"', 'gpus = "0,1"', "0,1"),  # the workload's own wins
    ],
)
def test_experiment_gpus_reach_the_runs_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: str, own: str, gpus: str | None
) -> None:
    from types import SimpleNamespace

    import tracing.request
    import tracing.runner
    from experiments import orchestrate

    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT.format(settings=settings, own=own))
    experiment = orchestrate.load_experiment(path)
    seen: list[RunOptions] = []
    monkeypatch.setattr(orchestrate, "ensure_datasets", lambda *args: {"u": tmp_path})
    monkeypatch.setattr(
        tracing.request, "workload_request", lambda *args, **kw: seen.append(kw["run"])
    )
    monkeypatch.setattr(
        tracing.runner,
        "trace",
        lambda request: SimpleNamespace(status="completed", error=None, run_dir=None),
    )
    outcomes = orchestrate.run_experiment(experiment, tmp_path / "out", log=lambda line: None)
    assert [o.status for o in outcomes] == ["completed", "completed"]
    assert [run.gpus for run in seen] == [gpus, gpus]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ('gpus = "1"', r'2 accelerators need as many GPUs, gpus = "1" gives 1'),
        ("gpus = 0", "gpus of unet3d: gpus 0 asks for no GPU"),
        ('gpus = "0,,1"', "gpus of unet3d: bad gpus"),
        ("gpus = true", "gpus of unet3d must be"),
        ("gpu = 1", "unknown key 'gpu'"),
    ],
)
def test_bad_experiment_gpus_fail_when_loaded(tmp_path: Path, settings: str, message: str) -> None:
    from experiments.orchestrate import load_experiment

    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT.format(settings=settings, own=""))
    with pytest.raises(UserError, match=message):
        load_experiment(path)


def _service(devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"image": "x", "deploy": {"resources": {"reservations": {"devices": devices}}}}


@pytest.mark.parametrize(
    ("devices", "gpus"),
    [
        ([{"capabilities": ["gpu"], "driver": "nvidia", "count": 2}], "2"),
        ([{"capabilities": ["gpu"], "count": "all"}], "all"),
        ([{"capabilities": ["gpu"]}], "all"),  # neither count nor ids: all, as compose has it
        ([{"capabilities": ["gpu"], "device_ids": ["0", "3"]}], "device=0,3"),
        ([{"capabilities": ["gpu", "utility"], "device_ids": ["GPU-3f2a"]}], "device=GPU-3f2a"),
        ([{"capabilities": ["gpu"], "device_ids": ["1"]}], "device=1"),  # GPU 1, not a count
        ([{"capabilities": [["gpu"]], "count": 1}], "1"),  # docker API's list of lists
        ([{"capabilities": ["tpu"], "count": 1}], None),  # not a GPU
        ([], None),
    ],
)
def test_compose_gpu_reservations_become_gpus(
    devices: list[dict[str, Any]], gpus: str | None
) -> None:
    from tracing.topology import service_gpus, service_spec

    assert service_gpus(_service(devices), "service s") == gpus
    spec = service_spec("s", _service(devices), RunOptions(gpus="all"), Path("."))
    assert spec.gpus == (gpus or "all")  # the run's --gpus where the service reserves none


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (
            [{"capabilities": ["gpu"], "count": 1, "device_ids": ["0"]}],
            "count or device_ids, not both",
        ),
        ([{"capabilities": ["gpu"], "count": 1}, {"capabilities": ["gpu"], "count": 1}], "2 GPU"),
        ([{"capabilities": ["gpu"], "count": 0}], "gpus 0 asks for no GPU"),
        ([{"capabilities": ["gpu"], "count": "many"}], "GPU count must be a number or all"),
    ],
)
def test_bad_compose_gpu_reservations_are_one_clear_error(
    devices: list[dict[str, Any]], message: str
) -> None:
    from tracing.topology import service_gpus

    with pytest.raises(UserError, match=message) as caught:
        service_gpus(_service(devices), "service s")
    assert str(caught.value).startswith("service s: ")


COMPOSE = """
services:
  rank0:
    image: twintrace/unet3d:original
    deploy:
      resources:
        reservations:
          devices:
            - driver: nvidia
              capabilities: [gpu]
              device_ids: ["0", "1"]
  rank1:
    image: twintrace/unet3d:original
    deploy:
      resources:
        reservations:
          devices:
            - capabilities: [gpu]
              count: all
  storage:
    image: twintrace/base:latest
"""


def test_a_compose_file_reserving_gpus_gives_its_containers_gpus(tmp_path: Path) -> None:
    """Through the real ``docker-compose config`` (no daemon needed)."""
    import shutil

    from tests.conftest import require
    from tracing.topology import topology_request

    require(
        shutil.which("docker-compose"), "docker-compose is not installed (`make setup` installs it)"
    )
    path = tmp_path / "topology.yml"
    path.write_text(COMPOSE)
    request = topology_request(path, tmp_path / "runs")
    assert {c.role: c.gpus for c in request.containers} == {
        "rank0": "device=0,1",
        "rank1": "all",
        "storage": None,
    }
    request = topology_request(path, tmp_path / "runs", run=RunOptions(gpus="2"))
    assert {c.role: c.gpus for c in request.containers}["storage"] == "2"
