"""Registers and spills of our Triton kernels on a GPU architecture, measured on a machine without a GPU.

    python benchmarks/kernel_registers.py --out benchmarks/results/kernel_registers.json

Each kernel is launched the way the model launches it (the launchers of lkat_lens.kernels, on CPU tensors of an LKAT
layer's shapes: 201 tokens, heads of 64, bf16; chunk mode's parallel state passing at 2048^2's 16,389 tokens), but the
launch is caught before it reaches a device: every configuration its autotuner would try is compiled for the
architecture (`--arch`, default 90: H100 / H200) by Triton's compiler, and the ptxas that Triton ships reports
(`ptxas -v`) the registers, stack frame and spill bytes per thread. So a kernel variant's register pressure, which
decides how many programs share an SM and how much goes to local memory, is known before device time is spent on it;
its time is not (bench_gla_registers.py and bench_gla.py measure that on the GPU). The catching uses Triton's launch
internals as of Triton 3.8 (this project's CPU machine).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
import triton
from common import RESULTS, environment, write_result  # benchmarks/ is the script folder
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction, create_function_from_signature

from lkat_lens.kernels import chunk_states, gated_norm, gla_gate, gla_input, gla_short, kan_triton, rbf_triton

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
USAGE = {
    "regs": r"Used (\d+) registers",
    "stack_bytes": r"(\d+) bytes stack frame",
    "spill_store_bytes": r"(\d+) bytes spill stores",
    "spill_load_bytes": r"(\d+) bytes spill loads",
}


@contextmanager
def caught_launches():
    """Within it, launching an autotuned or plain Triton kernel records (kernel, args, kwargs, configs) in the
    yielded list instead of running it (configs: the autotuner's, or None)."""
    launches: list[tuple[JITFunction, tuple, dict, list | None]] = []

    def autotuned(self, *args, **kwargs):
        launches.append((self.fn, args, _launch_kwargs(kwargs), list(self.configs)))

    def plain(self, *args, **kwargs):
        launches.append((self, args, _launch_kwargs(kwargs), None))

    with mock.patch.object(Autotuner, "run", autotuned), mock.patch.object(JITFunction, "run", plain):
        yield launches


def _launch_kwargs(kwargs: dict) -> dict:
    """A launch's keyword arguments without the launcher's own (grid, warmup)."""
    return {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}


def compile_for(kernel: JITFunction, args: tuple, kwargs: dict, arch: int) -> triton.compiler.CompiledKernel:
    """`kernel` compiled for CUDA architecture `arch` as a launch with these arguments would compile it (the same
    argument specialisation: dtypes, constexprs, integer sizes, 16-byte alignment), without a device."""
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def usage(compiled: triton.compiler.CompiledKernel, arch: int) -> dict:
    """Registers, stack frame and spill bytes per thread of a compiled kernel, from `ptxas -v` on its PTX."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        report = subprocess.run(
            [str(PTXAS), "-v", "--gpu-name", gpu, ptx.name, "-o", "/dev/null"],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    return {name: int(re.search(pattern, report)[1]) for name, pattern in USAGE.items()}


def config_label(config: triton.Config | None, kwargs: dict) -> dict:
    """A configuration's launch options and meta-parameters, as recorded in a row."""
    if config is None:
        return {k: kwargs.get(k) for k in ("num_stages", "maxnreg")} | {"num_warps": kwargs.get("num_warps", 4)}
    return {"num_warps": config.num_warps, "num_stages": config.num_stages, "maxnreg": config.maxnreg, **config.kwargs}


def measure(name: str, launcher: Callable[[], object], arch: int) -> list[dict]:
    """One row per (kernel launched by `launcher`, autotuning configuration): its registers and spills."""
    if any(m.INTERPRET for m in (gla_short, gla_input, chunk_states, kan_triton, rbf_triton, gla_gate)):
        raise RuntimeError("TRITON_INTERPRET=1 runs the kernels on the CPU instead of compiling them: unset it")
    with caught_launches() as launches:
        launcher()
    rows = []
    for kernel, args, kwargs, configs in launches:
        for config in configs or [None]:
            full = kwargs if config is None else {**kwargs, **config.all_kwargs()}
            full = {k: v for k, v in full.items() if v is not None}
            row = {"case": name, "kernel": kernel.__name__, **config_label(config, kwargs)}
            rows.append(row | usage(compile_for(kernel, args, full, arch), arch))
    return rows


def lkat_layer(T: int = 201, heads: int = 6, head_dim: int = 64) -> dict[str, Callable[[], object]]:
    """The launchers of an LKAT layer's kernels on CPU tensors of its shapes (batch 2: sizes that decide nothing
    of the compiled code but 32- or 64-bit offsets): GLA input path forward and backward (q/k: RMSNorm and RoPE;
    v: neither; q, k and v of one projection output at once, as the core runs them), short GLA forward and
    backward, the eager output path (g_norm * SiLU(g)) forward and backward."""
    B, D = 2, heads * head_dim
    x, do = (torch.randn(B, T, D, dtype=torch.bfloat16) for _ in range(2))
    conv, norm = torch.randn(D, 1, 4), torch.ones(head_dim)
    cos, sin = torch.ones(T, head_dim), torch.zeros(T, head_dim)
    q, k, v, do_heads = (torch.randn(B, T, heads, head_dim, dtype=torch.bfloat16) for _ in range(4))
    gk = F.logsigmoid(torch.randn(B, T, heads, head_dim)) / 16
    scale = head_dim**-0.5
    o, g = (t.flatten(0, 1) for t in (q, v))
    bias = torch.zeros(head_dim)
    y = torch.randn(B, T, 3 * D, dtype=torch.bfloat16)
    convs, norms = (conv, conv, conv), (norm, norm)
    return {
        "gla_input q/k forward": lambda: gla_input.gla_input_fwd(x, conv, norm, cos, sin, heads, 1e-6),
        "gla_input q/k backward": lambda: gla_input.gla_input_bwd(x, conv, norm, cos, sin, do, heads, 1e-6),
        "gla_input v forward": lambda: gla_input.gla_input_fwd(x, conv, None, None, None, heads, 1e-6),
        "gla_input v backward": lambda: gla_input.gla_input_bwd(x, conv, None, None, None, do, heads, 1e-6),
        "gla_input q/k/v forward": lambda: gla_input.gla_qkv_fwd(y, convs, norms, cos, sin, heads, (1e-6, 1e-6)),
        "gla_input q/k/v backward": lambda: gla_input.gla_qkv_bwd(
            y, convs, norms, cos, sin, (do_heads, do_heads, do_heads), heads, (1e-6, 1e-6), torch.empty_like(y)
        ),
        "gla_short forward": lambda: gla_short.gla_short_fwd(q, k, v, gk, scale, 0),
        "gla_short backward": lambda: gla_short.gla_short_bwd(q, k, v, gk, q.new_empty(0), do_heads, scale, 0),
        "gated_norm forward": lambda: gated_norm.gated_norm_fwd(o, g, norm, bias, 1e-5),
        "gated_norm backward": lambda: gated_norm.gated_norm_bwd(o, g, norm, bias, o, 1e-5),
    }


def lkat_high_resolution(T: int = 16389, batch: int = 2, heads: int = 6, head_dim: int = 64) -> dict[str, Callable]:
    """The launchers of the parallel state passing (kernels.chunk_states) on CPU tensors of LKAT-S's shapes at
    2048^2 (two images of 16,389 tokens): own terms forward and backward and the scan both ways in chunk mode's 257
    chunks of 64, and the own terms in the short kernels' segments (gla_short.SEGMENT tokens)."""
    q, k, v, do = (torch.randn(batch, T, heads, head_dim, dtype=torch.bfloat16) for _ in range(4))
    g = torch.zeros(batch, T, heads, head_dim)
    x = torch.zeros(batch, triton.cdiv(T, 64), heads, head_dim, head_dim)
    segment = gla_short.SEGMENT
    return {
        "chunk_states own states": lambda: chunk_states._own_terms("states", k, v, g, 64),
        "chunk_states own state grads": lambda: chunk_states._own_terms("grads", q, do, g, 64, 0.125),
        "chunk_states scan": lambda: chunk_states.scan(x, g, 64),
        "chunk_states scan reverse": lambda: chunk_states.scan(x, g, 64, reverse=True),
        "chunk_states own states (segments)": lambda: chunk_states._own_terms("states", k, v, g, segment, raw=True),
        "chunk_states own state grads (segments)": lambda: chunk_states._own_terms(
            "grads", q, do, g, segment, 0.1, raw=True
        ),
    }


def lkat_segments(T: int = 4097, batch: int = 6, heads: int = 6, head_dim: int = 64) -> dict[str, Callable]:
    """The launchers of the short GLA kernels walking segments (LKAT-S at 1024^2: six images of 4,097 tokens), each
    with the chunk-state kernels it launches (own terms from the gates, scan)."""
    q, k, v, do = (torch.randn(batch, T, heads, head_dim, dtype=torch.bfloat16) for _ in range(4))
    gk = F.logsigmoid(torch.randn(batch, T, heads, head_dim)) / 16
    segment, scale = gla_short.SEGMENT, head_dim**-0.5
    h = torch.zeros(batch, triton.cdiv(T, segment), heads, head_dim, head_dim)
    return {
        "gla_short segmented forward": lambda: gla_short.gla_short_fwd(q, k, v, gk, scale, segment),
        "gla_short segmented backward": lambda: gla_short.gla_short_bwd(q, k, v, gk, h, do, scale, segment),
    }


def kan_layers(
    tokens: int = 16 * 201, dim: int = 192, hidden: int = 768, G: int = 4, edge_grid: int = 8
) -> dict[str, Callable]:
    """The launchers of the fused KAN kernels (kernels.kan_triton) on CPU tensors, bf16: the shared basis at LKAT-T's
    fc1 (dim -> hidden) and fc2 (hidden -> dim), the edge basis (FastKAN's G = 8) at fc2; 16 images, a row count
    divisible by 16 as a batch of 128's is. The kernels' CUDA-only check is lifted while they are caught."""
    cases = {}
    for layer, (K, N) in (("fc1", (dim, hidden)), ("fc2", (hidden, dim))):
        x, W = torch.randn(tokens, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16)
        gw, dy = torch.randn(1, G), torch.randn(tokens, N, dtype=torch.bfloat16)
        cases[f"kan {layer} forward"] = _on_cpu(lambda x=x, gw=gw, W=W: kan_triton.kan_fwd(x, gw, W, -2.0, 2.0))
        cases[f"kan {layer} backward"] = _on_cpu(
            lambda x=x, gw=gw, W=W, dy=dy: kan_triton.kan_bwd(x, gw, W, dy, -2.0, 2.0)
        )
    x, dy = torch.randn(tokens, hidden, dtype=torch.bfloat16), torch.randn(tokens, dim, dtype=torch.bfloat16)
    We = torch.randn(dim, hidden * edge_grid, dtype=torch.bfloat16)
    cases["kan edge fc2 forward"] = _on_cpu(lambda: kan_triton.edge_fwd(x, We, -2.0, 2.0, edge_grid))
    cases["kan edge fc2 backward"] = _on_cpu(lambda: kan_triton.edge_bwd(x, We, dy, -2.0, 2.0, edge_grid))
    return cases


def lkat_mlp_and_gate(tokens: int = 16 * 201, dim: int = 192, hidden: int = 768, rank: int = 16) -> dict[str, Callable]:
    """The launchers of the kernels `auto` takes on CUDA for an LKAT-T layer's KAN layers and forget gate, on CPU
    tensors: the RBF op of the shared basis (the "triton" path) forward and backward, at fc2's input, and the GLA gate
    forward and backward (its low-rank code of `rank`, heads of 64 keys). The RBF op's CUDA-only check is lifted and
    the device's SM count given as an H100's while they are caught."""
    x, dy = torch.randn(tokens * hidden, 1, dtype=torch.bfloat16), torch.randn(tokens * hidden, 1, dtype=torch.bfloat16)
    w = torch.randn(1, 4)
    code, weight, bias = torch.randn(tokens, rank, dtype=torch.bfloat16), torch.randn(dim, rank), torch.randn(dim)
    dgk = torch.randn(tokens, dim)
    return {
        "rbf forward": _on_cpu(lambda: rbf_triton.rbf_grid_linear_fwd(x, w, -2.0, 2.0, torch.bfloat16)),
        "rbf backward": _on_cpu(lambda: rbf_triton.rbf_grid_linear_bwd(x, w, dy, -2.0, 2.0, torch.bfloat16)),
        "gla_gate forward": lambda: gla_gate.gla_gate_fwd(code, weight, bias, 16.0),
        "gla_gate backward": lambda: gla_gate.gla_gate_bwd(code, weight, bias, dgk, 16.0),
    }


def _on_cpu(launch: Callable[[], object]) -> Callable[[], object]:
    """launch as a case: run with the CUDA-only check the KAN and RBF kernels share lifted and an H100's SM count (its
    launches are caught, never run)."""

    def case() -> object:
        with (
            mock.patch.object(rbf_triton, "require_device", lambda x2d, kernels=None: None),
            mock.patch.object(rbf_triton, "num_sms", lambda device: 132),
        ):
            return launch()

    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: H100, H200)")
    parser.add_argument("--cases", nargs="*", default=None, help="a subset of the cases (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cases = lkat_layer() | lkat_high_resolution() | lkat_segments() | kan_layers() | lkat_mlp_and_gate()
    env = environment() | {"arch": f"sm_{args.arch}", "ptxas": str(PTXAS.name)}
    rows = []
    for name in args.cases or list(cases):
        rows += [{**row, **env} for row in measure(name, cases[name], args.arch)]
    write_result(args.out or RESULTS / f"kernel_registers-sm_{args.arch}-{env['date']}.json", rows)
    print("| case | kernel | warps | stages | maxnreg | meta | registers | stack B | spill stores B | spill loads B |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        meta = ", ".join(f"{k}={v}" for k, v in r.items() if k.isupper())
        print(
            f"| {r['case']} | {r['kernel']} | {r['num_warps']} | {r['num_stages'] or '—'} | {r['maxnreg'] or '—'} | "
            f"{meta or '—'} | {r['regs']} | {r['stack_bytes']} | {r['spill_store_bytes']} | {r['spill_load_bytes']} |"
        )


if __name__ == "__main__":
    main()
