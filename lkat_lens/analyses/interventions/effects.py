"""The effect of interventions on a sample: the change of the label-class logit and of accuracy.

An intervention is any object with `attach(model, rows) -> list[RemovableHandle]`: it registers forward hooks that
edit only the batch rows `rows` (a slice) and returns their handles. `measure` runs the clean model once per batch
of images and then many interventions per forward pass: k copies of the batch side by side (k = batch_size // images
in the batch), intervention i attached to copy i. Every op of the models acts on each image alone, so this equals
one run per intervention up to the rounding of another batch size (tests/test_interventions_gla_kan.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..batching import batches, on_model
from ..parts import eval_mode
from ..serialize import json_ready

__all__ = ["Effects", "Intervention", "attached", "describe", "intervened_logits", "measure"]

ALL_ROWS = slice(None)


class Intervention(Protocol):
    """Anything that edits a forward pass through hooks on chosen batch rows."""

    def attach(self, model: nn.Module, rows: slice) -> list[RemovableHandle]:
        """Register the hooks that intervene on batch rows `rows`; return their handles."""
        ...

    def describe(self) -> str:
        """A short label, e.g. "block 3 head 1 α=0"."""
        ...


InterventionLike = Intervention | Sequence[Intervention]  # one intervention, or several applied together


def _group(intervention: InterventionLike) -> tuple[Intervention, ...]:
    """One intervention or a sequence of them as a tuple (applied together)."""
    return tuple(intervention) if isinstance(intervention, Sequence) else (intervention,)


def describe(intervention: InterventionLike) -> str:
    """The label of an intervention or of several applied together ("clean" for none)."""
    return " + ".join(i.describe() for i in _group(intervention)) or "clean"


@contextmanager
def attached(model: nn.Module, interventions: Sequence[Intervention], rows: slice = ALL_ROWS) -> Iterator[nn.Module]:
    """The interventions attached to the model (on batch rows `rows`) for the duration of a with-block."""
    handles: list[RemovableHandle] = []
    try:
        for intervention in interventions:
            handles += intervention.attach(model, rows)
        yield model
    finally:
        for handle in handles:
            handle.remove()


def intervened_logits(model: nn.Module, images: torch.Tensor, *interventions: Intervention) -> torch.Tensor:
    """Logits [B, classes] (fp32, on the CPU) of the images with every given intervention applied."""
    with eval_mode(model), torch.no_grad(), attached(model, interventions):
        return model(on_model(model, images)).float().cpu()


@dataclass
class Effects:
    """Per intervention: the mean change of the label-class logit and the accuracy over the same images."""

    labels: list[str]  # what each intervention does
    logit_change: torch.Tensor  # [n] mean over images of (intervened - clean) logit of the image's label class
    logit_abs_change: torch.Tensor  # [n] mean over images of |intervened - clean| label-class logit
    accuracy: torch.Tensor  # [n] top-1 accuracy with the intervention, percent
    clean_accuracy: float  # percent
    clean_logit: float  # mean clean logit of the label class
    num_images: int

    @property
    def accuracy_change(self) -> torch.Tensor:
        """[n] accuracy with the intervention minus the clean accuracy, percentage points."""
        return self.accuracy - self.clean_accuracy

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready copy (with accuracy_change)."""
        return json_ready(self) | {"accuracy_change": json_ready(self.accuracy_change)}


def measure(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    interventions: Sequence[InterventionLike],
    batch_size: int | None = None,
) -> Effects:
    """The effect of each intervention (or group applied together) on the images [N, C, H, W] with labels [N].

    Images go in batches of `batch_size` (all at once when None) on the model's device; each forward pass holds up
    to batch_size // batch rows copies of a batch, one per intervention.
    """
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels")
    groups = [_group(i) for i in interventions]
    n = len(groups)
    logit_sum = torch.zeros(n, dtype=torch.float64)
    abs_sum = torch.zeros(n, dtype=torch.float64)
    correct = torch.zeros(n, dtype=torch.float64)
    clean_logit = clean_correct = 0.0
    start = 0
    with eval_mode(model), torch.no_grad():
        for chunk in batches(images, batch_size):
            x = on_model(model, chunk)
            m = x.shape[0]
            y = labels[start : start + m].to(x.device).long()
            start += m
            clean = model(x).double()
            clean_target = clean.gather(-1, y[:, None])[:, 0]
            clean_logit += float(clean_target.sum())
            clean_correct += float((clean.argmax(-1) == y).sum())
            copies = max(1, (batch_size or m) // m)
            for first in range(0, n, copies):
                part = groups[first : first + copies]
                handles: list[RemovableHandle] = []
                try:
                    for j, group in enumerate(part):
                        for intervention in group:
                            handles += intervention.attach(model, slice(j * m, (j + 1) * m))
                    logits = model(x.repeat(len(part), *([1] * (x.dim() - 1)))).double().unflatten(0, (len(part), m))
                finally:
                    for handle in handles:
                        handle.remove()
                target = logits.gather(-1, y[None, :, None].expand(len(part), m, 1))[..., 0]
                logit_sum[first : first + len(part)] += (target - clean_target).sum(-1).cpu()
                abs_sum[first : first + len(part)] += (target - clean_target).abs().sum(-1).cpu()
                correct[first : first + len(part)] += (logits.argmax(-1) == y).sum(-1).double().cpu()
    total = images.shape[0]
    return Effects(
        labels=[describe(g) for g in groups],
        logit_change=logit_sum / total,
        logit_abs_change=abs_sum / total,
        accuracy=100.0 * correct / total,
        clean_accuracy=100.0 * clean_correct / total,
        clean_logit=clean_logit / total,
        num_images=total,
    )
