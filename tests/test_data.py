"""Tests of vitlab.data: data sets, idx files, image folders, image conversion and batch augmentation."""

from __future__ import annotations

import gzip
import struct
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from _helpers import one_line
from vitlab.data import (
    DATASETS,
    BatchAugment,
    DataSplit,
    convert_channels,
    dataset_stats,
    load_dataset,
    load_image,
    mnist5k_split_indices,
    normalization,
    normalize,
    resize_images,
)
from vitlab.errors import DataError

IDX_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


# ------------------------------------------------------------------------------------------- mnist-5k


@pytest.fixture(scope="module")
def mnist5k() -> tuple[DataSplit, DataSplit]:
    return load_dataset("mnist-5k", img_size=28, in_chans=1)


def test_mnist5k_sizes_and_stratification(mnist5k):
    train, test = mnist5k
    assert len(train) == 4000 and len(test) == 1000
    assert train.images.shape == (4000, 1, 28, 28) and test.images.shape == (1000, 1, 28, 28)
    assert train.labels.bincount(minlength=10).tolist() == [400] * 10
    assert test.labels.bincount(minlength=10).tolist() == [100] * 10
    assert train.classes == [str(i) for i in range(10)] == test.classes


def test_mnist5k_values_and_dtypes(mnist5k):
    train, test = mnist5k
    for split in (train, test):
        assert split.images.dtype == torch.uint8 and split.labels.dtype == torch.int64
        assert split.images.min() == 0 and split.images.max() == 255
        assert 0.08 < split.images.float().mean().item() / 255 < 0.2  # digits: mostly black background
        assert split.labels.min() == 0 and split.labels.max() == 9


def test_mnist5k_split_fixed_disjoint_and_independent_of_rng(mnist5k):
    labels = np.repeat(np.arange(10), 500)[np.argsort(np.arange(5000) % 7, kind="stable")]
    torch.manual_seed(0)
    np.random.seed(0)
    tr1, te1 = mnist5k_split_indices(labels)
    torch.manual_seed(1)
    np.random.seed(1)
    tr2, te2 = mnist5k_split_indices(labels)
    assert np.array_equal(tr1, tr2) and np.array_equal(te1, te2)
    assert len(np.intersect1d(tr1, te1)) == 0 and len(tr1) + len(te1) == 5000
    assert np.bincount(labels[te1]).tolist() == [100] * 10
    # not simply the first 100 of each class, and another seed gives another split
    assert not np.array_equal(te1, mnist5k_split_indices(labels, seed=1)[1])
    assert not all(np.array_equal(te1[labels[te1] == c], np.flatnonzero(labels == c)[:100]) for c in range(10))
    # a second load (after touching the global RNG) returns the very same split
    torch.manual_seed(123)
    train, test = load_dataset("mnist-5k", img_size=28, in_chans=1)
    assert torch.equal(train.images, mnist5k[0].images) and torch.equal(test.labels, mnist5k[1].labels)


def test_mnist5k_converted_to_rgb_and_resized():
    train, test = load_dataset("mnist-5k", img_size=32, in_chans=3)
    assert train.images.shape == (4000, 3, 32, 32) and test.images.dtype == torch.uint8
    assert torch.equal(train.images[:, 0], train.images[:, 2])


# ---------------------------------------------------------------------------------------------- idx


def write_idx(path: Path, array: np.ndarray, *, compress: bool = True, magic: int | None = None) -> None:
    """Write a uint8 array as an idx file (independent of the reader under test)."""
    header = struct.pack(">I", magic if magic is not None else 0x0800 | array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if compress:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)


def make_idx_dir(folder: Path, *, compress: bool = True, n_train: int = 12, n_test: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for role, array in arrays.items():
        write_idx(folder / IDX_NAMES[role], array, compress=compress)
    return arrays


def test_idx_round_trip_gz(tmp_path):
    arrays = make_idx_dir(tmp_path)
    train, test = load_dataset("mnist", data_dir=tmp_path, img_size=28, in_chans=1)
    assert torch.equal(train.images[:, 0], torch.from_numpy(arrays["train_images"]))
    assert torch.equal(test.images[:, 0], torch.from_numpy(arrays["test_images"]))
    assert train.labels.tolist() == arrays["train_labels"].tolist()
    assert test.labels.dtype == torch.int64 and test.labels.tolist() == arrays["test_labels"].tolist()
    assert train.classes == [str(i) for i in range(10)]


def test_idx_uncompressed_in_torchvision_layout_fashion(tmp_path):
    arrays = make_idx_dir(tmp_path / "FashionMNIST" / "raw", compress=False, seed=3)
    train, test = load_dataset("fashion-mnist", data_dir=tmp_path, img_size=14, in_chans=3)
    assert train.images.shape == (12, 3, 14, 14) and test.images.shape == (6, 3, 14, 14)
    assert test.labels.tolist() == arrays["test_labels"].tolist()
    assert train.classes[0] == "T-shirt/top" and len(train.classes) == 10


def test_idx_wrong_magic_names_file(tmp_path):
    make_idx_dir(tmp_path)
    labels = np.zeros(12, dtype=np.uint8)
    write_idx(tmp_path / IDX_NAMES["train_images"], labels)  # an idx1 file where an idx3 file belongs
    with pytest.raises(DataError) as exc:
        load_dataset("mnist", data_dir=tmp_path, img_size=28, in_chans=1)
    msg = one_line(exc)
    assert "train-images-idx3-ubyte.gz" in msg and "0x00000801" in msg and "idx3" in msg


def test_idx_garbage_magic(tmp_path):
    make_idx_dir(tmp_path)
    write_idx(tmp_path / IDX_NAMES["test_labels"], np.zeros(6, dtype=np.uint8), magic=0x12345678)
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz: wrong magic number 0x12345678"):
        load_dataset("mnist", data_dir=tmp_path, img_size=28, in_chans=1)


def test_idx_truncated_names_file(tmp_path):
    make_idx_dir(tmp_path)
    path = tmp_path / (IDX_NAMES["test_images"] + ".gz")
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[:-100]))  # valid gzip, data cut short
    with pytest.raises(DataError) as exc:
        load_dataset("mnist", data_dir=tmp_path, img_size=28, in_chans=1)
    msg = one_line(exc)
    assert "t10k-images-idx3-ubyte.gz" in msg and "truncated" in msg


def test_idx_truncated_gzip_stream(tmp_path):
    make_idx_dir(tmp_path)
    path = tmp_path / (IDX_NAMES["train_labels"] + ".gz")
    path.write_bytes(path.read_bytes()[:-12])  # gzip stream cut short
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz"):
        load_dataset("mnist", data_dir=tmp_path, img_size=28, in_chans=1)


def test_idx_count_mismatch(tmp_path):
    make_idx_dir(tmp_path)
    write_idx(tmp_path / IDX_NAMES["train_labels"], np.zeros(11, dtype=np.uint8))
    with pytest.raises(DataError, match="12 images .* 11 labels"):
        load_dataset("mnist", data_dir=tmp_path, img_size=28, in_chans=1)


def test_missing_data_dir_mentions_flag(tmp_path):
    with pytest.raises(DataError) as exc:
        load_dataset("mnist", data_dir=tmp_path / "nowhere", img_size=28, in_chans=1)
    msg = one_line(exc)
    assert "--data-dir" in msg and "nowhere" in msg and "train-images-idx3-ubyte.gz" in msg


def test_offline_download_becomes_one_line(tmp_path, monkeypatch):
    import torchvision.datasets

    calls = []

    def offline(root, train=True, download=False):
        calls.append((root, download))
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    with pytest.raises(DataError) as exc:
        load_dataset("mnist", data_dir=tmp_path, img_size=28, in_chans=1)  # exists, no idx files
    msg = one_line(exc).replace(str(tmp_path), "<tmp>")  # the tmp path itself contains "offline"
    assert "looks offline" in msg and "--data-dir" in msg and "t10k-labels-idx1-ubyte.gz" in msg
    assert calls == [(str(tmp_path), True)]
    with pytest.raises(DataError) as exc:
        load_dataset("cifar10", root=tmp_path / "cache", img_size=32, in_chans=3)
    msg = one_line(exc).replace(str(tmp_path), "<tmp>")
    assert "looks offline" in msg and "cifar-10-batches-py" in msg and calls[-1][0] == str(tmp_path / "cache")


def test_not_found_without_download(tmp_path):
    with pytest.raises(DataError, match="download is off.*--data-dir"):
        load_dataset("fashion-mnist", data_dir=tmp_path, img_size=28, in_chans=1, download=False)


def test_unknown_dataset_and_bad_chans():
    with pytest.raises(DataError, match="mnist-5k"):
        load_dataset("svhn", img_size=28, in_chans=1)
    with pytest.raises(DataError, match="in_chans=2"):
        load_dataset("mnist-5k", img_size=28, in_chans=2)


# ------------------------------------------------------------------------------------- image folder


def save_image(path: Path, mode: str, size: tuple[int, int], value: int, fmt: str = "PNG") -> None:
    """A flat image of brightness ``value`` in the given PIL mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = Image.new("RGB", size, (value, value, value))
    if mode == "L":
        img = rgb.convert("L")
    elif mode == "RGBA":
        img = rgb.convert("RGBA")
        img.putalpha(128)
    elif mode == "P":
        img = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    else:
        img = rgb
    img.save(path, fmt)


def make_folder(root: Path) -> None:
    modes = ["L", "RGB", "RGBA", "P"]
    sizes = [(20, 20), (31, 17), (8, 40), (16, 16)]
    for split, n in (("train", 4), ("val", 2)):
        for cls, value in (("bright", 220), ("dark", 30)):
            for i in range(n):
                save_image(root / split / cls / f"{i}.png", modes[i], sizes[i], value)
    (root / "train" / "bright" / "notes.txt").write_text("not an image")


def test_imagefolder_mixed_modes_and_sizes(tmp_path):
    make_folder(tmp_path)
    train, val = load_dataset("imagefolder", data_dir=tmp_path, img_size=16, in_chans=3)
    assert train.classes == ["bright", "dark"] == val.classes
    assert train.images.shape == (8, 3, 16, 16) and val.images.shape == (4, 3, 16, 16)
    assert train.labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1] and val.labels.tolist() == [0, 0, 1, 1]
    for split in (train, val):
        brightness = split.images.float().mean(dim=(1, 2, 3))
        assert torch.all((brightness > 128) == (split.labels == 0))
    gray, _ = load_dataset("imagefolder", data_dir=tmp_path, img_size=12, in_chans=1)
    assert gray.images.shape == (8, 1, 12, 12)


def test_imagefolder_empty_class_folder(tmp_path):
    make_folder(tmp_path)
    (tmp_path / "val" / "dark").rename(tmp_path / "val" / "dark_moved")
    (tmp_path / "val" / "dark").mkdir()
    with pytest.raises(DataError) as exc:
        load_dataset("imagefolder", data_dir=tmp_path, img_size=16, in_chans=3)
    assert str(tmp_path / "val" / "dark") in one_line(exc) and "no images" in str(exc.value)


def test_imagefolder_missing_split_and_bad_image(tmp_path):
    make_folder(tmp_path)
    (tmp_path / "train" / "dark" / "9.png").write_bytes(b"\x89PNG but not really")
    with pytest.raises(DataError, match="9.png"):
        load_dataset("imagefolder", data_dir=tmp_path, img_size=16, in_chans=3)
    empty = tmp_path / "empty"
    (empty / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="val"):
        load_dataset("imagefolder", data_dir=empty, img_size=16, in_chans=3)


# ------------------------------------------------------------------------------------ image helpers


def test_convert_channels_gray_rgb():
    gray = torch.randint(0, 256, (2, 1, 5, 6), dtype=torch.uint8)
    rgb = convert_channels(gray, 3)
    assert rgb.shape == (2, 3, 5, 6) and all(torch.equal(rgb[:, c], gray[:, 0]) for c in range(3))
    assert torch.equal(convert_channels(rgb, 1), gray)  # gray -> rgb -> gray is lossless
    assert convert_channels(gray, 1) is gray


def test_convert_channels_matches_pil_luminance():
    arr = np.random.default_rng(0).integers(0, 256, (9, 11, 3), dtype=np.uint8)
    expected = np.asarray(Image.fromarray(arr, "RGB").convert("L"))
    got = convert_channels(torch.from_numpy(arr).permute(2, 0, 1), 1)  # (1, 9, 11)
    assert got.shape == (1, 9, 11) and np.array_equal(got[0].numpy(), expected)


def test_convert_channels_errors():
    with pytest.raises(DataError, match="in_chans=2"):
        convert_channels(torch.zeros(1, 1, 4, 4, dtype=torch.uint8), 2)
    with pytest.raises(DataError, match="4-channel"):
        convert_channels(torch.zeros(1, 4, 4, 4, dtype=torch.uint8), 3)


def test_resize_images():
    x = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8)
    assert resize_images(x, 28) is x
    y = resize_images(x, 32)
    assert y.shape == (3, 1, 32, 32) and y.dtype == torch.uint8
    flat = torch.full((1, 3, 20, 30), 77, dtype=torch.uint8)
    assert torch.equal(resize_images(flat, 7), torch.full((1, 3, 7, 7), 77, dtype=torch.uint8))
    stripes = torch.tensor([0, 100, 100, 0], dtype=torch.uint8).repeat(4).view(1, 1, 1, 16).expand(1, 1, 16, 16)
    small = resize_images(stripes, 4)  # antialiasing averages each group of 4; plain bilinear would give 100
    assert small.shape == (1, 1, 4, 4) and 40 <= small.min() and small.max() <= 60


def test_load_image_jpeg_odd_size_and_non_image(tmp_path):
    path = tmp_path / "odd.jpg"
    save_image(path, "RGB", (37, 23), 200, fmt="JPEG")
    img = load_image(path, img_size=16, in_chans=3)
    assert img.shape == (3, 16, 16) and img.dtype == torch.uint8
    assert abs(img.float().mean().item() - 200) < 3
    assert load_image(path, img_size=23, in_chans=1).shape == (1, 23, 23)
    bad = tmp_path / "bad.png"
    bad.write_text("hello, I am text")
    with pytest.raises(DataError) as exc:
        load_image(bad, img_size=16, in_chans=3)
    assert str(bad) in one_line(exc)
    with pytest.raises(DataError, match="does not exist"):
        load_image(tmp_path / "missing.png", img_size=16, in_chans=3)


def test_stats_and_normalize():
    assert set(DATASETS) == {"mnist", "fashion-mnist", "cifar10", "cifar100", "mnist-5k", "imagefolder"}
    assert dataset_stats("mnist") == ((0.1307,), (0.3081,)) == dataset_stats("mnist-5k")
    assert dataset_stats("fashion-mnist") == ((0.2860,), (0.3530,))
    assert len(dataset_stats("cifar10")[0]) == 3 and dataset_stats("imagefolder")[0] == (0.485, 0.456, 0.406)
    assert normalization("mnist", 3) == ((0.1307,) * 3, (0.3081,) * 3)
    mean, std = normalization("cifar10", 1)
    assert len(mean) == len(std) == 1 and 0.45 < mean[0] < 0.5
    x = torch.tensor([0, 255], dtype=torch.uint8).view(1, 1, 1, 2)
    y = normalize(x, (0.5,), (0.25,))
    assert y.dtype == torch.float32 and torch.allclose(y.flatten(), torch.tensor([-2.0, 2.0]))
    with pytest.raises(DataError, match="normalization"):
        normalize(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), (0.5,), (0.25,))


# ------------------------------------------------------------------------------------- BatchAugment


def batch(seed: int = 0, b: int = 16) -> torch.Tensor:
    return torch.rand(b, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def test_augment_identity_when_off():
    aug = BatchAugment(degrees=0, scale=(1.0, 1.0), shear=0, translate=0)
    x = batch()
    assert torch.equal(aug(x), x) and torch.equal(aug(x, torch.Generator().manual_seed(0)), x)


def test_augment_deterministic_with_generator():
    aug = BatchAugment()
    x = batch()
    a = aug(x, torch.Generator().manual_seed(7))
    b = aug(x, torch.Generator().manual_seed(7))
    c = aug(x, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.allclose(a, c)
    assert not torch.allclose(a, x)
    # images of one batch get different parameters
    same = aug(x[:1].expand(4, -1, -1, -1).contiguous(), torch.Generator().manual_seed(7))
    assert not torch.allclose(same[0], same[1])


def test_augment_shape_dtype_preserved():
    aug = BatchAugment(hflip=True, pad_crop=2, erase_prob=0.5)
    x = batch(b=8)
    y = aug(x, torch.Generator().manual_seed(0))
    assert y.shape == x.shape and y.dtype == torch.float32
    u8 = (x * 255).to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    z = aug(u8, torch.Generator().manual_seed(0))
    assert z.shape == (8, 3, 28, 28) and z.dtype == torch.uint8
    with pytest.raises(DataError):
        aug(x[0])


def test_augment_translation_moves_mass_in_expected_direction():
    x = torch.zeros(32, 1, 28, 28)
    x[:, :, 10:18, 10:18] = 1.0  # a centred square
    aug = BatchAugment(degrees=0, scale=(1.0, 1.0), shear=0, translate=0.1)
    theta = aug.sample_theta(32, 28, 28, torch.Generator().manual_seed(3))
    y = aug(x, torch.Generator().manual_seed(3))
    shift_x = -theta[:, 0, 2] * 28 / 2  # content moves by minus the sampling offset, in pixels
    shift_y = -theta[:, 1, 2] * 28 / 2
    coords = torch.arange(28, dtype=torch.float32)
    mass = y.sum(dim=(1, 2, 3))
    com_x = (y.sum(dim=(1, 2)) * coords).sum(-1) / mass - 13.5
    com_y = (y.sum(dim=(1, 3)) * coords).sum(-1) / mass - 13.5
    assert shift_x.abs().max() > 1.5 and shift_y.abs().max() > 1.5
    assert torch.allclose(com_x, shift_x, atol=1e-3) and torch.allclose(com_y, shift_y, atol=1e-3)
    assert torch.allclose(mass, torch.full_like(mass, 64.0), atol=1e-3)  # square stays inside


def test_augment_pad_crop_is_whole_pixel_shift():
    x = batch(b=8)
    aug = BatchAugment(degrees=0, scale=(1.0, 1.0), shear=0, translate=0, pad_crop=3)
    theta = aug.sample_theta(8, 28, 28, torch.Generator().manual_seed(5))
    y = aug(x, torch.Generator().manual_seed(5))
    for i in range(8):
        dx, dy = (-theta[i, :, 2] * 14).round().long().tolist()
        assert abs(dx) <= 3 and abs(dy) <= 3
        expected = torch.zeros_like(x[i])
        src = x[i, :, max(0, -dy) : 28 - max(0, dy), max(0, -dx) : 28 - max(0, dx)]
        expected[:, max(0, dy) : 28 - max(0, -dy), max(0, dx) : 28 - max(0, -dx)] = src
        assert torch.allclose(y[i], expected, atol=1e-5)


def test_augment_rotation_turns_content_by_sampled_angle():
    x = torch.zeros(8, 1, 28, 28)
    x[:, :, 13:15, 4:24] = 1.0  # horizontal bar through the centre
    aug = BatchAugment(degrees=40, scale=(1.0, 1.0), shear=0, translate=0)
    theta = aug.sample_theta(8, 28, 28, torch.Generator().manual_seed(0))
    y = aug(x, torch.Generator().manual_seed(0))
    expected = torch.atan2(-theta[:, 1, 0], theta[:, 0, 0])  # theta holds the inverse rotation
    coords = torch.arange(28, dtype=torch.float32) - 13.5
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    w = y[:, 0]
    mass = w.sum(dim=(1, 2))
    mxx, myy, mxy = ((w * xx * xx).sum((1, 2)), (w * yy * yy).sum((1, 2)), (w * xx * yy).sum((1, 2)))
    orientation = 0.5 * torch.atan2(2 * mxy, mxx - myy)  # principal axis, image y pointing down
    assert expected.abs().max() > torch.deg2rad(torch.tensor(10.0))
    assert torch.allclose(orientation, expected, atol=0.03)
    assert torch.allclose(mass, x.sum(dim=(1, 2, 3)), rtol=0.03)


def test_augment_hflip_only_flips():
    x = batch(b=32)
    aug = BatchAugment(degrees=0, scale=(1.0, 1.0), shear=0, translate=0, hflip=True)
    y = aug(x, torch.Generator().manual_seed(1))
    flipped = torch.tensor([torch.allclose(y[i], x[i].flip(-1), atol=1e-5) for i in range(32)])
    kept = torch.tensor([torch.allclose(y[i], x[i], atol=1e-5) for i in range(32)])
    assert torch.all(flipped ^ kept) and 4 < flipped.sum() < 28


def test_augment_bad_arguments():
    with pytest.raises(DataError, match="scale"):
        BatchAugment(scale=(1.2, 0.8))
    with pytest.raises(DataError, match="erase_prob"):
        BatchAugment(erase_prob=1.5)


# --- training-batch augmentation: mixup / cutmix and TrivialAugment change the batch ---------------


def _pipeline(**aug):
    from vitlab.train.batches import BatchPipeline
    from vitlab.train.config import RunConfig

    off = dict(degrees=0.0, scale=(1.0, 1.0), shear=0.0, translate=0.0, erase_prob=0.0, hflip=False, pad_crop=0,
               trivial_augment=False, mixup=0.0, cutmix=0.0, label_smoothing=0.0)
    return BatchPipeline(RunConfig(**{**off, **aug}), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), num_classes=8, in_chans=3)


def _batch():
    images = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8)
    return images, torch.arange(8)  # every image its own class, so a mixed target shows both partners


def test_pipeline_without_augmentation_only_normalizes():
    images, labels = _batch()
    x, y = _pipeline().train_batch(images, labels, torch.Generator().manual_seed(0))
    torch.testing.assert_close(x, normalize(images, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    assert torch.equal(y, labels)


def test_mixup_blends_each_image_with_its_partner_as_the_targets_say():
    np.random.seed(0)
    images, labels = _batch()
    clean = normalize(images, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    x, y = _pipeline(mixup=0.8).train_batch(images, labels, torch.Generator().manual_seed(0))
    assert y.shape == (8, 8)
    torch.testing.assert_close(y.sum(dim=1), torch.ones(8))
    lam = y[0, 0].item()
    assert 0 < lam < 1 and not torch.allclose(x, clean)
    torch.testing.assert_close(y[0, 7].item(), 1 - lam)  # timm mixes image i with image B-1-i
    torch.testing.assert_close(x, lam * clean + (1 - lam) * clean.flip(0), atol=1e-5, rtol=1e-5)


def test_cutmix_pastes_a_box_of_the_partner_whose_area_is_the_target_weight():
    np.random.seed(0)
    images, labels = _batch()
    clean = normalize(images, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    x, y = _pipeline(cutmix=1.0).train_batch(images, labels, torch.Generator().manual_seed(0))
    pasted = (x != clean).any(dim=1)  # (B, H, W): pixels that changed
    assert pasted.any()
    from_partner = torch.isclose(x, clean.flip(0)).all(dim=1)
    assert bool((from_partner | ~pasted).all())  # every changed pixel is the partner's pixel
    box = pasted[0]
    rows, cols = box.any(dim=1).nonzero(), box.any(dim=0).nonzero()
    assert box[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()  # one rectangle
    area = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1) / 256
    torch.testing.assert_close(y[0, 7].item(), float(area), atol=1e-6, rtol=0)


def test_trivial_augment_changes_rgb_images():
    images, labels = _batch()
    clean = normalize(images, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    x, y = _pipeline(trivial_augment=True).train_batch(images, labels, torch.Generator().manual_seed(0))
    changed = [not torch.allclose(x[i], clean[i]) for i in range(8)]
    assert sum(changed) >= 4  # some draws (the identity op, magnitude 0) leave an image as it is
    assert x.shape == clean.shape and x.dtype == clean.dtype and torch.equal(y, labels)
