"""A model's trainable parameters as views of a few flat Parameters, for compiled training steps bound by the host.

A compiled LKAT-T training step without CUDA graphs is bound by the host, and part of the host's work is per parameter
tensor: torch.compile's graphs take each as an input and return each gradient, autograd accumulates each gradient, and
the optimizer and zero_grad loop over them (LKAT-T has 285, timm's ViT-T 152). `FlatParameters` keeps the model as it
is (its Parameters, names, state_dict, hooks and analyses unchanged) but stores each optimizer group's parameters of
one block in one flat Parameter (26 for either model): the model's own Parameters become views of it that take no
gradient, and a forward runs the model through `torch.func.functional_call` with views of the flats, which
torch.compile traces into its graph. Compiled on an H200, LKAT-T trained 1.09x faster and ViT-T 1.13x (medians of
eight interleaved rounds; fastest steps 1.06x and 1.12x; benchmarks/bench_flat_params.py), and LKAT-T 1.25x once this
forward's guards were one tag-safe subtree (`splits`; another process, on a slower host). It is for training steps
compiled without CUDA graphs: eager steps lose by it (the views and the swap cost more host time than they save), and
under CUDA graphs LKAT-T's steps are 0.97x as fast (ViT-T's 1.02x; 0.80x while the guards checked every piece).
Without gradients the wrapper calls the model itself: through the swap a compiled inference step had lost too
(dynamo guards it: 0.74x).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

_BLOCK = re.compile(r"^(.*?blocks\.\d+)\.")


def block_of(name: str) -> str:
    """The block a parameter name belongs to ("blocks.3" for "blocks.3.attn.q_proj.weight"), "" outside blocks."""
    match = _BLOCK.match(name)
    return match.group(1) if match else ""


@dataclass(frozen=True)
class Piece:
    """One of the model's parameters inside a flat: its name, shape and element offset."""

    name: str
    shape: torch.Size
    offset: int

    @property
    def numel(self) -> int:
        return self.shape.numel()


class FlatParameters(nn.Module):
    """`module` whose trainable parameters live in flat Parameters, one per optimizer group and block.

    `param_groups` are the optimizer's groups of `module`'s parameters (timm's `param_groups_weight_decay`, say);
    `self.param_groups` are the same groups over the flats, to build the optimizer from. Every trainable parameter
    of `module` must be in exactly one group, and the parameters of one flat share a dtype and device. The model's
    Parameters stay registered (so `module.state_dict()` and everything that reads weights by name see the trained
    values) with requires_grad False; their gradients are in the flats' `.grad` (see `gradients_exposed`). Move the
    model to its device before flattening it: moving it after would give its Parameters storage of their own."""

    def __init__(self, module: nn.Module, param_groups: Sequence[dict[str, Any]]) -> None:
        super().__init__()
        self.module = module
        names = {id(p): n for n, p in module.named_parameters() if p.requires_grad}
        grouped = [id(p) for group in param_groups for p in group["params"]]
        if len(set(grouped)) != len(grouped) or set(grouped) != set(names):
            raise ValueError("param_groups must hold every trainable parameter of the module exactly once")
        self.flats = nn.ParameterList()
        self.layouts: list[list[Piece]] = []  # per flat (in optimizer order), its pieces
        # per flat, its pieces' names, sizes and shapes as plain tuples: what the traced forward reads (`views`), so
        # that torch.compile's guards on it stay one tag-safe subtree (reading the pieces' lists and properties made
        # dynamo check every piece's name and shape on every call: 917 leaf guards for lkat_micro instead of 314)
        self.splits: tuple[tuple[tuple[str, ...], tuple[int, ...], tuple[tuple[int, ...], ...]], ...] = ()
        self.order: list[tuple[int, int]] = []  # per parameter in param_groups' order: (flat, piece)
        self.group_sizes: list[int] = []  # parameters per group
        self.param_groups: list[dict[str, Any]] = []
        for group in param_groups:
            params = list(group["params"])
            first = len(self.flats)
            for block in dict.fromkeys(block_of(names[id(p)]) for p in params):
                self._add_flat([p for p in params if block_of(names[id(p)]) == block], names)
            where = {
                piece.name: (flat, k)
                for flat in range(first, len(self.flats))
                for k, piece in enumerate(self.layouts[flat])
            }
            self.order += [where[names[id(p)]] for p in params]
            self.group_sizes.append(len(params))
            self.param_groups.append({**group, "params": list(self.flats[first:])})

    def _add_flat(self, members: list[nn.Parameter], names: dict[int, str]) -> None:
        """One flat Parameter holding `members` in order; they become views of it that take no gradient."""
        kinds = {(p.dtype, p.device) for p in members}
        if len(kinds) != 1:
            raise ValueError(f"the parameters of one flat must share a dtype and device, got {sorted(map(str, kinds))}")
        flat = torch.cat([p.detach().reshape(-1) for p in members])
        layout, offset = [], 0
        for p in members:
            layout.append(Piece(names[id(p)], p.shape, offset))
            p.data = _piece_of(flat, layout[-1])
            p.requires_grad_(False)
            offset += p.numel()
        self.flats.append(nn.Parameter(flat))
        self.layouts.append(layout)
        names, sizes, shapes = zip(*((piece.name, piece.numel, tuple(piece.shape)) for piece in layout), strict=True)
        self.splits += ((names, sizes, shapes),)

    def views(self) -> dict[str, torch.Tensor]:
        """Each flattened parameter's name and its view of its flat (through which the flat takes its gradient)."""
        out = {}
        for flat, (names, sizes, shapes) in zip(self.flats, self.splits, strict=True):
            for name, tensor, shape in zip(names, flat.split(sizes), shapes, strict=True):
                out[name] = tensor.view(shape)
        return out

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward: through views of the flats while gradients are on; else the module itself, whose
        Parameters alias the flats (the same values, without building views or swapping them in)."""
        if not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        return functional_call(self.module, self.views(), args, kwargs)

    @contextlib.contextmanager
    def gradients_exposed(self) -> Iterator[None]:
        """Within: each flattened parameter's `.grad` is its view of its flat's gradient (None where the flat has
        none), for code that reads gradients by parameter (telemetry); after: None again, holding nothing."""
        params = dict(self.module.named_parameters())
        try:
            for flat, layout in zip(self.flats, self.layouts, strict=True):
                for piece in layout:
                    params[piece.name].grad = None if flat.grad is None else _piece_of(flat.grad, piece)
            yield
        finally:
            for layout in self.layouts:
                for piece in layout:
                    params[piece.name].grad = None

    def unflatten_optimizer_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """An optimizer state_dict over the flats (`optimizer.state_dict()`) as an optimizer over the unflattened
        `param_groups` would hold it: each per-element state tensor sliced per parameter, the rest (step) copied."""
        per_param = {}
        for position, (flat, k) in enumerate(self.order):
            if flat in state["state"]:
                piece, numel = self.layouts[flat][k], self.flats[flat].numel()
                per_param[position] = {
                    key: _piece_of(value, piece).clone() if _per_element(value, (numel,)) else _copy(value)
                    for key, value in state["state"][flat].items()
                }
        return {"state": per_param, "param_groups": self._groups_like(state["param_groups"], self.group_sizes)}

    def flatten_optimizer_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A per-parameter optimizer state_dict (a checkpoint's, `unflatten_optimizer_state`'s form) over the flats,
        to load into the optimizer built from `self.param_groups`. ValueError if it does not fit these groups."""
        sizes = [len(group["params"]) for group in state["param_groups"]]
        if sizes != self.group_sizes:
            raise ValueError(
                f"the optimizer state's groups hold {sizes} parameters; this model's hold {self.group_sizes}"
            )
        ids = [index for group in state["param_groups"] for index in group["params"]]
        found: dict[int, dict[int, dict[str, Any]]] = {}
        for position, (flat, k) in enumerate(self.order):
            if ids[position] in state["state"]:
                found.setdefault(flat, {})[k] = state["state"][ids[position]]
        flat_state = {}
        for flat, pieces in found.items():
            layout = self.layouts[flat]
            if len(pieces) != len(layout):
                raise ValueError(f"the optimizer state covers only some of the parameters of {layout[0].name}'s flat")
            flat_state[flat] = {
                key: torch.cat([pieces[k][key].reshape(-1) for k in range(len(layout))])
                if _per_element(pieces[0][key], layout[0].shape)
                else _copy(pieces[0][key])
                for key in pieces[0]
            }
        flats_per_group = [len(group["params"]) for group in self.param_groups]
        return {"state": flat_state, "param_groups": self._groups_like(state["param_groups"], flats_per_group)}

    @staticmethod
    def _groups_like(groups: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
        """`groups`' settings with consecutive parameter indices, `sizes[i]` of them in group i."""
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [
            {**group, "params": list(range(start, start + size))}
            for group, start, size in zip(groups, starts, sizes, strict=True)
        ]


def _piece_of(flat: torch.Tensor, piece: Piece) -> torch.Tensor:
    """`piece`'s view of a flat tensor (the flat itself, its gradient, or a state tensor of its size)."""
    return flat[piece.offset : piece.offset + piece.numel].view(piece.shape)


def _per_element(value: Any, shape: tuple[int, ...] | torch.Size) -> bool:
    """Whether an optimizer state value holds one entry per parameter element (exp_avg), not a count (step)."""
    return isinstance(value, torch.Tensor) and value.shape == torch.Size(shape)


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value
