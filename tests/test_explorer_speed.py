"""Block switching on an LKAT-B-sized checkpoint: once a block's analyses are computed, its views answer in < 0.5 s."""

import time

import plotly.io as pio
import pytest
import torch

from lkat_lens.apps.explorer import create_app
from lkat_lens.apps.selection import Selection
from lkat_lens.apps.views import edges, gates, tokens
from lkat_lens.checkpoint import save_checkpoint
from lkat_lens.data import NORMALIZATION
from lkat_lens.models import create_model

SWITCH_BUDGET_S = 0.5
VARIANT = "lkat_base_patch16_224"


@pytest.fixture(scope="module")
def base_app(tmp_path_factory):
    """The explorer of a randomly initialised LKAT-B (768/12/12, 224², digits data: 2 images, 4 edges a grid)."""
    torch.manual_seed(0)
    model = create_model(VARIANT, num_classes=10)
    mean, std = NORMALIZATION["digits"]
    data = {"name": "digits", "img_size": 224, "mean": mean, "std": std, "class_names": [str(d) for d in range(10)]}
    path = tmp_path_factory.mktemp("lkat_b") / "lkat_b.pt"
    save_checkpoint(
        path, model_name=VARIANT, model_kwargs={"num_classes": 10}, state_dict=model.state_dict(), data=data
    )
    del model
    return create_app(path, num_images=2, edges=4, probe_images=2)


def switch_to(app, block: int) -> float:
    """Seconds to answer a block change: every block-dependent view's callback, each figure serialised as Dash does."""
    ckpt = app.explorer_state[0]
    at = Selection(block=block, image=0, head=1)
    start = time.perf_counter()
    figs = [
        *edges.block_figures(ckpt, at.block),
        edges.importance(ckpt, at.block, "fc1"),
        edges.edge_detail(ckpt, at.block, "fc1", None),
        *gates.gate_figures(ckpt, at.block, at.head),
        *gates.attention_figures(ckpt, at.block, at.image, at.head, at.patch),
        *tokens.token_figures(ckpt, at.block, at.image, at.patch),
    ]
    for fig in figs:
        pio.to_json(fig)
    return time.perf_counter() - start


@pytest.mark.timed
def test_lkat_base_block_switch_is_fast(base_app, capsys):
    ckpt = base_app.explorer_state[0]
    assert (ckpt.num_blocks, ckpt.num_heads, ckpt.grid_size) == (12, 12, (14, 14))
    first = [switch_to(base_app, block) for block in (3, 7)]  # first computation of two blocks
    switches = [switch_to(base_app, block) for block in (3, 7) * 3]
    with capsys.disabled():
        print(
            f"\nLKAT-B explorer: first computation of a block {max(first):.2f} s; "
            f"switching between computed blocks {min(switches):.3f}-{max(switches):.3f} s (budget {SWITCH_BUDGET_S} s)"
        )
    assert max(switches) < SWITCH_BUDGET_S
    assert tuple(ckpt.edge_importance(3, "fc1").edge_std.shape) == (3072, 768)
    assert "tiles of 12×3 edges" in edges.importance(ckpt, 3, "fc1").layout.title.text
