"""The explorer's checkpoints: each a `Study` (lkat_lens.study) plus displayable pictures and uploads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from lkat_lens.checkpoint import load
from lkat_lens.data import DataError
from lkat_lens.images import LoadedImage, display_images, load_image
from lkat_lens.runs import run_folder_of
from lkat_lens.study import Study, StudyDefaults, resolve_device

MAX_UPLOAD_BYTES = 2 * 2**20


class BadUpload(ValueError):
    """An uploaded file that is not a readable image."""


class CheckpointState(Study):
    """A study as the explorer holds it: plus the sample as displayable pictures and uploads with a size limit."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        data: str | None = None,
        data_dir: str | os.PathLike = "data",
        masks_dir: str | os.PathLike | None = None,
        num_images: int = 32,
        edges: int = 8,
        probe_images: int = 256,
        device: str | torch.device | None = None,
        batch_size: int = StudyDefaults.batch_size,
    ) -> None:
        device = resolve_device(device)
        model, info = load(path)
        defaults = StudyDefaults(num_images=num_images, edges=edges, probe_images=probe_images, batch_size=batch_size)
        super().__init__(
            model, info, data=data, data_dir=data_dir, masks_dir=masks_dir, defaults=defaults, device=device
        )
        self.shown = self.display(self.sample.images)
        # on a GPU, the first forward's one-time costs at start-up, not on the first block shown (README)
        self.warm_up_seconds = self.warm_up() if self.device.type == "cuda" else 0.0

    def upload(self, content: bytes, name: str = "the upload") -> LoadedImage:
        """An uploaded image file as a model input (lkat_lens.images.load_image); BadUpload if too large or unusable."""
        if len(content) > MAX_UPLOAD_BYTES:
            size = len(content) / 2**20
            raise BadUpload(f"{name}: {size:.1f} MiB is over the {MAX_UPLOAD_BYTES / 2**20:g} MiB upload limit")
        try:
            return load_image(content, self.info.data, name=name)
        except DataError as err:
            raise BadUpload(str(err)) from None

    def display(self, images: torch.Tensor) -> np.ndarray:
        """Normalised images back to displayable uint8 RGB."""
        return display_images(images, self.info.data)


class ExplorerState:
    """Every checkpoint the explorer can show: those named on the command line (loaded at start, in that order),
    then the epoch snapshots of their run folders (loaded when first picked, e.g. as the compared checkpoint)."""

    def __init__(
        self,
        checkpoints: Sequence[CheckpointState],
        snapshots: Sequence[Path] = (),
        load: Callable[[Path], CheckpointState] | None = None,
    ) -> None:
        if not checkpoints:
            raise ValueError("the explorer needs at least one checkpoint")
        self.checkpoints = list(checkpoints)
        self.paths = [c.path for c in self.checkpoints] + [Path(p) for p in snapshots]
        self._loaded: dict[Path, CheckpointState] = {c.path: c for c in self.checkpoints}
        self._load = load
        self._lock = threading.Lock()

    def __getitem__(self, index: int) -> CheckpointState:
        return self.at(self.paths[index])

    def at(self, path: Path) -> CheckpointState:
        """The checkpoint at a path, loaded on first use (a snapshot of a run folder)."""
        with self._lock:
            if path not in self._loaded:
                if self._load is None:
                    raise KeyError(f"{path} is not one of the explorer's checkpoints")
                self._loaded[path] = self._load(path)
            return self._loaded[path]

    def labels(self) -> list[str]:
        """How the page names each checkpoint: its run folder and file name."""
        return [f"{p.parent.name}/{p.name}" for p in self.paths]

    def snapshots_of(self, ckpt: CheckpointState) -> list[tuple[int, Path]]:
        """The epoch snapshots of the checkpoint's run folder, (epoch, path) oldest first ([] outside a run)."""
        run = run_folder_of(ckpt.path)
        return run.snapshots if run else []

    @property
    def num_blocks(self) -> int:
        """The block count the shared selector spans (the largest of the checkpoints)."""
        return max(c.num_blocks for c in self.checkpoints)

    @property
    def num_heads(self) -> int:
        """The head count the shared selector spans (the largest of the checkpoints)."""
        return max(c.num_heads for c in self.checkpoints)

    @property
    def num_images(self) -> int:
        """Sample images every checkpoint has."""
        return min(len(c.sample.labels) for c in self.checkpoints)

    @property
    def num_patches(self) -> int:
        """The patch count the shared selection spans (the largest grid of the checkpoints)."""
        return max(c.grid_size[0] * c.grid_size[1] for c in self.checkpoints)
