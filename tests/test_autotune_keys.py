"""Every autotuned kernel of an LKAT layer keys its tuning on how much its launch has to do (tuned.programs_key),
so that a tuning made at a small batch (a test, an analysis of a few images) does not serve a training batch: Triton's
autotuning cache outlives the process. Measured on an H200 before the key held it: the GLA input path's backward at
LKAT-T's training shape ran with warps tuned at another batch (the GPU tests had tuned it first), and the q, k and v
paths' forward + backward took 0.255 ms against 0.221 ms with 2 warps, which win at batch 128."""

from __future__ import annotations

import pytest

from lkat_lens.kernels import gated_norm, gla_input, gla_short, kan_triton, rbf_triton
from lkat_lens.kernels.tuned import programs_key

AUTOTUNED = {  # name -> the kernel's TunedKernel, built as on CUDA (no GPU needed to build it)
    **{f"gla_input {name}": lambda name=name: gla_input._autotuned(name) for name in gla_input._KERNELS},
    "gla_short intra-chunk forward": lambda: gla_short._autotuned("fwd_intra", 64),
    "gla_short forward walk": lambda: gla_short._autotuned("fwd", 64),
    "gla_short backward": lambda: gla_short._autotuned("bwd", 64),
    "gated_norm forward": lambda: gated_norm._autotuned("forward"),
    "gated_norm backward": lambda: gated_norm._autotuned("backward"),
    "rbf forward": lambda: rbf_triton._autotuned(False, True),
    "rbf backward": lambda: rbf_triton._autotuned(True, False),
    **{f"KAN GEMM {name}": lambda name=name: kan_triton._autotuned(name) for name in kan_triton._KERNELS},
}


@pytest.mark.parametrize("name", AUTOTUNED)
def test_autotuning_is_keyed_on_the_launch_size(name: str) -> None:
    assert "programs" in AUTOTUNED[name]().autotuner.keys


def test_programs_key_is_the_power_of_two_at_or_above_the_product() -> None:
    assert [programs_key(n) for n in (1, 2, 3, 128, 129)] == [1, 2, 4, 128, 256]
    assert programs_key(128, 3) == 512 and programs_key(2, 3) == 8 and programs_key(6, 6, 33) == 2048
    assert programs_key(128, 3) != programs_key(2, 3)  # LKAT-T's training batch against a test's
