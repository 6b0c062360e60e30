"""The guards torch.compile checks on every call of a compiled forward, each model as it is and flattened (issue 19).

Dynamo runs a compiled frame's guards before every call. Where the traced code reads no property or list of a
module's subtree, `torch._dynamo.config.use_recursive_dict_tags_for_guards` (on by default in torch 2.10 and 2.11)
checks the whole subtree by its dictionary tags at once ("tag safe"); elsewhere each guard runs. Per model and
variant (as it is; flattened, `lkat_lens.flat_params.FlatParameters`): `torch.compile(fullgraph=True)` with a backend
that runs dynamo's graph as it is (no inductor build: the guards are dynamo's), one training forward and backward of a
batch of 2 at 224² under bf16 autocast, then the leaf guards counted, whether `self` is one tag-safe root, and the
median of --checks timed checks of the guards (with the recursive dict tags on, as torch 2.11 runs them, and off, as
torch 2.12 and later do by default).

    python benchmarks/bench_flat_guards.py --sizes tiny small
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from pathlib import Path

import torch
from common import dated_result_path, environment, write_result  # benchmarks/ is the script folder
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

import lkat_lens
from lkat_lens.flat_params import FlatParameters
from lkat_lens.recipe import param_groups


def leaf_guards(manager) -> int:
    """The number of leaf guards under a guard manager."""
    return len(manager.get_leaf_guards()) + sum(leaf_guards(child) for child in manager.get_child_managers())


def guard_check_times(net: torch.nn.Module, x: torch.Tensor, checks: int) -> tuple[list[float], object]:
    """The µs of each of `checks` checks of the guards of net's compiled forward called on x (its newest cache entry,
    under bf16 autocast as it was called), and the entry. LookupError where dynamo keeps no entry, RuntimeError where
    the guards fail that call."""
    entries = _debug_get_cache_entry_list(type(net).forward.__code__)
    if not entries:
        raise LookupError(f"no compiled forward of {type(net).__name__}")
    bound = inspect.signature(type(net).forward).bind(net, x)
    bound.apply_defaults()
    f_locals, guards = dict(bound.arguments), entries[0].guard_manager
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        if not guards.check(f_locals):
            raise RuntimeError("the guards fail on the call they were built for")
        times = []
        for _ in range(checks):
            start = time.perf_counter()
            guards.check(f_locals)
            times.append((time.perf_counter() - start) * 1e6)
    return times, entries[0]


def measure(name: str, flat: bool, device: str, checks: int, recursive_tags: bool) -> dict:
    """One model's row: guards, tag safety and check time of its compiled forward."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = lkat_lens.create_model(name, num_classes=1000).to(device)
    net = FlatParameters(model, param_groups(model, 0.01)) if flat else model
    x = torch.randn(2, 3, 224, 224, device=device)
    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=recursive_tags):
        compiled = torch.compile(net, backend=lambda graph, _: graph.forward, fullgraph=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            compiled(x).float().sum().backward()
        times, entry = guard_check_times(net, x, checks)
    root = entry.guard_manager.root
    self_guards = next(m for m in root.get_child_managers() if m.get_source() == "L['self']")
    return {
        "model": name,
        "flat": flat,
        "recursive_dict_tags": recursive_tags,
        "leaf_guards": leaf_guards(root),
        "self_tag_safe_root": self_guards.is_tag_safe_root(),
        "guard_check_us": statistics.median(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny"], choices=["tiny", "small", "base"])
    parser.add_argument("--families", nargs="+", default=["vit", "lkat"], choices=["vit", "lkat"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checks", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = environment()
    out = args.out or dated_result_path("bench_flat_guards", env)
    rows = []
    for size in args.sizes:
        for family in args.families:
            for flat in (False, True):
                for recursive_tags in (True, False):
                    rows.append(measure(f"{family}_{size}_patch16_224", flat, args.device, args.checks, recursive_tags))
                    write_result(out, {"environment": env, "device": args.device, "rows": rows})
                    print(rows[-1], flush=True)


if __name__ == "__main__":
    main()
