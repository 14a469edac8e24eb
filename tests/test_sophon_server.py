"""The storage server for real on this host (a process of its own, gRPC over loopback): every
remote mode gives the local pipeline's samples pixel for pixel, bad requests get gRPC errors and
the server goes on, SIGTERM stops it and its workers cleanly; and the requests a remote dataset
makes of the tracer (no Docker needed to build them).

The gRPC calls run in forked processes (``workloads.sophon.client.in_subprocess``), as in
training: the test process never starts gRPC, so tests that fork DataLoader workers later in the
session stay safe.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from core.errors import UserError
from datagen.images import ImageGenParams, generate_images
from workloads.images.dataset import ImageFolderDataset
from workloads.images.files import load_image_data
from workloads.sophon.client import in_subprocess

REPO = Path(__file__).resolve().parent.parent
SIZE = 48  # the crop's edge: small tensors, the same code path as 224


@pytest.fixture(scope="module")
def tiny_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve JPEGs of ~60 kB in 3 classes, two of them in val."""
    out = tmp_path_factory.mktemp("sophon") / "img"
    params = ImageGenParams(
        classes=3, mean_kb=60, size_sigma=0.3, val_fraction=0.2, distinct_images=6
    )
    generate_images(out, 12 * 60_000, seed=5, workers=1, params=params)
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


class Server:
    """``python -m workloads.sophon.server`` on a free port, stopped with SIGTERM."""

    def __init__(self, data: Path, workers: int = 2) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        argv = [sys.executable, "-m", "workloads.sophon.server", "--data", str(data)]
        argv += ["--port", "0", "--prep-workers", str(workers)]
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "serving" in line, line + self.proc.stderr.read()  # type: ignore[union-attr]
        self.port = int(line.split(" on port ")[1].split()[0])
        self.address = f"127.0.0.1:{self.port}"

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def server(tiny_images: Path) -> Iterator[Server]:
    srv = Server(tiny_images)
    yield srv
    srv.stop()


def _remote_items(
    address: str, split: str, mode: str, stages: list[int] | None, train: bool, epoch: int
) -> list[tuple[np.ndarray, int]]:
    """Every sample of ``split`` through a RemoteImageDataset (runs in a forked process)."""
    from workloads.sophon.client import RemoteImageDataset, describe

    listing = describe(address, timeout_s=60)
    ds = RemoteImageDataset(
        address,
        split,
        listing.labels[split],
        mode,
        stages=stages,
        image_size=SIZE,
        train=train,
        seed=7,
    )
    ds.set_epoch(epoch)
    items = ds.__getitems__(list(range(len(ds))))
    one = ds[len(ds) - 1]  # the single-item path too
    ds.close()
    assert np.array_equal(one[0].numpy(), items[-1][0].numpy())
    return [(x.numpy(), int(y)) for x, y in items]


@pytest.mark.parametrize(
    "mode,train",
    [
        ("remote-nooff", True),
        ("remote-alloff", True),
        ("remote-partial", True),
        ("remote-sophon", True),
        ("remote-partial", False),
    ],
)
def test_every_mode_gives_the_local_samples_pixel_for_pixel(
    server: Server, tiny_images: Path, mode: str, train: bool
) -> None:
    data = load_image_data(tiny_images)
    split = "train" if train else "val"
    samples = data.train if train else data.val
    # The selective mode with every stage in turn: the storage node stops after each transform
    # and the client replays the draws of the transforms it skipped.
    stages = [i % 5 for i in range(len(samples))] if mode == "remote-sophon" else None
    remote = in_subprocess(_remote_items, server.address, split, mode, stages, train, 3)
    local = ImageFolderDataset(samples, image_size=SIZE, train=train, seed=7)  # type: ignore
    local.set_epoch(3)
    assert len(remote) == len(local) > 0
    for i, (pixels, label) in enumerate(remote):
        x, y = local[i]
        assert label == int(y)
        assert pixels.dtype == np.float32 and pixels.shape == (3, SIZE, SIZE)
        assert np.array_equal(pixels, x.numpy()), f"sample {i} differs"


def _profile_and_probe(address: str) -> tuple[list[Any], float]:
    from workloads.sophon.client import probe_bandwidth, profile_samples

    return profile_samples(address, "train", 7, SIZE, True), probe_bandwidth(address, min_s=0.05)


def test_profile_measures_sizes_and_times(server: Server, tiny_images: Path) -> None:
    profiles, bandwidth = in_subprocess(_profile_and_probe, server.address)
    data = load_image_data(tiny_images)
    assert [p.index for p in profiles] == list(range(len(data.train)))
    for p, s in zip(profiles, data.train, strict=True):
        assert p.bytes_after[0] == s.path.stat().st_size  # raw
        assert p.bytes_after[2] == p.bytes_after[3] == SIZE * SIZE * 3  # cropped, flipped
        assert p.bytes_after[4] == SIZE * SIZE * 3 * 4  # float32 tensor
        assert p.bytes_after[1] > p.bytes_after[2]  # decoded: the whole image
        assert p.cpu_ns[0] > 0  # decoding always costs something
    assert bandwidth > 1e6  # loopback: far more than a megabyte per second


def _bad_requests(address: str, corrupt: int) -> dict[str, str]:
    """What the server answers to bad requests (status and message), and whether it goes on."""
    import grpc

    from workloads.sophon import rpc

    pb2, pb2_grpc = rpc.modules()
    out = {}
    with grpc.insecure_channel(address) as ch:
        stub = pb2_grpc.SampleStoreStub(ch)

        def status(call: Any) -> str:
            try:
                list(call())
                return "OK"
            except grpc.RpcError as exc:
                return f"{exc.code().name}: {exc.details()}"

        def fetch(**kw: Any) -> Any:
            args = {"mode": pb2.PARTIAL_OFFLOAD, "split": "train", "image_size": SIZE}
            return lambda: stub.Fetch(pb2.FetchRequest(**{**args, "train": True, **kw}))

        out["unknown sample"] = status(fetch(indices=[0, 10**6]))
        out["unknown split"] = status(fetch(indices=[0], split="test"))
        out["bad size"] = status(fetch(indices=[0], image_size=0))
        out["stages missing"] = status(fetch(indices=[0, 1], mode=pb2.SELECTIVE, stages=[1]))
        out["corrupt"] = status(fetch(indices=[corrupt]))
        out["corrupt raw"] = status(fetch(indices=[corrupt], mode=pb2.NO_OFFLOAD))
        out["probe too big"] = status(lambda: stub.Probe(pb2.ProbeRequest(bytes=1 << 40)))
        # A client gone mid-stream: one sample read of a long request, then cancelled.
        call = stub.Fetch(
            pb2.FetchRequest(
                mode=pb2.ALL_OFFLOAD, split="train", image_size=SIZE, train=True,
                indices=[i % 5 for i in range(500)],
            )
        )  # fmt: skip
        next(call)
        call.cancel()
        out["after cancel"] = status(lambda: [stub.Describe(pb2.DescribeRequest(), timeout=30)])
    return out


def test_bad_requests_get_grpc_errors_and_the_server_goes_on(
    tiny_images: Path, tmp_path: Path
) -> None:
    data = tmp_path / "img"
    shutil.copytree(tiny_images, data)
    listing = load_image_data(data)
    corrupt = 2
    bad_file = listing.train[corrupt].path  # type: ignore[union-attr]
    bad_file.write_bytes(b"\xff\xd8 this is not a JPEG " * 50)
    srv = Server(data, workers=1)
    try:
        got = in_subprocess(_bad_requests, srv.address, corrupt)
        assert got["unknown sample"].startswith("OUT_OF_RANGE: no sample 1000000 in split train")
        assert got["unknown split"].startswith("INVALID_ARGUMENT: unknown split 'test'")
        assert got["bad size"].startswith("INVALID_ARGUMENT: image_size must be")
        assert got["stages missing"].startswith("INVALID_ARGUMENT: a selective request needs")
        assert got["corrupt"].startswith("DATA_LOSS: cannot decode the image")
        assert str(bad_file) in got["corrupt"]
        assert got["corrupt raw"] == "OK"  # the file as it is: the client finds out
        assert got["probe too big"].startswith("INVALID_ARGUMENT")
        assert got["after cancel"] == "OK"
        assert srv.proc.poll() is None  # still serving
        workers = _children(srv.proc.pid)
        assert workers  # the preprocessing pool
    finally:
        code = srv.stop()
    assert code == 0, srv.proc.stderr.read() if srv.proc.stderr else ""  # clean SIGTERM
    time.sleep(0.2)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def test_a_dataset_it_cannot_serve_is_one_line(tmp_path: Path) -> None:
    from cli import cli

    result = CliRunner().invoke(cli, ["storage-server", "--data", str(tmp_path / "none")])
    assert result.exit_code != 0 and "does not exist" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = CliRunner().invoke(
        cli, ["storage-server", "--data", str(tmp_path), "--prep-workers", "0"]
    )
    assert result.exit_code != 0 and "--prep-workers must be at least 1" in result.output


# ---------------------------------------------------------------------------------------------
# The requests of a remote dataset (no Docker)


def test_a_remote_dataset_is_a_storage_and_a_training_container(
    tiny_images: Path, tmp_path: Path
) -> None:
    from tracing.remote import StorageNode
    from tracing.request import RunOptions, workload_request

    request = workload_request(
        "resnet18",
        "sleep",
        tiny_images,
        tmp_path,
        options={"dataset": "remote-partial"},
        storage=StorageNode(prep_workers=2, cpus=0.5),
        run=RunOptions(net_bandwidth_bits_s=50_000_000),
    )
    main, storage = request.containers
    assert (main.role, storage.role) == ("main", "storage")
    assert not any(m.target == "/data" for m in main.mounts)  # samples come over the network
    assert [(m.source, m.target, m.read_only) for m in storage.mounts] == [
        (tiny_images.resolve(), "/data", True)
    ]
    assert storage.daemon and storage.cpus == 0.5 and storage.image == main.image
    assert storage.command is not None and storage.command[-2:] == ("--prep-workers", "2")


def test_a_storage_host_elsewhere_gives_one_container_a_route_out(tmp_path: Path) -> None:
    from tracing.request import workload_request

    request = workload_request(
        "resnet18",
        "sleep",
        None,
        tmp_path,
        options={"dataset": "remote-nooff", "storage_host": "10.1.2.3:50051"},
    )
    (main,) = request.containers
    assert main.external_network and main.config is not None
    assert main.config.options["storage_host"] == "10.1.2.3:50051"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--set", "dataset=remote-nooff", "--storage-host", "h:1", "--data", "{img}"], "both say"),
        (["--storage-host", "h:1"], "--set dataset=remote-nooff"),
        (["--set", "dataset=remote", "--data", "{img}"], "dataset must be one of"),
        (["--set", "dataset=remote-nooff", "--set", "storage_host=nohost"], "HOST:PORT"),
        (["--data", "{img}", "--net-bandwidth", "10mb"], "bad --net-bandwidth"),
        (["--data", "{img}", "--net-bandwidth", "10mbit"], "a run of one container has none"),
        (["--data", "{img}", "--prep-workers", "2"], "are for a remote dataset"),
        (
            ["--set", "dataset=remote-nooff", "--storage-host", "h:1", "--prep-workers", "2"],
            "replaces",
        ),
        (["--set", "dataset=remote-sophon", "--data", "{img}", "--storage-cpus", "0"], "positive"),
    ],
)
def test_bad_remote_options_are_one_line(
    tiny_images: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    from cli import cli

    argv = ["trace", "--workload", "resnet18", "--variant", "sleep", "--out", str(tmp_path)]
    argv += [a.replace("{img}", str(tiny_images)) for a in args]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_grouped_dataset_is_refused_before_anything_starts(tmp_path: Path) -> None:
    from tracing.remote import check_served_dataset

    grouped = tmp_path / "g"
    generate_images(grouped, 8 * 30_000, seed=1, workers=1, params=ImageGenParams(
        classes=2, mean_kb=30, group_size=4, val_fraction=0.0, distinct_images=4))  # fmt: skip
    with pytest.raises(UserError, match="serves the folder layout"):
        check_served_dataset(grouped)
