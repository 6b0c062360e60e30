"""benchmarks/step_breakdown.py: a profiled step's kernels by part of the model, on names from real H200 profiles."""

from __future__ import annotations

import pytest
from benchmark_script import imported


@pytest.fixture(scope="module")
def breakdown():
    """The script as a module."""
    with imported("step_breakdown") as module:
        yield module


GATE = "GLA gate (log-sigmoid, or our kernels with its Linear)"
KERNELS = {  # a kernel name from a profiled LKAT or ViT step -> its part
    "_gla_short_bwd_kernel": "GLA: our short kernels",
    "_own_states_kernel": "GLA: states between segments",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0": (
        "attention: SDPA"
    ),
    "_gla_input_bwd_kernel": "GLA input path (conv, SiLU, RMSNorm, RoPE)",
    "_gla_qkv_fwd_kernel": "GLA input path (conv, SiLU, RMSNorm, RoPE)",
    "_bwd_kernel": "GLA input path (conv, SiLU, RMSNorm, RoPE)",
    "_gated_norm_fwd_kernel": "GLA output path (LayerNorm x SiLU gate), our kernels",
    "triton_red_fused_div_log_sigmoid_backward_log_sigmoid_forward_sum_view_18": GATE,
    "_gla_gate_bwd_kernel": GATE,
    "_rbf_grid_linear_kernel": "KAN: our Triton kernels",
    "triton_per_fused__to_copy__unsafe_view_add_clamp_exp2_mul_native_layer_norm_native_layer_norm_backward_pow_12": (
        "KAN basis, traced (inductor)"
    ),
    "triton_poi_fused_gelu_gelu_backward_view_8": "GELU (inductor)",
    "void implicit_convolve_sgemm<__nv_bfloat16, __nv_bfloat16, 128, 5, 5, 3, 3, 3, 1, false, false, true>": (
        "patch embedding convolution (cuDNN)"
    ),
    "nvjet_sm90_tst_192x128_64x5_1x4_h_bz_coopB_NNT": "GEMM (cuBLAS, CUTLASS)",
    "triton_red_fused__to_copy_native_layer_norm_backward_view_11": "layer norms (inductor)",
    "triton_poi_fused__to_copy_cat_silu_backward_view_20": "other inductor kernels (copies, cats, sums)",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>>": (
        "optimizer (fused AdamW)"
    ),
    "Memset (Unknown)": "other (torch reductions, memsets, loss)",
}


@pytest.mark.parametrize("kernel", KERNELS)
def test_each_kernel_goes_to_its_part(breakdown, kernel: str) -> None:
    assert breakdown.part_of(kernel) == KERNELS[kernel]


def _row(label: str, compile_mode: str, kernels: dict[str, float]) -> dict:
    top = [{"op": op, "calls": 12, "ms": ms} for op, ms in kernels.items()]
    return {"label": label, "compile": compile_mode, "train_profile": {"top_kernels": top, "device_time_ms": 10.0}}


def test_table_sums_each_part_and_the_listed_share(breakdown) -> None:
    kernels = {"_gla_short_bwd_kernel": 3.0, "_gla_short_fwd_kernel": 1.0, "nvjet_sm90_a": 2.0, "nvjet_sm90_b": 0.5}
    lines = breakdown.table([_row("LKAT-T", "reduce-overhead", kernels)], "train").splitlines()
    assert "| GLA: our short kernels | 4.000 |" in lines
    assert "| GEMM (cuBLAS, CUTLASS) | 2.500 |" in lines
    assert lines[-1] == "| share in the listed kernels | 65.0% |"
    assert not any(line.startswith("| attention") for line in lines)


def test_older_eager_rows_are_refused(breakdown) -> None:
    """Before the rename `_bwd_kernel` was the input path's or the eager output path's: an eager row is ambiguous."""
    with pytest.raises(SystemExit, match="share their names"):
        breakdown.table([_row("LKAT-T", "eager", {"_bwd_kernel": 1.0})], "train")


def test_rows_sharing_a_label_keep_their_own_columns(breakdown) -> None:
    """A --compare run of two compile modes labels both ViT-T rows alike: each keeps its own column."""
    rows = [_row("ViT-T", "eager", {"nvjet_a": 3.0}), _row("ViT-T", "reduce-overhead", {"nvjet_a": 1.0})]
    lines = breakdown.table(rows, "train").splitlines()
    assert lines[0] == "| train step, kernel ms | ViT-T (eager) | ViT-T (reduce-overhead) |"
    assert "| GEMM (cuBLAS, CUTLASS) | 3.000 | 1.000 |" in lines
