"""Tests of the image-classification dataset generator (folder and grouped layouts).

The datasets are a few MB of realistic images (mean ~110 kB at ImageNet-like resolutions) with
few classes and a small pool, so each generation takes about a second.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from core.errors import UserError
from datagen.common import load_manifest
from datagen.images import (
    OVERHEAD_BYTES,
    ImageGenParams,
    class_name,
    encode_pool_image,
    generate_images,
    plan_images,
    pool_caps,
    unique_jpeg,
)
from tests.datagen_helpers import (
    assert_same_with_one_writer,
    data_bytes,
    data_files,
    dataset_fixture,
)

SIZE = 3_000_000
FOLDER = ImageGenParams(classes=5, val_fraction=0.1, distinct_images=12)
GROUPED = ImageGenParams(classes=3, val_fraction=0.2, distinct_images=10, group_size=4)


def decode_rgb(data: bytes) -> np.ndarray:
    img = Image.open(io.BytesIO(data))
    assert img.format == "JPEG" and img.mode == "RGB"
    return np.asarray(img)


folder = dataset_fixture("folder", generate_images, SIZE, seed=3, workers=2, params=FOLDER)
grouped = dataset_fixture("grouped", generate_images, SIZE, seed=3, workers=2, params=GROUPED)


# --------------------------------------------------------------------------------------------
# Folder layout


def test_folder_layout_names_splits_and_round_robin_labels(folder: tuple[Path, dict]) -> None:
    out, manifest = folder
    p = manifest["params"]
    n_train, n_val = p["train_images"], p["val_images"]
    assert p["layout"] == "folder" and p["images"] == n_train + n_val > 20
    assert n_val == round(p["images"] * 0.1)
    expected = {f"train/{class_name(k % 5)}/{class_name(k % 5)}_{k}.JPEG" for k in range(n_train)}
    expected |= {f"val/{class_name(k % 5)}/ILSVRC2012_val_{k + 1:08d}.JPEG" for k in range(n_val)}
    assert data_files(out) == expected
    assert sorted(os.listdir(out / "train")) == [class_name(c) for c in range(5)]


def test_folder_sizes_are_exact_realistic_and_fill_the_request(folder: tuple[Path, dict]) -> None:
    out, manifest = folder
    files = data_bytes(out)
    sizes = np.array([len(b) for b in files.values()])
    # The last image is shrunk to fill what remains: the total is exactly the request here.
    assert manifest["total_bytes"] == sizes.sum() == SIZE
    assert {f["name"]: f["bytes"] for f in manifest["files"]} == {
        n: len(b) for n, b in files.items()
    }
    assert 0.8 * 110_000 < sizes[:-1].mean() < 1.25 * 110_000
    assert sizes.min() >= FOLDER.min_kb * 1000 and sizes.std() > 20_000


def test_every_file_is_a_decodable_realistic_jpeg(folder: tuple[Path, dict]) -> None:
    out, manifest = folder
    distinct = set()
    for name, data in data_bytes(out).items():
        pixels = decode_rgb(data)
        h, w, _ = pixels.shape
        assert min(w, h) >= 100 and max(w, h) <= 1500, (name, w, h)
        assert 0.7 <= w / h <= 1.45, (name, w, h)
        # Real content, not a flat image: JPEG sizes depend on it.
        assert pixels.std() > 20
        distinct.add(hashlib.sha256(pixels.tobytes()).hexdigest())
    # Files repeat pool images (same pixels) but no two files have the same bytes.
    assert 2 < len(distinct) <= manifest["params"]["distinct_images"] == FOLDER.distinct_images
    hashes = {hashlib.sha256(b).hexdigest() for b in data_bytes(out).values()}
    assert len(hashes) == manifest["params"]["images"]


def test_files_carry_their_index_in_a_com_segment_after_app0(folder: tuple[Path, dict]) -> None:
    out, _ = folder
    data = (out / "train" / class_name(2) / f"{class_name(2)}_7.JPEG").read_bytes()
    assert data[:4] == b"\xff\xd8\xff\xe0"  # JFIF APP0 still first
    at = 4 + int.from_bytes(data[4:6], "big")
    assert data[at : at + 2] == b"\xff\xfe"
    assert data[at + 4 : at + 4 + 29] == b"twintrace image 000000000007\n"


def test_manifest_records_the_pool_and_the_params(folder: tuple[Path, dict]) -> None:
    out, manifest = folder
    loaded = load_manifest(out)
    assert loaded["generator"] == "images" and loaded["seed"] == 3
    p = loaded["params"]
    assert p["classes"] == 5 and p["group_size"] == 0 and p["distinct_images"] == 12
    assert p["mean_image_bytes"] == pytest.approx(SIZE / p["images"], abs=0.1)
    assert 0.5 * p["mean_image_bytes"] < p["mean_distinct_image_bytes"] <= p["mean_image_bytes"]
    assert loaded["total_bytes"] == SIZE


def test_different_seed_gives_different_images(tmp_path: Path, folder: tuple[Path, dict]) -> None:
    seed3, _ = folder
    other = tmp_path / "other"
    generate_images(other, 1_000_000, seed=4, workers=2, params=FOLDER)
    name = f"train/{class_name(0)}/{class_name(0)}_0.JPEG"
    a = decode_rgb((other / name).read_bytes())
    b = decode_rgb((seed3 / name).read_bytes())
    assert a.shape != b.shape or not np.array_equal(a, b)


def test_same_seed_gives_identical_bytes_whatever_the_worker_count(
    tmp_path: Path, folder: tuple[Path, dict]
) -> None:
    assert_same_with_one_writer(generate_images, folder, tmp_path, SIZE, seed=3, params=FOLDER)


# --------------------------------------------------------------------------------------------
# Grouped layout


def read_index(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and list(rows[0]) == ["group", "offset", "size", "label", "path"]
    return rows


def test_grouped_layout_has_one_file_per_g_images_and_an_index(
    grouped: tuple[Path, dict],
) -> None:
    out, manifest = grouped
    p = manifest["params"]
    g = GROUPED.group_size
    assert p["layout"] == "grouped" and p["train_images"] % g == 0 and p["val_images"] % g == 0
    assert p["val_images"] >= g
    files = data_files(out)
    for split, n in (("train", p["train_images"]), ("val", p["val_images"])):
        groups = {f"{split}/groups/group_{i:06d}.bin" for i in range(n // g)}
        assert groups | {f"{split}/index.csv"} == {f for f in files if f.startswith(split)}
        assert len(read_index(out / split / "index.csv")) == n
    assert p["groups"] == p["images"] // g
    # Only whole groups: short of the request by less than one group.
    assert SIZE - 4 * 400_000 < manifest["total_bytes"] <= SIZE


def test_group_files_are_exactly_the_concatenation_the_index_describes(
    grouped: tuple[Path, dict],
) -> None:
    out, _ = grouped
    g = GROUPED.group_size
    for split in ("train", "val"):
        rows = read_index(out / split / "index.csv")
        by_group: dict[int, list[dict[str, str]]] = {}
        for row in rows:
            by_group.setdefault(int(row["group"]), []).append(row)
        for number, members in by_group.items():
            data = (out / split / "groups" / f"group_{number:06d}.bin").read_bytes()
            assert len(members) == g
            offset = 0
            for k, row in enumerate(members):
                assert int(row["offset"]) == offset
                size = int(row["size"])
                image = data[offset : offset + size]
                decode_rgb(image)
                # The member is a whole JPEG tagged with its global image index.
                assert image[:2] == b"\xff\xd8" and image[-2:] == b"\xff\xd9"
                k_split = number * g + k
                label = k_split % GROUPED.classes
                assert int(row["label"]) == label
                if split == "train":
                    assert (
                        row["path"]
                        == f"train/{class_name(label)}/{class_name(label)}_{k_split}.JPEG"
                    )
                else:
                    assert row["path"] == (
                        f"val/{class_name(label)}/ILSVRC2012_val_{k_split + 1:08d}.JPEG"
                    )
                offset += size
            assert offset == len(data)


def test_grouped_and_folder_layouts_hold_the_same_images(tmp_path: Path) -> None:
    # The layout changes only how images are stored, not which images they are.
    params = dict(classes=2, val_fraction=0.0, distinct_images=6)
    a = generate_images(tmp_path / "f", 800_000, seed=5, params=ImageGenParams(**params))
    b = generate_images(
        tmp_path / "g", 800_000, seed=5, params=ImageGenParams(**params, group_size=2)
    )
    rows = read_index(tmp_path / "g" / "train" / "index.csv")
    assert len(rows) <= a["params"]["images"] and b["params"]["images"] == len(rows)
    for row in rows:
        group = tmp_path / "g" / "train" / "groups" / f"group_{int(row['group']):06d}.bin"
        member = group.read_bytes()[int(row["offset"]) :][: int(row["size"])]
        assert member == (tmp_path / "f" / row["path"]).read_bytes()


# --------------------------------------------------------------------------------------------
# Plan, pool and validation


def test_plan_matches_the_size_distribution_on_a_large_request() -> None:
    plan = plan_images(2_000_000_000, seed=0)
    assert plan.total_bytes == 2_000_000_000
    assert plan.sizes.mean() == pytest.approx(110_000, rel=0.02)
    assert plan.n_val == round(plan.images * 0.02)
    # Every file has room for its pool image and the tag; padding is a small part on average.
    room = plan.sizes - plan.caps[plan.pool]
    assert room.min() >= OVERHEAD_BYTES
    assert np.median(room / plan.sizes) < 0.05


def test_pool_images_stay_under_their_caps_and_near_them() -> None:
    caps = pool_caps(ImageGenParams(), 16)
    assert caps[0] <= 8000 - OVERHEAD_BYTES and np.all(np.diff(caps) >= 0)
    for j in (0, 5, 15):
        data = encode_pool_image(0, j, int(caps[j]), 90)
        assert len(data) <= caps[j]
        if j:
            assert len(data) >= 0.6 * caps[j]
        decode_rgb(data)


def test_unique_jpeg_pads_to_the_exact_size_across_several_segments() -> None:
    jpeg = encode_pool_image(0, 3, 20_000, 90)
    for size in (len(jpeg) + OVERHEAD_BYTES, len(jpeg) + 70_000, len(jpeg) + 5_000_003):
        data = b"".join(unique_jpeg(jpeg, size, seed=0, index=12))
        assert len(data) == size
        assert np.array_equal(decode_rgb(data), decode_rgb(jpeg))
    with pytest.raises(ValueError, match="padding"):
        unique_jpeg(jpeg, len(jpeg) + 3, seed=0, index=12)


def test_invalid_requests_are_rejected_before_touching_the_directory(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    with pytest.raises(UserError, match="at least 8000 bytes"):
        generate_images(out, 7_999)
    with pytest.raises(UserError, match="one group of 64 images"):
        generate_images(out, 1_000_000, params=ImageGenParams(group_size=64))
    with pytest.raises(UserError, match="greater than zero"):
        generate_images(out, 0)
    with pytest.raises(UserError, match="seed"):
        generate_images(out, 1_000_000, seed=-1)
    with pytest.raises(UserError, match="workers"):
        generate_images(out, 1_000_000, workers=0)
    assert not out.exists()
    out.mkdir()
    (out / "precious.txt").write_text("keep")
    with pytest.raises(UserError, match="not empty"):
        generate_images(out, 100_000, params=ImageGenParams(distinct_images=2))
    assert os.listdir(out) == ["precious.txt"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("classes", 0),
        ("quality", 101),
        ("group_size", -1),
        ("distinct_images", 0),
        ("mean_kb", 10.0),
        ("min_kb", 1.0),
        ("size_sigma", 3.0),
        ("val_fraction", 0.9),
        ("classes", True),
        ("mean_kb", float("nan")),
    ],
)
def test_invalid_params_are_rejected_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(UserError, match=field):
        ImageGenParams(**{field: value})


def test_one_image_dataset_has_no_val_split(tmp_path: Path) -> None:
    manifest = generate_images(tmp_path / "one", 9_000, params=ImageGenParams(distinct_images=4))
    p = manifest["params"]
    assert p["images"] == 1 and p["val_images"] == 0 and manifest["total_bytes"] == 9_000
    assert not (tmp_path / "one" / "val").exists()
