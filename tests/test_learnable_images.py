"""Learnable image datasets (``./cli.py datagen images --learnable``): pixels that depend on the
class, so that accuracy means something (the grouping and HFTA accuracy studies). Deterministic
for a seed, train and val distinct images, the folder and grouped layouts the same samples, and
a tiny model of the zoo learns it far above chance, its accuracy in the MLLOG as
``eval_accuracy`` and in the run's phases."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datagen.images import ImageGenParams, generate_images, plan_images

ROOT = Path(__file__).resolve().parent.parent


def _learnable(**kw: object) -> ImageGenParams:
    return ImageGenParams(
        **{"classes": 10, "learnable": True, "val_fraction": 0.2, "mean_kb": 20, **kw}  # type: ignore[arg-type]
    )


def _pixels(data: bytes) -> str:
    with Image.open(__import__("io").BytesIO(data)) as img:
        return hashlib.sha256(np.asarray(img.convert("RGB")).tobytes()).hexdigest()


@pytest.fixture(scope="module")
def learnable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """500 images of about 20 kB, 10 classes, a fifth of them for validation."""
    out = tmp_path_factory.mktemp("learnable") / "img"
    generate_images(out, 10_000_000, seed=4, workers=2, params=_learnable())
    return out


def test_labels_are_drawn_per_image_whatever_the_size_or_layout() -> None:
    small = plan_images(2_000_000, 4, _learnable())
    large = plan_images(8_000_000, 4, _learnable(group_size=8))
    n = small.images - 1  # the folder layout's last image is cut to fit the size
    assert [small.label(i) for i in range(n)] == [large.label(i) for i in range(n)]
    assert small.sizes[:n].tolist() == large.sizes[:n].tolist()
    # Balanced enough: every class, none far from a tenth.
    counts = np.bincount([large.label(i) for i in range(large.images)], minlength=10)
    assert counts.min() > 0.5 * large.images / 10, counts
    # A group of consecutive images mixes classes, as a shuffled dataset's groups do.
    groups = [{large.label(i) for i in range(g, g + 8)} for g in range(0, large.images, 8)]
    assert np.mean([len(g) for g in groups]) > 4


def test_the_dataset_is_deterministic_and_its_splits_are_distinct_images(
    learnable: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    generate_images(again, 10_000_000, seed=4, workers=1, params=_learnable())
    first = json.loads((learnable / "manifest.json").read_text())
    second = json.loads((again / "manifest.json").read_text())
    assert first["files"] == second["files"]
    for f in first["files"]:
        assert (learnable / f["name"]).read_bytes() == (again / f["name"]).read_bytes(), f
    params = first["params"]
    assert params["learnable"] and params["classes_used"] == 10
    assert params["distinct_images"] == params["images"]  # every image its own
    train = {_pixels(p.read_bytes()) for p in learnable.glob("train/*/*.JPEG")}
    val = {_pixels(p.read_bytes()) for p in learnable.glob("val/*/*.JPEG")}
    assert len(train) == params["train_images"] and len(val) == params["val_images"]
    assert not train & val


def test_a_class_is_a_hue(learnable: Path) -> None:
    """The mean hue of a class's images is near the class's place on the colour wheel."""
    for label in range(10):
        hues = []
        for path in sorted(learnable.glob(f"train/n{label:08d}/*.JPEG"))[:8]:
            with Image.open(path) as img:
                hsv = np.asarray(img.convert("RGB").resize((32, 32)).convert("HSV"), float)
            angle = hsv[..., 0] / 255 * 2 * np.pi
            hues.append(np.angle(np.mean(np.exp(1j * angle))) / (2 * np.pi) % 1)
        distance = np.abs((np.array(hues) - label / 10 + 0.5) % 1 - 0.5)
        assert np.median(distance) < 0.05, (label, hues)


def _index(data: bytes) -> int:
    """The image's index in its dataset, from the tag its first COM segment carries."""
    at = data.index(b"twintrace image ") + len(b"twintrace image ")
    return int(data[at : at + 12])


def test_folder_and_grouped_layouts_hold_the_same_samples(learnable: Path, tmp_path: Path) -> None:
    """Image i is the same bytes with the same label in the folder layout and in a grouped
    one; the layouts differ only by the folder layout's last image (cut to fit) and the
    grouped one's last partial group, and by where the val split begins (whole groups)."""
    grouped = tmp_path / "g8"
    generate_images(grouped, 10_000_000, seed=4, workers=2, params=_learnable(group_size=8))
    folder = {}
    for path in learnable.glob("*/n*/*.JPEG"):
        data = path.read_bytes()
        folder[_index(data)] = (data, int(path.parent.name[1:]))
    same = 0
    for split in ("train", "val"):
        with open(grouped / split / "index.csv") as f:
            for row in csv.DictReader(f):
                group = grouped / split / "groups" / f"group_{int(row['group']):06d}.bin"
                with open(group, "rb") as g:
                    g.seek(int(row["offset"]))
                    data = g.read(int(row["size"]))
                i = _index(data)
                if i == len(folder) - 1:  # the folder layout's last image, cut to fit
                    continue
                assert folder[i] == (data, int(row["label"])), (i, row)
                same += 1
    assert same >= len(folder) - 8, (same, len(folder))


def test_a_tiny_model_learns_it_and_logs_its_accuracy(learnable: Path, tmp_path: Path) -> None:
    """ResNet-18 at 32 x 32 pixels and 8 channels, 5 epochs of 400 images on the CPU (about
    10 s): top-1 on the 97 val images at least 60 % (chance: 10 %), logged once per epoch as
    MLLOG ``eval_accuracy`` (top-5, the loss and the samples in its metadata), and in the
    phases the run's MLLOG becomes."""
    from tracing.mllog import parse_mllog

    config = {
        "workload": "resnet18", "variant": "original", "epochs": 5, "batch_size": 16,
        "workers": 1, "eval_every": 1, "checkpoint_every": 0, "device": "cpu",
        "options": {"optimizer": "sgd", "learning_rate": 0.05, "image_size": 32, "width": 8},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "workloads", "run", "--config", str(tmp_path / "config.json"),
         "--data", str(learnable), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    phases = parse_mllog(out / "mllog.log")
    accuracy = phases[phases["key"] == "eval_accuracy"].sort_values("epoch")
    assert accuracy["epoch"].tolist() == [1, 2, 3, 4, 5]
    top1 = [float(v) for v in accuracy["value"]]
    assert top1[-1] >= 0.6, top1
    lines = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (out / "mllog.log").open()]
    (last,) = [e for e in lines if e["key"] == "eval_accuracy" and e["metadata"]["epoch"] == 5]
    meta = last["metadata"]
    val = json.loads((learnable / "manifest.json").read_text())["params"]["val_images"]
    assert meta["samples"] == val and top1[-1] <= meta["top5"] <= 1 and meta["loss"] > 0, meta
