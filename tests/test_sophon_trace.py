"""Integration: the storage + training topology of a remote dataset, traced for real (Docker,
bpftrace, gRPC between the containers, tc): the bytes on the network per mode follow the sample
sizes (images larger than the crop: all offload > no offload > partial), both containers' file
I/O is traced, and a bandwidth cap limits the traffic and is gone after the run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.samples import sampled_total
from analysis.sophon import epoch_interval
from analysis.timeline import lane_groups, timeline_figure
from datagen.images import ImageGenParams, generate_images
from store.rundir import Run, load_run
from tests.conftest import REPO, reaped
from tracing.remote import StorageNode
from tracing.request import RunOptions, workload_request
from tracing.runner import trace
from tracing.shaper import qdisc_of
from workloads.images.files import load_image_data

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.bpftrace]

IMAGES = 8
CROP = 224 * 224 * 3  # bytes of a cropped RGB sample
TENSOR = CROP * 4  # bytes of a normalised float32 sample


@pytest.fixture(scope="module")
def large_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight JPEGs of about 300 kB: each larger than its 224 x 224 crop (150,528 B)."""
    out = tmp_path_factory.mktemp("sophon-trace") / "img"
    params = ImageGenParams(
        classes=2, mean_kb=300, size_sigma=0.05, val_fraction=0.0, distinct_images=4
    )
    generate_images(out, IMAGES * 300_000, seed=2, workers=2, params=params)
    return out


def trace_sophon(
    mode: str, data: Path, runs_root: Path, cap: int | None = None, **run: object
) -> Run:
    """resnet18 sleep of one epoch over the remote dataset ``mode`` served by a storage
    container, the network capped at ``cap`` bits per second; ``run``: more RunOptions (the
    nodes of a run across them, tests/test_cluster.py). The completed run."""
    request = workload_request(
        "resnet18",
        "sleep",
        data,
        runs_root,
        settings={
            "epochs": 1,
            "batch_size": 4,
            "workers": 1,
            "eval_every": 0,
            "checkpoint_every": 0,
        },
        options={"dataset": mode},
        storage=StorageNode(prep_workers=1),
        run=RunOptions(timeout_s=300, net_bandwidth_bits_s=cap, **run),  # type: ignore[arg-type]
    )
    outcome = trace(request, print)
    assert outcome.status == "completed", outcome.error
    return load_run(outcome.run_dir)


def _received(run: Run) -> float:
    assert run.start_ns is not None and run.end_ns is not None
    return sampled_total(run.samples, "container_net_rx", "main", run.start_ns, run.end_ns)


def test_network_bytes_per_mode_follow_the_sample_sizes(
    images: dict[str, str], large_images: Path, runs_root: Path
) -> None:
    files = load_image_data(large_images).train
    assert len(files) == IMAGES
    raw = sum(s.path.stat().st_size for s in files)  # type: ignore[union-attr]
    assert all(s.path.stat().st_size > CROP for s in files)  # type: ignore[union-attr]
    payload = {
        "remote-nooff": raw,
        "remote-alloff": IMAGES * TENSOR,
        "remote-partial": IMAGES * CROP,
    }
    got = {}
    for mode in payload:
        run = trace_sophon(mode, large_images, runs_root)
        got[mode] = _received(run)
        # Every sample crossed the link once, plus the protocols' headers (a few per cent).
        assert 0.9 * payload[mode] < got[mode] < 1.2 * payload[mode] + 200_000, (mode, got)
        # The storage container's file I/O is traced as any container's: each file read once.
        ev = run.events
        reads = ev[
            ev["kind"].astype(str).isin(["read", "pread64", "readv"])
            & (ev["container"].astype(str) == "storage")
            & ev["path"].astype(str).str.startswith("/data/train/")
        ]
        assert int(reads["bytes"].sum()) == raw, mode
        # The training container has no dataset: it read none of it.
        main_reads = ev[
            (ev["container"].astype(str) == "main")
            & ev["path"].astype(str).str.startswith("/data/")
        ]
        assert main_reads.empty
        # Both containers' traffic is in the timeline's network lane.
        if mode == "remote-partial":
            fig = timeline_figure([run])
            groups = [g.role for g in lane_groups(run)]
            assert groups == ["main", "storage"]
            network_rows = [e for e in fig.layout.meta["lanes"] if e["lane"] == "network"]
            assert len(network_rows) == 2
    assert got["remote-alloff"] > got["remote-nooff"] > got["remote-partial"]


def test_the_cap_limits_the_traffic_and_is_gone_after_the_run(
    images: dict[str, str], large_images: Path, runs_root: Path
) -> None:
    cap = 20_000_000  # 20 Mbit/s
    capped = trace_sophon("remote-sophon", large_images, runs_root, cap=cap)
    shaping = capped.manifest["net_shaping"]
    assert shaping["rate_bits_s"] == cap and set(shaping["devices"]) == {"main", "storage"}
    assert shaping["direction"] == "ingress"
    check_capped(capped, cap)
    # Uncapped, the same probe measures far more: the cap is what limited it.
    free = trace_sophon("remote-sophon", large_images, runs_root)
    free_plan = json.loads((free.path / "out" / "main" / "offload-plan.json").read_text())
    assert free_plan["bandwidth_bytes_s"] * 8 > 5 * cap
    assert free_plan["offloaded"] < IMAGES  # a fast link: the network is not the bottleneck
    # No shaper outlives its run: the capped interfaces are gone, or carry no tbf.
    for device in shaping["devices"].values():
        assert not Path(f"/sys/class/net/{device}").exists() or " tbf " not in qdisc_of(device)


def check_capped(run: Run, cap: int) -> None:
    """What a link capped at ``cap`` does to a remote-sophon run of :func:`trace_sophon`: the
    offload planner's probe measures the cap less the headers, so every image (each larger
    than its crop) is offloaded; the epoch's traffic into the training container stays under
    the cap."""
    plan = json.loads((run.path / "out" / "main" / "offload-plan.json").read_text())
    print(f"probe {plan['bandwidth_bytes_s'] * 8 / 1e6:.1f} Mbit/s, {plan['offloaded']} offloaded")
    assert 0.6 * cap < plan["bandwidth_bytes_s"] * 8 <= 1.05 * cap, plan
    # (at the crop, or decoded for the odd small image padded to its file size)
    assert plan["offloaded"] == IMAGES and plan["at_raw"] == 0, plan
    _, t0, t1 = epoch_interval(run)
    epoch_rate = (
        sampled_total(run.samples, "container_net_rx", "main", t0, t1) * 8 / ((t1 - t0) * 1e-9)
    )
    print(f"epoch traffic {epoch_rate / 1e6:.1f} Mbit/s")
    assert epoch_rate <= 1.1 * cap


def test_ctrl_c_removes_the_cap(images: dict[str, str], tmp_path: Path, runs_root: Path) -> None:
    """Two idle containers capped at 10 Mbit/s, interrupted: the caps go with the run."""
    compose = tmp_path / "idle.yml"
    idle = '["python3", "-c", "import time\\nwhile True: time.sleep(0.1)"]'
    compose.write_text(
        'version: "3.7"\nservices:\n'
        f"  a:\n    image: twintrace/base:latest\n    command: {idle}\n"
        f"  b:\n    image: twintrace/base:latest\n    command: {idle}\n"
    )
    argv = [sys.executable, str(REPO / "cli.py"), "trace", "--compose", str(compose)]
    argv += ["--out", str(runs_root), "--quiet", "--net-bandwidth", "10mbit"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    devices: dict[str, str] = {}
    with reaped(proc):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not devices:
            for manifest_path in runs_root.glob("*/manifest.json"):
                manifest = json.loads(manifest_path.read_text())
                if manifest.get("start_ns"):
                    devices = manifest["net_shaping"]["devices"]
            time.sleep(0.2)
        assert set(devices) == {"a", "b"}, "the trace never started"
        for device in devices.values():
            assert " tbf " in qdisc_of(device) and "rate 10Mbit" in qdisc_of(device)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr.decode()
    for device in devices.values():
        assert not Path(f"/sys/class/net/{device}").exists() or " tbf " not in qdisc_of(device)
