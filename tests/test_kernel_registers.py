"""benchmarks/kernel_registers.py: the launches it catches instead of running, and the registers and spills it
reports for an H100 / H200 (sm_90) without a GPU."""

from __future__ import annotations

import pytest
from benchmark_script import imported

from lkat_lens.kernels import chunk_states, gated_norm, gla_short


@pytest.fixture(scope="module")
def tool():
    """The script as a module."""
    with imported("kernel_registers") as module:
        yield module


def test_catches_the_launch_with_every_autotuning_configuration(tool) -> None:
    """The short GLA backward's launch on CPU tensors is caught (a real launch would fail on them), with the
    configurations its autotuner tries."""
    with tool.caught_launches() as launches:
        tool.lkat_layer(T=33, heads=2)["gla_short backward"]()
    ((kernel, args, kwargs, configs),) = launches
    assert kernel.__name__ == "_gla_short_bwd_kernel"
    assert kwargs["K"] == kwargs["V"] == 64 and args[0].shape == (2, 33, 2, 64)
    expected = [(c.num_warps, c.maxnreg) for c in gla_short._backward_configs(64)]
    assert [(c.num_warps, c.maxnreg) for c in configs] == expected


def test_reports_registers_and_spills_for_sm90(tool) -> None:
    """Every configuration of the short GLA backward compiles for sm_90 here; a register cap holds, the uncapped
    kernels stay within the 255 registers a thread can have, and a frame that spills stores and loads bytes."""
    rows = tool.measure("gla_short backward", tool.lkat_layer(T=33, heads=2)["gla_short backward"], arch=90)
    assert len(rows) == len(gla_short._backward_configs(64))
    for row in rows:
        assert 0 < row["regs"] <= (row["maxnreg"] or 255), row
        assert (row["spill_store_bytes"] > 0) == (row["spill_load_bytes"] > 0), row
        assert row["stack_bytes"] >= 0 and (row["spill_store_bytes"] == 0 or row["stack_bytes"] > 0), row
    assert any(row["maxnreg"] for row in rows)


def test_output_path_kernels_fit_their_registers(tool) -> None:
    """Every configuration the eager output path's autotuner tries compiles for sm_90 without spilling, at LKAT-B's
    head count."""
    layer = tool.lkat_layer(T=33, heads=12)
    for case in ("gated_norm forward", "gated_norm backward"):
        rows = tool.measure(case, layer[case], arch=90)
        assert len(rows) == len(gated_norm._CONFIGS), rows
        assert all(row["spill_store_bytes"] == 0 and row["regs"] <= 255 for row in rows), rows


def test_chunk_state_kernels_fit_their_registers(tool) -> None:
    """Every configuration the parallel chunk states' autotuners try (own terms both ways, the scan both ways)
    compiles for sm_90 without spilling, at LKAT-S's 2048^2 shapes (257 chunks)."""
    cases = tool.lkat_high_resolution(T=16389, batch=1)
    configs = {"scan": chunk_states._SCAN_CONFIGS, "own": chunk_states._STATE_CONFIGS}
    for case, launcher in cases.items():
        rows = tool.measure(case, launcher, arch=90)
        assert len(rows) == len(configs["scan" if "scan" in case else "own"]), rows
        assert all(row["spill_store_bytes"] == 0 and row["regs"] <= 255 for row in rows), rows


def test_every_kernel_of_an_lkat_layer_compiles_for_sm90(tool) -> None:
    """Each kernel an LKAT layer launches on CUDA (GLA input path, short GLA, output path, RBF op, forget gate) and
    each fused KAN kernel (shared and edge basis) compiles for sm_90 here within 255 registers, with the first
    configuration its autotuner tries. The interpreter runs code that Triton's compiler refuses (a loop-carried name
    that changed type once broke the edge kernels on the GPU alone): such code fails here, before device time is
    spent on it."""
    cases = tool.lkat_layer(T=33, heads=2) | tool.lkat_mlp_and_gate(tokens=32) | tool.kan_layers(tokens=32)
    compiled = set()
    for launcher in cases.values():
        with tool.caught_launches() as found:
            launcher()
        for kernel, args, kwargs, configs in found:
            first = {k: v for k, v in configs[0].all_kwargs().items() if v is not None} if configs else {}
            regs = tool.usage(tool.compile_for(kernel, args, kwargs | first, 90), 90)["regs"]
            assert 0 < regs <= 255, (kernel.__name__, regs)
            compiled.add(kernel.__name__)
    assert len(compiled) >= 14, compiled
