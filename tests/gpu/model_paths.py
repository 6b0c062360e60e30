"""What the whole-model GPU tests share: KAN layers given weight, one forward/backward and relative errors."""

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
