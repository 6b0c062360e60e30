"""What the whole-model GPU tests share: KAN layers given weight, one forward/backward and relative errors, and the
errors of a path around the GLA (set_backends' gla_input, gla_output, gla_gate) fused and as modules."""

import copy

import torch
from tolerance import rel_norm

import lkat_lens


def give_kan_weight(model: torch.nn.Module) -> torch.nn.Module:
    """The reference initialisation makes KAN outputs ~0; give the KAN layers weight so that they are tested."""
    for m in model.modules():
        if isinstance(m, lkat_lens.models.KANLayer):
            torch.nn.init.normal_(m.grid_linear.weight, std=0.5)
            torch.nn.init.normal_(m.dim_linear.weight, std=m.in_features**-0.5)
    return model


def run(model, x, y, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """fp32 logits and parameter gradients of one forward/backward (under autocast to `dtype` unless fp32)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        logits = model(x)
    torch.nn.functional.cross_entropy(logits.float(), y).backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().float(), grads


def worst_grad(grads: dict[str, torch.Tensor], grads_ref: dict[str, torch.Tensor]) -> tuple[str, float]:
    """The parameter whose gradient is furthest from the reference (relative), and that error."""
    worst = max((n for n in grads_ref if grads_ref[n].norm() > 0), key=lambda n: rel_norm(grads[n], grads_ref[n]))
    return worst, rel_norm(grads[worst], grads_ref[worst])


def lkat_t_and_images(depth: int = 2) -> tuple[torch.nn.Module, torch.Tensor]:
    """A `depth`-block LKAT-T at 224² (201 tokens) with the exact torch GLA on CUDA, and a batch of 4 images."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_tiny_patch16_224", num_classes=10, depth=depth).cuda()
    images = torch.randn(4, 3, 224, 224, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    return model.set_backends(attn="torch"), images


def backend_step(model: torch.nn.Module, images: torch.Tensor, autocast: bool = False, **backends: str) -> list:
    """Logits and the flat parameter gradient (fp64) of one backward of the logits' squares, with
    set_backends(**backends), under bf16 autocast when `autocast`."""
    model.set_backends(**backends)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(images).float()
    logits.square().sum().backward()
    return [logits.detach(), torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])]


def errors(results: list[torch.Tensor], truth: list[torch.Tensor]) -> float:
    """The larger relative (Frobenius) error of the logits and of the flat gradient."""
    return max(rel_norm(a, b) for a, b in zip(results, truth, strict=True))


def fp64_path_errors(model: torch.nn.Module, images: torch.Tensor, path: str) -> dict[str, float]:
    """{mode: error} of the fp32 model with its `path` (a set_backends keyword) in modes "torch" and "fused", each
    against the model in fp64 (modules)."""
    exact = backend_step(copy.deepcopy(model).double(), images.double(), **{path: "torch"})
    return {mode: errors(backend_step(model, images, **{path: mode}), exact) for mode in ("torch", "fused")}


def compiled_path_errors(model: torch.nn.Module, images: torch.Tensor, path: str, kernel: str) -> dict[str, float]:
    """{mode: error} of torch.compile (fullgraph, bf16 autocast) of copies of `model` with its `path` in modes "torch"
    and "fused", each against the eager fp32 model (modules); the GLA in mode "auto" (the torch form's recurrence would
    be traced step by step). Asserts that the compiled step ran the Triton kernel named `kernel` exactly when fused."""
    truth = backend_step(copy.deepcopy(model), images, attn="auto", **{path: "torch"})
    measured = {}
    for mode in ("torch", "fused"):
        compiled = torch.compile(copy.deepcopy(model).set_backends(attn="auto", **{path: mode}), fullgraph=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            measured[mode] = errors(backend_step(compiled, images, autocast=True), truth)
        names = {e.key for e in prof.key_averages()}
        assert any(kernel in n for n in names) == (mode == "fused"), (mode, sorted(names)[:20])
    torch.compiler.reset()
    return measured
