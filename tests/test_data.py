"""Datasets and transforms: scikit-learn digits, CIFAR-10/100 files, ImageFolder trees, timm transforms."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits
from tolerance import assert_close
from torchvision import transforms
from torchvision.datasets import CIFAR10, CIFAR100

from lkat_lens import data as lkdata

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_cifar(root: Path, name: str, n_train: int, n_test: int, num_classes: int, seed: int = 0) -> dict:
    """Write a tiny dataset in the on-disk CIFAR python format torchvision reads; returns what was written."""
    rng = np.random.default_rng(seed)
    reader = lkdata.CIFAR_READERS[name]
    folder = root / reader.base_folder
    folder.mkdir(parents=True)
    train = rng.integers(0, 256, (n_train, 3, 32, 32), dtype=np.uint8)
    test = rng.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8)
    train_y = [i % num_classes for i in range(n_train)]
    test_y = [(i + 1) % num_classes for i in range(n_test)]
    label_key = "labels" if name == "cifar10" else "fine_labels"
    classes = CIFAR10_CLASSES if name == "cifar10" else [f"class_{i:02d}" for i in range(num_classes)]
    parts = np.array_split(np.arange(n_train), len(reader.train_list))
    for (fname, _), idx in zip(reader.train_list, parts, strict=True):
        batch = {"data": train[idx].reshape(len(idx), -1), label_key: [train_y[i] for i in idx]}
        (folder / fname).write_bytes(pickle.dumps(batch))
    (folder / reader.test_list[0][0]).write_bytes(pickle.dumps({"data": test.reshape(n_test, -1), label_key: test_y}))
    (folder / reader.meta["filename"]).write_bytes(pickle.dumps({reader.meta["key"]: classes}))
    hwc = (0, 2, 3, 1)
    return {
        "train": train.transpose(hwc),
        "test": test.transpose(hwc),
        "train_y": train_y,
        "test_y": test_y,
        "classes": classes,
    }


def reader_for_written_files(base: type[CIFAR10], root: Path) -> type[CIFAR10]:
    """torchvision's CIFAR reader expecting the md5 sums of the files a test wrote.

    torchvision verifies every CIFAR file against the md5 of the official release before reading it, so
    tiny test files never pass as the real thing. The honest way in is the one torchvision itself uses
    (CIFAR100 subclasses CIFAR10 and overrides `train_list`/`test_list`/`meta`): a subclass whose expected
    sums are those of the written files. Everything else (pickle reading, HWC layout, class names) is
    torchvision's own, and test_cifar_md5_check_stays_on shows the stock reader still rejects these files.
    """
    folder = root / base.base_folder

    def md5(name: str) -> str:
        return hashlib.md5((folder / name).read_bytes()).hexdigest()

    return type(
        f"Written{base.__name__}",
        (base,),
        {
            "train_list": [[n, md5(n)] for n, _ in base.train_list],
            "test_list": [[n, md5(n)] for n, _ in base.test_list],
            "meta": {**base.meta, "md5": md5(base.meta["filename"])},
        },
    )


def use_written_cifar(monkeypatch: pytest.MonkeyPatch, root: Path, name: str) -> None:
    """Make lkat_lens.data read `name` through reader_for_written_files (explicitly, for this test only)."""
    base = {"cifar10": CIFAR10, "cifar100": CIFAR100}[name]
    monkeypatch.setitem(lkdata.CIFAR_READERS, name, reader_for_written_files(base, root))


def write_image_folder(
    root: Path, classes: list[str], per_class: tuple[int, int], size: int = 12, seed: int = 0
) -> None:
    """Write root/train/<class>/*.png and root/val/<class>/*.png with random RGB pixels."""
    rng = np.random.default_rng(seed)
    for split, count in zip(("train", "val"), per_class, strict=True):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i}.png")


def test_digits_split_is_fixed_stratified_and_exact():
    train, val = lkdata.build_dataset("digits", "train"), lkdata.build_dataset("digits", "val")
    assert (len(train), len(val)) == (1437, 360)
    assert train.classes == [str(d) for d in range(10)]
    assert np.bincount(val.targets).tolist() == [36, 36, 35, 37, 36, 37, 36, 36, 35, 36]
    digits = load_digits()
    pool = {
        row.tobytes(): int(t)
        for row, t in zip(np.round(digits.images * 255 / 16).astype(np.uint8), digits.target, strict=True)
    }
    img, label = val[7]
    assert img.mode == "RGB" and img.size == (8, 8)
    arr = np.asarray(img)
    assert (arr[..., 0] == arr[..., 1]).all() and (arr[..., 0] == arr[..., 2]).all()
    assert pool[np.ascontiguousarray(arr[..., 0]).tobytes()] == label
    assert np.array_equal(lkdata.build_dataset("digits", "val").images, val.images)


def test_digits_normalisation_matches_pixel_statistics():
    pixels = np.round(load_digits().images * 255 / 16) / 255
    mean, std = lkdata.NORMALIZATION["digits"]
    assert mean[0] == pytest.approx(pixels.mean(), abs=1e-4)
    assert std[0] == pytest.approx(pixels.std(), abs=1e-4)


@pytest.mark.parametrize(("name", "num_classes"), [("cifar10", 10), ("cifar100", 100)])
def test_cifar_files_read_through_torchvision(tmp_path, monkeypatch, name, num_classes):
    written = write_cifar(tmp_path, name, n_train=10, n_test=4, num_classes=num_classes)
    use_written_cifar(monkeypatch, tmp_path, name)
    train = lkdata.build_dataset(name, "train", data_dir=tmp_path)
    val = lkdata.build_dataset(name, "val", data_dir=tmp_path)
    assert lkdata.check_same_classes(train, val) == written["classes"]
    assert (len(train), len(val)) == (10, 4)
    img, label = train[3]
    assert np.array_equal(np.asarray(img), written["train"][3]) and label == written["train_y"][3]
    img, label = val[2]
    assert np.array_equal(np.asarray(img), written["test"][2]) and label == written["test_y"][2]


def test_cifar_md5_check_stays_on(tmp_path):
    write_cifar(tmp_path, "cifar10", n_train=5, n_test=2, num_classes=10)
    with pytest.raises(lkdata.DataError, match="not found or corrupted.*--download"):
        lkdata.build_dataset("cifar10", "train", data_dir=tmp_path)


def test_image_folder(tmp_path):
    write_image_folder(tmp_path, ["cat", "dog", "emu"], per_class=(2, 1))
    train = lkdata.build_dataset("imagefolder", "train", data_dir=tmp_path)
    val = lkdata.build_dataset("imagefolder", "val", data_dir=tmp_path)
    assert lkdata.check_same_classes(train, val) == ["cat", "dog", "emu"]
    assert (len(train), len(val)) == (6, 3)
    assert [label for _, label in val] == [0, 1, 2]


def test_dataset_errors(tmp_path):
    with pytest.raises(lkdata.DataError, match="unknown dataset 'mnist'"):
        lkdata.build_dataset("mnist", "train")
    with pytest.raises(lkdata.DataError, match="imagefolder needs"):
        lkdata.build_dataset("imagefolder", "val", data_dir=tmp_path / "nowhere")
    (tmp_path / "train").mkdir()
    with pytest.raises(lkdata.DataError, match="could not read image folder"):
        lkdata.build_dataset("imagefolder", "train", data_dir=tmp_path)
    write_image_folder(tmp_path / "mixed", ["a", "b"], per_class=(1, 1))
    (tmp_path / "mixed" / "val" / "b").rename(tmp_path / "mixed" / "val" / "c")
    train = lkdata.build_dataset("imagefolder", "train", data_dir=tmp_path / "mixed")
    val = lkdata.build_dataset("imagefolder", "val", data_dir=tmp_path / "mixed")
    with pytest.raises(lkdata.DataError, match="different classes"):
        lkdata.check_same_classes(train, val)


def test_eval_transform_resizes_then_center_crops():
    tf = lkdata.eval_transform(224, (0.5,) * 3, (0.25,) * 3, crop_pct=0.875)
    resize, crop = tf.transforms[0], tf.transforms[1]
    assert isinstance(resize, transforms.Resize) and resize.size == 256
    assert resize.interpolation == transforms.InterpolationMode.BICUBIC
    assert isinstance(crop, transforms.CenterCrop) and crop.size == (224, 224)
    img = Image.fromarray(np.full((32, 32, 3), 191, dtype=np.uint8))
    out = tf(img)
    assert out.shape == (3, 224, 224)
    assert_close(out, torch.full((3, 224, 224), (191 / 255 - 0.5) / 0.25), atol=1e-6, rtol=0)


def test_eval_transform_for_checkpoint_data():
    info = {
        "img_size": 16,
        "mean": [0.3, 0.3, 0.3],
        "std": [0.4, 0.4, 0.4],
        "crop_pct": 1.0,
        "interpolation": "bicubic",
    }
    out = lkdata.eval_transform_for(info)(Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)))
    assert_close(out, torch.full((3, 16, 16), -0.75), atol=1e-6, rtol=0)


def test_train_transform_without_randomness_is_resize_and_normalise():
    tf = lkdata.train_transform(
        16,
        (0.5,) * 3,
        (0.5,) * 3,
        pad=0,
        pad_mode="constant",
        hflip=0.0,
        auto_augment=None,
        re_prob=0.0,
        re_scale=(0.02, 0.1),
    )
    img = Image.fromarray(np.full((8, 8, 3), 255, dtype=np.uint8))
    assert_close(tf(img), torch.ones(3, 16, 16))
