"""torch.compile's guards skip an unchanged model whole: dynamo's recursive dict tags cover a module's subtree only
when the traced forward reads no property of it (and no super()), so every model's subtree must stay "tag safe".
A subtree that is not is checked guard by guard on every call: 0.42 ms of host time before LKAT-T's first kernel
on the H100's host, against 4 us for timm's ViT-T (benchmarks/README.md, "Host time before the first kernel")."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

import lkat_lens
from lkat_lens import recipe as lkrecipe
from lkat_lens.flat_params import FlatParameters


def _self_guards(model: torch.nn.Module, x: torch.Tensor):
    """The guard manager of `self` in the guards of model's compiled forward, after one training call."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
        compiled = torch.compile(model, backend=lambda gm, _: gm.forward, fullgraph=True)
        compiled(x).sum().backward()
        (entry,) = _debug_get_cache_entry_list(type(model).forward.__code__)
    managers = entry.guard_manager.root.get_child_managers()
    return next(m for m in managers if m.get_source() == "L['self']")


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [("lkat_micro", {}), ("rbfkat_tiny_patch16_224", {"img_size": 32, "depth": 2}), ("vit5_micro", {})],
    ids=["lkat", "rbfkat", "vit5"],
)
def test_model_guards_are_one_tag_safe_root(name: str, kwargs: dict) -> None:
    torch.manual_seed(0)
    model = lkat_lens.create_model(name, num_classes=10, **kwargs)
    size = model.patch_embed.img_size
    guards = _self_guards(model, torch.randn(2, 3, *size))
    assert guards.is_tag_safe_root(), "a property or super() read in forward makes the guards check every module"


def test_a_flattened_models_guards_are_one_tag_safe_root() -> None:
    """FlatParameters' traced forward reads its pieces from plain tuples (`splits`): reading their list of pieces
    and a property of each made dynamo check every piece's name and shape on every call (lkat_micro: 917 leaf guards,
    not tag safe)."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10)
    flat = FlatParameters(model, lkrecipe.param_groups(model, 0.01))
    guards = _self_guards(flat, torch.randn(2, 3, *model.patch_embed.img_size))
    assert guards.is_tag_safe_root(), "FlatParameters.forward reads a list or property of the flattened module"
