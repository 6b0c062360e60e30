"""torch.compile's trace of the GLA core (kernels/gla_core.py), captured on the CPU: dynamo and AOT autograd trace the
core's autograd.Function with its host code into graphs whose Triton launches are user-defined kernels, with no graph
break, and Triton's mutation analysis finds what each kernel writes; for CUDA graphs (short_ops, set by
LKAT.set_backends(cuda_graphs=True)) the short GLA's forward and backward stay one custom op each instead (their
kernels keep their register caps; gla_core says why).

No kernel runs: the graphs are captured and never executed. dynamo records Triton kernels only where torch finds a
Triton-capable device, and the mutation analysis builds each kernel's TTIR for the current target, so the child
process this file starts tells torch that Triton is available and gives Triton an sm_90 target, and has the analysis
type a Python float as fp64, as inductor passes it (a kernel whose types then disagree fails to build, and the
analysis counts every input as written). The compiled core's values are the GPU test's
(tests/gpu/test_gla_core_gpu.py); what this file guards is the tracing itself: a getter dynamo cannot read, a tuple
argument (inductor and the mutation analysis take none), a `storage_offset` (dynamo traces none), a float scalar used
uncast, a kernel that writes a view which is not dense (inductor copies such a view wrongly, tuned.written_through).
Two more cases trace a whole compiled lkat_micro training step, as it is and set for CUDA graphs: every layer takes
the core, with no graph break (VisionGLA.fuses_core and VisionGLA.core under torch.compile). There the kernel
modules' INTERPRET flags are set in the child so that the model's dispatch sends CPU tensors to the kernels as it
sends CUDA tensors; the launches are then the interpreter's (each kernel's own configuration instead of its
autotuner), with the same kernels and arguments.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

PREFIX = "TRACE "
# What each of the core's kernels writes (its outputs and partial sums), by graph
WRITES = {
    "forward": {
        "_gla_qkv_fwd_kernel": ["k_ptr", "q_ptr", "v_ptr"],
        "_gla_gate_fwd_kernel": ["gk_ptr"],
        "_gla_short_fwd_intra_kernel": ["oa_ptr"],
        "_gla_short_fwd_kernel": ["o_ptr"],
        "_gated_norm_fwd_kernel": ["out_ptr"],
    },
    "backward": {
        "_gated_norm_bwd_kernel": ["dg_ptr", "do_ptr", "part_ptr"],
        "_gla_short_bwd_kernel": ["dg_ptr", "dk_ptr", "dq_ptr", "dv_ptr"],
        "_gla_gate_bwd_kernel": ["dcode_ptr", "part_ptr"],
        "_gla_qkv_bwd_kernel": ["dnw_ptr", "dw_ptr", "dx_ptr"],
    },
}
# in segments, the chunk states' kernels too (the scan writes y alone: see chunk_states._scan_rows)
SEGMENT_WRITES = {
    "forward": {"_own_states_kernel": ["gl", "x"], "_scan_kernel": ["y"]},
    "backward": {"_own_state_grads_kernel": ["gl", "x"], "_scan_kernel": ["y"]},
}
# With short_ops, the short GLA's custom ops take the place of its kernels (and, in segments, the chunk states')
SHORT_KERNELS = {"_gla_short_fwd_intra_kernel", "_gla_short_fwd_kernel", "_gla_short_bwd_kernel"}
OPS = {"forward": ["lkat_lens.gla_short.default"], "backward": ["lkat_lens.gla_short_backward.default"]}


def _capture() -> dict:
    """The child's side: {"forward" | "backward": [{"kernel", "writes", "dense", "inputs_written"} per launch]}."""
    import torch
    import torch._dynamo.variables.builder as dynamo_builder
    import torch.utils._triton as torch_triton
    from test_gla_core import EPS, NORMALIZER, leaves_of, make_case, scale_of
    from torch._dynamo.backends.common import aot_autograd
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime import jit as triton_jit

    import lkat_lens
    from lkat_lens.kernels import gated_norm, gla_core, gla_gate, gla_input, gla_short

    class _Target:
        """Triton's active driver as far as the mutation analysis asks: the target to build TTIR for."""

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

    torch_triton.has_triton = dynamo_builder.has_triton = lambda: True
    driver.set_active(_Target())
    # the analysis types a Python float as inductor's generated code passes it, fp64 (Triton's launch: fp32)
    native_type = triton_jit.mangle_type
    triton_jit.mangle_type = lambda arg, *rest: "fp64" if type(arg) is float else native_type(arg, *rest)
    torch._functorch.config.force_non_lazy_backward_lowering = True  # the backward's graph at compile time
    failures = []  # the mutation analysis logs a warning when a kernel's TTIR fails to build

    class Failures(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "assuming every input is mutated" in record.getMessage():
                failures.append(f"{record.getMessage()}: {record.exc_info[1] if record.exc_info else ''}"[:600])

    logging.getLogger("torch._dynamo").addHandler(Failures(logging.WARNING))  # triton_kernel_wrap logs there
    graphs = {}

    class Captured(Exception):
        """Raised in place of running the captured forward."""

    def keep(name):
        def compiler(graph, _inputs):
            graphs[name] = graph
            return lambda *_: (_ for _ in ()).throw(Captured())  # nothing runs

        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    try:
        short_ops = os.environ["CORE_SHORT_OPS"] == "1"
        if os.environ["CORE_CASE"].startswith("lkat_micro"):
            for module in (gla_core, gla_input, gla_gate, gated_norm, gla_short):
                module.INTERPRET = True  # the model's dispatch takes the kernels for CPU tensors, as for CUDA ones
            model = lkat_lens.create_model("lkat_micro", num_classes=10)
            fused = dict(gla_input="fused", gla_gate="fused", gla_output="fused", gla_core="fused")
            model.set_backends(attn="short", cuda_graphs=short_ops, **fused)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                torch.compile(model, backend=backend, fullgraph=True)(torch.randn(2, 3, 16, 16))
        else:
            heads, T, segment = 2, int(os.environ["CORE_T"]), int(os.environ["CORE_SEGMENT"])
            flat, _ = make_case(T, heads, 16, 16, 16, torch.bfloat16, True)
            args = (heads, scale_of(flat, heads), segment, list(EPS), NORMALIZER, short_ops)
            compiled = torch.compile(
                lambda *leaves: gla_core._gla_core(*leaves, *args)[0], backend=backend, fullgraph=True
            )
            compiled(*leaves_of(flat))
    except Captured:
        pass
    result = {"analysis_failures": failures}
    for name, graph in graphs.items():
        placeholders = {node for node in graph.graph.nodes if node.op == "placeholder"}
        wrapper = torch.ops.higher_order.triton_kernel_wrapper_functional
        result[name] = [_launch(node, placeholders) for node in graph.graph.nodes if node.target is wrapper]
        ours = [node.target for node in graph.graph.nodes if isinstance(node.target, torch._ops.OpOverload)]
        result[f"{name}_ops"] = [str(op) for op in ours if op.namespace == "lkat_lens"]
    return result


def _launch(node, placeholders: set) -> dict:
    """What one traced launch (a triton_kernel_wrapper_functional node) runs and writes."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    operands, written = node.kwargs["kwargs"], node.kwargs["tensors_to_clone"]
    return {
        "kernel": kernel_side_table.get_kernel(node.kwargs["kernel_idx"]).fn.__name__,
        "writes": sorted(written),
        "dense": all(operands[name].meta["val"].is_contiguous() for name in written),
        "inputs_written": sorted(name for name in written if operands[name] in placeholders),
    }


# (tokens, segment, cores, short_ops): one core walking the sequence at once, one in LKAT's segments (from 512 tokens
# on: the chunk states' kernels too), lkat_micro's training step (4 layers of 21 tokens, each with its core), and the
# same for CUDA graphs (set_backends(cuda_graphs=True): the short GLA as ops)
CASES = {
    "one_walk": (21, 0, 1, False),
    "segments": (600, 128, 1, False),
    "lkat_micro": (21, 0, 4, False),
    "lkat_micro_cuda_graphs": (21, 0, 4, True),
}


@pytest.fixture(scope="module", params=list(CASES))
def trace(request) -> dict:
    T, segment, cores, short_ops = CASES[request.param]
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(CORE_CASE=request.param, CORE_T=str(T), CORE_SEGMENT=str(segment), CORE_SHORT_OPS=str(int(short_ops)))
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(PREFIX)]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return {"segment": segment, "cores": cores, "short_ops": short_ops, **json.loads(lines[-1].removeprefix(PREFIX))}


def expected_writes(graph: str, segment: int, short_ops: bool) -> dict[str, list[str]]:
    """The kernels a core launches in `graph` (forward or backward) and what each writes."""
    if short_ops:
        return {name: writes for name, writes in WRITES[graph].items() if name not in SHORT_KERNELS}
    return {**WRITES[graph], **(SEGMENT_WRITES[graph] if segment else {})}


def test_the_core_traces_into_its_kernels_without_a_graph_break(trace: dict) -> None:
    """One forward graph and one backward graph (fullgraph) with the core's kernels, in segments the chunk states'
    too, each launched once a core (in lkat_micro, once a layer) and found to write exactly its own outputs; for CUDA
    graphs the short GLA's op once a core in place of its kernels."""
    for graph in ("forward", "backward"):
        expected = expected_writes(graph, trace["segment"], trace["short_ops"])
        launched = [launch["kernel"] for launch in trace[graph]]
        assert sorted(launched) == sorted(list(expected) * trace["cores"])
        for launch in trace[graph]:
            assert launch["writes"] == expected[launch["kernel"]], launch
        assert trace[f"{graph}_ops"] == (OPS[graph] * trace["cores"] if trace["short_ops"] else [])


def test_each_kernel_writes_only_dense_tensors_of_its_own(trace: dict) -> None:
    """The mutation analysis built every kernel (floats typed fp64) and found what each writes (had it failed, every
    input would count as written): a kernel writes something, never the core's inputs, and only dense tensors."""
    assert not trace["analysis_failures"], trace["analysis_failures"]
    for launch in trace["forward"] + trace["backward"]:
        assert launch["writes"] and not launch["inputs_written"] and launch["dense"], launch


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(PREFIX + json.dumps(_capture()))
