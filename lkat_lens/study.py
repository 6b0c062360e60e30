"""The study object: one checkpoint under study, with its parts, data sample, defaults and cached analyses.

`lkat-lens analyze`, `lkat-lens figures` and the explorer are thin front ends over a `Study` (see
docs/architecture.md): it opens the checkpoint once (an lkat-lens file, or a reference state_dict with a variant),
knows the model's parts through `lkat_lens.analyses.parts`, loads its seeded data sample on first use and computes
every analysis once per key (block, layer, image, ...). No Dash and no figures in here.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import IO, Any, TypeVar

import torch
from torch import nn
from tqdm.auto import tqdm

from .analyses import (
    attention,
    attributions,
    distributed_stats,
    edge_functions,
    faithfulness,
    gates,
    grid_span,
    interventions,
    parts,
    probes,
    tokens,
)
from .analyses.attention import AttentionMatrices, ClsAttention, Rollout
from .analyses.attributions import Attribution, FaithfulnessCurves
from .analyses.batching import batches, full_fp32, on_model
from .analyses.edge_functions import EdgeCurves, EdgeFunctionSummary, EdgeImportance, LayerStatistics
from .analyses.faithfulness import MethodEvaluation
from .analyses.gates import GateStats
from .analyses.interventions import AblationResult, DirectLogitAttribution, LogitLens, PatchingResult
from .analyses.interventions import edges as edge_interventions
from .analyses.interventions import gates as gate_interventions
from .analyses.interventions.edges import EdgeAblation, PruneCurve, SymbolicSwapResult
from .analyses.interventions.effects import intervened_logits
from .analyses.interventions.gates import GateClamp, GateClampSweep
from .analyses.probes import ProbeResults
from .analyses.symbolic import SymbolicFitResult
from .analyses.tokens import TokenNorms
from .checkpoint import CheckpointInfo, load
from .data import Sample, load_sample

T = TypeVar("T")
GATE_BLOCK_FIELDS = ("log_alpha", "log_alpha_quantiles", "head_log_alpha_quantiles", "hist_counts", "log_alpha_map")


@dataclass(frozen=True)
class StudyDefaults:
    """Sample sizes and method settings every front end shares (their command-line options override them)."""

    num_images: int = 64  # held-out images the statistics run over
    probe_images: int = 256  # training images the linear probes are fitted on
    attribution_images: int = 4  # images shown with attention and attribution maps
    edges: int = 16  # edge functions per layer grid, most important first
    batch_size: int = 64  # images per forward pass of the streaming statistics
    mprt_images: int = 16  # images the randomisation test (MPRT) of `map_evaluation` runs on
    method_settings: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (("gradient_shap", (("n_samples", 8),)),)

    def settings(self, method: str) -> dict[str, Any]:
        """Keyword arguments of an attribution method (Integrated Gradients picks its own steps)."""
        return dict(dict(self.method_settings).get(method, ()))


def on_cpu(result: T) -> T:
    """A result with every tensor in it (fields of dataclasses, dicts, lists, tuples) moved to the CPU."""
    if isinstance(result, torch.Tensor):
        return result.cpu()
    if is_dataclass(result) and not isinstance(result, type):
        changed = {f.name: on_cpu(getattr(result, f.name)) for f in fields(result) if f.init}
        return replace(result, **changed)
    if isinstance(result, dict):
        return {key: on_cpu(value) for key, value in result.items()}
    if isinstance(result, list | tuple) and not hasattr(result, "_fields"):
        return type(result)(on_cpu(value) for value in result)
    return result


class NeedsLabelsError(ValueError):
    """An analysis that needs labelled images, asked of a sample without labels (a plain image folder)."""


def progress_bar(progress: bool | None = None, file: IO[str] | None = None, **kwargs: Any) -> tqdm:
    """A tqdm bar (name it with desc=, count with total= and unit=): shown when `progress` is True, hidden when it is
    False, and when None shown only if `file` (default stderr) is a terminal."""
    return tqdm(disable=None if progress is None else not progress, file=file, dynamic_ncols=True, **kwargs)


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device to study on: the one named, or CUDA when available, else the CPU (a clear error for a device
    this machine does not have)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {str(device)!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested, but CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {device} requested, but this machine has {torch.cuda.device_count()} CUDA devices")
    return device


class Study:
    """One model and its checkpoint metadata under study; every analysis result is computed once (thread-safe)."""

    def __init__(
        self,
        model: nn.Module,
        info: CheckpointInfo,
        *,
        data: str | None = None,
        data_dir: str | os.PathLike = "data",
        masks_dir: str | os.PathLike | None = None,
        defaults: StudyDefaults = StudyDefaults(),
        device: str | torch.device | None = None,
        progress: bool | None = None,
        progress_file: IO[str] | None = None,
        over_ranks: bool | None = None,
    ) -> None:
        """progress: bars for the streaming passes (None: at a terminal only). over_ranks (default: whether a
        torch.distributed process group is initialised): each rank streams its shard of the sample and the
        statistics cover every rank's (analyses.distributed_stats); then every rank must call them in one order."""
        if not info.data:
            raise ValueError(f"{info.path} records no dataset or normalisation; pass a lkat-lens checkpoint")
        self.model = model.eval() if device is None else model.eval().to(device)
        self.device = next(model.parameters()).device
        self.info = info
        self.path = Path(info.path)
        self.defaults = defaults
        self.data_source = {"name": data, "data_dir": data_dir}
        self.masks_dir = masks_dir
        self.class_names: list[str] = list(info.data.get("class_names") or [])
        self._cache: dict[tuple, Any] = {}
        self._lock = threading.RLock()
        self.computed: list[tuple] = []
        self.over_ranks = distributed_stats.active() if over_ranks is None else over_ranks
        self.rank = distributed_stats.rank_and_size()[0] if self.over_ranks else 0
        self.progress = False if self.rank else progress
        self.progress_file = progress_file

    @property
    def is_main(self) -> bool:
        """Whether this process writes results (rank 0, or the only process)."""
        return self.rank == 0

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        *,
        variant: str | None = None,
        data: str | None = None,
        data_dir: str | os.PathLike = "data",
        masks_dir: str | os.PathLike | None = None,
        device: str | torch.device | None = None,
        progress: bool | None = None,
        progress_file: IO[str] | None = None,
        over_ranks: bool | None = None,
        **defaults: Any,
    ) -> Study:
        """Load a checkpoint (or a reference state_dict with `variant`) and study it on `device` (default: CUDA when
        available, else the CPU); `masks_dir` holds object masks of the held-out images (lkat_lens.data.load_sample);
        keywords set StudyDefaults."""
        device = resolve_device(device)
        model, info = load(path, variant=variant)
        return cls(
            model,
            info,
            data=data,
            data_dir=data_dir,
            masks_dir=masks_dir,
            defaults=StudyDefaults(**defaults),
            device=device,
            progress=progress,
            progress_file=progress_file,
            over_ranks=over_ranks,
        )

    # ---------------------------------------------------------------------------------------------- parts

    @property
    def num_blocks(self) -> int:
        """Number of transformer blocks."""
        return len(self.model.blocks)

    @property
    def num_heads(self) -> int:
        """Attention heads per block."""
        return int(self.model.blocks[0].attn.num_heads)

    @property
    def num_parameters(self) -> int:
        """Total parameter count."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (rows, columns)."""
        return parts.patch_grid(self.model)

    @property
    def patch_size(self) -> tuple[int, int]:
        """The patch size (height, width)."""
        return parts.patch_size(self.model)

    @property
    def token_layout(self) -> dict[str, slice]:
        """Where the patches, registers and class token sit in the token sequence."""
        return self.model.token_layout

    @property
    def has_kan(self) -> bool:
        """Whether the model has RBF-KAN layers (edge-function analyses apply)."""
        return bool(parts.kan_layers(self.model))

    @property
    def has_gates(self) -> bool:
        """Whether the model has GLA forget gates (gate analyses apply)."""
        return bool(parts.gla_blocks(self.model))

    @property
    def has_class_token(self) -> bool:
        """Whether the model has a class token (class-token attention and rollout apply)."""
        return "cls" in self.model.token_layout

    def block_layers(self, block: int) -> dict[str, str]:
        """The block's KAN layers as short name ("fc1") -> module name."""
        return parts.block_kan_layers(self.model, block)

    def kan_layer(self, block: int, layer: str) -> nn.Module:
        """One block's KAN layer module by short name."""
        return parts.kan_layers(self.model)[self.block_layers(block)[layer]]

    def class_name(self, index: int) -> str:
        """A class's name (its index when the checkpoint names none)."""
        if index < 0:
            return "no label"
        return self.class_names[index] if index < len(self.class_names) else str(index)

    # ----------------------------------------------------------------------------------------------- data

    @cached_property
    def sample(self) -> Sample:
        """The seeded held-out sample every statistic runs over (loaded on first use); `.masks` holds its object
        masks when the dataset draws them (shapes) or a masks folder was given, else None."""
        return load_sample(
            self.info.data, "val", self.defaults.num_images, masks_dir=self.masks_dir, **self.data_source
        )

    @cached_property
    def probe_train(self) -> Sample:
        """The seeded training-split sample the linear probes are fitted on."""
        return load_sample(self.info.data, "train", self.defaults.probe_images, **self.data_source)

    def warm_up(self) -> float:
        """One fp32 forward of the sample's first batch, so that the one-time costs of a process's first forward on
        a GPU (fla's import, Triton loading or compiling and autotuning its kernels, kan="auto" measuring its paths
        at the batch's shape) are paid now rather than by the first analysis; returns the seconds it took. Nothing
        is cached."""
        start = time.perf_counter()
        with torch.no_grad(), full_fp32():
            self.model(on_model(self.model, next(self._batches(self.sample.images))))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def _batches(self, images: torch.Tensor) -> Iterator[torch.Tensor]:
        """The images in batches of the study's batch size."""
        return batches(images, self.defaults.batch_size)

    @property
    def shard(self) -> torch.Tensor:
        """The sample images this process streams: its rank's contiguous shard under over_ranks, else all."""
        return distributed_stats.shard(self.sample.images) if self.over_ranks else self.sample.images

    def stream(self, what: str, limit: int | None = None) -> Iterator[torch.Tensor]:
        """Batches of this process's shard of the sample under a progress bar that names the pass and counts the
        images done, with an ETA; `limit`: the pass reads only that many of them."""
        images = self.shard
        total = len(images) if limit is None else min(limit, len(images))
        with progress_bar(self.progress, self.progress_file, total=total, desc=what, unit="image") as bar:
            for batch in self._batches(images):
                yield batch
                bar.update(min(batch.shape[0], total - bar.n))

    def images(self, image: int | slice) -> torch.Tensor:
        """Sample images by index (one index keeps a batch dimension of 1)."""
        index = slice(image, image + 1) if isinstance(image, int) else image
        return self.sample.images[index]

    @property
    def has_labels(self) -> bool:
        """Whether the sample images have labels (a plain image folder has none: no accuracy, no probes)."""
        return self.sample.labelled

    def require_labels(self, what: str) -> None:
        """Refuse an analysis that needs labels when the sample has none."""
        if not self.has_labels:
            source = self.data_source["name"] or self.info.data.get("name")
            raise NeedsLabelsError(
                f"{what}: this needs labelled images, and the {source!r} images in {self.data_source['data_dir']} "
                "have none"
            )

    @cached_property
    def sample_top1(self) -> float:
        """Top-1 accuracy on the sample, in percent (NeedsLabelsError without labels)."""
        self.require_labels("top-1 accuracy")
        with torch.no_grad(), full_fp32():
            logits = torch.cat([self.model(on_model(self.model, b)).cpu() for b in self.stream("top-1 accuracy")])
        labels = distributed_stats.shard(self.sample.labels) if self.over_ranks else self.sample.labels
        correct = int((logits.argmax(-1) == labels).sum())
        if self.over_ranks:
            correct = distributed_stats.count_over_ranks(correct)
        return 100.0 * correct / len(self.sample.labels)

    # -------------------------------------------------------------------------------------------- caching

    def cached(self, key: tuple, compute: Callable[[], T]) -> T:
        """The result stored under key, computed (once) on first use, its tensors on the CPU."""
        with self._lock:
            if key not in self._cache:
                with full_fp32():
                    self._cache[key] = on_cpu(compute())
                self.computed.append(key)
            return self._cache[key]

    # ------------------------------------------------------------------------------------ edge functions

    def layer_statistics(self) -> dict[str, LayerStatistics]:
        """Input/output statistics and grid coverage of every KAN layer on the sample."""
        return self.cached(
            ("layer_statistics",),
            lambda: edge_functions.layer_statistics(
                self.model, self.stream("KAN layer statistics"), over_ranks=self.over_ranks
            ),
        )

    def span_shares(self) -> dict[str, float]:
        """The share of its RBF grid every KAN layer's inputs occupy on the sample (analyses.grid_span)."""
        return self.cached(
            ("span_shares",),
            lambda: grid_span.layer_span_shares(
                self.model,
                self.stream("grid span of the KAN inputs", limit=grid_span.SPAN_IMAGES),
                over_ranks=self.over_ranks,
            ),
        )

    def span_share(self, block: int, layer: str) -> float:
        """The share of its RBF grid the block layer's inputs occupy on the sample."""
        return self.span_shares()[self.block_layers(block)[layer]]

    def edge_summary(self) -> EdgeFunctionSummary:
        """Importance, coverage and top edges of every KAN layer (the report's edge-function section)."""
        return self.cached(
            ("edge_summary",),
            lambda: edge_functions.summarize_edge_functions(
                self.model, self.stream("KAN edge functions"), over_ranks=self.over_ranks
            ),
        )

    def edge_curves(self, block: int, layer: str) -> tuple[EdgeCurves, list[float], LayerStatistics]:
        """The block layer's top edge curves, their importance and the layer statistics."""
        name = self.block_layers(block)[layer]
        stats = self.layer_statistics()[name]
        module = self.kan_layer(block, layer)
        curves, scores = self.cached(
            ("edge_curves", name), lambda: edge_functions.top_edge_curves(module, stats, self.defaults.edges)
        )
        return curves, scores, stats

    def edge_importance(self, block: int, layer: str) -> EdgeImportance:
        """The block layer's edge importance (std of each edge function over the sample)."""
        name = self.block_layers(block)[layer]
        stats = self.layer_statistics()[name]
        module = self.kan_layer(block, layer)
        return self.cached(("edge_importance", name), lambda: edge_functions.edge_importance(module, stats))

    def edge_fit(self, block: int, layer: str, edge: tuple[int, int]) -> tuple[EdgeCurves, SymbolicFitResult]:
        """One edge's curve on the plotting grid and its symbolic fit (on the RBF grid's span)."""
        module = self.kan_layer(block, layer)

        def compute() -> tuple[EdgeCurves, SymbolicFitResult]:
            return edge_functions.edge_curves(module, [edge]), edge_functions.fit_edge(module, edge)

        return self.cached(("edge_fit", block, layer, edge), compute)

    # --------------------------------------------------------------------------------- gates and tokens

    def gate_statistics(self) -> GateStats | None:
        """Forget-gate statistics of every GLA block, or None for a model without GLA gates."""
        if not self.has_gates:
            return None
        return self.cached(
            ("gates",),
            lambda: gates.gate_statistics(self.model, self.stream("GLA forget gates"), over_ranks=self.over_ranks),
        )

    def block_gates(self, block: int) -> GateStats | None:
        """The gate statistics restricted to one block, or None when the block has no GLA gate."""
        stats = self.gate_statistics()
        if stats is None or block not in stats.blocks:
            return None
        i = stats.blocks.index(block)
        fields: dict[str, Any] = {f: getattr(stats, f)[i : i + 1] for f in GATE_BLOCK_FIELDS}
        fields["log_alpha_by_type"] = {k: v[i : i + 1] for k, v in stats.log_alpha_by_type.items()}
        return replace(stats, blocks=[block], **fields)

    def token_norms(self) -> TokenNorms:
        """Token norms across depth on the sample."""
        return self.cached(
            ("tokens",),
            lambda: tokens.token_norms(self.model, self.stream("token norms"), over_ranks=self.over_ranks),
        )

    # ---------------------------------------------------------------------------------------- attention

    def attention(self, block: int, image: int) -> AttentionMatrices:
        """One block's attention matrices [1, 1, H, T, T] for one sample image (GLA: implicit attention)."""
        return self.cached(
            ("attention", block, image), lambda: attention.attention_matrices(self.model, self.images(image), [block])
        )

    def cls_attention(self, block: int, image: int) -> ClsAttention:
        """Class-token attention of one block for one sample image (the class-token rows of `attention`)."""
        found = self.attention(block, image)
        rows = found.matrices[..., found.cls_index, :]
        return ClsAttention(rows, found.blocks, found.kinds, found.layout, found.grid_size)

    def cls_attention_maps(self) -> ClsAttention:
        """Class-token attention of every block on the first `attribution_images` sample images."""
        few = self.images(slice(0, self.defaults.attribution_images))
        return self.cached(("cls_attention_maps",), lambda: attention.cls_attention(self.model, few))

    def patch_attention(self, block: int, image: int, patch: int) -> torch.Tensor:
        """What one patch token reads in one block: its attention row on the patches [H, gh, gw]."""
        found = self.attention(block, image)
        row = found.matrices[0, 0, :, found.layout["patches"].start + patch, found.layout["patches"]]
        return row.unflatten(-1, found.grid_size)

    def rollout(self, image: int | slice, method: str) -> Rollout:
        """Attention rollout through every block ("attention" or "gradient") for sample image(s)."""
        key = (image.start, image.stop) if isinstance(image, slice) else image
        return self.cached(
            ("rollout", key, method), lambda: attention.attention_rollout(self.model, self.images(image), method)
        )

    # ------------------------------------------------------------------------------------- attributions

    def predictions(self, image: int, k: int = 5) -> list[tuple[str, float]]:
        """The model's top-k classes and probabilities for one sample image."""
        return self.cached(("predict", image, k), lambda: self.top_k(self.images(image), k))

    @torch.no_grad()
    def top_k(self, images: torch.Tensor, k: int = 5) -> list[tuple[str, float]]:
        """The k most probable classes of one image [1, C, H, W] as (name, probability)."""
        probs = self.model(on_model(self.model, images)).float().softmax(-1)[0].cpu()
        values, index = probs.topk(min(k, probs.numel()))
        return [(self.class_name(i), v) for i, v in zip(index.tolist(), values.tolist(), strict=True)]

    def attribute(self, images: torch.Tensor, method: str, target: int | None = None) -> Attribution:
        """A method's attribution of a class (default: the predicted one), with the study's method settings."""
        with full_fp32():
            found = attributions.attribute(self.model, images, method, target, **self.defaults.settings(method))
        return on_cpu(found)

    def attribution(self, image: int | slice, method: str, target: int | None = None) -> Attribution:
        """A method's attribution for sample image(s), cached."""
        key = (image.start, image.stop) if isinstance(image, slice) else image
        return self.cached(
            ("attribution", key, method, target), lambda: self.attribute(self.images(image), method, target)
        )

    def faithfulness_of(self, images: torch.Tensor, found: Attribution) -> FaithfulnessCurves:
        """Deletion/insertion curves of an attribution over its images' patches (blurred replacement)."""
        with full_fp32():
            return on_cpu(attributions.deletion_insertion(self.model, images, found, target=found.target))

    def faithfulness(self, image: int | slice, method: str, target: int | None = None) -> FaithfulnessCurves:
        """Deletion/insertion curves of a sample attribution, cached."""
        key = (image.start, image.stop) if isinstance(image, slice) else image
        found = self.attribution(image, method, target)
        return self.cached(
            ("faithfulness", key, method, target), lambda: self.faithfulness_of(self.images(image), found)
        )

    # --------------------------------------------------------------------------- faithfulness of the maps

    def object_masks(self) -> torch.Tensor:
        """The sample's object masks [N, H, W] (bool); ValueError when the data has none."""
        if self.sample.masks is None:
            raise ValueError(
                f"the {self.info.data.get('name')} sample has no object masks: evaluate on a dataset that draws them "
                "(--data shapes) or give one mask per image with --masks DIR"
            )
        return self.sample.masks

    def map_targets(self, explain: str) -> torch.Tensor | None:
        """The classes the maps explain: "predicted" (None: each image's prediction) or "label" (the true class)."""
        if explain not in ("predicted", "label"):
            raise ValueError(f"explain must be 'predicted' or 'label', got {explain!r}")
        return self.sample.labels if explain == "label" else None

    def map_evaluation(self, method: str, explain: str = "predicted") -> MethodEvaluation:
        """One relevance-map method scored against the sample's object masks (analyses.faithfulness), cached."""
        faithfulness.check_method(self.model, method)
        masks, target = self.object_masks(), self.map_targets(explain)
        return self.cached(
            ("map_evaluation", method, explain),
            lambda: faithfulness.evaluate_method(
                self.model,
                self.sample.images,
                masks,
                method,
                target,
                batch_size=self.defaults.batch_size,
                mprt_images=self.defaults.mprt_images,
                settings=self.defaults.settings(method),
            ),
        )

    def map_scores(self, image: int, method: str, target: int | None = None) -> dict[str, float]:
        """Localisation and perturbation scores of one sample image's attribution (the one `attribution` caches)
        against its object mask."""
        masks = self.object_masks()[image : image + 1]
        found = self.attribution(image, method, target)

        def compute() -> dict[str, float]:
            scores = faithfulness.score_maps(
                self.model, self.images(image), masks, on_model(self.model, found.pixel_map), found.target
            )
            return {name: float(scores[name][0]) for name in faithfulness.METRICS if name in scores}

        return self.cached(("map_scores", image, method, target), compute)

    # ------------------------------------------------------------------------------------------- probes

    def probes(self) -> ProbeResults:
        """Linear probes per depth, fitted on the training-split sample and scored on the held-out sample
        (NeedsLabelsError without labels)."""
        self.require_labels("linear probes")
        return self.cached(
            ("probes",),
            lambda: probes.linear_probes(
                self.model,
                self.probe_train.images,
                self.probe_train.labels,
                self.sample.images,
                self.sample.labels,
                batch_size=self.defaults.batch_size,
            ),
        )

    # ------------------------------------------------------------------------------------ interventions

    def corrupted(self, image: int, corrupt: str | int, seed: int = 0) -> torch.Tensor:
        """Sample image `image` corrupted: "noise", "blur", "shuffle" (seeded), or another sample image's index."""
        if isinstance(corrupt, int):
            return self.images(corrupt)
        return interventions.corrupt(self.images(image), corrupt, patch_size=self.patch_size, seed=seed)

    def patching(
        self, image: int, corrupt: str | int, point: str = "resid_pre", target: int | None = None, seed: int = 0
    ) -> PatchingResult:
        """Activation patching of `point` from sample image `image` into its corruption, cached."""
        return self.cached(
            ("patching", image, corrupt, point, target, seed),
            lambda: interventions.activation_patching(
                self.model, self.images(image), self.corrupted(image, corrupt, seed), point, target=target
            ),
        )

    def ablation(self, image: int, point: str = "heads", target: int | None = None, seed: int = 0) -> AblationResult:
        """The four ablations of `point` on sample image `image`, the rest of the sample as reference, cached."""
        others = torch.cat([self.sample.images[:image], self.sample.images[image + 1 :]])
        return self.cached(
            ("ablation", image, point, target, seed),
            lambda: interventions.ablate(
                self.model, self.images(image), point, reference=others, target=target, seed=seed
            ),
        )

    def logit_attribution(self, image: int, target: int | None = None) -> DirectLogitAttribution:
        """Direct logit attribution of sample image `image` (default: its predicted class), split by head where the
        model has per-head outputs, cached."""
        return self.cached(
            ("logit_attribution", image, target),
            lambda: interventions.direct_logit_attribution(
                self.model, self.images(image), target, heads=parts.has_head_outputs(self.model)
            ),
        )

    def logit_lens(self, image: int, target: int | None = None) -> LogitLens:
        """The logit lens of sample image `image`, cached."""
        return self.cached(
            ("logit_lens", image, target), lambda: interventions.logit_lens(self.model, self.images(image), target)
        )

    # ------------------------------------------------------------------- interventions: GLA gates, KAN edges

    @property
    def gla_blocks(self) -> list[int]:
        """The blocks with GLA forget gates (gate clamps and state cuts apply there)."""
        return parts.gla_blocks(self.model)

    def gate_clamps(self) -> GateClampSweep | None:
        """Every GLA head (and block) with its forget gate clamped to α = 1 and to α = 0, on the sample; None
        without GLA gates."""
        if not self.has_gates:
            return None
        return self.cached(
            ("gate_clamps",),
            lambda: gate_interventions.gate_clamp_sweep(
                self.model, self.sample.images, self.sample.labels, batch_size=self.defaults.batch_size
            ),
        )

    def kan_importance(self) -> dict[str, EdgeImportance]:
        """Every KAN layer's edge importance on the sample, by module name."""
        stats = self.layer_statistics()
        layers = parts.kan_layers(self.model)
        return self.cached(
            ("kan_importance",),
            lambda: {name: edge_functions.edge_importance(layer, stats[name]) for name, layer in layers.items()},
        )

    def prune_curve(self) -> PruneCurve | None:
        """Accuracy and label-logit change on the sample against the share of KAN edges pruned (every KAN layer
        pruned below each threshold of its largest edge importance); None without KAN layers."""
        if not self.has_kan:
            return None
        importance = self.kan_importance()
        return self.cached(
            ("prune_curve",),
            lambda: edge_interventions.prune_sweep(
                self.model,
                self.sample.images,
                self.sample.labels,
                importance=importance,
                batch_size=self.defaults.batch_size,
            ),
        )

    def symbolic_swap(self, block: int, layer: str, k: int = 5) -> SymbolicSwapResult:
        """The block layer's k most important edges swapped for their symbolic fits (those of `edge_fit`), alone
        and together, on the sample."""
        name = self.block_layers(block)[layer]
        importance = self.kan_importance()[name]
        fits = {(q, p): self.edge_fit(block, layer, (q, p))[1].best for q, p, _ in importance.top_edges(k)}
        return self.cached(
            ("symbolic_swap", name, k),
            lambda: edge_interventions.symbolic_swap(
                self.model,
                self.sample.images,
                self.sample.labels,
                name,
                k,
                fits,
                importance,
                batch_size=self.defaults.batch_size,
            ),
        )

    def top_edge(self, block: int, layer: str, rank: int) -> tuple[int, int]:
        """The (q, p) of the block layer's edge of importance rank `rank` (0 = most important)."""
        top = self.kan_importance()[self.block_layers(block)[layer]].top_edges(rank + 1)
        if rank >= len(top):
            raise ValueError(f"block {block} {layer} has {len(top)} edges; no edge of rank {rank}")
        return top[rank][:2]

    def intervened_predictions(
        self,
        image: int,
        clamp: tuple[int, int | None, float] | None = None,
        ablation: tuple[int, str, int] | None = None,
        k: int = 5,
    ) -> list[tuple[str, float]]:
        """The top-k classes of a sample image with a gate clamp (block, head or None for all, α) and/or an edge
        ablation (block, layer, importance rank of the edge) applied."""
        interventions = []
        if clamp is not None:
            interventions.append(GateClamp(clamp[0], clamp[1], None, clamp[2]))
        if ablation is not None:
            block, layer, rank = ablation
            edge = self.top_edge(block, layer, rank)
            interventions.append(EdgeAblation.edges(self.model, self.block_layers(block)[layer], [edge]))

        def compute() -> list[tuple[str, float]]:
            probs = intervened_logits(self.model, self.images(image), *interventions).softmax(-1)[0]
            values, index = probs.topk(min(k, probs.numel()))
            return [(self.class_name(i), v) for i, v in zip(index.tolist(), values.tolist(), strict=True)]

        return self.cached(("intervened_predictions", image, clamp, ablation, k), compute)

    # --------------------------------------------------------------------------------------------- card

    def card(self) -> dict[str, Any]:
        """The model card: variant, architecture, parameters, data and accuracy, with readable values."""
        return model_card(self.model, self.info)


def model_card(model: nn.Module, info: CheckpointInfo) -> dict[str, Any]:
    """Variant, architecture (depth, width, heads, KAN basis and grid), parameters, dataset and accuracy."""
    kwargs = info.model_kwargs
    kan = next(iter(parts.kan_layers(model).values()), None)
    architecture: dict[str, Any] = {
        "depth": len(model.blocks),
        "width": int(getattr(model, "embed_dim", 0)) or None,
        "heads": int(model.blocks[0].attn.num_heads),
        "patch size": "×".join(str(s) for s in parts.patch_size(model)),
        "image size": info.data.get("img_size"),
        "attention": "GLA" if parts.gla_blocks(model) else "softmax",
    }
    if kan is not None:
        rbf = kan.rbf
        architecture["KAN basis"] = kwargs.get("kan_basis", "shared")
        architecture["KAN grid"] = f"{rbf.num_grids} centres on [{rbf.grid_min:g}, {rbf.grid_max:g}]"
    card: dict[str, Any] = {
        "variant": info.model_name,
        "architecture": architecture,
        "parameters": f"{sum(p.numel() for p in model.parameters()):,}",
        "dataset": info.data.get("name"),
        "classes": len(info.data.get("class_names") or []) or None,
    }
    card |= training_summary(info)
    if getattr(info, "provenance", None):
        card["where each setting came from"] = dict(info.provenance)
    return {k: v for k, v in card.items() if v is not None}


def training_summary(info: CheckpointInfo) -> dict[str, Any]:
    """Which epoch of how many this checkpoint holds, and its validation accuracy (last and best so far)."""
    epochs = [m for m in info.metrics if "val_top1" in m]
    if not epochs:
        return {}
    planned = (info.train.get("args") or {}).get("epochs")
    last = epochs[-1]
    best = max(epochs, key=lambda m: m["val_top1"])
    held = f"epoch {last['epoch']}" + (f" of {planned}" if planned else "")
    if best is last and len(epochs) > 1:
        held += " (the best epoch so far)"
    return {
        "training": held,
        "val top-1 (this epoch)": f"{last['val_top1']:.2f} %",
        "val top-1 (best so far)": f"{best['val_top1']:.2f} % (epoch {best['epoch']})",
    }


def format_card(card: dict[str, Any], indent: str = "") -> str:
    """The model card as aligned `key: value` lines (nested sections indented)."""
    width = max(len(k) for k in card)
    lines = []
    for key, value in card.items():
        if isinstance(value, dict):
            lines += [f"{indent}{key}:", format_card(value, indent + "  ")]
        else:
            lines.append(f"{indent}{key + ':':<{width + 1}} {value}")
    return "\n".join(lines)
