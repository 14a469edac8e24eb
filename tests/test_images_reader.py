"""Tests of the image-classification readers: listing and checks, transforms, torch datasets.

The datasets are generated small (mean 20 kB images, 3 classes) and read at image_size 32, so
a DataLoader with two workers gets through them in well under a second.
"""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from core.errors import UserError
from datagen.images import ImageGenParams, class_name, generate_images
from workloads.data import DataSummary
from workloads.events import Emitter
from workloads.images import transforms as T
from workloads.images.dataset import (
    GroupedImageDataset,
    ImageFolderDataset,
    collate_groups,
    make_dataset,
    read_whole,
)
from workloads.images.files import ImageGroup, ImageSample, check_dataset, load_image_data

S = 32
SMALL = ImageGenParams(classes=3, mean_kb=20, min_kb=4, val_fraction=0.2, distinct_images=6)
G = 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("img") / "folder"
    return out, generate_images(out, 400_000, seed=1, workers=2, params=SMALL)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("img") / "grouped"
    params = ImageGenParams(**{**SMALL.__dict__, "group_size": G})
    return out, generate_images(out, 400_000, seed=1, workers=2, params=params)


def copy_of(dataset: tuple[Path, dict], tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(dataset[0], copy)
    return copy


def jpeg_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=95)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# Listing and checks


def test_folder_listing_gives_sorted_classes_and_labels(folder: tuple[Path, dict]) -> None:
    out, manifest = folder
    data = load_image_data(out)
    assert data.layout == "folder" and data.group_size == 0
    assert data.classes == tuple(class_name(c) for c in range(3))
    assert len(data.train) == manifest["params"]["train_images"] > 10
    assert len(data.val) == manifest["params"]["val_images"] >= 2
    for sample in (*data.train, *data.val):
        assert isinstance(sample, ImageSample)
        assert data.classes[sample.label] == sample.path.parent.name
    # Round-robin labels: every class is present and balanced to within one image.
    counts = np.bincount([s.label for s in data.train], minlength=3)
    assert counts.max() - counts.min() <= 1


def test_check_dataset_counts_images_files_and_bytes(
    folder: tuple[Path, dict], grouped: tuple[Path, dict]
) -> None:
    out, manifest = folder
    images = manifest["params"]["images"]
    assert check_dataset(out) == DataSummary(images, images, manifest["total_bytes"])
    out, manifest = grouped
    groups = [f for f in manifest["files"] if f["name"].endswith(".bin")]
    assert check_dataset(out) == DataSummary(
        manifest["params"]["images"], len(groups), sum(f["bytes"] for f in groups)
    )


def test_grouped_listing_follows_the_index(grouped: tuple[Path, dict]) -> None:
    out, manifest = grouped
    data = load_image_data(out)
    assert data.layout == "grouped" and data.group_size == G
    assert data.classes == tuple(class_name(c) for c in range(3))
    assert data.images == manifest["params"]["images"]
    assert len(data.train) == manifest["params"]["train_images"] // G
    group = data.train[1]
    assert isinstance(group, ImageGroup)
    assert group.path == out / "train" / "groups" / "group_000001.bin"
    assert [m.label for m in group.members] == [k % 3 for k in range(G, 2 * G)]
    assert group.members[0].name == f"train/{class_name(0)}/{class_name(0)}_3.JPEG"
    whole = group.path.read_bytes()
    assert sum(m.size for m in group.members) == len(whole)
    for m in group.members:
        T.decode(whole[m.offset : m.offset + m.size], m.name)


def test_listing_errors_say_what_to_do(tmp_path: Path, folder: tuple[Path, dict]) -> None:
    with pytest.raises(UserError, match="does not exist.*datagen images"):
        load_image_data(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="not an image dataset"):
        load_image_data(tmp_path / "empty")
    copy = copy_of(folder, tmp_path)
    (copy / "val" / "n99999999").mkdir()
    with pytest.raises(UserError, match="n99999999 is a class that train/ does not have"):
        load_image_data(copy)
    (copy / "val" / "n99999999").rmdir()
    first = sorted((copy / "train" / class_name(0)).iterdir())[0]
    first.write_bytes(b"")
    with pytest.raises(UserError, match=f"{first} is empty"):
        check_dataset(copy)
    first.write_bytes(b"GIF89a not a jpeg")
    with pytest.raises(UserError, match=f"{first} is not a JPEG"):
        check_dataset(copy)


def test_index_errors_name_the_file_and_line(tmp_path: Path, grouped: tuple[Path, dict]) -> None:
    copy = copy_of(grouped, tmp_path)
    index = copy / "train" / "index.csv"
    lines = index.read_text().splitlines()
    index.write_text("\n".join(["group,offset,bytes,label,path", *lines[1:]]) + "\n")
    with pytest.raises(UserError, match="expected the header group,offset,size,label,path"):
        load_image_data(copy)
    index.write_text("\n".join([*lines[:3], "0,abc,5,0,x/y.JPEG", *lines[3:]]) + "\n")
    with pytest.raises(UserError, match="index.csv line 4 is not group,offset"):
        load_image_data(copy)
    bad_label = lines[1].split(",")
    bad_label[3] = "2"  # member 0 is class n00000000 (label 0)
    index.write_text("\n".join([lines[0], ",".join(bad_label), *lines[2:]]) + "\n")
    with pytest.raises(UserError, match="label 2 is given to class folders"):
        load_image_data(copy)
    index.write_text("\n".join(lines) + "\n")
    (copy / "train" / "groups" / "group_000002.bin").unlink()
    with pytest.raises(UserError, match="group_000002.bin is listed .* cannot be found"):
        check_dataset(copy)


def test_truncated_group_file_is_caught_by_the_check(
    tmp_path: Path, grouped: tuple[Path, dict]
) -> None:
    copy = copy_of(grouped, tmp_path)
    path = copy / "train" / "groups" / "group_000001.bin"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(UserError, match=f"{path} is truncated.*{len(data) - 100}"):
        check_dataset(copy)


# --------------------------------------------------------------------------------------------
# Transforms


def gradient(width: int, height: int) -> Image.Image:
    """An RGB image whose pixel (x, y) is (x % 256, y % 256, (x + y) % 256)."""
    x, y = np.meshgrid(np.arange(width), np.arange(height))
    pixels = np.stack([x % 256, y % 256, (x + y) % 256], axis=2).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def test_decode_gives_rgb_and_names_the_source_of_bad_data() -> None:
    gray = Image.new("L", (40, 30), 77)
    img = T.decode(jpeg_bytes(gray), "gray.jpg")
    assert img.mode == "RGB" and img.size == (40, 30)
    data = jpeg_bytes(gradient(64, 48))
    with pytest.raises(UserError, match="cannot decode the image somewhere/x.JPEG"):
        T.decode(data[: len(data) // 2], "somewhere/x.JPEG")
    with pytest.raises(UserError, match="cannot decode the image other.JPEG"):
        T.decode(b"\0" * 100, "other.JPEG")


def test_random_resized_crop_params_stay_within_bounds() -> None:
    rng = np.random.default_rng(0)
    width, height = 500, 375
    areas, ratios = [], []
    for _ in range(2000):
        top, left, h, w = T.rrc_params(width, height, rng)
        assert top >= 0 and top + h <= height and left >= 0 and left + w <= width
        assert h > 0 and w > 0
        areas.append(h * w / (width * height))
        ratios.append(w / h)
    # Rounding to whole pixels moves the bounds by a little.
    assert min(areas) > 0.07 and max(areas) <= 1.0
    assert min(ratios) > 3 / 4 - 0.02 and max(ratios) < 4 / 3 + 0.02
    # The draws cover the range, not one corner of it.
    assert np.quantile(areas, 0.1) < 0.2 and np.quantile(areas, 0.9) > 0.6


def test_random_resized_crop_falls_back_to_a_clamped_centre_crop() -> None:
    rng = np.random.default_rng(0)
    # No area fraction above 1 fits: every attempt fails and the centre crop is used.
    assert T.rrc_params(1000, 200, rng, scale=(1.5, 2.0)) == (0, (1000 - 267) // 2, 200, 267)
    assert T.rrc_params(200, 1000, rng, scale=(1.5, 2.0)) == ((1000 - 267) // 2, 0, 267, 200)
    assert T.rrc_params(400, 300, rng, scale=(1.5, 2.0)) == (0, 0, 300, 400)


def test_random_resized_crop_resizes_the_chosen_region() -> None:
    img = gradient(300, 200)
    out = T.random_resized_crop(img, S, np.random.default_rng(5))
    assert out.size == (S, S) and out.mode == "RGB"
    top, left, h, w = T.rrc_params(300, 200, np.random.default_rng(5))
    pixels = np.asarray(out).astype(int)
    # The red channel is x: the output spans the crop's columns from left to right.
    assert abs(pixels[:, 0, 0].mean() - left) <= w / S + 2
    assert abs(pixels[:, -1, 0].mean() - (left + w - 1)) <= w / S + 2


def test_hflip_mirrors_with_probability_p() -> None:
    img = gradient(20, 10)
    rng = np.random.default_rng(0)
    assert np.array_equal(np.asarray(T.hflip(img, rng, p=1.0)), np.asarray(img)[:, ::-1])
    assert T.hflip(img, rng, p=0.0) is img
    flips = [T.hflip(img, rng) is not img for _ in range(400)]
    assert 150 < sum(flips) < 250


def test_normalisation_uses_the_imagenet_mean_and_std() -> None:
    img = Image.new("RGB", (4, 3), (255, 0, 128))
    x = T.to_normalized_tensor(img)
    assert x.dtype == torch.float32 and x.shape == (3, 3, 4)
    expected = [
        (1.0 - 0.485) / 0.229,
        (0.0 - 0.456) / 0.224,
        (128 / 255 - 0.406) / 0.225,
    ]
    for c in range(3):
        assert torch.allclose(x[c], torch.full((3, 4), expected[c]), atol=1e-5)


def test_eval_transform_resizes_the_shorter_side_then_centre_crops() -> None:
    assert T.resize_shorter(gradient(500, 375), 37).size == (49, 37)
    assert T.resize_shorter(gradient(375, 500), 37).size == (37, 49)
    assert round(S * 256 / 224) == 37
    for size in ((500, 375), (375, 500), (37, 37)):
        assert T.eval_transform(gradient(*size), S).shape == (3, S, S)
    img = gradient(40, 30)
    crop = np.asarray(T.center_crop(img, 20))
    assert np.array_equal(crop, np.asarray(img)[5:25, 10:30])


def test_train_transform_is_a_function_of_the_generator_state() -> None:
    img = gradient(300, 200)
    a = T.train_transform(img, S, np.random.default_rng(3))
    b = T.train_transform(img, S, np.random.default_rng(3))
    c = T.train_transform(img, S, np.random.default_rng(4))
    assert a.shape == (3, S, S) and torch.equal(a, b) and not torch.equal(a, c)


# --------------------------------------------------------------------------------------------
# Datasets


def loader_error(loader: DataLoader) -> str:
    """The message of the UserError iterating ``loader`` raises.

    The traceback is dropped before the iterator: it holds the iterator in a reference cycle,
    and an iterator freed by the cycle collector finds its queues already closed and waits 5 s
    per worker for them to time out.
    """
    it = iter(loader)
    message = ""
    try:
        for _ in it:
            pass
    except UserError as exc:
        message = str(exc)
        exc.__traceback__ = None
    del it
    assert message, "no UserError was raised"
    return message


def test_read_whole_reads_the_file_and_names_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc" * 1000)
    assert read_whole(path) == b"abc" * 1000
    with pytest.raises(UserError, match=f"cannot read {tmp_path / 'nope.JPEG'}"):
        read_whole(tmp_path / "nope.JPEG")


def test_folder_dataset_with_a_dataloader_gives_every_label_in_order(
    folder: tuple[Path, dict],
) -> None:
    data = load_image_data(folder[0])
    ds = ImageFolderDataset(data.train, image_size=S, seed=1)
    ds.set_epoch(0)
    loader = DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    labels, count = [], 0
    for x, y in loader:
        assert x.dtype == torch.float32 and x.shape[1:] == (3, S, S)
        assert y.dtype == torch.int64
        labels.extend(y.tolist())
        count += len(x)
    assert count == len(data.train)
    assert labels == [s.label for s in data.train]


def test_folder_dataset_augmentation_depends_on_seed_epoch_and_index(
    folder: tuple[Path, dict],
) -> None:
    data = load_image_data(folder[0])
    ds = ImageFolderDataset(data.train[:4], image_size=S, seed=1)
    ds.set_epoch(0)
    first = [ds[i][0] for i in range(4)]
    assert all(torch.equal(first[i], ds[i][0]) for i in range(4))
    ds.set_epoch(1)
    assert not all(torch.equal(first[i], ds[i][0]) for i in range(4))
    val = ImageFolderDataset(data.val, image_size=S, train=False)
    val.set_epoch(0)
    x0 = val[0][0]
    val.set_epoch(5)
    assert torch.equal(x0, val[0][0])


def test_grouped_dataset_collates_groups_into_batches(grouped: tuple[Path, dict]) -> None:
    data = load_image_data(grouped[0])
    ds = make_dataset(data, "train", image_size=S, seed=2)
    assert isinstance(ds, GroupedImageDataset)
    ds.set_epoch(0)
    x, y = ds[0]
    assert x.shape == (G, 3, S, S) and y.tolist() == [0, 1, 2]
    loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate_groups)
    labels = []
    for x, y in loader:
        assert x.shape[1:] == (3, S, S) and x.shape[0] == len(y)
        labels.extend(y.tolist())
    assert x.shape[0] in (G, 2 * G)
    first_batch = next(iter(loader))[0]
    assert first_batch.shape == (2 * G, 3, S, S)
    assert labels == [m.label for g in data.train for m in g.members]
    # Same draws whatever the batching: member k of group i is transformed identically.
    assert torch.equal(first_batch[G : 2 * G], ds[1][0])


def test_datasets_log_load_and_preproc_events(
    tmp_path: Path, folder: tuple[Path, dict], grouped: tuple[Path, dict]
) -> None:
    log = tmp_path / "mllog.log"
    with Emitter(log, instrumenting=True) as emitter:
        folder_ds = make_dataset(load_image_data(folder[0]), "val", image_size=S, emitter=emitter)
        folder_ds.set_epoch(2)
        folder_ds[1]
        group_ds = make_dataset(load_image_data(grouped[0]), "train", image_size=S, emitter=emitter)
        group_ds.set_epoch(2)
        group_ds[1]
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]
    keys = [(e["key"], e["metadata"].get("index"), e["metadata"].get("group")) for e in events]
    assert keys == [
        ("sample_load", 1, None),
        ("sample_preproc", 1, None),
        ("sample_load", None, 1),
        ("sample_preproc", None, 1),
    ]
    assert all(e["metadata"]["epoch"] == 2 and e["value"] > 0 for e in events)
    assert events[2]["metadata"]["samples"] == G
    for e in events:
        assert e["metadata"]["ts_ns"] - e["metadata"]["start_ns"] == e["value"]


def test_corrupt_jpeg_raises_a_user_error_naming_the_file(
    tmp_path: Path, folder: tuple[Path, dict]
) -> None:
    copy = copy_of(folder, tmp_path)
    data = load_image_data(copy)
    victim = data.train[2].path
    victim.write_bytes(victim.read_bytes()[:3000])
    ds = ImageFolderDataset(data.train, image_size=S)
    with pytest.raises(UserError, match=f"cannot decode the image {victim}"):
        ds[2]
    # Also from a DataLoader worker: the error reaches the caller instead of hanging it.
    assert str(victim) in loader_error(DataLoader(ds, batch_size=2, num_workers=2))
    victim.unlink()
    with pytest.raises(UserError, match=f"cannot read {victim}"):
        ds[2]


def test_corrupt_or_truncated_group_member_names_group_and_member(
    tmp_path: Path, grouped: tuple[Path, dict]
) -> None:
    copy = copy_of(grouped, tmp_path)
    data = load_image_data(copy)
    ds = GroupedImageDataset(data.train, image_size=S)
    group = data.train[1]
    member = group.members[1]
    original = group.path.read_bytes()
    raw = bytearray(original)
    raw[member.offset : member.offset + 64] = b"\0" * 64
    group.path.write_bytes(bytes(raw))
    with pytest.raises(UserError, match=f"{member.name} in {group.path}.*offset {member.offset}"):
        ds[1]
    # Truncated after listing (the check would have caught it before): named with the member.
    group.path.write_bytes(original[: group.members[2].offset + 10])
    last = group.members[2]
    with pytest.raises(UserError, match=f"{group.path} is truncated: {last.name} needs"):
        ds[1]


def test_collate_groups_concatenates_along_the_first_dimension() -> None:
    items = [
        (torch.zeros(3, 3, 4, 4), torch.tensor([0, 1, 2])),
        (torch.ones(2, 3, 4, 4), torch.tensor([3, 4])),
    ]
    x, y = collate_groups(items)
    assert x.shape == (5, 3, 4, 4) and y.tolist() == [0, 1, 2, 3, 4]
    assert math.isclose(float(x.sum()), 2 * 3 * 16)
