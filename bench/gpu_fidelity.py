"""Real GPU against its emulation: the zoo's ``original`` models on a GPU, then ``sleep`` from the
profiles measured on that GPU, step and epoch times side by side (``docs/gpus.md``).

Natively, without Docker (a GPU machine may have no engine): for each workload, on a dataset
generated here once in the workload's real format,

1. ``./cli.py profile measure --device cuda --db --accelerator ACC`` at the run's batch size
   and half of it (the profile lands in ``store/profiles/measured/ACC-<model>.json`` and
   is copied to ``OUT/profiles/``);
2. ``python -m workloads run`` with ``variant original`` on the GPU: the real job;
3. the same with ``variant sleep`` and that profile: the data pipeline is the same, the
   model's computation is the emulation (no GPU used).

Per run: the median step (the time between consecutive ``step_end`` points of rank 0,
the first step left out, as ``experiments/fidelity.py``) and the epoch's training time.
Results go to ``OUT/gpu-fidelity.json`` after every workload (a run cut short keeps what
finished) and a table to standard output.

    python bench/gpu_fidelity.py --out /tmp/gpu                   # on a GPU machine
    python bench/gpu_fidelity.py --out /tmp/gpu --device cpu --quick   # the procedure, here
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from datagen.registry import generate  # noqa: E402
from tracing.mllog import parse_mllog  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
    """One workload's GPU configuration: dataset (generator, bytes, generator options),
    workload options, batch size, loader workers and steps."""

    workload: str
    generator: str
    data_bytes: int
    options: dict[str, Any]
    batch: int
    workers: int
    steps: int
    generator_options: dict[str, Any] = dataclasses.field(default_factory=dict)


IMAGES = 700_000_000
#: Published model sizes where one GPU holds them (ResNet/AlexNet at 224 px, BERT-large at
#: sequence length 512, UNet3D at MLPerf's 128^3 patch with 32 base channels); DLRM with
#: MLPerf's MLP widths and embedding dimension, its tables capped at 400,000 rows (MLPerf's
#: 40 million would not fit one card).
GPU: tuple[Config, ...] = (
    Config("resnet50", "images", IMAGES, {"image_size": 224}, 64, 12, 40),
    Config("bert", "bert", 40_000_000, {"size": "large"}, 8, 4, 40),
    Config(
        "unet3d",
        "unet3d",
        1_000_000_000,
        {"patch_size": 128, "base_channels": 32},
        2,
        8,
        24,
        {"scale": 0.5},
    ),
    Config(
        "dlrm",
        "dlrm",
        300_000_000,
        {
            "embedding_dim": 128,
            "bottom_mlp": "512-256-128",
            "top_mlp": "1024-1024-512-256-1",
            "max_ind_range": 400_000,
        },
        32768,
        4,
        40,
    ),
    Config("resnet18", "images", IMAGES, {"image_size": 224}, 128, 12, 40),
    Config("alexnet", "images", IMAGES, {"image_size": 224}, 128, 12, 40),
)
#: The same procedure in seconds on a CPU (a check of the script, not a figure).
QUICK: tuple[Config, ...] = (
    Config("resnet18", "images", 20_000_000, {"image_size": 32}, 8, 1, 8),
    Config("bert", "bert", 4_000_000, {}, 4, 1, 8),
    Config("unet3d", "unet3d", 40_000_000, {"patch_size": 32}, 1, 1, 6, {"scale": 0.25}),
    Config("dlrm", "dlrm", 10_000_000, {}, 512, 1, 8),
)


def dataset(root: Path, c: Config) -> Path:
    path = root / f"{c.generator}-{c.data_bytes}"
    if not (path / "manifest.json").exists():
        generate(
            c.generator, path, c.data_bytes, seed=0, force=path.exists(), **c.generator_options
        )
    return path


def sets(options: dict[str, Any]) -> list[str]:
    return [arg for k, v in options.items() for arg in ("--set", f"{k}={v}")]


def measure(
    c: Config, data: Path, device: str, accelerator: str, out: Path, seconds: float
) -> Path:
    """Measure ``c``'s profile at its batch size and half of it; returns the profile's path."""
    sizes = sorted({max(1, c.batch // 2), c.batch})
    profile = out / "profiles" / f"{accelerator}-{c.workload}.json"
    profile.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(REPO / "cli.py"),
        "profile",
        "measure",
        "--workload",
        c.workload,
        "--data",
        str(data),
        "--batch-sizes",
        ",".join(map(str, sizes)),
        "--device",
        device,
        "--max-seconds",
        str(seconds),
        *sets(c.options),
        "--out",
        str(profile),
    ]
    if device == "cuda":
        command += ["--db", "--accelerator", accelerator, "--replace"]
    subprocess.run(command, check=True, cwd=REPO)
    return profile


def run(
    c: Config, variant: str, data: Path, out: Path, device: str, profile: Path | None
) -> dict[str, Any]:
    """One native run of ``c``; returns its median step, steps and epoch time."""
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "workload": c.workload,
        "variant": variant,
        "epochs": 1,
        "batch_size": c.batch,
        "workers": c.workers,
        "max_steps": c.steps,
        "checkpoint_every": 0,
        "device": device if variant != "sleep" else "cpu",
        "options": c.options,
        "profile": str(profile) if profile else None,
    }
    (out / "config.json").write_text(json.dumps(config))
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "workloads",
            "run",
            "--config",
            str(out / "config.json"),
            "--data",
            str(data),
            "--out",
            str(out),
        ],
        check=True,
        cwd=REPO,
    )
    wall = time.monotonic() - started
    phases = parse_mllog(out / "mllog.log")
    rank0 = phases[(phases["rank"] == 0) & (phases["epoch"] == 1)]
    ends = rank0[rank0["key"] == "step_end"].sort_values("step")["ts_ns"].to_numpy()
    steps = [float(d) / 1e9 for d in (ends[1:] - ends[:-1])][1:]
    epoch = rank0[rank0["key"] == "epoch"]["duration_ns"].sum() / 1e9
    return {
        "median_step_s": statistics.median(steps),
        "min_step_s": min(steps),
        "max_step_s": max(steps),
        "steps": len(steps) + 2,
        "epoch_s": float(epoch),
        "wall_s": wall,
    }


def device_name(device: str) -> str:
    if device != "cuda":
        return "CPU"
    import torch

    return torch.cuda.get_device_name(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--accelerator", default="h100-80gb", help="profile database name")
    parser.add_argument("--workloads", default="", help="comma-separated subset")
    parser.add_argument("--quick", action="store_true", help="tiny CPU-sized configurations")
    parser.add_argument("--measure-seconds", type=float, default=6.0)
    parser.add_argument("--deadline-s", type=float, default=1e9, help="start no workload after")
    args = parser.parse_args()
    configs = QUICK if args.quick else GPU
    if args.workloads:
        wanted = args.workloads.split(",")
        configs = tuple(c for c in configs if c.workload in wanted)
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "device": device_name(args.device),
        "accelerator": args.accelerator,
        "cpus": os.cpu_count(),
        "command": " ".join(sys.argv),
        "workloads": {},
    }
    for c in configs:
        if time.monotonic() - started > args.deadline_s:
            print(f"{c.workload}: skipped, past the deadline", file=sys.stderr, flush=True)
            continue
        entry: dict[str, Any] = {"config": dataclasses.asdict(c)}
        result["workloads"][c.workload] = entry
        try:
            t = time.monotonic()
            data = dataset(args.out / "data", c)
            entry["datagen_s"] = time.monotonic() - t
            t = time.monotonic()
            profile = measure(
                c, data, args.device, args.accelerator, args.out, args.measure_seconds
            )
            entry["measure_s"] = time.monotonic() - t
            entry["profile"] = json.loads(profile.read_text())
            runs = args.out / "runs" / c.workload
            entry["original"] = run(c, "original", data, runs / "original", args.device, None)
            entry["sleep"] = run(c, "sleep", data, runs / "sleep", args.device, profile)
            real, emu = entry["original"], entry["sleep"]
            entry["step_error"] = emu["median_step_s"] / real["median_step_s"] - 1
            entry["epoch_error"] = emu["epoch_s"] / real["epoch_s"] - 1
            print(
                f"{c.workload}: real step {real['median_step_s'] * 1e3:.1f} ms, emulated "
                f"{emu['median_step_s'] * 1e3:.1f} ms ({entry['step_error']:+.1%}); epoch "
                f"{real['epoch_s']:.2f} s vs {emu['epoch_s']:.2f} s ({entry['epoch_error']:+.1%})",
                flush=True,
            )
        except (subprocess.CalledProcessError, OSError, ValueError) as exc:
            entry["error"] = str(exc)
            print(f"{c.workload}: failed: {exc}", file=sys.stderr, flush=True)
        entry["elapsed_s"] = time.monotonic() - started
        (args.out / "gpu-fidelity.json").write_text(json.dumps(result, indent=1))
    shutil.rmtree(args.out / "data", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
