"""Datasets (scikit-learn digits, CIFAR-10/100, ImageFolder) and image transforms from timm's pieces."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform
from timm.data.auto_augment import rand_augment_transform
from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.data.random_erasing import RandomErasing
from timm.data.transforms import str_to_interp_mode, str_to_pil_interp
from torch.utils.data import Dataset
from torchvision import transforms
from torchvision.datasets import CIFAR10, CIFAR100, ImageFolder

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder")

# Per-channel normalisation. Digits: pixel statistics of the 1797 images scaled to [0, 1], repeated over RGB.
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "digits": ((0.3053,) * 3, (0.3759,) * 3),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagefolder": (tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD)),
}
DEFAULT_IMG_SIZE = {"digits": 16, "cifar10": 224, "cifar100": 224, "imagefolder": 224}
IN_CHANS = 3  # every dataset is served as RGB; digits repeat their gray level over the three channels

# torchvision's readers of the on-disk CIFAR format (they verify each file's md5 before reading it).
CIFAR_READERS: dict[str, type[CIFAR10]] = {"cifar10": CIFAR10, "cifar100": CIFAR100}

Transform = Callable[[Image.Image], Any]


class DataError(ValueError):
    """A dataset that is unknown, missing or unreadable (a user error)."""


class DigitsDataset(Dataset):
    """scikit-learn's 8x8 handwritten digits as RGB PIL images, split 80/20 by a fixed stratified seed."""

    classes = [str(d) for d in range(10)]
    SPLIT_SEED = 0
    VAL_FRACTION = 0.2

    def __init__(self, split: str, transform: Transform | None = None) -> None:
        # imported here: scikit-learn is slow to import and only this dataset needs it
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        digits = load_digits()
        pixels = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
        train_idx, val_idx = train_test_split(
            np.arange(len(pixels)),
            test_size=self.VAL_FRACTION,
            random_state=self.SPLIT_SEED,
            stratify=digits.target,
        )
        idx = np.sort(train_idx if split == "train" else val_idx)
        self.images = pixels[idx]
        self.targets = [int(t) for t in digits.target[idx]]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = Image.fromarray(self.images[index]).convert("RGB")
        return (self.transform(img) if self.transform else img), self.targets[index]


def build_dataset(
    name: str,
    split: str,
    *,
    data_dir: str | os.PathLike = "data",
    transform: Transform | None = None,
    download: bool = False,
) -> Dataset:
    """The `split` ('train' or 'val') of dataset `name`; it has `.classes` (class names in label order)."""
    if name == "digits":
        return DigitsDataset(split, transform)
    if name in CIFAR_READERS:
        return _cifar(name, split, Path(data_dir), transform, download)
    if name == "imagefolder":
        return _image_folder(split, Path(data_dir), transform)
    raise DataError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


def _cifar(name: str, split: str, root: Path, transform: Transform | None, download: bool) -> Dataset:
    """torchvision's CIFAR reader over `root`/<its base folder>."""
    reader = CIFAR_READERS[name]
    try:
        return reader(str(root), train=split == "train", transform=transform, download=download)
    except RuntimeError as err:
        hint = "" if download else "; pass --download to fetch it"
        raise DataError(f"{name} not found or corrupted under {root / reader.base_folder} ({err}){hint}") from None
    except OSError as err:
        raise DataError(f"could not download or read {name} under {root}: {err}") from None


def _image_folder(split: str, root: Path, transform: Transform | None) -> Dataset:
    """torchvision's ImageFolder over `root`/train or `root`/val (one sub-folder per class)."""
    folder = root / split
    if not folder.is_dir():
        raise DataError(f"imagefolder needs {folder}/ (with {root}/train/ and {root}/val/, one folder per class)")
    try:
        return ImageFolder(str(folder), transform=transform)
    except (FileNotFoundError, OSError) as err:
        raise DataError(f"could not read image folder {folder}: {err}") from None


def check_same_classes(train: Dataset, val: Dataset) -> list[str]:
    """The class names shared by the two splits (raises DataError if they differ)."""
    if list(train.classes) != list(val.classes):
        raise DataError(f"train and val splits have different classes: {train.classes} vs {val.classes}")
    return [str(c) for c in train.classes]


def train_transform(
    img_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    pad: int,
    pad_mode: str,
    hflip: float,
    auto_augment: str | None,
    re_prob: float,
    re_scale: tuple[float, float],
    interpolation: str = "bicubic",
) -> transforms.Compose:
    """Resize -> RandomCrop(pad) -> HFlip -> RandAugment -> ToTensor -> Normalize -> RandomErasing."""
    steps: list[Any] = [transforms.Resize(img_size, interpolation=str_to_interp_mode(interpolation))]
    steps.append(transforms.RandomCrop(img_size, padding=pad, padding_mode=pad_mode))
    if hflip > 0:
        steps.append(transforms.RandomHorizontalFlip(p=hflip))
    if auto_augment:
        steps.append(rand_augment_transform(auto_augment, _aa_hparams(img_size, mean, interpolation)))
    steps += [transforms.ToTensor(), transforms.Normalize(mean, std)]
    if re_prob > 0:
        steps.append(RandomErasing(re_prob, min_area=re_scale[0], max_area=re_scale[1], mode="const", device="cpu"))
    return transforms.Compose(steps)


def _aa_hparams(img_size: int, mean: Sequence[float], interpolation: str) -> dict[str, Any]:
    """RandAugment hyper-parameters as timm's create_transform derives them."""
    return dict(
        translate_const=int(img_size * 0.45),
        img_mean=tuple(min(255, round(255 * m)) for m in mean),
        interpolation=str_to_pil_interp(interpolation),
    )


def eval_transform(
    img_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    crop_pct: float,
    interpolation: str = "bicubic",
) -> transforms.Compose:
    """Resize to img_size / crop_pct -> CenterCrop(img_size) -> ToTensor -> Normalize (timm's eval)."""
    return create_transform(
        img_size,
        is_training=False,
        interpolation=interpolation,
        crop_pct=crop_pct,
        mean=tuple(mean),
        std=tuple(std),
    )


def eval_transform_for(info: dict[str, Any]) -> transforms.Compose:
    """The evaluation transform a checkpoint's `data` dict describes."""
    return eval_transform(
        int(info["img_size"]),
        info["mean"],
        info["std"],
        crop_pct=float(info.get("crop_pct", 0.875)),
        interpolation=str(info.get("interpolation", "bicubic")),
    )


@dataclass
class Sample:
    """Evaluation-transformed images [N, C, H, W] with their labels [N]."""

    images: torch.Tensor
    labels: torch.Tensor
    masks: torch.Tensor | None = None


def load_sample(
    data: dict[str, Any], split: str, num: int, *, name: str | None = None, data_dir: str | os.PathLike = "data"
) -> Sample:
    """The first `num` images of a dataset split (seeded shuffle), transformed as the checkpoint was evaluated."""
    dataset = build_dataset(name or data["name"], split, data_dir=data_dir, transform=eval_transform_for(data))
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:num]
    images, labels = zip(*(dataset[int(i)] for i in order), strict=True)
    return Sample(torch.stack(images), torch.as_tensor(labels))
