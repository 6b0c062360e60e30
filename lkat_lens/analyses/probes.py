"""Per-block linear probes: how linearly decodable the labels are from the residual stream at each depth.

Depth 0 is `hook_embed` (tokens entering the first block); depth i + 1 is `blocks.{i}.hook_resid_post`.
Feature kinds come from the model's `token_layout`: "cls" is the class token (the LAST token for LKAT and
rbfKAT, the FIRST for timm ViT and ViT-5), "mean_patch" is the mean over the patch tokens (registers and
the class token excluded). A probe is a standardiser followed by scikit-learn's LogisticRegression, fitted
on one split and scored on a held-out split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from .parts import eval_mode, residual_names

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

FEATURE_KINDS = ("cls", "mean_patch")


@dataclass
class ProbeResults:
    """Train and held-out accuracy of a linear probe per feature kind (keys) and depth (array index)."""

    depth_names: list[str]
    train_accuracy: dict[str, np.ndarray]
    test_accuracy: dict[str, np.ndarray]
    num_classes: int
    num_train: int
    num_test: int
    chance: float

    def best(self, kind: str) -> tuple[int, float]:
        """The depth with the highest held-out accuracy for a feature kind, and that accuracy."""
        acc = self.test_accuracy[kind]
        depth = int(np.argmax(acc))
        return depth, float(acc[depth])

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly copy (lists of floats)."""
        return {
            "depth_names": self.depth_names,
            "train_accuracy": {k: v.tolist() for k, v in self.train_accuracy.items()},
            "test_accuracy": {k: v.tolist() for k, v in self.test_accuracy.items()},
            "num_classes": self.num_classes,
            "num_train": self.num_train,
            "num_test": self.num_test,
            "chance": self.chance,
            "chance_rule": "majority-class rate of the held-out labels (accuracy of always guessing it)",
        }


def feature_kinds(model: nn.Module) -> tuple[str, ...]:
    """The feature kinds a model offers ("cls" only when its token layout has a class token)."""
    return tuple(k for k in FEATURE_KINDS if k != "cls" or "cls" in model.token_layout)


def token_features(tokens: torch.Tensor, layout: dict[str, slice]) -> dict[str, torch.Tensor]:
    """Residual-stream tokens [B,T,D] -> {"cls": [B,D], "mean_patch": [B,D]} by the model's token layout."""
    out = {}
    if "cls" in layout:
        out["cls"] = tokens[:, layout["cls"]].squeeze(1)
    out["mean_patch"] = tokens[:, layout["patches"]].mean(1)
    return out


def collect_features(model: nn.Module, images: torch.Tensor, batch_size: int = 64) -> dict[str, torch.Tensor]:
    """Probe features per kind as [depths, N, D] float32 CPU tensors, from batches run without gradients."""
    names = residual_names(model)
    layout = model.token_layout
    param = next(model.parameters())
    parts: dict[str, list[list[torch.Tensor]]] = {kind: [[] for _ in names] for kind in feature_kinds(model)}
    with eval_mode(model), torch.no_grad():
        for batch in images.split(batch_size):
            _, cache = model.run_with_cache(batch.to(param.device, param.dtype), names=names)
            for depth, name in enumerate(names):
                for kind, feats in token_features(cache[name], layout).items():
                    parts[kind][depth].append(feats.float().cpu())
    return {kind: torch.stack([torch.cat(chunks) for chunks in per_depth]) for kind, per_depth in parts.items()}


def make_probe(max_iter: int = 1000, C: float = 1.0, seed: int = 0) -> Pipeline:
    """A standardiser followed by a multinomial logistic regression (scikit-learn is imported here: it is slow)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter, random_state=seed))


def fit_probe(
    train_x: np.ndarray | torch.Tensor,
    train_y: np.ndarray | torch.Tensor,
    test_x: np.ndarray | torch.Tensor,
    test_y: np.ndarray | torch.Tensor,
    **probe_kwargs: Any,
) -> tuple[float, float]:
    """Fit one probe on the training split; return (train accuracy, held-out accuracy)."""
    probe = make_probe(**probe_kwargs).fit(_numpy(train_x), _numpy(train_y))
    return float(probe.score(_numpy(train_x), _numpy(train_y))), float(probe.score(_numpy(test_x), _numpy(test_y)))


def _numpy(x: np.ndarray | torch.Tensor | Sequence[int]) -> np.ndarray:
    """A NumPy copy of a tensor or array-like."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def linear_probes(
    model: nn.Module,
    train_images: torch.Tensor,
    train_labels: torch.Tensor | np.ndarray | Sequence[int],
    test_images: torch.Tensor,
    test_labels: torch.Tensor | np.ndarray | Sequence[int],
    batch_size: int = 64,
    **probe_kwargs: Any,
) -> ProbeResults:
    """Fit a linear probe per depth and feature kind on the training images; score it on the test images.

    `probe_kwargs` (max_iter, C, seed) configure every probe; chance is the held-out majority-class rate.
    """
    y_train, y_test = _numpy(train_labels), _numpy(test_labels)
    if len(y_train) != len(train_images) or len(y_test) != len(test_images):
        raise ValueError("each split needs one label per image")
    train_feats = collect_features(model, train_images, batch_size)
    test_feats = collect_features(model, test_images, batch_size)
    train_acc, test_acc = {}, {}
    for kind, feats in train_feats.items():
        pairs = zip(feats, test_feats[kind], strict=True)
        scores = [fit_probe(f, y_train, g, y_test, **probe_kwargs) for f, g in pairs]
        train_acc[kind] = np.array([s[0] for s in scores])
        test_acc[kind] = np.array([s[1] for s in scores])
    _, counts = np.unique(y_test, return_counts=True)
    return ProbeResults(
        depth_names=residual_names(model),
        train_accuracy=train_acc,
        test_accuracy=test_acc,
        num_classes=len(np.union1d(y_train, y_test)),
        num_train=len(y_train),
        num_test=len(y_test),
        chance=float(counts.max() / len(y_test)),
    )
