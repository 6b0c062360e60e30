"""Loaded checkpoints of the explorer and their analysis results, each computed once per checkpoint/block."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from lkat_lens.analyses import attention, attributions, edge_functions, gates, probes, tokens
from lkat_lens.analyses.attention import AttentionMatrices, ClsAttention, Rollout
from lkat_lens.analyses.attributions import Attribution, FaithfulnessCurves
from lkat_lens.analyses.edge_functions import EdgeCurves, EdgeImportance, LayerStatistics
from lkat_lens.analyses.gates import GateStats
from lkat_lens.analyses.probes import ProbeResults
from lkat_lens.analyses.symbolic import SymbolicFitResult
from lkat_lens.analyses.tokens import TokenNorms
from lkat_lens.checkpoint import CheckpointInfo, load
from lkat_lens.data import DataError
from lkat_lens.figures_cli import display_images, top_edge_curves
from lkat_lens.images import LoadedImage, load_image
from lkat_lens.report import Sample, load_sample

T = TypeVar("T")
MAX_UPLOAD_BYTES = 2 * 2**20
GATE_BLOCK_FIELDS = ("log_alpha", "log_alpha_quantiles", "head_log_alpha_quantiles", "hist_counts", "log_alpha_map")


class BadUpload(ValueError):
    """An uploaded file that is not a readable image."""


class CheckpointState:
    """One checkpoint's model, data sample and cached analyses (thread-safe, each result computed once)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        data: str | None = None,
        data_dir: str | os.PathLike = "data",
        num_images: int = 32,
        edges: int = 8,
        probe_images: int = 256,
    ) -> None:
        self.path = Path(path)
        self.model, self.info = load(path)
        if not self.info.data:
            raise ValueError(f"{path} records no dataset or normalisation; the explorer needs a lkat-lens checkpoint")
        self.model.eval()
        self.sample: Sample = load_sample(self.info.data, "val", num_images, name=data, data_dir=data_dir)
        self.shown = display_images(self.sample.images, self.info.data)
        self.edges = edges
        self.probe_images = probe_images
        self.data_source = {"name": data, "data_dir": data_dir}
        self.class_names: list[str] = list(self.info.data.get("class_names") or [])
        self._cache: dict[tuple, Any] = {}
        self._lock = threading.RLock()
        self.computed: list[tuple] = []

    @property
    def num_blocks(self) -> int:
        """Number of transformer blocks."""
        return len(self.model.blocks)

    @property
    def num_parameters(self) -> int:
        """Total parameter count."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def num_heads(self) -> int:
        """Attention heads per block."""
        return int(self.model.blocks[0].attn.num_heads)

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (rows, columns)."""
        return tuple(self.model.patch_embed.grid_size)

    @property
    def has_kan(self) -> bool:
        """Whether the model has RBF-KAN layers (edge-function views apply)."""
        return bool(edge_functions.kan_layers(self.model))

    @property
    def has_gates(self) -> bool:
        """Whether the model has GLA forget gates (gate views apply)."""
        return any(name.endswith("hook_gk") for name in self.model.list_hooks())

    def class_name(self, index: int) -> str:
        """A class's name (its index when the checkpoint names none)."""
        return self.class_names[index] if index < len(self.class_names) else str(index)

    def cached(self, key: tuple, compute: Callable[[], T]) -> T:
        """The result stored under key, computed (once) on first use."""
        with self._lock:
            if key not in self._cache:
                self._cache[key] = compute()
                self.computed.append(key)
            return self._cache[key]

    def block_layers(self, block: int) -> dict[str, str]:
        """The block's KAN layers as short name ("fc1") -> module name."""
        names = edge_functions.kan_layers(self.model)
        return {n.rsplit(".", 1)[-1]: n for n in names if n.startswith(f"blocks.{block}.")}

    def layer_statistics(self) -> dict[str, LayerStatistics]:
        """Statistics of every KAN layer on the sample."""
        return self.cached(
            ("layer_statistics",), lambda: edge_functions.layer_statistics(self.model, self.sample.images)
        )

    def edge_curves(self, block: int, layer: str) -> tuple[EdgeCurves, list[float], LayerStatistics]:
        """The block layer's top edge curves, their importance and the layer statistics."""
        name = self.block_layers(block)[layer]
        stats = self.layer_statistics()[name]
        modules = edge_functions.kan_layers(self.model)
        curves, scores = self.cached(("edge_curves", name), lambda: top_edge_curves(modules[name], stats, self.edges))
        return curves, scores, stats

    def edge_importance(self, block: int, layer: str) -> EdgeImportance:
        """The block layer's edge importance (std of each edge function over the sample)."""
        name = self.block_layers(block)[layer]
        stats = self.layer_statistics()[name]
        modules = edge_functions.kan_layers(self.model)
        return self.cached(("edge_importance", name), lambda: edge_functions.edge_importance(modules[name], stats))

    def edge_fit(self, block: int, layer: str, edge: tuple[int, int]) -> tuple[EdgeCurves, SymbolicFitResult]:
        """One edge's curve on the plotting grid and its symbolic fit (on the RBF grid's span)."""
        module = edge_functions.kan_layers(self.model)[self.block_layers(block)[layer]]

        def compute() -> tuple[EdgeCurves, SymbolicFitResult]:
            return edge_functions.edge_curves(module, [edge]), edge_functions.fit_edge(module, edge)

        return self.cached(("edge_fit", block, layer, edge), compute)

    def gate_statistics(self) -> GateStats | None:
        """Forget-gate statistics of every GLA block, or None for a model without GLA gates."""
        if not self.has_gates:
            return None
        return self.cached(("gates",), lambda: gates.gate_statistics(self.model, self.sample.images))

    def block_gates(self, block: int) -> GateStats | None:
        """The gate statistics restricted to one block, or None when the block has no GLA gate."""
        stats = self.gate_statistics()
        if stats is None or block not in stats.blocks:
            return None
        i = stats.blocks.index(block)
        fields: dict[str, Any] = {f: getattr(stats, f)[i : i + 1] for f in GATE_BLOCK_FIELDS}
        fields["log_alpha_by_type"] = {k: v[i : i + 1] for k, v in stats.log_alpha_by_type.items()}
        return dataclasses.replace(stats, blocks=[block], **fields)

    def token_norms(self) -> TokenNorms:
        """Token norms across depth on the sample."""
        return self.cached(("tokens",), lambda: tokens.token_norms(self.model, self.sample.images))

    def attention(self, block: int, image: int) -> AttentionMatrices:
        """One block's attention matrices [1, 1, H, T, T] for one sample image (GLA: implicit attention)."""
        images = self.sample.images[image : image + 1]
        return self.cached(
            ("attention", block, image), lambda: attention.attention_matrices(self.model, images, [block])
        )

    def cls_attention(self, block: int, image: int) -> ClsAttention:
        """Class-token attention of one block for one sample image (the class-token rows of `attention`)."""
        found = self.attention(block, image)
        rows = found.matrices[..., found.cls_index, :]
        return ClsAttention(rows, found.blocks, found.kinds, found.layout, found.grid_size)

    def patch_attention(self, block: int, image: int, patch: int) -> torch.Tensor:
        """What one patch token reads in one block: its attention row on the patches [H, gh, gw]."""
        found = self.attention(block, image)
        row = found.matrices[0, 0, :, found.layout["patches"].start + patch, found.layout["patches"]]
        return row.unflatten(-1, found.grid_size)

    def rollout(self, image: int, method: str) -> Rollout:
        """Attention rollout through every block for one sample image ("attention" or "gradient")."""
        images = self.sample.images[image : image + 1]
        return self.cached(("rollout", image, method), lambda: attention.attention_rollout(self.model, images, method))

    def patch_size(self) -> tuple[int, int]:
        """The model's patch size (height, width)."""
        return attributions.model_patch_size(self.model)

    def predictions(self, image: int, k: int = 5) -> list[tuple[str, float]]:
        """The model's top-k classes and probabilities for one sample image."""
        return self.cached(
            ("predict", image, k), lambda: top_k(self.model, self.sample.images[image : image + 1], k, self.class_names)
        )

    def attribution(self, image: int, method: str, target: int | None = None) -> Attribution:
        """A method's attribution of a class (default: the predicted one) for one sample image."""
        images = self.sample.images[image : image + 1]
        return self.cached(
            ("attribution", image, method, target), lambda: attribute(self.model, images, method, target)
        )

    def faithfulness(self, image: int, method: str, target: int | None = None) -> FaithfulnessCurves:
        """Deletion/insertion curves of a sample image's attribution."""
        images = self.sample.images[image : image + 1]
        found = self.attribution(image, method, target)
        return self.cached(("faithfulness", image, method, target), lambda: faithfulness(self.model, images, found))

    def probes(self) -> ProbeResults:
        """Linear probes per depth, fitted on a training-split sample and scored on the explorer's sample."""

        def compute() -> ProbeResults:
            train = load_sample(self.info.data, "train", self.probe_images, **self.data_source)
            return probes.linear_probes(self.model, train.images, train.labels, self.sample.images, self.sample.labels)

        return self.cached(("probes",), compute)

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


def attribute(model: nn.Module, images: torch.Tensor, method: str, target: int | None = None) -> Attribution:
    """The attribution of a class (default: predicted) with the method's explorer settings (few steps, fast)."""
    settings = {"integrated_gradients": {"n_steps": 16}, "gradient_shap": {"n_samples": 8}}
    return attributions.attribute(model, images, method, target, **settings.get(method, {}))


def faithfulness(model: nn.Module, images: torch.Tensor, found: Attribution) -> FaithfulnessCurves:
    """Deletion/insertion curves of an attribution over its image's patches (blurred replacement)."""
    return attributions.deletion_insertion(model, images, found, target=found.target)


@torch.no_grad()
def top_k(model: nn.Module, images: torch.Tensor, k: int, class_names: Sequence[str]) -> list[tuple[str, float]]:
    """The k most probable classes of one image as (name, probability)."""
    probs = model(images).float().softmax(-1)[0]
    values, index = probs.topk(min(k, probs.numel()))
    names = [class_names[i] if i < len(class_names) else str(i) for i in index.tolist()]
    return list(zip(names, values.tolist(), strict=True))


class ExplorerState:
    """Every checkpoint the explorer shows, in command-line order."""

    def __init__(self, checkpoints: Sequence[CheckpointState]) -> None:
        if not checkpoints:
            raise ValueError("the explorer needs at least one checkpoint")
        self.checkpoints = list(checkpoints)

    def __getitem__(self, index: int) -> CheckpointState:
        return self.checkpoints[index]

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


def model_card(info: CheckpointInfo, parameters: int) -> dict[str, Any]:
    """Variant, parameters, dataset and accuracy of a checkpoint, for display."""
    last = info.metrics[-1] if info.metrics else {}
    best = max((m["val_top1"] for m in info.metrics if "val_top1" in m), default=None)
    return {
        "variant": info.model_name,
        "parameters": parameters,
        "dataset": info.data.get("name"),
        "image size": info.data.get("img_size"),
        "epochs": last.get("epoch"),
        "val top-1 (last)": last.get("val_top1"),
        "val top-1 (best)": best,
    }
