"""The host work of one eager training step, counted: aten ops dispatched and Triton kernels launched, ViT against LKAT.

    python benchmarks/host_ops.py --sizes tiny small

Issue 19: in eager mode LKAT-T and LKAT-S are bound by the host, and a step's host time on the lent GPU machines
moves by up to 2x between processes. A count moves with the code only, so it says what a change to the eager path
saves wherever it runs. Runs on the CPU: the Triton interpreter takes the model's fused paths (input path, gate,
short GLA, output path, core, the KAN layers' "triton" path: what `auto` takes on CUDA at these sizes), and each
Triton launch is counted at the launcher and not executed (the interpreter would run it in numpy; the step's aten
ops do not depend on the kernels' values). One step is forward, loss and backward under bf16 autocast, after two
warm-up steps; the optimizer is left out (on CUDA it is one fused AdamW; on the CPU it would be another one).
The images are 32x32 (the op count does not depend on the token count below the GLA's segment length, 512).
Writes JSON and prints markdown: each model's ops by part (patch and token embedding, each kind of block module's
forward, the backward) and the most frequent ops.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported: the kernels' launchers take CPU tensors

import argparse  # noqa: E402
import collections  # noqa: E402
from pathlib import Path  # noqa: E402

import timm  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import dated_result_path, environment, write_result  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import lkat_lens  # noqa: E402

IMG = 32
SIZES = {"tiny": "T", "small": "S", "base": "B"}


class Counter(TorchDispatchMode):
    """Counts every aten op dispatched, by the part of the step named in `part`."""

    def __init__(self) -> None:
        super().__init__()
        self.part = "embedding and head"
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[self.part, str(func).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def build(name: str) -> torch.nn.Module:
    """The model on the CPU with 10 classes for 32x32 images; LKAT on the paths `auto` takes on CUDA."""
    torch.manual_seed(0)
    if name.startswith("vit"):
        return timm.create_model(name, pretrained=False, num_classes=10, img_size=IMG)
    model = lkat_lens.create_model(name, num_classes=10, img_size=IMG)
    fused = dict(gla_input="fused", gla_output="fused", gla_gate="fused", gla_core="fused")
    return model.set_backends(attn="short", kan="triton", **fused)


def count_step(model: torch.nn.Module, launches: list[int]) -> dict:
    """The aten ops and Triton launches of one training step, by part."""
    images, labels = torch.randn(2, 3, IMG, IMG), torch.randint(0, 10, (2,))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        counter.part = "backward"
        loss.backward()
        model.zero_grad(set_to_none=True)

    counter = Counter()
    for _ in range(2):  # warm-up: cached tables, path choices
        counter.part = "embedding and head"
        step()
    counter.ops.clear()
    for block in model.blocks:
        block.register_forward_hook(lambda *_: setattr(counter, "part", "embedding and head"))
        for name, module in block.named_children():
            module.register_forward_pre_hook(lambda *_, name=name: setattr(counter, "part", f"blocks: {name}"))
            module.register_forward_hook(lambda *_: setattr(counter, "part", "blocks: residuals"))
    launches[0] = 0
    counter.part = "embedding and head"
    with counter:
        step()
    parts: collections.Counter = collections.Counter()
    for (part, _), n in counter.ops.items():
        parts[part] += n
    top = collections.Counter()
    for (_, op), n in counter.ops.items():
        top[op] += n
    return {"aten_ops": sum(parts.values()), "triton_launches": launches[0], "by_part": dict(parts),
            "top_ops": dict(top.most_common(12))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny"], choices=list(SIZES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    launches = [0]

    def counted_launch(self, *args, **kwargs) -> None:
        launches[0] += 1

    InterpretedFunction.run = counted_launch  # counted, not executed (module docstring)
    env = environment()
    rows = []
    for size in args.sizes:
        for name in (f"vit_{size}_patch16_224", f"lkat_{size}_patch16_224"):
            label = f"{'ViT' if name.startswith('vit') else 'LKAT'}-{SIZES[size]}"
            rows.append({"model": label, **count_step(build(name), launches), **env})
    path = write_result(args.out or dated_result_path("host_ops", env), rows)
    print("| model | aten ops | Triton launches | by part | most frequent |\n|---|---|---|---|---|")
    for r in rows:
        parts = ", ".join(f"{k} {v}" for k, v in r["by_part"].items())
        top = ", ".join(f"{k} {v}" for k, v in list(r["top_ops"].items())[:6])
        print(f"| {r['model']} | {r['aten_ops']} | {r['triton_launches']} | {parts} | {top} |")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
