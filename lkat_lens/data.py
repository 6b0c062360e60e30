"""Datasets (scikit-learn digits, CIFAR-10/100, ImageFolder, procedural shapes with object masks), image
transforms from timm's pieces, and the evaluation sample (images, labels, masks) analyses run on."""

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
from timm.data.transforms import MaybeToTensor, str_to_interp_mode, str_to_pil_interp
from torch.utils.data import Dataset
from torchvision import transforms
from torchvision.datasets import CIFAR10, CIFAR100, ImageFolder

from .shapes import ShapesDataset

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "shapes")

# Per-channel normalisation. Digits: pixel statistics of the 1797 images scaled to [0, 1], repeated over RGB.
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "digits": ((0.3053,) * 3, (0.3759,) * 3),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagefolder": (tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD)),
    # pixel statistics of the first 2000 training images at 224x224 (32x32 gives the same to 2e-3)
    "shapes": ((0.5016, 0.5005, 0.4927), (0.2542, 0.2500, 0.2491)),
}
DEFAULT_IMG_SIZE = {"digits": 16, "cifar10": 224, "cifar100": 224, "imagefolder": 224, "shapes": 224}
# The settings that fix a procedural dataset beside its image size (a checkpoint's data["options"]).
DATASET_OPTIONS = {"shapes": ("train_images", "val_images", "seed")}
IN_CHANS = 3  # every dataset is served as RGB; digits repeat their gray level over the three channels

# torchvision's readers of the on-disk CIFAR format (they verify each file's md5 before reading it).
CIFAR_READERS: dict[str, type[CIFAR10]] = {"cifar10": CIFAR10, "cifar100": CIFAR100}

Transform = Callable[[Image.Image], Any]
PIXEL_STEPS = (MaybeToTensor, transforms.ToTensor, transforms.Normalize)  # eval steps that move no pixel


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
    img_size: int | None = None,
    options: dict[str, Any] | None = None,
) -> Dataset:
    """The `split` ('train' or 'val') of dataset `name`; it has `.classes` (class names in label order).

    `img_size` and `options` (DATASET_OPTIONS, e.g. shapes' train_images, val_images, seed) concern procedural
    datasets, which draw their images at that size (default: DEFAULT_IMG_SIZE); the others ignore them.
    """
    unknown = set(options or {}) - set(DATASET_OPTIONS.get(name, ()))
    if unknown:
        raise DataError(f"dataset {name!r} takes no option(s) {', '.join(sorted(unknown))}")
    if name == "shapes":
        opts = options or {}
        try:
            return ShapesDataset(
                split,
                img_size or DEFAULT_IMG_SIZE[name],
                transform,
                num_images=opts.get(f"{split}_images"),
                seed=int(opts.get("seed", 0)),
            )
        except ValueError as err:
            raise DataError(f"shapes: {err}") from None
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


def mask_transform_for(info: dict[str, Any]) -> Callable[[Image.Image], torch.Tensor]:
    """Object masks through the geometry of `eval_transform_for(info)` (its resize and centre crop, with nearest
    interpolation): a PIL mask of the image's size -> bool [img_size, img_size], True where it was nonzero."""
    tf = eval_transform(
        int(info["img_size"]),
        info["mean"],
        info["std"],
        crop_pct=float(info.get("crop_pct", 0.875)),
        interpolation="nearest",
    )
    geometry = transforms.Compose([t for t in tf.transforms if not isinstance(t, PIXEL_STEPS)])

    def to_mask(mask: Image.Image) -> torch.Tensor:
        return torch.from_numpy(np.asarray(geometry(mask)) > 0)

    return to_mask


@dataclass
class Sample:
    """Evaluation-transformed images [N, C, H, W] with their labels [N], and object masks where known: bool
    [N, H, W] in the geometry of `images` (True on the object; from the dataset, e.g. shapes, or a masks folder)."""

    images: torch.Tensor
    labels: torch.Tensor
    masks: torch.Tensor | None = None


def load_sample(
    data: dict[str, Any],
    split: str,
    num: int,
    *,
    name: str | None = None,
    data_dir: str | os.PathLike = "data",
    masks_dir: str | os.PathLike | None = None,
) -> Sample:
    """The first `num` images of a dataset split (seeded shuffle), transformed as the checkpoint was evaluated.

    Masks come from `masks_dir` when given (one PNG per image with the image's file stem, nonzero = object; at
    <masks_dir>/<class>/<stem>.png or <masks_dir>/<stem>.png), else from the dataset if it draws them (shapes).
    """
    name = name or data["name"]
    own = name == data.get("name")  # a procedural dataset is rebuilt with the checkpoint's settings
    dataset = build_dataset(
        name,
        split,
        data_dir=data_dir,
        transform=eval_transform_for(data),
        img_size=int(data["img_size"]),
        options=data.get("options") if own else None,
    )
    order = [int(i) for i in torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:num]]
    masks = None  # before the images: a bad masks folder fails at once
    if masks_dir is not None:
        masks = masks_from_folder(dataset, order, Path(masks_dir), mask_transform_for(data))
    elif isinstance(dataset, ShapesDataset):
        to_mask = mask_transform_for(data)
        masks = torch.stack([to_mask(Image.fromarray(dataset.mask(i).astype(np.uint8) * 255, "L")) for i in order])
    images, labels = zip(*(dataset[i] for i in order), strict=True)
    return Sample(torch.stack(images), torch.as_tensor(labels), masks)


def masks_from_folder(
    dataset: Dataset, indices: Sequence[int], folder: Path, to_mask: Callable[[Image.Image], torch.Tensor]
) -> torch.Tensor:
    """bool [N, H, W]: the mask file of each image (same stem, in `folder`), aligned with the image's geometry."""
    if not folder.is_dir():
        raise DataError(f"masks folder {folder} does not exist")
    samples = getattr(dataset, "samples", None)
    if samples is None:
        raise DataError(
            f"masks folder {folder}: this dataset's images have no file names to match mask files against "
            "(masks from a folder need an imagefolder; shapes brings its own masks)"
        )
    root = Path(dataset.root)
    return torch.stack([to_mask(_read_mask(Path(samples[i][0]), root, folder)) for i in indices])


def _read_mask(image: Path, root: Path, folder: Path) -> Image.Image:
    """The mask of `image` as a PIL 'L' image of the image's size (255 on the object)."""
    candidates = [folder / image.relative_to(root).with_suffix(".png"), folder / f"{image.stem}.png"]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        raise DataError(f"no mask for image {image}: neither {candidates[0]} nor {candidates[1]} exists")
    try:
        with Image.open(path) as m:
            values = np.asarray(m)
        with Image.open(image) as img:
            width, height = img.size
    except OSError as err:
        raise DataError(f"could not read mask {path}: {err}") from None
    if values.ndim == 3:  # RGB(A): nonzero in any colour channel
        values = values[..., :3].any(axis=-1)
    mask = Image.fromarray((values != 0).astype(np.uint8) * 255, "L")
    if mask.size != (width, height):
        if abs(mask.height * width / mask.width - height) > 1:
            raise DataError(
                f"mask {path} is {mask.width}x{mask.height} but image {image} is {width}x{height}: "
                "a different aspect ratio cannot be aligned"
            )
        mask = mask.resize((width, height), Image.NEAREST)
    return mask
